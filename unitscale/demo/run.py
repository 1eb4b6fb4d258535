"""The demo's conductor: plan, start, play, watch, stop everything, report."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc

from foundation.errors import ConfigError
from foundation.net import free_port
from foundation.replica_model import PROFILES, Profile
from protos.externalscaler import externalscaler_pb2 as keda_pb
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from protos.unitscale.v1 import signals_pb2_grpc as signals_grpc
from replay.simulate import COLD_START_TIERS, simulate
from replay.trace import Trace, TraceError, read_trace, scale
from scaler.config import PolicyConfig, load_config
from unitscale.demo import vllm_replica
from unitscale.demo.fleet import Fleet
from unitscale.demo.keda import KedaLoop
from unitscale.demo.load import LoadGenerator, clip, wall_trace
from unitscale.demo.observe import ReasonTail, Sampler
from unitscale.demo.processes import ComponentError, Supervisor, unitscale_command
from unitscale.demo.report import REPORT_FILES, LiveRun, headline, write_report
from unitscale.demo.tiers import compare_plan_tiers
from unitscale.demo.view import View
from unitscale.demo.workload import WorkloadShape, generate, lead_in
from unitscale.demo.world import (
    REPLICA_CAP,
    Plan,
    alternatives,
    check_lead_in,
    keda_spec,
    make_plan,
    prediction,
    scaler_config,
    trigger_metadata,
    write_yaml,
)
from unitscale.outputs import given_inputs, report_directory

ROOT = Path(__file__).resolve().parents[2]
CONFIG_POLL = 0.05
"""Seconds between config-file checks: the demo's EndpointSlice updates land this fast."""
SAMPLE_EVERY = 10.0
"""Trace seconds between samples (the replay's series step)."""
SLEEP_POLL = 2.0
"""Trace seconds between two reads of each ready replica's ``/is_sleeping`` (standby): a
sleep or wake is billed at most this late, against sleeps of minutes."""


CONFIG_FILES = {name: f"config/{name}.yaml" for name in ("scaler", "exporter", "gateway")}
"""Each server's config file in the demo's directory, rewritten every run."""


COLD_START = "local-disk"
"""The tier simulated replicas start from by default (``--cold-start``)."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """``unitscale demo``'s flags."""

    report: Path
    duration: float = 180.0
    """Wall seconds of trace to play (the trace is cut to ``duration x compression``)."""
    time_compression: float | None = None
    """Default 10 with simulated replicas; 1 with vLLM, whose steps cannot be sped up."""
    trace: Path | None = None
    rate_multiplier: float = 1.0
    real_vllm: bool = False
    seed: int = 0
    profile: str = "qwen2.5-32b-h200"
    max_replicas: int | None = None
    """Default the ScaledObject's maximum, at most 8 simulated replicas or 2 vLLM ones
    (each ~2 GB of memory and a core)."""
    target_concurrency: float | None = None
    """The trigger's ``targetConcurrency``: the ScaledObject's unless given (else 16)."""
    cold_start: str = COLD_START
    standby: bool | None = None
    """Sleeping replicas (the trigger's ``standby: "true"``; None: the ScaledObject's
    ``standby``, on where it says nothing); simulated replicas only: vLLM for CPUs has no
    sleep mode."""
    scaled_object: Path = ROOT / "deploy" / "scaledobjects" / "recommended.yaml"
    scaler_config: Path | None = None
    live_view: bool | None = None
    """Rich panel (True), log lines (False), or by whether stdout is a terminal."""
    command: str = "unitscale demo"


def capacity_priors(profile: Profile) -> PolicyConfig:
    """The scaler's capacity priors for ``profile``.

    Its rates at a 2,000-token prompt and at 32 decoding requests (the replica model's),
    so that the first decisions are right before the scaler learns the capacity.
    """
    prefill = 2000 / profile.mixed_step_seconds(0, 0, 2000)
    decode = 32 / profile.mixed_step_seconds(32, 32 * 2000, 0)
    return PolicyConfig(
        prefill_tokens_per_second=round(prefill, -2), decode_tokens_per_second=round(decode, -1)
    )


def default_policy(profile: Profile) -> PolicyConfig:
    """The scaler's policy without ``--scaler-config``: planned with ``profile``.

    The profile the replicas simulate gives a replica's capacity for the observed mix
    within the SLOs, and the load is planned from demand with headroom steered by attainment
    (docs/scaler.md); its ``capacity_priors`` stand in until the mix is known.
    """
    priors = capacity_priors(profile)
    return PolicyConfig(
        prefill_tokens_per_second=priors.prefill_tokens_per_second,
        decode_tokens_per_second=priors.decode_tokens_per_second,
        profile=profile.name,
    )


def _demo_policy(path: Path) -> PolicyConfig:
    """``--scaler-config``'s policy; the demo's scaler is given that section alone.

    Raises:
        ConfigError: a bad config, or one whose policy names one of its own ``profiles``
            (the demo runs the built-in ones; ``unitscale replay --scaler-config`` plans
            with an SRE's own).
    """
    config = load_config(path)
    if config.policy.profile in {own.name for own in config.replica_profiles}:
        raise ConfigError(
            f"{path}: the demo plans with the built-in profiles only, not policy.profile"
            f" {config.policy.profile!r} of its own profiles (unitscale replay"
            " --scaler-config tries one on a trace)"
        )
    return config.policy


def load_trace(options: DemoOptions, length: float) -> Trace:
    """The demo's trace in trace time, cut to ``length`` seconds.

    Raises:
        ConfigError: unreadable trace, or no request within ``length``.
    """
    if options.trace is None:
        trace = generate(WorkloadShape(length=length), options.seed)
    else:
        try:
            trace = scale(read_trace(options.trace), options.rate_multiplier, 1.0, options.seed)
        except TraceError as err:
            raise ConfigError(str(err)) from err
    keep = trace.arrival <= length
    if not keep.any():
        raise ConfigError(f"no request in the first {length:g} s of the trace")
    return Trace(trace.name, trace.arrival[keep], trace.prompt[keep], trace.output[keep])


def validate(options: DemoOptions) -> None:
    """Refuse bad flags before anything starts.

    Raises:
        ConfigError: the flag and what it allows.
    """
    if options.duration <= 0:
        raise ConfigError("--duration must be positive")
    if options.time_compression is not None and options.time_compression <= 0:
        raise ConfigError("--time-compression must be positive")
    if options.rate_multiplier <= 0:
        raise ConfigError("--rate-multiplier must be positive")
    if options.rate_multiplier != 1.0 and options.trace is None:
        raise ConfigError("--rate-multiplier applies to --trace; the built-in workload is fixed")
    if options.profile not in PROFILES:
        raise ConfigError(f"--profile {options.profile!r}: one of {', '.join(PROFILES)}")
    if options.cold_start not in COLD_START_TIERS:
        raise ConfigError(
            f"--cold-start {options.cold_start!r}: one of {', '.join(COLD_START_TIERS)}"
        )
    if options.real_vllm and options.cold_start != COLD_START:
        raise ConfigError(
            "--cold-start is the simulated replicas': --real-vllm starts real ones; drop it"
        )
    if options.max_replicas is not None and options.max_replicas < 1:
        raise ConfigError("--max-replicas must be at least 1")


async def run_demo(options: DemoOptions) -> int:
    """Run the demo; returns the exit status (0, 1 on a component failure, 130 on Ctrl-C).

    Raises:
        ConfigError: bad options, ScaledObject, scaler config or trace.
    """
    validate(options)
    plan = _plan(options)
    trace = _trace(options, plan)
    out = options.report
    # Once the flags are good: --scaler-config REPORT/config/scaler.yaml was replaced by
    # the demo's own (hostile pass 48).
    outputs = (*REPORT_FILES, *CONFIG_FILES.values())
    report_directory(out, "--report", outputs, given_inputs(options))
    lead = (
        f" after a lead-in of one request {plan.lead_in / 60:.1f} min before (a Deployment"
        " that served before, its sleepers held)"
        if plan.lead_in
        else ""
    )
    print(
        f"unitscale demo: {len(trace)} requests over"
        f" {options.duration * plan.compression / 60:.0f} min of trace time{lead}, played"
        f" {plan.compression:g}x faster ({options.duration:g} s); report and logs in {out}",
        flush=True,
    )
    if options.real_vllm:
        print("building the tiny model for vLLM...", flush=True)
        await asyncio.to_thread(vllm_replica.build_model, out / "model")
    conductor = Conductor(options, plan, trace)
    status = await conductor.run()
    if conductor.live is not None:
        _predict_and_report(options, plan, trace, conductor.live)
    return status


def _plan(options: DemoOptions) -> Plan:
    """The plan for ``options``: compression, policy, ScaledObject, cold start.

    Raises:
        ConfigError: vLLM for CPUs not installed, bad ScaledObject or scaler config.
    """
    compression = options.time_compression or (1.0 if options.real_vllm else 10.0)
    profile = PROFILES[options.profile]
    if options.real_vllm:
        vllm_replica.check_installed()
    policy = (
        _demo_policy(options.scaler_config)
        if options.scaler_config is not None
        else default_policy(profile)
    )
    plan = make_plan(
        compression,
        profile,
        options.scaled_object,
        policy,
        options.max_replicas,
        options.target_concurrency,
        standby=False if options.real_vllm else options.standby,
        replica_cap=2 if options.real_vllm else REPLICA_CAP,
    )
    plan = dataclasses.replace(
        plan,
        cold_start_tier=options.cold_start,
        measured_cold_start=vllm_replica.START_ESTIMATE * compression
        if options.real_vllm
        else None,
    )
    check_lead_in(plan)
    return plan


def _trace(options: DemoOptions, plan: Plan) -> Trace:
    """The trace to play: ``duration`` wall seconds of it, clipped to fit vLLM for CPUs."""
    trace = load_trace(options, options.duration * plan.compression)
    if options.real_vllm:
        trace = clip(trace, **vllm_replica.LIMITS)  # the prediction gets the same tokens
    return lead_in(trace, plan.lead_in) if plan.lead_in else trace


def _predict_and_report(options: DemoOptions, plan: Plan, trace: Trace, live: LiveRun) -> None:
    """The replay's prediction for the same trace and plan, the report, its headline."""
    print("predicting the same run with the replay simulator...", flush=True)
    replay_policy, replay_config = prediction(plan)
    predicted = simulate(trace, replay_policy, replay_config)
    others = {
        name: simulate(trace, policy, config)
        for name, (policy, config) in alternatives(plan).items()
    }
    out = options.report
    tiers = compare_plan_tiers(plan, trace)  # cold vs cache-warm vs sleeping, simulated
    metrics = write_report(out, plan, live, predicted, trace.name, options.command, others, tiers)
    print(headline(metrics["live"], metrics["predicted"]))
    print(f"report: {out / 'report.md'}")


_PORTS = ("scaler", "scaler-metrics", "exporter", "exporter-grpc", "gateway", "gateway-grpc")
"""Every port the servers listen on, each picked free on loopback."""


def _local(port: int) -> str:
    """``HOST:PORT`` on loopback."""
    return f"127.0.0.1:{port}"


def _servers(ports: dict[str, int]) -> dict[str, tuple[str, list[str], str]]:
    """Name -> (log level, its flags, the URL that answers 200 once it serves)."""
    return {
        "scaler": ("info", ["--listen", _local(ports["scaler"]),
                            "--metrics-listen", _local(ports["scaler-metrics"])],
                   f"http://{_local(ports['scaler-metrics'])}/metrics"),
        "exporter": ("warning", ["--listen", _local(ports["exporter"]),
                                 "--grpc-listen", _local(ports["exporter-grpc"])],
                     f"http://{_local(ports['exporter'])}/healthz"),
        "gateway": ("info", ["--listen", _local(ports["gateway"]),
                                "--grpc-listen", _local(ports["gateway-grpc"])],
                    f"http://{_local(ports['gateway'])}/health"),
    }  # fmt: skip


class _Clock:
    """Wall seconds since the trace started playing (about -1e9 before it does)."""

    def __init__(self) -> None:
        self._start = time.monotonic() + 1e9  # set for real when the trace starts

    def start(self) -> None:
        self._start = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self._start


class Conductor:
    """Starts the processes, plays the trace, and stops everything, whatever happens."""

    def __init__(self, options: DemoOptions, plan: Plan, trace: Trace) -> None:
        self.options = options
        self.plan = plan
        self.trace = trace
        self.supervisor = Supervisor(options.report / "logs", str(options.report.resolve()))
        self.clock = _Clock()
        self.live: LiveRun | None = None
        self.events: list[tuple[float, str]] = []

    async def run(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            status = await self._run(stop)
        except ComponentError as failure:
            print(f"unitscale demo: stopped: {failure}", flush=True)
            status = 1
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            await self.supervisor.stop_all()
        left = await self.supervisor.leftovers()
        if left:
            print(f"unitscale demo: process groups left behind: {left}", flush=True)
            status = status or 1
        return status

    async def _run(self, stop: asyncio.Event) -> int:
        """Start the servers, play the trace until it ends or ``stop``, record the run."""
        plan, c = self.plan, self.plan.compression
        ports = {name: free_port() for name in _PORTS}
        files = self._write_configs(ports)
        fleet = self._fleet(files, _local(ports["scaler"]))
        await self._start_servers(ports, files)
        ref = keda_pb.ScaledObjectRef(
            name=plan.scaled_object.name,
            namespace=plan.scaled_object.namespace,
            scalerMetadata=trigger_metadata(plan, _local(ports["scaler"])),
        )
        title = f"unitscale demo ({plan.profile.name}, {c:g}x time)"
        view = View(title, self.options.duration * c + plan.lead_in, self.options.live_view)
        async with (
            grpc.aio.insecure_channel(_local(ports["scaler"])) as keda_channel,
            grpc.aio.insecure_channel(_local(ports["exporter-grpc"])) as exporter_channel,
            grpc.aio.insecure_channel(_local(ports["gateway-grpc"])) as gateway_channel,
        ):
            keda = self._keda(keda_grpc.ExternalScalerStub(keda_channel), ref, fleet, view)
            sampler = Sampler(
                signals_grpc.SignalsServiceStub(exporter_channel),
                signals_grpc.SignalsServiceStub(gateway_channel),
                c,
            )
            self.clock.start()
            load = self._load(f"http://{_local(ports['gateway'])}")
            interrupted, stopped = await self._play(stop, view, keda, sampler, fleet, load)
        self.live = LiveRun(
            load.outcomes, fleet.replicas, sampler.samples, self.events, self._kind(), interrupted
        )
        return 130 if stopped.done() and not stopped.cancelled() else 0

    def _write_configs(self, ports: dict[str, int]) -> dict[str, Path]:
        """Each server's config file; the scaler's written now, the others by the fleet."""
        (self.options.report / "config").mkdir(parents=True, exist_ok=True)
        files = {name: self.options.report / path for name, path in CONFIG_FILES.items()}
        sources = [_local(ports["exporter-grpc"]), _local(ports["gateway-grpc"])]
        write_yaml(files["scaler"], scaler_config(self.plan, sources))
        return files

    def _fleet(self, files: dict[str, Path], scaler: str) -> Fleet:
        """The Deployment; with standby its gateway asks ``scaler`` for the standby plan."""
        real = self.options.real_vllm
        return Fleet(
            self.supervisor,
            self.plan,
            vllm_replica.launcher(self.options.report / "model") if real else self._sim_replica,
            files["gateway"],
            files["exporter"],
            CONFIG_POLL,
            self.clock,
            ready_timeout=vllm_replica.START_TIMEOUT if real else 30.0,
            standby_scaler=scaler if self.plan.standby is not None else None,
        )

    def _sim_replica(self, port: int) -> list[str]:
        """The argv of a simulated replica on ``port``, at the plan's speed and budget.

        It steps ``compression`` times faster, with the chunk budget for the ITL SLO, as
        vLLM would be launched (``Plan.replica_profile``).
        """
        name = self.plan.profile.name
        budget = self.plan.replica_profile.max_num_batched_tokens
        return unitscale_command(
            "--log-level", "warning", "sim-replica", "--listen", _local(port),
            "--profile", name, "--model", name, "--speedup", f"{self.plan.compression:g}",
            "--max-num-batched-tokens", str(budget),
        )  # fmt: skip

    async def _start_servers(self, ports: dict[str, int], files: dict[str, Path]) -> None:
        """The scaler, the exporter and the gateway, each serving before this returns."""
        table = _servers(ports)
        children = {}
        for name, (level, flags, _) in table.items():
            poll = f"--config-poll={CONFIG_POLL * 1000:g}ms"
            argv = ["--log-level", level, name, *flags, "--config", str(files[name]), poll]
            children[name] = await self.supervisor.start(name, unitscale_command(*argv))
        await asyncio.gather(
            *(self.supervisor.wait_http(children[n], url, 30) for n, (_, _, url) in table.items())
        )

    def _keda(
        self,
        stub: keda_grpc.ExternalScalerStub,
        ref: keda_pb.ScaledObjectRef,
        fleet: Fleet,
        view: View,
    ) -> KedaLoop:
        """KEDA and the HPA scaling ``fleet``; each change is an event."""

        def report(who: str, before: int, after: int, why: str) -> None:
            t = self.clock() * self.plan.compression
            self._event(view, t, f"{who}: {before} -> {after} replicas ({why})")

        plan = self.plan
        return KedaLoop(
            stub,
            ref,
            keda_spec(plan),
            plan.scaled_object.push,
            lambda: fleet.desired,
            fleet.scale_to,
            self.clock,
            report,
        )

    def _load(self, gateway_url: str) -> LoadGenerator:
        """The trace's requests at their (compressed) times, to the gateway."""
        plan = self.plan
        return LoadGenerator(
            wall_trace(self.trace, plan.compression, 0.0),
            gateway_url,
            plan.profile.name if not self.options.real_vllm else vllm_replica.MODEL_NAME,
            self.clock,
        )

    async def _play(
        self,
        stop: asyncio.Event,
        view: View,
        keda: KedaLoop,
        sampler: Sampler,
        fleet: Fleet,
        load: LoadGenerator,
    ) -> tuple[bool, asyncio.Task[Literal[True]]]:
        """Play the trace with KEDA, the sampler and the scaler's reasons running.

        Until the trace is done, a component fails (raised), ``stop`` is set or time
        is up; returns whether the run was cut short, and the task that waited on ``stop``.
        """
        reasons = ReasonTail(self.supervisor.logs / "scaler.log")
        epoch = time.time()  # the scaler's log has wall-clock times
        watchers = [
            asyncio.create_task(keda.run(), name="keda"),
            asyncio.create_task(self._reasons(view, reasons, epoch), name="reasons"),
            asyncio.create_task(self._sample(view, sampler, fleet, load), name="sampler"),
        ]
        if self.plan.standby is not None:
            poll = max(self.plan.wall(SLEEP_POLL), CONFIG_POLL)
            watchers.append(asyncio.create_task(fleet.watch_sleep(poll), name="sleep"))
        player = asyncio.create_task(load.run(), name="load")
        failed = asyncio.create_task(self.supervisor.failure.get(), name="failure")
        stopped = asyncio.create_task(stop.wait(), name="stop")
        everything: set[asyncio.Task[Any]] = {player, failed, stopped, *watchers}
        # The trace's length plus time for the last requests (a backlog after a
        # cold start, say); then the run ends whatever is still in flight.
        limit = self.options.duration + max(30.0, self.options.duration / 4)
        limit += self.plan.wall(self.plan.lead_in)
        with view:
            done, _ = await asyncio.wait(
                everything, timeout=limit, return_when=asyncio.FIRST_COMPLETED
            )
            _settle(everything, done, failed)
            interrupted = stopped in done or player not in done
            await fleet.stop()
        return interrupted, stopped

    def _kind(self) -> str:
        """The replicas, as the report names them."""
        if self.options.real_vllm:
            return f"vLLM for CPUs serving `{vllm_replica.MODEL_NAME}` (real processes)"
        return f"simulated `{self.plan.profile.name}` (`unitscale sim-replica`)"

    async def _reasons(self, view: View, reasons: ReasonTail, epoch: float) -> None:
        """The scaler's decisions as it logs them, at their own times (trace time)."""
        while True:
            for at, line in reasons.read():
                t = max(0.0, at - epoch) * self.plan.compression
                self._event(view, t, f"scaler: {line}")
            await asyncio.sleep(0.2)

    def _event(self, view: View, t: float, text: str) -> None:
        self.events.append((t, text))
        view.event(t, text)

    async def _sample(
        self, view: View, sampler: Sampler, fleet: Fleet, load: LoadGenerator
    ) -> None:
        """A sample of the system every ``SAMPLE_EVERY`` trace seconds, shown live."""
        clock = self.clock
        period = self.plan.wall(SAMPLE_EVERY)
        sent_before = 0
        next_at = 0.0
        while True:
            await asyncio.sleep(max(0.0, next_at - clock()))
            next_at += period
            sample = await sampler.sample(
                clock(),
                fleet.awake,
                fleet.count("ready"),
                load.sent - sent_before,
                fleet.count("sleeping"),
            )
            sent_before = load.sent
            view.sample(sample)


def _settle(
    tasks: set[asyncio.Task[Any]], done: set[asyncio.Task[Any]], failure: asyncio.Task[Any]
) -> None:
    """Cancel the tasks still running; raise what a finished one raised, or the failure.

    ``failure``'s result is a component's error: raised, not returned.
    """
    for task in tasks - done:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            if task in done and task is not failure:
                task.result()
    if failure in done:
        raise failure.result()
