"""The whole loop under load, with faults injected on a schedule: is anything lost?

Real processes on 127.0.0.1 in the demo's compressed world (``unitscale.demo.world``:
every clock ``C`` times faster, so a 3-minute run holds half an hour of production
time): the gateway, simulated replicas, the exporter and the scaler, each reading a
hot-reloaded config file. This process is everyone else:

- **load**: a steady open-loop rate of small completions through the gateway, each
  outcome classified (served; refused explicitly with the API's error shape; failed
  with its replica, SIGKILLed while serving it; anything else is *lost*);
- **keda**: GetMetrics and IsActive every second, as KEDA's operator calls them;
- **faults**, each a few seconds then recovery: a replica SIGKILLed and started again
  (a Deployment's pod), the exporter likewise, a wrong-typed duration written into each
  server's config then a good one back, a hostile target (broken exposition) listed in
  the exporter's config then removed.

Beside them, on their own schedules over the same minutes (issue 27):

- **prometheus**: the scaler's Prometheus source polls a fake Prometheus here, which
  answers one more deployment's steady signals (a second ScaledObject KEDA polls) and,
  one after another, hostile answers: JSON nested 100,000 deep, a sample value that is an
  object, a 400-digit integer, +Inf, negative load, a signal time a day ahead, 0 replicas
  beside running requests;
- **admission**: the admission controller (the served class, in this process, its status
  writes recorded) every 0.5 s over four HAMi nodes it is told of by watch events, one
  node's register or one pod's allocation turning hostile (a 5,000-digit integer, JSON
  nested 100,000 deep) in turn; new gangs each pass, a scrape between passes, a resync
  from scratch beside the loop every 20 s, its answers compared with the kept state's.

Goals: no request lost; no decision on missing data (while a fault hides signals the
scaler answers UNAVAILABLE or holds; it never lowers its answer nor says inactive while
traffic flows), nor on impossible data (the same for the Prometheus deployment while its
answers are hostile; no gang admitted on a node whose annotations cannot be read); RSS
flat; every process and loop alive and healthy at the end; logs bounded.
Exit 0 whatever the goals say; non-zero only when the bench itself could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from bench.soak_hostile import (
    ADMISSION_KINDS,
    PROM_DEPLOYMENT,
    PROM_KINDS,
    AdmissionSoak,
    HostilePrometheus,
    HostileTarget,
    hostile_bodies,
    run_admission,
)
from foundation.errors import UnitscaleError
from foundation.net import free_port
from foundation.replica_model import PROFILES
from protos.externalscaler import externalscaler_pb2 as keda_pb
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler.registry import METRIC_NAME
from unitscale.demo.processes import Child, ComponentError, Supervisor, unitscale_command
from unitscale.demo.run import capacity_priors
from unitscale.demo.world import (
    Plan,
    exporter_config,
    gateway_config,
    make_plan,
    scaler_config,
    trigger_metadata,
    write_yaml,
)

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "qwen2.5-32b-h200"
"""The demo's profile: its capacity puts a few replicas' worth of work within 2 cores' reach."""
CONFIG_POLL = 0.1
"""Seconds between config-file checks in every server: a bad file is read at once."""
REFUSALS = (404, 413, 429, 503)
"""Statuses the gateway answers itself on purpose (with the API's error shape)."""
KILL_BLAME = 2.0
"""A request in flight at a replica's SIGKILL that fails this soon after it died with it."""
STREAM_EVERY = 8
"""Every 8th request streams (a replica's death mid-stream); the rest are whole answers."""
RECONNECT_MAX = 1.0
"""The scaler's longest wait before re-watching a source (``world.scaler_config``'s)."""
BIG_LOG_MB = 5.0
RSS_GOAL_PCT = 10.0
PROM_INTERVAL = 1.0
"""Seconds between the scaler's Prometheus rounds (within ``max-signal-age``'s 3 s)."""
PROM_CATCH_UP = PROM_INTERVAL + 1.0
"""After a hostile answer ends, until the next good round has been stored."""


# --- records ------------------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it; times in seconds since the load started."""

    sent: float
    streamed: bool
    finished: float | None = None
    kind: str = "lost"
    """served, refused, killed (failed with its replica) or lost."""
    detail: str = "no answer"


@dataclass(slots=True)
class Answer:
    """One KEDA poll: GetMetrics' value (or status code) and IsActive's (or code)."""

    at: float
    value: float | str
    active: bool | str


@dataclass(slots=True)
class Fault:
    """One injected fault: when it began, when recovery was done, what was seen."""

    kind: str
    target: str
    injected: float
    recovered: float | None = None
    seen: list[str] = field(default_factory=list)
    """What misbehaved: sentences for the report."""
    broken: set[str] = field(default_factory=set)
    """Servers it left alive but not working, to restart before the next fault."""
    hides: bool = False
    """It hid signals: a replica or the exporter down, or the exporter's scrape loop
    stopped. Only then is a lower answer (or inactive) a decision on missing data."""


@dataclass(slots=True)
class Crash:
    """A process that exited without being asked to."""

    role: str
    at: float
    code: int | None
    tail: str


# --- the processes --------------------------------------------------------------------------


class Cluster:
    """The servers as a kubelet keeps them: started, SIGKILLed on purpose, restarted."""

    def __init__(self, plan: Plan, replicas: int, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.supervisor = Supervisor(workdir / "logs", marker=str(workdir))
        self.port = {name: free_port() for name in _PORT_NAMES}
        self.replica_ports = [free_port() for _ in range(replicas)]
        self.files = {n: workdir / f"{n}.yaml" for n in ("gateway", "exporter", "scaler")}
        urls = [f"http://127.0.0.1:{p}" for p in self.replica_ports]
        sources = [self.addr("exporter-grpc"), self.addr("gateway-grpc")]
        self.good: dict[str, dict[str, Any]] = {
            "gateway": gateway_config(plan, urls),
            "exporter": exporter_config(plan, urls),
            "scaler": scaler_config(plan, sources),
        }
        self.children: dict[str, Child] = {}
        self.every_child: list[tuple[str, Child]] = []
        self.crashes: list[Crash] = []
        self.clock: Callable[[], float] = time.monotonic
        self._restarts: Counter[str] = Counter()
        self._watchers: set[asyncio.Task[None]] = set()

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.port[name]}"

    @property
    def roles(self) -> list[str]:
        return ["gateway", "exporter", "scaler", *(f"replica-{i}" for i in self._replicas)]

    @property
    def _replicas(self) -> range:
        return range(len(self.replica_ports))

    def argv(self, role: str) -> list[str]:
        poll = f"--config-poll={CONFIG_POLL * 1000:g}ms"
        if role.startswith("replica-"):
            port = self.replica_ports[int(role.split("-")[1])]
            return unitscale_command(
                "sim-replica", "--listen", f"127.0.0.1:{port}", "--profile", PROFILE,
                "--model", PROFILE, "--speedup", f"{self.plan.compression:g}",
            )  # fmt: skip
        http, grpc_flag, grpc_port = {
            "gateway": ("gateway", "--grpc-listen", "gateway-grpc"),
            "exporter": ("exporter", "--grpc-listen", "exporter-grpc"),
            "scaler": ("scaler", "--metrics-listen", "scaler-metrics"),
        }[role]
        flags = ["--listen", self.addr(http), grpc_flag, self.addr(grpc_port)]
        return unitscale_command(role, *flags, "--config", str(self.files[role]), poll)

    def health_url(self, role: str) -> str:
        if role.startswith("replica-"):
            return f"http://127.0.0.1:{self.replica_ports[int(role.split('-')[1])]}/health"
        return {
            "gateway": f"http://{self.addr('gateway')}/health",
            "exporter": f"http://{self.addr('exporter')}/healthz",
            "scaler": f"http://{self.addr('scaler-metrics')}/metrics",
        }[role]

    def write(self, server: str, config: dict[str, Any]) -> None:
        write_yaml(self.files[server], config)

    async def start(self, role: str) -> Child:
        """Start ``role`` (a fresh log per incarnation) and wait until it answers."""
        n = sum(r == role for r, _ in self.every_child)
        name = role if n == 0 else f"{role}.restart-{n}"
        # PYTHONPATH: the children run this checkout's code, like the bench itself.
        child = await self.supervisor.start(name, self.argv(role), {"PYTHONPATH": str(ROOT)})
        self.children[role] = child
        self.every_child.append((role, child))
        await self.supervisor.wait_http(child, self.health_url(role), 60)
        self._spawn(self._watch(role, child))
        return child

    async def kill(self, role: str) -> float:
        """SIGKILL ``role`` (no grace: a node failure, an OOM kill) and wait until it is gone.

        Returns when the signal was sent (clock seconds).
        """
        child = self.children[role]
        child.retiring = True  # on purpose: not a crash
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        killed = self.clock()
        await child.exited.wait()
        return killed

    async def _watch(self, role: str, child: Child) -> None:
        """A process that dies on its own is a finding; it is restarted, as a kubelet would."""
        code = await child.process.wait()
        await child.exited.wait()
        if child.retiring:
            return
        self.crashes.append(Crash(role, self.clock(), code, child.tail(8)))
        self._restarts[role] += 1
        if self._restarts[role] <= 3:  # bounded, like CrashLoopBackOff giving up for a while
            await asyncio.sleep(1.0)
            with contextlib.suppress(ComponentError):
                await self.start(role)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def stop(self) -> None:
        for child in self.children.values():
            child.retiring = True
        for task in list(self._watchers):
            task.cancel()
        await self.supervisor.stop_all(grace=10)

    def log_count(self, role: str, needle: str) -> int:
        """Lines of ``role``'s current log that contain ``needle``."""
        child = self.children[role]
        try:
            text = child.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return 0
        return sum(needle in line for line in text.splitlines())


_PORT_NAMES = (
    "gateway", "gateway-grpc", "exporter", "exporter-grpc", "scaler", "scaler-metrics",
)  # fmt: skip


# --- stage: start ---------------------------------------------------------------------------


async def start(
    cluster: Cluster, hostile: HostileTarget
) -> tuple[keda_pb.ScaledObjectRef, keda_pb.ScaledObjectRef]:
    """Every process answering and the scaler deciding; the hostile target serving.

    Returns the ScaledObjects KEDA asks about: the demo's trigger, compressed, and the
    same trigger for the deployment only the fake Prometheus knows.
    """
    for server, config in cluster.good.items():
        cluster.write(server, config)
    await asyncio.gather(*(cluster.start(f"replica-{i}") for i in cluster._replicas))
    await asyncio.gather(*(cluster.start(r) for r in ("exporter", "gateway", "scaler")))
    # The hostile bodies are a real replica's exposition, broken: past the engine check.
    real = await _fetch(cluster.health_url("replica-0").replace("/health", "/metrics"))
    await hostile.start(hostile_bodies(real))
    plan = cluster.plan
    ref = keda_pb.ScaledObjectRef(
        name=plan.scaled_object.name,
        namespace=plan.scaled_object.namespace,
        scalerMetadata=trigger_metadata(plan, cluster.addr("scaler")),
    )
    prom = keda_pb.ScaledObjectRef(
        name=PROM_DEPLOYMENT,
        namespace=plan.scaled_object.namespace,
        scalerMetadata={**ref.scalerMetadata, "deployment": PROM_DEPLOYMENT},
    )
    await until_decided(cluster.addr("scaler"), ref, 60)
    await until_decided(cluster.addr("scaler"), prom, 60)
    return ref, prom


async def _fetch(url: str) -> bytes:
    async with aiohttp.ClientSession() as session:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.read()


# --- stage: load ----------------------------------------------------------------------------


class Load:
    """An open-loop rate of small completions through the gateway, every outcome kept."""

    def __init__(
        self, url: str, rate: float, count: int, max_tokens: int, timeout: float, clock: Clock
    ) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.rate = rate
        self.count = count
        self.timeout = timeout
        self.clock = clock
        self.outcomes: list[Outcome] = []

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        # Longer than the gateway's buffer timeout: a waiting request is answered first.
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks = []
            for i in range(self.count):
                await asyncio.sleep(max(0.0, i / self.rate - self.clock()))
                tasks.append(
                    asyncio.create_task(self._send(session, streamed=i % STREAM_EVERY == 0))
                )
            await asyncio.gather(*tasks)

    async def _send(self, session: aiohttp.ClientSession, streamed: bool) -> None:
        body = {
            "model": PROFILE, "prompt": [100] * 32, "max_tokens": self.max_tokens,
            "ignore_eos": True, "stream": streamed,
        }  # fmt: skip
        outcome = Outcome(self.clock(), streamed)
        self.outcomes.append(outcome)
        try:
            async with session.post(self.url, json=body) as response:
                data = await response.read()
                outcome.kind, outcome.detail = classify(response, data, streamed)
        except TimeoutError:
            outcome.kind, outcome.detail = "lost", f"no answer within {self.timeout:g}s"
        except aiohttp.ClientError as err:
            outcome.kind, outcome.detail = "broken", f"{type(err).__name__}"
        outcome.finished = self.clock()


def classify(response: aiohttp.ClientResponse, data: bytes, streamed: bool) -> tuple[str, str]:
    """(kind, detail) of a complete HTTP answer; ``broken`` becomes killed or lost later."""
    status = response.status
    if status == 200:
        whole = False
        if streamed:
            whole = data.rstrip().endswith(b"data: [DONE]")
        else:
            with contextlib.suppress(ValueError, AttributeError):
                whole = bool(json.loads(data).get("choices"))
        return ("served", "200") if whole else ("broken", "200 with an incomplete body")
    try:
        shaped = json.loads(data).get("object") == "error"
    except (ValueError, AttributeError):
        shaped = False
    if not shaped:
        kind = response.headers.get("Content-Type", "?").split(";")[0]
        return "broken", f"{status} without the API's error shape ({kind})"
    if status not in REFUSALS:
        return "broken", f"{status} (the API's error shape)"
    if status in (429, 503) and "Retry-After" not in response.headers:
        return "broken", f"{status} without Retry-After"
    return "refused", str(status)


def blame(outcomes: list[Outcome], kills: list[float]) -> None:
    """A broken answer in flight at a replica's SIGKILL, ending just after it, died with it."""
    for o in outcomes:
        if o.kind != "broken":
            continue
        end = o.finished if o.finished is not None else float("inf")
        if any(o.sent <= k <= end <= k + KILL_BLAME for k in kills):
            o.kind = "killed"
        else:
            o.kind = "lost"


# --- stage: keda ----------------------------------------------------------------------------


class Keda:
    """GetMetrics and IsActive every second, as KEDA's operator polls an external scaler."""

    def __init__(self, address: str, ref: keda_pb.ScaledObjectRef, clock: Clock) -> None:
        self.address = address
        self.ref = ref
        self.clock = clock
        self.answers: list[Answer] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            request = keda_pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=METRIC_NAME)
            next_at = self.clock()
            while not stop.is_set():
                at = self.clock()
                value: float | str
                active: bool | str
                try:
                    reply = await stub.GetMetrics(request, timeout=2)
                    value = reply.metricValues[0].metricValueFloat
                except grpc.aio.AioRpcError as err:
                    value = err.code().name
                try:
                    active = (await stub.IsActive(self.ref, timeout=2)).result
                except grpc.aio.AioRpcError as err:
                    active = err.code().name
                self.answers.append(Answer(at, value, active))
                next_at += 1.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - self.clock()))


async def until_decided(address: str, ref: keda_pb.ScaledObjectRef, within: float) -> None:
    """Until the scaler answers GetMetrics with a number: the whole loop carries signals."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = keda_grpc.ExternalScalerStub(channel)
        request = keda_pb.GetMetricsRequest(scaledObjectRef=ref, metricName=METRIC_NAME)
        deadline = time.monotonic() + within
        while True:
            try:
                await stub.GetMetrics(request, timeout=2)
                return
            except grpc.aio.AioRpcError as err:
                if time.monotonic() > deadline:
                    raise UnitscaleError(
                        f"the scaler never answered a number: {err.details()}"
                    ) from err
            await asyncio.sleep(0.2)


# --- stage: faults --------------------------------------------------------------------------


class Faults:
    """Each fault: inject, hold a few seconds, recover, check what should have held."""

    def __init__(self, cluster: Cluster, hostile: HostileTarget, clock: Clock, hold: float) -> None:
        self.cluster = cluster
        self.hostile = hostile
        self.clock = clock
        self.hold = hold
        self.record: list[Fault] = []
        self.kills: list[float] = []
        """When a replica was SIGKILLed (for blaming the requests it was serving)."""

    def schedule(self) -> list[tuple[str, str, Callable[[Fault], Awaitable[None]]]]:
        """(kind, target, play) in the order played."""
        last = f"replica-{len(self.cluster.replica_ports) - 1}"
        bad = {
            # Wrong types for duration keys: what a typo in a ConfigMap looks like.
            "exporter": ("interval", [1]),
            "scaler": ("max-signal-age", None),
            "gateway": ("buffer-timeout", [1]),
        }
        return [
            ("replica-kill", last, self._replica_kill),
            ("exporter-kill", "exporter", self._exporter_kill),
            *(
                ("bad-config", f"{server} {key}: {value!r}", self._bad_config(server, key, value))
                for server, (key, value) in bad.items()
            ),
            *(
                ("hostile-target", kind, self._hostile(kind))
                for kind in ("invalid", "binary", "bad-le", "huge")
            ),
            ("replica-kill", "replica-0", self._replica_kill),
        ]

    async def play(self, start_at: float, slot: float) -> None:
        for i, (kind, target, play) in enumerate(self.schedule()):
            await asyncio.sleep(max(0.0, start_at + i * slot - self.clock()))
            fault = Fault(kind, target, self.clock())
            self.record.append(fault)
            print(f"[{fault.injected:6.1f}s] fault: {kind} ({target})", flush=True)
            await play(fault)
            # A server a fault left broken (alive but deaf) would poison every later fault:
            # restart it, as a liveness probe that checked the right thing would.
            for role in sorted(fault.broken):
                fault.seen.append(
                    f"{role} restarted by the bench so that the next fault starts whole"
                )
                await self.cluster.kill(role)
                await self._restart(fault, role)
            fault.recovered = self.clock()

    async def _replica_kill(self, fault: Fault) -> None:
        fault.hides = True
        self.kills.append(await self.cluster.kill(fault.target))
        await asyncio.sleep(self.hold)
        await self._restart(fault, fault.target)

    async def _exporter_kill(self, fault: Fault) -> None:
        fault.hides = True
        await self.cluster.kill("exporter")
        await asyncio.sleep(self.hold)
        await self._restart(fault, "exporter")

    async def _restart(self, fault: Fault, role: str) -> None:
        try:
            await self.cluster.start(role)
        except ComponentError as err:
            fault.seen.append(f"{role} did not come back: {str(err).splitlines()[0]}")

    def _bad_config(
        self, server: str, key: str, value: object
    ) -> Callable[[Fault], Awaitable[None]]:
        async def play(fault: Fault) -> None:
            cluster = self.cluster
            refused = cluster.log_count(server, "config update refused")
            cluster.write(server, {**cluster.good[server], key: value})
            await asyncio.sleep(self.hold)
            if cluster.children[server].exited.is_set():
                fault.seen.append(f"{server} exited on the bad value")
                fault.hides = server != "scaler"
            elif cluster.log_count(server, "config update refused") == refused:
                fault.seen.append(f"{server} logged no 'config update refused' for the bad value")
            # A good config that differs (harmlessly) from the last one: a live reload
            # logs "config reloaded"; a reload loop that died on the bad value does not.
            cluster.good[server] = _nudged(server, cluster.good[server])
            if not await self._reloaded(
                server, lambda: cluster.write(server, cluster.good[server])
            ):
                fault.seen.append(
                    f"{server} did not reload the next good config within 5 s:"
                    " its hot reload died on the bad value"
                )
                # Only the exporter's reload is needed later (the hostile targets); a
                # gateway restarted here would lose requests for the bench, not the fault.
                if server == "exporter":
                    fault.broken.add(server)
            if server == "exporter" and not await scrape_loop_alive(cluster):
                fault.seen.append("the exporter's scrape loop stopped after the bad value")
                fault.broken.add(server)
                fault.hides = True

        return play

    def _hostile(self, kind: str) -> Callable[[Fault], Awaitable[None]]:
        async def play(fault: Fault) -> None:
            cluster = self.cluster
            good = cluster.good["exporter"]
            deployment = good["deployments"][0]
            listed = {**deployment, "targets": [*deployment["targets"], self.hostile.url(kind)]}
            hostile_config = {**good, "deployments": [listed]}
            if not await self._reloaded(
                "exporter", lambda: cluster.write("exporter", hostile_config)
            ):
                fault.seen.append("the exporter did not reload the config listing the target")
            before = await exporter_cycles(cluster)
            scrapes = self.hostile.scrapes[kind]
            await asyncio.sleep(self.hold)
            after = await exporter_cycles(cluster)
            if self.hostile.scrapes[kind] == scrapes:
                fault.seen.append("the exporter never scraped the hostile target")
            if before is None or after is None or after <= before:
                fault.hides = True
            if before is None or after is None:
                fault.seen.append("the exporter's /healthz stopped answering")
            elif after <= before:
                fault.seen.append(
                    f"the exporter's scrape loop stopped: /healthz cycles {before} -> {after}"
                    f" over {self.hold:.1f} s while the target was listed"
                    " (the process and /healthz stay up)"
                )
            if not await self._reloaded("exporter", lambda: cluster.write("exporter", good)):
                fault.seen.append("the exporter did not reload the config without the target")
            if not await scrape_loop_alive(cluster):
                fault.broken.add("exporter")
                fault.hides = True

        return play

    async def _reloaded(self, server: str, write: Callable[[], None]) -> bool:
        """Whether ``server`` logs a new "config reloaded" within 5 s of ``write()``."""
        cluster = self.cluster
        before = cluster.log_count(server, "config reloaded")
        write()
        deadline = self.clock() + 5.0
        while self.clock() < deadline:
            await asyncio.sleep(CONFIG_POLL)
            if cluster.log_count(server, "config reloaded") > before:
                return True
        return False


def _nudged(server: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with one setting changed so little that nothing else changes."""
    if server == "gateway":
        return {**config, "buffer-size": config["buffer-size"] + 1}
    if server == "scaler":
        return {**config, "grace-period": round(config["grace-period"] + 0.1, 3)}
    deployment = config["deployments"][0]
    accelerator = dict(deployment["accelerator"])
    accelerator["price-per-hour"] = round(accelerator["price-per-hour"] + 0.01, 4)
    return {**config, "deployments": [{**deployment, "accelerator": accelerator}]}


# --- stage: measure -------------------------------------------------------------------------


def rss_mb(pid: int, key: str = "VmRSS") -> float | None:
    """A process's resident memory now (``VmHWM``: its peak), from /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


async def exporter_cycles(cluster: Cluster) -> int | None:
    try:
        async with aiohttp.ClientSession() as session:
            url = cluster.health_url("exporter")
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                return int((await r.json())["cycles"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
        return None


async def scrape_loop_alive(cluster: Cluster) -> bool:
    """Whether the exporter's scrape cycles advance (its /healthz answers even when not)."""
    before = await exporter_cycles(cluster)
    await asyncio.sleep(4 * cluster.plan.wall(cluster.plan.scrape_interval))
    after = await exporter_cycles(cluster)
    return before is not None and after is not None and after > before


async def healthy(cluster: Cluster, role: str) -> str:
    """ "ok", or what is wrong with ``role`` now: exited, HTTP health, gRPC health, a stuck loop."""
    child = cluster.children[role]
    if child.exited.is_set():
        return f"exited ({child.process.returncode})"
    try:
        async with aiohttp.ClientSession() as session:
            timeout = aiohttp.ClientTimeout(total=3)
            async with session.get(cluster.health_url(role), timeout=timeout) as r:
                if r.status != 200:
                    return f"HTTP health {r.status}"
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"HTTP health: {type(err).__name__}"
    grpc_port = {"gateway": "gateway-grpc", "exporter": "exporter-grpc", "scaler": "scaler"}
    if role in grpc_port:
        async with grpc.aio.insecure_channel(cluster.addr(grpc_port[role])) as channel:
            try:
                stub = health_pb2_grpc.HealthStub(channel)
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
            except grpc.aio.AioRpcError as err:
                return f"gRPC health: {err.code().name}"
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                return f"gRPC health: {name}"
    if role == "exporter" and not await scrape_loop_alive(cluster):
        return "scrape loop stuck (/healthz cycles do not advance)"
    return "ok"


def log_stats(cluster: Cluster) -> dict[str, tuple[int, float]]:
    """Role -> (log lines, largest log file in MB) over all its incarnations."""
    out: dict[str, tuple[int, float]] = {}
    for role, child in cluster.every_child:
        try:
            data = child.log.read_bytes()
        except OSError:
            data = b""
        lines, big = out.get(role, (0, 0.0))
        out[role] = (lines + data.count(b"\n"), max(big, len(data) / 1024**2))
    return out


# --- the run --------------------------------------------------------------------------------


class Clock:
    """Seconds since the load started; ``epoch`` is that moment in wall-clock time (logs)."""

    def __init__(self) -> None:
        self.zero = time.monotonic()
        self.epoch = time.time()

    def __call__(self) -> float:
        return time.monotonic() - self.zero


@dataclass(frozen=True, slots=True)
class Memory:
    """One role's resident memory in MB: after warm-up, at the end, its peak."""

    warm: float | None
    end: float | None
    peak: float | None
    restarted: bool
    """A different process at the end than after warm-up (killed or crashed between)."""

    @property
    def growth_pct(self) -> float | None:
        if self.warm is None or self.end is None or self.restarted:
            return None
        return (self.end - self.warm) / self.warm * 100


@dataclass
class Run:
    """Everything measured, for the report."""

    seconds: float
    rate: float
    max_tokens: int
    timing: Timing
    outcomes: list[Outcome]
    answers: list[Answer]
    faults: list[Fault]
    crashes: list[Crash]
    memory: dict[str, Memory]
    health: dict[str, str]
    logs: dict[str, tuple[int, float]]
    hostile_scrapes: dict[str, int]
    reasons: list[tuple[float, str]]
    """The scaler's logged decisions, in bench seconds."""
    kills: list[float]
    """When replicas were SIGKILLed, in bench seconds."""
    side: Side
    """The Prometheus source and the admission pass under hostile answers."""


@dataclass
class Side:
    """What runs beside the processes' faults: hostile Prometheus answers, hostile nodes."""

    prometheus: HostilePrometheus
    keda: Keda | None = None
    """KEDA's polls of the Prometheus deployment's ScaledObject."""
    admission: AdmissionSoak = field(default_factory=AdmissionSoak)
    prom_faults: list[Fault] = field(default_factory=list)
    admission_alive: bool = False
    """Whether the admission loop was still passing when the load ended."""
    admission_end: str = "never started"
    scaler_counts: dict[str, int] = field(default_factory=dict)
    """The scaler's own counters of what it refused (``/metrics``), at the end."""

    @property
    def prom_answers(self) -> list[Answer]:
        return self.keda.answers if self.keda is not None else []

    @property
    def prom_hostile(self) -> Counter[str]:
        return self.prometheus.hostile

    @property
    def prom_queries(self) -> int:
        return self.prometheus.queries


@dataclass(frozen=True, slots=True)
class Timing:
    """The run's clock: warm-up, then one slot per fault, then a calm tail."""

    warmup: float
    slot: float
    hold: float
    """How long each fault lasts before its recovery starts."""
    catch_up: float
    """After a recovery, until signals can be whole again: a scrape and a watch reconnect."""
    settle: float
    """How long after its recovery a fault's window still runs (signals filling again)."""

    @classmethod
    def of(cls, seconds: float, faults: int, plan: Plan) -> Timing:
        # Warm: the scaler's answer settled, the start's peak out of its scale-down
        # window (a drop after that would be the faults').
        p = plan.policy
        settled = plan.wall(p.scale_down_window)
        warmup, tail = min(max(20.0, 2 * settled), 0.3 * seconds), min(10.0, 0.06 * seconds)
        slot = (seconds - warmup - tail) / faults
        hold = min(5.0, slot / 3)
        # Two signal ages: the newest signals then come from after the recovery.
        catch_up = plan.wall(plan.scrape_interval) + RECONNECT_MAX
        settle = max(catch_up, min(slot - hold, 2 * plan.wall(plan.max_signal_age) + 1.0))
        return cls(warmup, slot, hold, catch_up, settle)


async def soak(args: argparse.Namespace, workdir: Path) -> Run:
    """The stages in order: start, load + keda + faults, measure. Processes always stopped."""
    plan = _plan(args.compression, args.target_concurrency)
    cluster = Cluster(plan, args.replicas, workdir)
    hostile = HostileTarget()
    side = Side(HostilePrometheus())
    try:
        print(f"soak: starting {len(cluster.roles)} processes; logs in {workdir}/logs", flush=True)
        await side.prometheus.start()
        cluster.good["scaler"]["prometheus-source"] = prometheus_source(plan, side.prometheus.url)
        ref, prom_ref = await start(cluster, hostile)
        clock = cluster.clock = Clock()
        faults = Faults(cluster, hostile, clock, hold=0.0)
        timing = Timing.of(args.seconds, len(faults.schedule()), plan)
        faults.hold = timing.hold
        # Longer than the gateway's buffer timeout: a waiting request is answered first.
        timeout = plan.wall(plan.buffer_timeout) + 10.0
        url = f"http://{cluster.addr('gateway')}/v1/completions"
        load = Load(url, args.rate, int(args.rate * args.seconds), args.max_tokens, timeout, clock)
        keda = Keda(cluster.addr("scaler"), ref, clock)
        side.keda = Keda(cluster.addr("scaler"), prom_ref, clock)
        warm = await play(cluster, load, keda, faults, timing, side)
        memory, health = await measure(cluster, warm)
        side.scaler_counts = await scaler_counters(cluster)
        blame(load.outcomes, faults.kills)
        return Run(
            args.seconds, args.rate, args.max_tokens, timing, load.outcomes, keda.answers,
            faults.record, cluster.crashes, memory, health, log_stats(cluster),
            dict(hostile.scrapes), scaler_reasons(cluster, clock.epoch), faults.kills, side,
        )  # fmt: skip
    finally:
        await cluster.stop()
        await hostile.stop()
        await side.prometheus.stop()


def prometheus_source(plan: Plan, url: str) -> dict[str, Any]:
    """The scaler's ``prometheus-source``, asking the fake Prometheus in the demo's windows."""
    c = plan.compression
    return {
        "url": url,
        "interval": PROM_INTERVAL,
        "timeout": 0.8 * PROM_INTERVAL,
        "panic-window": plan.panic_window / c,
        "stable-window": plan.stable_window / c,
    }


async def scaler_counters(cluster: Cluster) -> dict[str, int]:
    """What the scaler counted as refused from its sources, by family and labels."""
    families = (
        "unitscale_scaler_source_errors_total",
        "unitscale_scaler_signals_refused_total",
        "unitscale_scaler_signals_unmeasured_total",
    )
    try:
        text = (await _fetch(cluster.health_url("scaler"))).decode()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(families) and float(value) > 0:
            short = name.removeprefix("unitscale_scaler_").replace("_total", "")
            out[short] = int(float(value))
    return out


async def play(
    cluster: Cluster, load: Load, keda: Keda, faults: Faults, timing: Timing, side: Side
) -> dict[str, tuple[int, float | None]]:
    """Load and KEDA throughout; faults after the warm-up, the Prometheus answers and the
    admission nodes turning hostile beside them. Returns role -> (pid, RSS) warm."""
    stop = asyncio.Event()
    loading = asyncio.create_task(load.run())
    polling = asyncio.create_task(keda.run(stop))
    assert side.keda is not None
    prom_polling = asyncio.create_task(side.keda.run(stop))
    span = timing.slot * len(faults.schedule())
    admitting = asyncio.create_task(
        run_admission(
            side.admission, load.clock, timing.warmup, span / len(ADMISSION_KINDS), timing.hold,
            stop,
        )
    )  # fmt: skip
    prom_playing = asyncio.create_task(
        play_prometheus(side, load.clock, timing.warmup, span / len(PROM_KINDS), timing.hold)
    )
    try:
        await asyncio.sleep(timing.warmup)
        warm = {r: (c.pid, rss_mb(c.pid)) for r, c in cluster.children.items()}
        print(
            f"[{load.clock():6.1f}s] warm; a fault every {timing.slot:.1f} s,"
            f" each held {timing.hold:.1f} s",
            flush=True,
        )
        await faults.play(timing.warmup, timing.slot)
        await loading
        await prom_playing
        print(f"[{load.clock():6.1f}s] load done; measuring", flush=True)
    finally:
        side.admission_alive = not admitting.done()
        stop.set()
        loading.cancel()
        prom_playing.cancel()
        await polling
        await prom_polling
        try:
            await admitting
            side.admission_end = "ended when asked"
        except Exception as err:  # the loop died: the report says how
            side.admission_end = f"died: {type(err).__name__}: {err}"
    return warm


async def play_prometheus(
    side: Side, clock: Clock, start_at: float, slot: float, hold: float
) -> None:
    """Each hostile answer for ``hold`` s, half a slot in: apart from the process faults."""
    for i, kind in enumerate(PROM_KINDS):
        await asyncio.sleep(max(0.0, start_at + (i + 0.5) * slot - clock()))
        fault = Fault("prometheus", kind, clock(), hides=True)
        side.prom_faults.append(fault)
        print(f"[{fault.injected:6.1f}s] prometheus answers: {kind}", flush=True)
        side.prometheus.kind = kind
        try:
            await asyncio.sleep(hold)
        finally:
            side.prometheus.kind = None
        fault.recovered = clock()


async def measure(
    cluster: Cluster, warm: dict[str, tuple[int, float | None]]
) -> tuple[dict[str, Memory], dict[str, str]]:
    """Each role's memory (warm, now, peak) and health, now that the load is over."""
    memory = {}
    for role, child in cluster.children.items():
        pid, rss = warm[role]
        memory[role] = Memory(rss, rss_mb(child.pid), rss_mb(child.pid, "VmHWM"), child.pid != pid)
    checks = await asyncio.gather(*(healthy(cluster, role) for role in cluster.roles))
    return memory, dict(zip(cluster.roles, checks, strict=True))


def _plan(compression: float, target_concurrency: float) -> Plan:
    """The demo's world at ``compression``, with a bench-sized fleet."""
    profile = PROFILES[PROFILE]
    plan = make_plan(
        compression,
        profile,
        ROOT / "deploy" / "scaledobjects" / "recommended.yaml",
        capacity_priors(profile),
        max_replicas=8,
        target_concurrency=target_concurrency,
        # The loop without sleepers, as it was measured: the gateway here sleeps nothing.
        standby=False,
    )
    # A scale-down that reacts within a fault's window (production's 5 min window would
    # hold any answer for 30 s of wall time and hide a wrong drop).
    policy = plan.policy.model_copy(update={"scale_down_window": 90.0})
    # A short buffer timeout: a request waiting through a fault is answered within the run.
    return replace(plan, policy=policy, buffer_timeout=60.0)


# --- stage: report --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tally:
    """The scaler's answers in one window, against the numeric answer before each."""

    unavailable: int = 0
    other_codes: int = 0
    held: int = 0
    raised: int = 0
    lowered: int = 0
    inactive: int = 0

    def plus(self, **counts: int) -> Tally:
        return replace(self, **{k: getattr(self, k) + v for k, v in counts.items()})

    @property
    def wrong(self) -> int:
        """Decisions taken on missing data: a lower answer, or inactive with traffic flowing."""
        return self.lowered + self.inactive

    def __str__(self) -> str:
        parts = [f"{self.unavailable} UNAVAILABLE", f"{self.held} held", f"{self.raised} raised"]
        if self.other_codes:
            parts.append(f"{self.other_codes} other codes")
        parts += [f"**{self.lowered} lowered**", f"**{self.inactive} inactive**"]
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One KEDA poll judged against the numeric answer before it."""

    answer: Answer
    window: str
    previous: float | None
    counts: dict[str, int]


def judge(
    answers: list[Answer], windows: dict[str, list[tuple[float, float]]], after: float
) -> list[Verdict]:
    """Every answer after ``after`` (the warm-up) in the first window that holds it."""
    out = []
    previous: float | None = None
    for a in answers:
        name = next(
            (n for n, spans in windows.items() if any(s <= a.at <= e for s, e in spans)), None
        )
        if a.at >= after and name is not None:
            counts: dict[str, int] = {}
            if isinstance(a.value, str):
                counts["unavailable" if a.value == "UNAVAILABLE" else "other_codes"] = 1
            elif previous is not None and a.value < previous:
                counts["lowered"] = 1
            elif previous is not None and a.value > previous:
                counts["raised"] = 1
            else:
                counts["held"] = 1
            if a.active is False:
                counts["inactive"] = 1
            out.append(Verdict(a, name, previous, counts))
        if not isinstance(a.value, str):
            previous = a.value
    return out


def tally(verdicts: list[Verdict], names: list[str]) -> dict[str, Tally]:
    out = {name: Tally() for name in names}
    for v in verdicts:
        out[v.window] = out[v.window].plus(**v.counts)
    return out


def scaler_reasons(cluster: Cluster, epoch: float) -> list[tuple[float, str]]:
    """(bench seconds, the scaler's "desired replicas N (why)") from all its logs."""
    out = []
    for role, child in cluster.every_child:
        if role != "scaler":
            continue
        with contextlib.suppress(OSError):
            for line in child.log.read_text(encoding="utf-8", errors="replace").splitlines():
                stamp, _, rest = line.partition(" INFO scaler.registry: ")
                if "desired replicas" not in rest:
                    continue
                with contextlib.suppress(ValueError):
                    at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    out.append((at - epoch, rest.split(": ", 1)[1]))
    return sorted(out)


def report(run: Run, record: bool) -> dict[str, Any]:
    """The table (appended to bench/RESULTS.md) and the JSON line's numbers."""
    kinds = Counter(o.kind for o in run.outcomes)
    lost_details = Counter(o.detail for o in run.outcomes if o.kind == "lost")
    killed_details = Counter(o.detail for o in run.outcomes if o.kind == "killed")
    refusals = Counter(o.detail for o in run.outcomes if o.kind == "refused")
    end = run.seconds + 60.0
    main = judged(run.faults, run.answers, run.timing, run.timing.catch_up, end)
    verdicts, tallies, hiding, during = main.verdicts, main.tallies, main.hiding, main.during
    wrong_by_kind = main.wrong_by_kind
    wrong = sum(wrong_by_kind.values())

    rows = [
        ("requests lost", f"{kinds['lost']} of {len(run.outcomes)}", "0", kinds["lost"] == 0),
        ("requests served", f"{kinds['served']}", "", None),
        ("refused explicitly (API error shape)", _counts(refusals) or "0", "", None),
        ("failed with their SIGKILLed replica", f"{kinds['killed']}", "counted apart", None),
        ("decisions taken on missing data", f"{wrong}", "0", wrong == 0),
    ]
    for name, t in tallies.items():
        if name in hiding:
            ok = wrong_by_kind[name] == 0
            rows.append((f"scaler answers during {name}", str(t), "UNAVAILABLE or held", ok))
        elif name in during:
            rows.append((f"scaler answers during {name}", str(t), "(hid no signal)", None))
        else:
            rows.append((f"scaler answers, {name}", str(t), "(context)", None))
    for role, m in run.memory.items():
        if m.warm is None or m.end is None:
            rows.append((f"RSS {role}", "unreadable", f"<= +{RSS_GOAL_PCT:g} %", False))
            continue
        text = f"{m.warm:.1f} -> {m.end:.1f} MB ({m.end - m.warm:+.1f} MB"
        if m.growth_pct is None:
            text += f"), peak {m.peak:.0f} MB; restarted in between"
            rows.append((f"RSS {role}", text, "n/a", None))
        else:
            text += f", {m.growth_pct:+.1f} %), peak {m.peak:.0f} MB"
            ok = m.growth_pct <= RSS_GOAL_PCT
            rows.append((f"RSS {role}", text, f"<= +{RSS_GOAL_PCT:g} %", ok))
    growths = [g for m in run.memory.values() if (g := m.growth_pct) is not None]
    sick = {r: h for r, h in run.health.items() if h != "ok"}
    rows.append((
        "alive and healthy at the end", f"{len(run.health) - len(sick)} of {len(run.health)}",
        "all", not sick,
    ))  # fmt: skip
    rows.append(("unexpected exits", f"{len(run.crashes)}", "0", not run.crashes))
    side_rows, side_numbers = side_report(run, end)
    rows += side_rows
    misbehaved = [f for f in run.faults if f.seen]
    rows.append(
        ("faults that misbehaved", f"{len(misbehaved)} of {len(run.faults)}", "0", not misbehaved)
    )
    lines = ", ".join(f"{r} {n:,}" for r, (n, _) in run.logs.items())
    biggest_role, (_, biggest) = max(run.logs.items(), key=lambda kv: kv[1][1])
    rows.append(("log lines", lines, "", None))
    rows.append(
        (
            "largest log file",
            f"{biggest:.2f} MB ({biggest_role})",
            f"<= {BIG_LOG_MB:g} MB",
            biggest <= BIG_LOG_MB,
        )
    )

    table = "\n".join(
        ["| metric | value | goal | |", "|---|---|---|---|"]
        + [
            f"| {m} | {v} | {g} | {'' if ok is None else 'met' if ok else '**missed**'} |"
            for m, v, g, ok in rows
        ]
    )
    notes = _notes(run, lost_details, killed_details, sick, verdicts)
    notes += "\n\n" + _side_notes(run, end)
    print(table)
    print(notes)
    if record:
        append("Soak: the whole loop under load with faults (bench/soak.py)", table, notes)
    return {
        "requests": len(run.outcomes),
        "served": kinds["served"],
        "refused": kinds["refused"],
        "killed_with_replica": kinds["killed"],
        "lost": kinds["lost"],
        "missing_data_decisions": wrong,
        "calm_lowered_or_inactive": tallies["calm"].wrong,
        "unavailable_answers": sum(t.unavailable for t in tallies.values()),
        "max_rss_growth_pct": round(max(growths, default=0.0), 1),
        "healthy_at_end": not sick,
        "unexpected_exits": len(run.crashes),
        "faults_misbehaved": len(misbehaved),
        "largest_log_mb": round(biggest, 3),
        **side_numbers,
    }


@dataclass(frozen=True, slots=True)
class Judged:
    """One KEDA stream's answers judged against the faults that touched it."""

    verdicts: list[Verdict]
    tallies: dict[str, Tally]
    during: dict[str, list[tuple[float, float]]]
    hiding: dict[str, list[tuple[float, float]]]
    """Windows of faults that hid (or spoiled) the signals: a lower answer is wrong there."""
    wrong_by_kind: Counter[str]


def judged(
    faults: list[Fault],
    answers: list[Answer],
    timing: Timing,
    catch_up: float,
    end: float,
    name: Callable[[Fault], str] = lambda f: f.kind,
) -> Judged:
    """``answers`` in each fault's window, after recovery, and in the calm between.

    During a fault: from its injection until the signals can be whole again (``catch_up``
    after the recovery: a scrape and a watch reconnect, or a query round). After: until
    it has settled. A decision on missing data: lower or inactive while a fault hid
    signals.
    """
    during: dict[str, list[tuple[float, float]]] = {}
    hiding: dict[str, list[tuple[float, float]]] = {}
    after: list[tuple[float, float]] = []
    for f in faults:
        recovered = f.recovered if f.recovered is not None else end
        span = (f.injected, recovered + catch_up)
        during.setdefault(name(f), []).append(span)
        if f.hides:
            hiding.setdefault(name(f), []).append(span)
        after.append((span[1], max(span[1], recovered + timing.settle)))
    faulty = [span for spans in during.values() for span in spans] + after
    windows = {**during, "after recovery": after, "calm": _gaps(faulty, timing.warmup, end)}
    verdicts = judge(answers, windows, timing.warmup)
    wrong_by_kind = Counter(
        v.window
        for v in verdicts
        if ({"lowered", "inactive"} & set(v.counts))
        and any(s <= v.answer.at <= e for s, e in hiding.get(v.window, []))
    )
    return Judged(verdicts, tally(verdicts, list(windows)), during, hiding, wrong_by_kind)


def side_report(run: Run, end: float) -> tuple[list[Row], dict[str, Any]]:
    """Rows and numbers of the Prometheus source and the admission pass under hostility."""
    side = run.side
    prom = judged(
        side.prom_faults, side.prom_answers, run.timing, PROM_CATCH_UP, end,
        name=lambda f: f"{f.kind} {f.target}",
    )  # fmt: skip
    hostile = [t for name, t in prom.tallies.items() if name in prom.hiding]
    during = Tally(**{f.name: sum(getattr(t, f.name) for t in hostile) for f in fields(Tally)})
    prom_wrong = sum(prom.wrong_by_kind.values())
    last = max((f.recovered or end for f in side.prom_faults), default=run.timing.warmup)
    numbers = [a for a in side.prom_answers if a.at > last + PROM_CATCH_UP]
    prom_alive = bool(numbers) and all(isinstance(a.value, float) for a in numbers)
    served = sum(side.prom_hostile.values())
    counted = _counts(Counter(side.scaler_counts)) or "none"
    adm = side.admission
    adm_wrong = len(adm.wrong)
    raised = sum(adm.raised.values())
    seen, named = sum(adm.hostile_seen.values()), sum(adm.hostile_counted.values())
    rows: list[Row] = [
        ("Prometheus source: decisions on impossible data", f"{prom_wrong}", "0",
         prom_wrong == 0),
        ("Prometheus source: answers while hostile", str(during), "UNAVAILABLE or held",
         prom_wrong == 0),
        ("Prometheus source: answers, calm", str(prom.tallies["calm"]), "(context)", None),
        ("Prometheus source alive at the end", "yes" if prom_alive else
         f"no ({len(numbers)} answers after the last hostile one, not all numbers)",
         "numbers again after the last hostile answer", prom_alive),
        ("hostile Prometheus answers served / counted by the scaler",
         f"{served} ({_counts(side.prom_hostile)}) / {counted}", "", None),
        ("admission passes (loop alive at the end)",
         f"{adm.passes} ({'alive' if side.admission_alive else side.admission_end})",
         "alive", side.admission_alive),
        ("admission decisions on missing or impossible data", f"{adm_wrong}", "0",
         adm_wrong == 0),
        ("admission passes that raised", f"{raised}", "0", raised == 0),
        ("hostile annotations named by the controller's check (passes)", f"{named} of {seen}",
         "all", named == seen),
        ("admission resyncs: answers differing from the kept state's",
         f"{adm.resync_differences:g} over {adm.resyncs} resyncs", "0",
         adm.resync_differences == 0 and adm.resyncs > 0),
    ]  # fmt: skip
    return rows, {
        "prometheus_impossible_data_decisions": prom_wrong,
        "prometheus_source_alive": prom_alive,
        "prometheus_hostile_answers": served,
        "admission_passes": adm.passes,
        "admission_alive": side.admission_alive,
        "admission_impossible_data_decisions": adm_wrong,
        "admission_passes_raised": raised,
        "admission_resyncs": adm.resyncs,
        "admission_resync_differences": adm.resync_differences,
    }


def _side_notes(run: Run, end: float) -> str:
    side = run.side
    adm = side.admission
    prom = judged(
        side.prom_faults, side.prom_answers, run.timing, PROM_CATCH_UP, end,
        name=lambda f: f"{f.kind} {f.target}",
    )  # fmt: skip
    out = [
        f"The Prometheus source: {PROM_DEPLOYMENT}'s ScaledObject (the same trigger) polled"
        f" like the other; its signals only from the fake Prometheus (every {PROM_INTERVAL:g}"
        f" s, {side.prom_queries} queries in all), each hostile answer held"
        f" {run.timing.hold:.1f} s and judged until {PROM_CATCH_UP:g} s after it ended."
        " Per hostile answer: "
        + "; ".join(f"{name}: {t}" for name, t in prom.tallies.items() if name in prom.hiding)
        + ".",
        f"The admission controller: {adm.passes} passes, each of 4 new one-pod 4-card gangs"
        " (the last pass's gone) over 4 nodes of 8 cards, 4 held by a serving pod on each,"
        " told by watch events, a scrape before each pass; while hostile,"
        f" {adm.ready_while_hostile} Ready (at most 3 a pass, never on the hostile node),"
        f" {adm.failed_decisions} units failed alone; {adm.resyncs} resyncs. Hostile passes"
        " by kind: " + _counts(adm.hostile_seen) + ".",
    ]
    out += [f"Admission decision on missing data: {w}" for w in adm.wrong[:10]]
    if adm.raised:
        out.append(f"Admission passes that raised: {_counts(adm.raised)}.")
    for v in prom.verdicts:
        if v.window == "calm" or not ({"lowered", "inactive"} & set(v.counts)):
            continue
        out.append(
            f"At {v.answer.at:.1f} s ({v.window}) {PROM_DEPLOYMENT}'s GetMetrics"
            f" {_g(v.previous)} -> {_g(v.answer.value)}, IsActive {v.answer.active}."
        )
    return "\n\n".join(out)


def _notes(
    run: Run,
    lost: Counter[str],
    killed: Counter[str],
    sick: dict[str, str],
    verdicts: list[Verdict],
) -> str:
    out = [
        f"{len(run.outcomes)} completions at {run.rate:g}/s (32-token prompts,"
        f" {run.max_tokens} tokens, every {STREAM_EVERY}th streamed) over {run.seconds:g} s;"
        f" {len(run.faults)} faults after"
        f" {run.timing.warmup:g} s of warm-up, each judged (its scaler answers) from its"
        f" injection until {run.timing.settle:.1f} s after its recovery. All processes and"
        " this load generator share the machine's cores. A decision on missing data: a"
        " GetMetrics answer lower than the one before, or IsActive false, while a fault hid"
        " signals (a replica or the exporter down, the exporter's scrape loop stopped); every"
        " other change of the answer outside the calm is listed below, with the scaler's reason.",
    ]
    if lost:
        out.append(f"Lost: {_counts(lost)}.")
        for o in [o for o in run.outcomes if o.kind == "lost"][:10]:
            kill = min(run.kills, key=lambda k: abs(k - o.sent), default=None)
            near = "" if kill is None else f" ({o.sent - kill:+.3f} s from a replica's SIGKILL)"
            out.append(
                f"Lost request sent at {o.sent:.3f} s{near}, answered at {_g(o.finished)} s:"
                f" {o.detail}."
            )
    if killed:
        out.append(f"Failed with their replica: {_counts(killed)}.")
    out.extend(
        f"Fault {f.kind} ({f.target}) at {f.injected:.0f} s: {what}."
        for f in run.faults
        for what in f.seen
    )
    # Every change of the scaler's answer outside the calm, with the scaler's own reason.
    for v in verdicts:
        if v.window == "calm" or not ({"lowered", "raised", "inactive"} & set(v.counts)):
            continue
        why = next((r for at, r in reversed(run.reasons) if at <= v.answer.at + 0.05), "?")
        out.append(
            f"At {v.answer.at:.1f} s ({v.window}) GetMetrics {_g(v.previous)} ->"
            f" {_g(v.answer.value)},"
            f" IsActive {v.answer.active}; the scaler's last reason: `{why}`."
        )
    for c in run.crashes:
        last = c.tail.splitlines()[-1] if c.tail else ""
        out.append(f"{c.role} exited on its own at {c.at:.0f} s (status {c.code}): {last}")
    for role, what in sick.items():
        out.append(f"At the end {role}: {what}.")
    out.append("Hostile target scrapes: " + _counts(Counter(run.hostile_scrapes)) + ".")
    return "\n\n".join(out)


Row = tuple[str, str, str, bool | None]


def _g(value: float | str | None) -> str:
    return value if isinstance(value, str) else "none" if value is None else f"{value:g}"


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in counter.most_common())


def _gaps(spans: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of [start, end] that no span covers."""
    out, at = [], start
    for s, e in sorted(spans):
        if s > at:
            out.append((at, s))
        at = max(at, e)
    if at < end:
        out.append((at, end))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="wall seconds of load")
    parser.add_argument("--rate", type=float, default=25.0, help="completions per second")
    parser.add_argument("--replicas", type=int, default=3, choices=(2, 3))
    parser.add_argument(
        "--compression", type=float, default=10.0, help="the demo's time compression"
    )
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens per completion")
    parser.add_argument("--target-concurrency", type=float, default=16.0)
    parser.add_argument(
        "--logs", type=Path, help="keep configs and logs here (default: a temp dir)"
    )
    parser.add_argument("--no-record", dest="record", action="store_false")
    args = parser.parse_args()
    if args.seconds < 30:
        parser.error("--seconds: at least 30 (warm-up, ten faults, a tail)")
    with contextlib.ExitStack() as stack:
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            workdir = args.logs.resolve()
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        try:
            run = asyncio.run(soak(args, workdir))
        except (UnitscaleError, OSError) as err:
            print(f"soak: could not run: {err}", file=sys.stderr)
            return 2
        print(json.dumps(report(run, args.record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
