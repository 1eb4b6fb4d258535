"""The demo's conductor: plan, start, play, watch, stop everything, report."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from foundation.errors import ConfigError
from foundation.net import free_port
from protos.externalscaler import externalscaler_pb2 as keda_pb
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from protos.unitscale.v1 import signals_pb2_grpc as signals_grpc
from replay.simulate import COLD_START_TIERS, simulate
from replay.trace import Trace, TraceError, read_trace, scale
from scaler.config import PolicyConfig, load_config
from serving.replica_model import PROFILES, Profile
from unitscale.demo import vllm_replica
from unitscale.demo.fleet import Fleet
from unitscale.demo.keda import KedaLoop
from unitscale.demo.load import LoadGenerator, clip, wall_trace
from unitscale.demo.observe import ReasonTail, Sampler
from unitscale.demo.processes import ComponentError, Supervisor, unitscale_command
from unitscale.demo.report import LiveRun, headline, write_report
from unitscale.demo.view import View
from unitscale.demo.workload import WorkloadShape, generate
from unitscale.demo.world import (
    Plan,
    alternatives,
    keda_spec,
    make_plan,
    prediction,
    scaler_config,
    trigger_metadata,
    write_yaml,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG_POLL = 0.05
"""Seconds between config-file checks: the demo's EndpointSlice updates land this fast."""
SAMPLE_EVERY = 10.0
"""Trace seconds between samples (the replay's series step)."""


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
    """Default 8 simulated replicas, or 2 vLLM ones (each ~2 GB of memory and a core)."""
    target_concurrency: float = 16.0
    cold_start: str = "local-disk"
    scaled_object: Path = ROOT / "deploy" / "scaledobject-recommended.yaml"
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
    if options.max_replicas is not None and options.max_replicas < 1:
        raise ConfigError("--max-replicas must be at least 1")


async def run_demo(options: DemoOptions) -> int:
    """Run the demo; returns the exit status (0, 1 on a component failure, 130 on Ctrl-C).

    Raises:
        ConfigError: bad options, ScaledObject, scaler config or trace.
    """
    validate(options)
    compression = options.time_compression or (1.0 if options.real_vllm else 10.0)
    profile = PROFILES[options.profile]
    if options.real_vllm:
        vllm_replica.check_installed()
    policy = (
        load_config(options.scaler_config).policy
        if options.scaler_config is not None
        else capacity_priors(profile)
    )
    plan = make_plan(
        compression,
        profile,
        options.scaled_object,
        policy,
        options.max_replicas or (2 if options.real_vllm else 8),
        options.target_concurrency,
    )
    plan = dataclasses.replace(
        plan,
        cold_start_tier=options.cold_start,
        measured_cold_start=vllm_replica.START_ESTIMATE * compression
        if options.real_vllm
        else None,
    )
    length = options.duration * compression
    trace = load_trace(options, length)
    if options.real_vllm:
        trace = clip(trace, **vllm_replica.LIMITS)  # the prediction gets the same tokens
    out = options.report
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"unitscale demo: {len(trace)} requests over {length / 60:.0f} min of trace time, played"
        f" {plan.compression:g}x faster ({options.duration:g} s); report and logs in {out}",
        flush=True,
    )
    if options.real_vllm:
        print("building the tiny model for vLLM...", flush=True)
        await asyncio.to_thread(vllm_replica.build_model, out / "model")
    conductor = Conductor(options, plan, trace)
    status = await conductor.run()
    if conductor.live is None:
        return status
    print("predicting the same run with the replay simulator...", flush=True)
    replay_policy, replay_config = prediction(plan)
    predicted = simulate(trace, replay_policy, replay_config)
    others = {
        name: simulate(trace, policy, config)
        for name, (policy, config) in alternatives(plan).items()
    }
    metrics = write_report(
        out, plan, conductor.live, predicted, trace.name, options.command, others
    )
    print(headline(metrics["live"], metrics["predicted"]))
    print(f"report: {out / 'report.md'}")
    return status


class Conductor:
    """Starts the processes, plays the trace, and stops everything, whatever happens."""

    def __init__(self, options: DemoOptions, plan: Plan, trace: Trace) -> None:
        self.options = options
        self.plan = plan
        self.trace = trace
        self.supervisor = Supervisor(options.report / "logs", str(options.report.resolve()))
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
        plan, options = self.plan, self.options
        config_dir = options.report / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        ports = {
            name: free_port()
            for name in (
                "scaler",
                "scaler-metrics",
                "exporter",
                "exporter-grpc",
                "gateway",
                "gateway-grpc",
            )
        }
        local = "127.0.0.1:{}".format
        files = {name: config_dir / f"{name}.yaml" for name in ("scaler", "exporter", "gateway")}
        write_yaml(
            files["scaler"],
            scaler_config(plan, [local(ports["exporter-grpc"]), local(ports["gateway-grpc"])]),
        )
        start = time.monotonic() + 1e9  # set for real when the trace starts

        def clock() -> float:
            return time.monotonic() - start

        launch = (
            vllm_replica.launcher(options.report / "model")
            if options.real_vllm
            else lambda port: unitscale_command(
                "--log-level",
                "warning",
                "sim-replica",
                "--listen",
                local(port),
                "--profile",
                plan.profile.name,
                "--model",
                plan.profile.name,
                "--speedup",
                f"{plan.compression:g}",
            )
        )
        fleet = Fleet(
            self.supervisor,
            plan,
            launch,
            files["gateway"],
            files["exporter"],
            CONFIG_POLL,
            clock,
            ready_timeout=vllm_replica.START_TIMEOUT if options.real_vllm else 30.0,
        )
        # name -> (log level, its flags, the URL that answers 200 once it serves)
        servers = {
            "scaler": ("info", ["--listen", local(ports["scaler"]),
                                "--metrics-listen", local(ports["scaler-metrics"])],
                       f"http://{local(ports['scaler-metrics'])}/metrics"),
            "exporter": ("warning", ["--listen", local(ports["exporter"]),
                                     "--grpc-listen", local(ports["exporter-grpc"])],
                         f"http://{local(ports['exporter'])}/healthz"),
            "gateway": ("warning", ["--listen", local(ports["gateway"]),
                                    "--grpc-listen", local(ports["gateway-grpc"])],
                        f"http://{local(ports['gateway'])}/health"),
        }  # fmt: skip
        children = {}
        for name, (level, flags, _) in servers.items():
            poll = f"--config-poll={CONFIG_POLL * 1000:g}ms"
            argv = ["--log-level", level, name, *flags, "--config", str(files[name]), poll]
            children[name] = await self.supervisor.start(name, unitscale_command(*argv))
        await asyncio.gather(
            *(self.supervisor.wait_http(children[n], url, 30) for n, (_, _, url) in servers.items())
        )
        scaler_address = local(ports["scaler"])
        ref = keda_pb.ScaledObjectRef(
            name=plan.scaled_object.name,
            namespace=plan.scaled_object.namespace,
            scalerMetadata=trigger_metadata(plan, scaler_address),
        )
        title = f"unitscale demo ({plan.profile.name}, {plan.compression:g}x time)"
        view = View(title, options.duration * plan.compression, options.live_view)
        c = plan.compression

        def report(who: str, before: int, after: int, why: str) -> None:
            self._event(view, clock() * c, f"{who}: {before} -> {after} replicas ({why})")

        interrupted = False
        async with (
            grpc.aio.insecure_channel(scaler_address) as keda_channel,
            grpc.aio.insecure_channel(local(ports["exporter-grpc"])) as exporter_channel,
            grpc.aio.insecure_channel(local(ports["gateway-grpc"])) as gateway_channel,
        ):
            keda = KedaLoop(
                keda_grpc.ExternalScalerStub(keda_channel),
                ref,
                keda_spec(plan),
                plan.scaled_object.push,
                lambda: fleet.desired,
                fleet.scale_to,
                clock,
                report,
            )
            sampler = Sampler(
                signals_grpc.SignalsServiceStub(exporter_channel),
                signals_grpc.SignalsServiceStub(gateway_channel),
                c,
            )
            start = time.monotonic()
            load = LoadGenerator(
                wall_trace(self.trace, c, 0.0),
                f"http://{local(ports['gateway'])}",
                plan.profile.name if not options.real_vllm else vllm_replica.MODEL_NAME,
                clock,
            )
            reasons = ReasonTail(self.supervisor.logs / "scaler.log")
            epoch = time.time()  # the scaler's log has wall-clock times
            tasks = {
                asyncio.create_task(keda.run(), name="keda"),
                asyncio.create_task(self._reasons(view, reasons, epoch), name="reasons"),
                asyncio.create_task(
                    self._sample(view, sampler, fleet, load, clock), name="sampler"
                ),
            }
            player = asyncio.create_task(load.run(), name="load")
            failed = asyncio.create_task(self.supervisor.failure.get(), name="failure")
            stopped = asyncio.create_task(stop.wait(), name="stop")
            # The trace's length plus time for the last requests (a backlog after a
            # cold start, say); then the run ends whatever is still in flight.
            limit = options.duration + max(30.0, options.duration / 4)
            with view:
                done, _ = await asyncio.wait(
                    {player, failed, stopped, *tasks},
                    timeout=limit,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in {player, failed, stopped, *tasks} - done:
                    task.cancel()
                for task in {player, failed, stopped, *tasks}:
                    with contextlib.suppress(asyncio.CancelledError):
                        if task in done and task is not failed:
                            task.result()
                if failed in done:
                    raise failed.result()
                interrupted = stopped in done or player not in done
                await fleet.stop()
        kind = (
            f"vLLM for CPUs serving `{vllm_replica.MODEL_NAME}` (real processes)"
            if options.real_vllm
            else f"simulated `{plan.profile.name}` (`unitscale sim-replica`)"
        )
        self.live = LiveRun(
            load.outcomes, fleet.replicas, sampler.samples, self.events, kind, interrupted
        )
        return 130 if stopped.done() and not stopped.cancelled() else 0

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
        self,
        view: View,
        sampler: Sampler,
        fleet: Fleet,
        load: LoadGenerator,
        clock: Callable[[], float],
    ) -> None:
        period = self.plan.wall(SAMPLE_EVERY)
        sent_before = 0
        next_at = 0.0
        while True:
            await asyncio.sleep(max(0.0, next_at - clock()))
            next_at += period
            sample = await sampler.sample(
                clock(), fleet.desired, fleet.count("ready"), load.sent - sent_before
            )
            sent_before = load.sent
            view.sample(sample)
