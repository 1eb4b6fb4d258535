"""Admission check throughput and latency: 1,000 pending Workloads on a real API server.

A fresh control plane with Kueue (the k8s test binaries, ``make k8s-bins``), our CRD, and
``unitscale admission`` as its own process with the real ``admission.decide.decide_all``.
Three pools of HAMi-annotated Nodes (8 H200 each, cards for about 9 Jobs in 10), each
with its CapacityCheckParameters, AdmissionCheck, ResourceFlavor, ClusterQueue and
LocalQueue, and ``--workloads`` Jobs: 8 in 10 ask one whole GPU, 1 in 10 a 20,000 MiB
share of one, 1 in 10 is a gang of 2 pods x 4 GPUs (``gpu_job``, on
``bench.admission_burst.job``).

1. **Backlog**: the Jobs wait on the first check with quota reserved while the controller
   is down (its check kept Active, as it stays while a controller restarts); then the
   controller starts. Throughput: Workloads decided per second from the moment every
   watch has listed to the last decision.
2. **Stream, pods placed**: with the controller running, Jobs arrive at ``--rate`` per
   second; a stand-in for HAMi's scheduler (``Placer``) creates each admitted Job's pods
   with HAMi's allocation annotations (the backlog's too, before this phase starts).
   Latency of each: from the watch showing its check Pending with quota reserved
   (actionable) to the watch showing our Ready, Retry or Rejected.
3. **Stream, no pods**: the same without the stand-in. There is no kubelet, so every
   Ready gang stays unplaced and is fitted again against its pool on every later pass
   (for ``decide.HOLD_SECONDS`` after its admission): the worst case for
   ``decide._pool_inventory``.

Times are taken by a watch of this process on every Workload (the controller's CPU is in
another process). ``--profile FILE`` runs the controller under cProfile.

``--real-pool``: the pool this product is for instead (issue 28): one pool of 1,250 Nodes
(10,000 cards) guarded by three checks, a backlog of 5,000, then 500 Jobs at ``--rate``
and 500 at ``--burst-rate`` (200/s), every admitted Job's pods placed; it also reports
the controller's CPU per decision and its peak RSS (``run_pool``).

    python bench/admission.py [--workloads 1000] [--nodes 180] [--rate 50] [--kueue-qps 500]
                              [--no-record] [--profile FILE]
    python bench/admission.py --real-pool [--nodes 1250] [--workloads 5000] [--stream 500]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import secrets
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from admission import annotations as names
from admission.config import AdmissionConfig
from admission.hami import parse_quantity
from admission.parameters import active_condition
from admission.workload import actionable, check_entries, format_time
from bench.admission_burst import job, phases
from bench.results import append
from tests.k8s import versions
from tests.k8s.control_plane import ControlPlane, Kueue, binaries, module_dir

ROOT = Path(__file__).resolve().parent.parent
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
V1BETA2 = "kueue.x-k8s.io/v1beta2"
CONTROLLER = "bench.unitscale.io/capacity"
H200_MIB = 143771
DECIDED = ("Ready", "Retry", "Rejected")
POOL_LABEL = "bench.unitscale.io/pool"
BACKLOG_GOAL = 200.0
"""Issue 28: a backlog of 1,000 decided at 200 a second or more."""
STREAM_GOAL_S = 1.0
"""Issue 28: at 50 Jobs a second, each check's latency p99 within a second."""
POOL_BACKLOG_GOAL = 100.0
"""Issue 28, on the 10,000-card pool: a backlog of 5,000 at 100 a second or more."""
POOL_STREAM_GOAL_S = 2.0
"""Issue 28, on the 10,000-card pool at 50 Jobs a second: p99 within 2 s."""
POOL_RSS_GOAL_MB = 500.0
"""Issue 28, on the 10,000-card pool: the controller's peak RSS."""
LIMIT = 600.0
"""Seconds any one wait may take before the run gives up (and says how far it got)."""
DIED: list[str] = []
"""What ended while the run waits on it (a task, the controller): every wait gives up."""


# --- the cluster ------------------------------------------------------------------------


def hami_node(name: str, pool: str, cards: int = 8) -> dict[str, Any]:
    """A Node as HAMi's device plugin leaves it: the JSON register, a fresh handshake."""
    register = [
        {
            "id": f"GPU-{name}-{i}",
            "index": i,
            "count": 10,
            "devmem": H200_MIB,
            "devcore": 100,
            "type": "NVIDIA-NVIDIA H200",
            "mode": "hami-core",
            "health": True,
        }
        for i in range(cards)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {POOL_LABEL: pool, names.HOSTNAME: name},
            "annotations": {
                names.HAMI_NODE_REGISTER: json.dumps(register),
                names.HAMI_NODE_HANDSHAKE: "Reported 2026-01-01 00:00:00",
            },
        },
    }


def gpu_job(i: int) -> dict[str, Any]:
    """``bench.admission_burst.job`` asking GPUs: 1 whole, a 20,000 MiB share, or 2 x 4."""
    body = job(i)
    container = body["spec"]["template"]["spec"]["containers"][0]
    gpus: dict[str, str] = {names.GPU: "1"}
    if i % 10 == 8:
        gpus[names.GPU_MEMORY] = "20000"
    elif i % 10 == 9:
        gpus[names.GPU] = "4"
        body["spec"] |= {"parallelism": 2, "completions": 2}
    container["resources"] = {"requests": {"cpu": "1", "memory": "1Gi", **gpus}, "limits": gpus}
    return body


@dataclass(frozen=True)
class Pool:
    """One check's objects; ``check`` is also the namespace, flavor and queues' name.

    ``nodes`` names the pool of Nodes the check guards (the check's own by default; the
    real-size run has three checks guard one pool).
    """

    check: str
    nodes: str = ""

    @property
    def label(self) -> str:
        return self.nodes or self.check

    def create(self, plane: ControlPlane, nodes: int, workloads: int) -> None:
        """The check's objects, and ``nodes`` Nodes labelled its pool (0: another's)."""
        plane.create_namespace(self.check)
        plane.ensure(
            "/apis/unitscale.io/v1alpha1/capacitycheckparameters",
            {
                "apiVersion": "unitscale.io/v1alpha1",
                "kind": "CapacityCheckParameters",
                "metadata": {"name": self.check},
                # A Retry comes back after an hour: each Workload is decided once here.
                "spec": {
                    "poolNodeSelector": {POOL_LABEL: self.label},
                    "retryAfterSeconds": 3600,
                },
            },
        )
        plane.ensure(
            f"{KUEUE}/admissionchecks",
            {
                "apiVersion": V1BETA2,
                "kind": "AdmissionCheck",
                "metadata": {"name": self.check},
                "spec": {
                    "controllerName": CONTROLLER,
                    "parameters": {
                        "apiGroup": "unitscale.io",
                        "kind": "CapacityCheckParameters",
                        "name": self.check,
                    },
                },
            },
        )
        self._queues(plane, workloads)
        with ThreadPoolExecutor(4) as threads:
            list(
                threads.map(
                    lambda n: plane.ensure(
                        "/api/v1/nodes", hami_node(f"{self.label}-{n}", self.label)
                    ),
                    range(nodes),
                )
            )

    def _queues(self, plane: ControlPlane, workloads: int) -> None:
        # Quota for every Job at once: the check, not Kueue, says which fit.
        quota = {
            "cpu": str(2 * workloads),
            "memory": f"{2 * workloads}Gi",
            names.GPU: str(8 * workloads),
            names.GPU_MEMORY: str(20000 * workloads),
        }
        plane.ensure(
            f"{KUEUE}/resourceflavors",
            {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": self.check}},
        )
        group = {
            "coveredResources": list(quota),
            "flavors": [
                {
                    "name": self.check,
                    "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()],
                }
            ],
        }
        plane.ensure(
            f"{KUEUE}/clusterqueues",
            {
                "apiVersion": V1BETA2,
                "kind": "ClusterQueue",
                "metadata": {"name": self.check},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [group],
                    "admissionChecksStrategy": {"admissionChecks": [{"name": self.check}]},
                },
            },
        )
        plane.ensure(
            f"{KUEUE}/namespaces/{self.check}/localqueues",
            {
                "apiVersion": V1BETA2,
                "kind": "LocalQueue",
                "metadata": {"name": "team"},
                "spec": {"clusterQueue": self.check},
            },
        )

    def keep_active(self, plane: ControlPlane) -> None:
        """Set Active=True as our controller does, so Kueue reserves while it is down."""
        path = f"{KUEUE}/admissionchecks/{self.check}"
        check = plane.request("GET", path)
        condition = active_condition(check, None, format_time(time.time()))
        if condition is not None:
            check["status"] = {"conditions": [condition]}
            plane.request("PUT", f"{path}/status", check)


# --- a stand-in for HAMi's scheduler and the kubelet ------------------------------------


@dataclass
class Card:
    uuid: str
    slots: int = 10
    memory: int = H200_MIB
    exclusive: bool = False

    @property
    def untouched(self) -> bool:
        return self.slots == 10 and not self.exclusive


@dataclass
class Placer:
    """Creates the pods of each admitted Job on cards it picks (first fit), as HAMi would.

    The pods carry HAMi's allocation annotations and ``spec.nodeName``, owned by the Job,
    and stay Pending (no kubelet): enough for the check to count their cards as held and
    the gang as placed.
    """

    plane: ControlPlane
    namespaces: frozenset[str]
    """Those of the checks guarding the pool (a check's Jobs live in its namespace)."""
    cards: dict[str, list[Card]]
    """Node name -> its cards."""
    placed: set[str] = field(default_factory=set)
    unplaced: int = 0
    """Admitted gangs the stand-in found no cards for (left unplaced)."""
    failed: int = 0
    """Pods the API server refused."""
    in_flight: int = 0
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    @classmethod
    def of(cls, plane: ControlPlane, checks: list[Pool], nodes: int) -> Placer:
        """The stand-in for the Nodes of ``checks[0]``'s pool, placing every check's Jobs."""
        names_ = [f"{checks[0].label}-{n}" for n in range(nodes)]
        return cls(
            plane,
            frozenset(c.check for c in checks),
            {n: [Card(f"GPU-{n}-{i}") for i in range(8)] for n in names_},
        )

    def offer(self, workload: dict[str, Any]) -> None:
        """Place the pods of ``workload`` once it is admitted (a Workload of the pool)."""
        if workload["metadata"]["namespace"] not in self.namespaces:
            return
        key = f"{workload['metadata']['namespace']}/{workload['metadata']['name']}"
        admitted = any(
            c["type"] == "Admitted" and c["status"] == "True"
            for c in (workload.get("status") or {}).get("conditions") or []
        )
        if admitted and key not in self.placed:
            self.placed.add(key)
            self.queue.put_nowait(workload)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(4) as threads:
            while True:
                pods = self._pods(await self.queue.get())
                if pods is None:
                    self.unplaced += 1
                    continue
                for pod in pods:
                    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods"
                    self.in_flight += 1
                    sent = loop.run_in_executor(threads, self.plane.ensure, path, pod)
                    sent.add_done_callback(self._sent)

    def _sent(self, future: asyncio.Future[None]) -> None:
        self.in_flight -= 1
        if future.cancelled() or future.exception() is not None:
            self.failed += 1

    def settled(self, admitted: int) -> bool:
        """``admitted`` Workloads were offered and every pod for them is created."""
        return len(self.placed) >= admitted and self.queue.empty() and self.in_flight == 0

    def _pods(self, workload: dict[str, Any]) -> list[dict[str, Any]] | None:
        meta = workload["metadata"]
        (pod_set,) = workload["spec"]["podSets"]
        limits = pod_set["template"]["spec"]["containers"][0]["resources"]["limits"]
        # The API server writes quantities its own way ("20000" comes back as "20k").
        gpus, memory = parse_quantity(limits[names.GPU]) or 1, limits.get(names.GPU_MEMORY)
        pods = []
        for k in range(int(pod_set.get("count", 1))):
            where = self._take(gpus, None if memory is None else parse_quantity(memory))
            if where is None:
                return None  # the rest of the gang stays unplaced, as in a full pool
            node, allocation = where
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{meta['name']}-{k}",
                        "namespace": meta["namespace"],
                        "ownerReferences": meta["ownerReferences"],
                        "annotations": {
                            names.HAMI_VGPU_NODE: node,
                            names.HAMI_DEVICES_ALLOCATED: allocation,
                        },
                    },
                    "spec": {
                        "nodeName": node,
                        "containers": [{"name": "main", "image": "registry.invalid/x:1"}],
                    },
                }
            )
        return pods

    def _take(self, gpus: int, memory: int | None) -> tuple[str, str] | None:
        """First node with ``gpus`` cards that take the request; its allocation value."""
        for node, cards in self.cards.items():
            if memory is None:
                fit = [c for c in cards if c.untouched][:gpus]
            else:
                fit = [c for c in cards if not c.exclusive and c.slots and c.memory >= memory]
                fit = fit[:gpus]
            if len(fit) < gpus:
                continue
            for card in fit:
                card.slots -= 1
                card.memory -= H200_MIB if memory is None else memory
                card.exclusive = memory is None
            used = (H200_MIB, 100) if memory is None else (memory, 0)
            return node, "".join(f"{c.uuid},NVIDIA,{used[0]},{used[1]}:" for c in fit) + ";"
        return None


# --- watching the Workloads ---------------------------------------------------------------


@dataclass
class Observed:
    """When this process's watch first saw each Workload actionable, and decided."""

    actionable: dict[str, float] = field(default_factory=dict)
    decided: dict[str, tuple[float, str]] = field(default_factory=dict)
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    hooks: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)

    def see(self, workload: dict[str, Any], now: float) -> None:
        meta = workload["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        self.latest[key] = workload
        for hook in self.hooks:
            hook(workload)
        check = meta["namespace"]  # each pool's namespace is named after its check
        if actionable(workload, {check}):
            self.actionable.setdefault(key, now)
        state = (check_entries(workload).get(check) or {}).get("state")
        if state in DECIDED and key not in self.decided:
            self.decided[key] = (now, str(state))

    def count(self, check: str, what: str) -> int:
        found = self.actionable if what == "actionable" else self.decided
        return sum(1 for key in found if key.startswith(f"{check}/"))


async def observe(plane: ControlPlane, seen: Observed) -> None:
    """List, then watch every Workload, relisting when the watch ends; until cancelled."""
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {plane.token}"}
    url = f"{plane.host}{KUEUE}/workloads"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=900)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        while True:
            async with session.get(url, ssl=context) as response:
                body = await response.json()
            for item in body["items"]:
                seen.see(item, time.perf_counter())
            query = {
                "watch": "true",
                "allowWatchBookmarks": "true",
                "resourceVersion": body["metadata"]["resourceVersion"],
                "timeoutSeconds": "600",
            }
            async with session.get(url, params=query, ssl=context) as response:
                async for line in response.content:
                    event = json.loads(line)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        seen.see(event["object"], time.perf_counter())
                    elif event["type"] == "ERROR":
                        break


async def until(what: str, done: Callable[[], bool], limit: float = LIMIT) -> float:
    """Wait (polling, capped) until ``done()``; the perf_counter time it became so."""
    deadline = time.perf_counter() + limit
    while not done():
        if DIED:
            raise SystemExit(f"bench/admission.py: {what}: {'; '.join(DIED)}")
        if time.perf_counter() > deadline:
            raise SystemExit(f"bench/admission.py: {what}: not after {limit:.0f} s")
        await asyncio.sleep(0.05)
    return time.perf_counter()


async def create_jobs(plane: ControlPlane, namespace: str, count: int, rate: float) -> float:
    """Create ``count`` Jobs, ``rate`` a second (0: as fast as the API takes them); seconds."""
    loop = asyncio.get_running_loop()
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as threads:
        pending = []
        for i in range(count):
            if rate > 0:
                await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
            pending.append(loop.run_in_executor(threads, plane.ensure, path, gpu_job(i)))
        await asyncio.gather(*pending)
    return time.perf_counter() - started


# --- where the machine's CPU goes ------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User and system CPU process ``pid`` used so far (``/proc/PID/stat``; 0 once gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuMeter:
    """The CPU each process sharing the machine spent over a phase: where its time went.

    On 2 cores a Workload decided costs the API server, etcd and Kueue far more than the
    check itself; a phase's figures say which of them bounds it.
    """

    pids: dict[str, int]
    """Each process by what it is: kube-apiserver, etcd, Kueue, the controller, this one."""
    config: Path | None = None
    """The controller's ``--config`` (None: its defaults)."""

    def read(self) -> tuple[float, dict[str, float]]:
        return time.perf_counter(), {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    @staticmethod
    def since(start: tuple[float, dict[str, float]], end: tuple[float, dict[str, float]]) -> Spent:
        return Spent(end[0] - start[0], {k: end[1][k] - start[1].get(k, 0.0) for k in end[1]})


@dataclass
class Spent:
    """CPU seconds by process over ``wall`` seconds."""

    wall: float
    cpu: dict[str, float]

    def ms(self, workloads: int) -> dict[str, float]:
        """Milliseconds each process spent per Workload."""
        return {k: round(1000 * v / max(workloads, 1), 2) for k, v in self.cpu.items()}

    def per(self, workloads: int) -> str:
        """Milliseconds each process spent per Workload, and how busy the machine was."""
        each = ", ".join(
            f"{name} {1000 * seconds / max(workloads, 1):.1f}"
            for name, seconds in self.cpu.items()
            if seconds > 0
        )
        busy = sum(self.cpu.values()) / max(self.wall * (os.cpu_count() or 1), 1e-9)
        return f"{each} (the {os.cpu_count()} cores {100 * busy:.0f}% busy)"


# --- the controller -----------------------------------------------------------------------


@dataclass
class ControllerProcess:
    """``unitscale admission`` in its own process; its stderr read as it comes."""

    process: asyncio.subprocess.Process
    port: int = 0
    synced_at: float | None = None
    lines: list[str] = field(default_factory=list)
    """Its last lines of log."""
    stopping: bool = False

    @classmethod
    async def start(
        cls, kubeconfig: Path, profile: Path | None = None, config: Path | None = None
    ) -> ControllerProcess:
        profiled = ("-m", "cProfile", "-o", str(profile)) if profile else ()
        configured = ("--config", str(config)) if config else ()
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, *profiled, "-m", "unitscale.cli", "admission", *configured),
            *("--kubeconfig", str(kubeconfig), "--controller-name", CONTROLLER),
            *("--metrics-listen", "127.0.0.1:0"),
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        running = cls(process)
        asyncio.get_running_loop().create_task(running._read())
        await until("the controller serving /metrics", lambda: running.port > 0, 60)
        return running

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.lines = [*self.lines[-19:], line]
            if match := re.search(r"serving /metrics on port (\d+)", line):
                self.port = int(match.group(1))
            if self.synced_at is None and "every watch has listed" in line:
                self.synced_at = time.perf_counter()
        if not self.stopping:
            DIED.append("the controller exited:\n" + "\n".join(self.lines))

    async def metrics(self) -> dict[str, float]:
        """The controller's own series, summed over labels, by sample name (+ outcome)."""
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{self.port}/metrics") as response:
                text = await response.text()
        found: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(r"(unitscale_admission_\w+)(\{[^}]*\})? (\S+)$", line)
            if match is None:
                continue
            name, labels, value = match.groups()
            outcome = re.search(r'(outcome|result)="(\w+)"', labels or "")
            key = name + (f":{outcome.group(2)}" if outcome else "")
            found[key] = found.get(key, 0.0) + float(value)
        return found

    def cpu_seconds(self) -> float:
        """User and system CPU the controller used so far."""
        return cpu_seconds(self.process.pid)

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        peak = re.search(r"VmHWM:\s+(\d+) kB", status)
        return int(peak.group(1)) / 1024 if peak else float("nan")

    async def stop(self) -> None:
        self.stopping = True
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


# --- the two phases -------------------------------------------------------------------------


def spans(seen: Observed, check: str) -> dict[str, Any]:
    """Latency (actionable -> decided) percentiles, the outcomes, and the decision span."""
    keys = [k for k in seen.decided if k.startswith(f"{check}/") and k in seen.actionable]
    waits = np.array([seen.decided[k][0] - seen.actionable[k] for k in keys])
    outcomes: dict[str, int] = {}
    for key in keys:
        outcomes[seen.decided[key][1]] = outcomes.get(seen.decided[key][1], 0) + 1
    times = [seen.decided[k][0] for k in keys]
    return {
        "decided": len(keys),
        "outcomes": outcomes,
        "p50_s": float(np.percentile(waits, 50)),
        "p99_s": float(np.percentile(waits, 99)),
        "max_s": float(waits.max()),
        "first_decided": min(times),
        "last_decided": max(times),
    }


def server_times(seen: Observed, check: str) -> dict[str, float]:
    """``bench.admission_burst.phases`` over the Ready ones (API timestamps, 1 s steps)."""
    ready = [
        w
        for k, w in seen.latest.items()
        if k.startswith(f"{check}/")
        and (check_entries(w).get(check) or {}).get("state") == "Ready"
        and any(c["type"] == "QuotaReserved" for c in w["status"].get("conditions") or [])
    ]
    return phases(ready, check) if ready else {}


async def backlog(
    plane: ControlPlane,
    pool: Pool,
    n: int,
    seen: Observed,
    profile: Path | None,
    meter: CpuMeter,
) -> dict[str, Any]:
    """N Workloads waiting on the check, then the controller starts: how fast it clears them.

    Also what each process spent while Kueue reserved them (the controller down) and
    while the controller decided them.
    """
    pool.keep_active(plane)
    created = await create_jobs(plane, pool.check, n, 0)
    start = time.perf_counter()
    before = meter.read()
    await until(
        "every backlog Workload reserved", lambda: seen.count(pool.check, "actionable") >= n
    )
    reserved = time.perf_counter() - start
    reserving = meter.since(before, meter.read())
    started = time.perf_counter()
    controller = await ControllerProcess.start(plane.kubeconfig, profile, meter.config)
    meter.pids["the controller"] = controller.process.pid
    before = meter.read()
    await until("every backlog Workload decided", lambda: seen.count(pool.check, "decided") >= n)
    deciding = meter.since(before, meter.read())
    result = spans(seen, pool.check)
    synced = controller.synced_at or started
    return {
        "controller": controller,
        "reserving": reserving,
        "spent": deciding,
        "created_s": created,
        "reserved_s": reserved,
        "synced_s": synced - started,
        "first_s": result["first_decided"] - synced,
        "cleared_s": result["last_decided"] - synced,
        "per_s": n / (result["last_decided"] - synced),
        **result,
    }


async def stream(
    plane: ControlPlane, pool: Pool, n: int, rate: float, seen: Observed
) -> dict[str, Any]:
    """N Workloads arriving at ``rate`` with the controller running: each one's latency."""
    created = await create_jobs(plane, pool.check, n, rate)
    await until("every streamed Workload decided", lambda: seen.count(pool.check, "decided") >= n)
    result = spans(seen, pool.check)
    first = min(seen.actionable[k] for k in seen.actionable if k.startswith(f"{pool.check}/"))
    return {
        "created_s": created,
        "per_s": n / (result["last_decided"] - first),
        **result,
        **server_times(seen, pool.check),
    }


@dataclass
class Phases:
    """What both runs do: a backlog, then streams, with the watch and the placers running."""

    plane: ControlPlane
    seen: Observed
    placers: list[Placer]
    """The stand-ins placing admitted Jobs' pods; the first places the backlog's."""
    meter: CpuMeter

    async def run(
        self,
        first: Pool,
        backlog_jobs: int,
        streams: list[tuple[Pool, int, float]],
        profile: Path | None,
    ) -> dict[str, Any]:
        """The backlog of ``first``, then each ``(pool, jobs, rate)`` stream in turn.

        Returns the backlog's and each stream's figures (a stream's with the controller's
        CPU over it), the controller's metrics and its peak RSS.
        """
        self.seen.hooks += [placer.offer for placer in self.placers]
        tasks = [asyncio.create_task(observe(self.plane, self.seen), name="the watch")]
        tasks += [
            asyncio.create_task(p.run(), name=f"placer {min(p.namespaces)}") for p in self.placers
        ]
        for task in tasks:
            task.add_done_callback(_died)
        controller = None
        try:
            a = await backlog(self.plane, first, backlog_jobs, self.seen, profile, self.meter)
            controller = a.pop("controller")
            a["cpu_s"] = controller.cpu_seconds()
            admitted = a["outcomes"].get("Ready", 0)
            placer = self.placers[0]
            await until("the backlog's pods created", lambda: placer.settled(admitted))
            done = []
            for pool, jobs, rate in streams:
                active = functools.partial(_active, self.plane, pool.check)
                await until(f"check {pool.check} Active", active, 60)
                before, machine = controller.cpu_seconds(), self.meter.read()
                result = await stream(self.plane, pool, jobs, rate, self.seen)
                spent = self.meter.since(machine, self.meter.read())
                cpu_s = controller.cpu_seconds() - before
                done.append(result | {"cpu_s": cpu_s, "rate": rate, "spent": spent})
            metrics = await controller.metrics()
            rss = controller.peak_rss_mb()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if controller is not None:
                await controller.stop()
        return {"backlog": a, "streams": done, "metrics": metrics, "rss_mb": rss}


async def run(plane: ControlPlane, args: argparse.Namespace, meter: CpuMeter) -> dict[str, Any]:
    """Three pools of ``--nodes``: a backlog, a stream with pods placed, one without."""
    suffix = secrets.token_hex(2)
    first, placed, held = (Pool(f"{phase}-{suffix}") for phase in ("backlog", "placed", "held"))
    for pool in (first, placed, held):
        pool.create(plane, args.nodes, args.workloads)
    # The backlog's gangs get pods too: unplaced, they would be held against later pools.
    placers = [Placer.of(plane, [pool], args.nodes) for pool in (first, placed)]
    phases = Phases(plane, Observed(), placers, meter)
    streams = [(pool, args.workloads, args.rate) for pool in (placed, held)]
    result = await phases.run(first, args.workloads, streams, args.profile)
    lost = {name: sum(getattr(p, name) for p in placers) for name in ("unplaced", "failed")}
    b, c = result.pop("streams")
    return result | {"placed": b | lost, "held": c}


async def run_pool(
    plane: ControlPlane, args: argparse.Namespace, meter: CpuMeter
) -> dict[str, Any]:
    """The pool at its real size: three checks guard one pool, every admitted Job placed.

    A backlog of ``--workloads`` (the controller starts with them waiting), then
    ``--stream`` Jobs at ``--rate`` a second, then as many at ``--burst-rate``; each
    phase's Jobs in their check's namespace, their pods placed on the one pool's cards.
    """
    suffix = secrets.token_hex(2)
    label = f"pool-{suffix}"
    first, steady, burst = (Pool(f"{p}-{suffix}", label) for p in ("backlog", "stream", "burst"))
    first.create(plane, args.nodes, args.workloads)
    for pool in (steady, burst):
        pool.create(plane, 0, args.stream)
    placer = Placer.of(plane, [first, steady, burst], args.nodes)
    phases = Phases(plane, Observed(), [placer], meter)
    streams = [(steady, args.stream, args.rate), (burst, args.stream, args.burst_rate)]
    result = await phases.run(first, args.workloads, streams, args.profile)
    b, c = result.pop("streams")
    return result | {
        "stream": b,
        "burst": c,
        "unplaced": placer.unplaced,
        "failed": placer.failed,
    }


def _died(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        DIED.append(f"{task.get_name()} failed: {task.exception()!r}")


def _active(plane: ControlPlane, check: str) -> bool:
    status = plane.request("GET", f"{KUEUE}/admissionchecks/{check}").get("status") or {}
    return any(
        c["type"] == "Active" and c["status"] == "True" for c in status.get("conditions") or []
    )


# --- the report -----------------------------------------------------------------------------


def _outcomes(counts: dict[str, int]) -> str:
    return ", ".join(f"{state} {counts[state]}" for state in DECIDED if state in counts)


def _row(phase: str, r: dict[str, Any], latency: str, goal: str, met: bool) -> str:
    return (
        f"| {phase} | {r['decided']} | {_outcomes(r['outcomes'])} | {r['per_s']:.1f} "
        f"| {latency} | {goal} | {'met' if met else 'MISSED'} |"
    )


def _latency(r: dict[str, Any]) -> str:
    return f"{r['p50_s']:.2f} / **{r['p99_s']:.2f}** / {r['max_s']:.2f}"


def _machine(
    workloads: int, backlog: dict[str, Any], streams: list[tuple[str, dict[str, Any]]]
) -> str:
    """Where the machine's CPU went in each phase, in ms per Workload."""
    reserving = (
        "Kueue reserving the backlog, the controller down "
        f"({workloads / backlog['reserved_s']:.0f}/s)"
    )
    phases = [
        (reserving, backlog["reserving"], workloads),
        ("the backlog decided", backlog["spent"], workloads),
        *((what, r["spent"], r["decided"]) for what, r in streams),
    ]
    return (
        "Where the machine's CPU went, ms per Workload: "
        + "; ".join(f"{what}: {spent.per(n)}" for what, spent, n in phases)
        + "."
    )


def _notes(args: argparse.Namespace, result: dict[str, Any]) -> str:
    a, b, c, m = result["backlog"], result["placed"], result["held"], result["metrics"]
    rate = f"{args.rate:g}/s"
    writes = "/".join(
        f"{m.get(f'unitscale_admission_writes_total:{r}', 0):.0f}"
        for r in ("applied", "conflict", "error")
    )
    return (
        f"Three pools of {args.nodes} Nodes x 8 H200 (HAMi JSON register), each with its "
        f"AdmissionCheck, ClusterQueue and LocalQueue and {args.workloads} Jobs: 8 in 10 ask "
        "1 GPU, 1 in 10 a 20,000 MiB share of one, 1 in 10 is a gang of 2 pods x 4 GPUs; "
        "quota for all, so the check alone decides. `unitscale admission` at its defaults "
        f"(debounce 0.5 s, {args.write_concurrency} writes in flight) in its own process "
        "with the real decide_all; "
        f"Kueue's client QPS raised to {args.kueue_qps:g} (its default 20 reserves about 4 "
        "Workloads a second). **Backlog**: Kueue reserved quota for all in "
        f"{a['reserved_s']:.1f} s with the controller down; from its start every watch had "
        f"listed in {a['synced_s']:.1f} s, the first decision landed {a['first_s']:.1f} s and "
        f"the last {a['cleared_s']:.1f} s after that (one pass decides them all, then the "
        "writes). **Streams**: Jobs created at "
        f"{rate} (in {b['created_s']:.1f} s and {c['created_s']:.1f} s); latency from this "
        "process's watch showing the check Pending with quota reserved to it showing our "
        "state; decided per s from the first actionable to the last decision. Pods placed (and "
        "in the backlog): a stand-in for HAMi's scheduler creates each admitted Job's pods on "
        f"cards it picks (first fit; {b['unplaced']} gangs found no cards, {b['failed']} pods "
        "refused). No "
        "pods: no kubelet, so every Ready gang stays unplaced and is fitted again against "
        "its pool on every pass for 5 minutes (decide._pool_inventory). Kueue's QuotaReserved "
        "time to our Ready by API timestamps (1 s steps; Kueue stamps its decision before its "
        f"write lands): p50 {b.get('ready_after_quota_p50_s', 0):.0f} / "
        f"{c.get('ready_after_quota_p50_s', 0):.0f} s. Controller: "
        f"{m.get('unitscale_admission_passes_total', 0):.0f} passes, "
        f"{m.get('unitscale_admission_pass_seconds_sum', 0):.1f} s in passes, status writes "
        f"applied/conflict/error {writes}, peak RSS {result['rss_mb']:.0f} MB. "
        "kube-apiserver, etcd, Kueue, the controller and this process share the machine. "
        + _machine(
            args.workloads, a, [("the stream with pods placed", b), ("the stream with no pods", c)]
        )
    )


def report(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    a, b, c, m = result["backlog"], result["placed"], result["held"], result["metrics"]
    met = {
        "backlog": a["per_s"] >= BACKLOG_GOAL,
        "placed": b["p99_s"] <= STREAM_GOAL_S,
        "held": c["p99_s"] <= STREAM_GOAL_S,
    }
    rate = f"{args.rate:g}/s"
    table = "\n".join(
        [
            "| phase | decided | outcomes | decided per s | check latency p50 / p99 / max s "
            "| goal | |",
            "|---|---:|---|---:|---|---|---|",
            _row(
                "backlog: the controller starts with them waiting",
                a,
                "",
                f">= {BACKLOG_GOAL:g}/s",
                met["backlog"],
            ),
            _row(
                f"stream at {rate}, pods placed",
                b,
                _latency(b),
                f"p99 <= {STREAM_GOAL_S:g} s",
                met["placed"],
            ),
            _row(
                f"stream at {rate}, no pods",
                c,
                _latency(c),
                f"p99 <= {STREAM_GOAL_S:g} s",
                met["held"],
            ),
        ]
    )
    notes = _notes(args, result)
    print(table)
    print(notes)
    if args.record:
        append("Admission check: throughput and latency (bench/admission.py)", table, notes)
    return {
        "workloads": args.workloads,
        "nodes_per_pool": args.nodes,
        "rate": args.rate,
        "backlog_per_s": round(a["per_s"], 2),
        "placed_per_s": round(b["per_s"], 2),
        "placed_latency_p50_s": round(b["p50_s"], 3),
        "placed_latency_p99_s": round(b["p99_s"], 3),
        "held_per_s": round(c["per_s"], 2),
        "held_latency_p50_s": round(c["p50_s"], 3),
        "held_latency_p99_s": round(c["p99_s"], 3),
        "outcomes": {"backlog": a["outcomes"], "placed": b["outcomes"], "held": c["outcomes"]},
        "passes": m.get("unitscale_admission_passes_total", 0),
        "rss_mb": round(result["rss_mb"], 1),
        "machine_cpu_ms_per_workload": {
            "reserving": a["reserving"].ms(args.workloads),
            "backlog": a["spent"].ms(args.workloads),
            "placed": b["spent"].ms(b["decided"]),
            "held": c["spent"].ms(c["decided"]),
        },
        "goals_met": met,
    }


def report_pool(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """The real-size run's table, notes and JSON line."""
    a, b, c, m = result["backlog"], result["stream"], result["burst"], result["metrics"]
    met = {
        "backlog": a["per_s"] >= POOL_BACKLOG_GOAL,
        "stream": b["p99_s"] <= POOL_STREAM_GOAL_S,
        "rss": result["rss_mb"] <= POOL_RSS_GOAL_MB,
    }
    cards = 8 * args.nodes

    def row(phase: str, r: dict[str, Any], latency: str, goal: str, ok: bool | None) -> str:
        verdict = "" if ok is None else ("met" if ok else "MISSED")
        per = 1000 * r["cpu_s"] / max(r["decided"], 1)
        return (
            f"| {phase} | {r['decided']} | {_outcomes(r['outcomes'])} | {r['per_s']:.1f} "
            f"| {latency} | {per:.1f} | {goal} | {verdict} |"
        )

    table = "\n".join(
        [
            f"| phase ({args.nodes:,} nodes, {cards:,} cards) | decided | outcomes | decided per s"
            " | check latency p50 / p99 / max s | controller CPU ms per decision | goal | |",
            "|---|---:|---|---:|---|---:|---|---|",
            row(
                f"backlog of {args.workloads:,}: the controller starts with them waiting",
                a,
                "",
                f">= {POOL_BACKLOG_GOAL:g}/s",
                met["backlog"],
            ),
            row(
                f"stream at {b['rate']:g}/s, pods placed",
                b,
                _latency(b),
                f"p99 <= {POOL_STREAM_GOAL_S:g} s",
                met["stream"],
            ),
            row(f"burst at {c['rate']:g}/s, pods placed", c, _latency(c), "(none)", None),
            f"| controller peak RSS | | | | | | <= {POOL_RSS_GOAL_MB:g} MB:"
            f" {result['rss_mb']:.0f} MB | {'met' if met['rss'] else 'MISSED'} |",
        ]
    )
    writes = "/".join(
        f"{m.get(f'unitscale_admission_writes_total:{r}', 0):.0f}"
        for r in ("applied", "conflict", "error")
    )
    notes = (
        f"One pool of {args.nodes:,} Nodes x 8 H200 (HAMi JSON register) guarded by three "
        "AdmissionChecks, each with its ClusterQueue and namespace: a backlog of "
        f"{args.workloads:,} Jobs waiting while the controller is down, then {args.stream:,} "
        f"at {b['rate']:g}/s and {args.stream:,} at {c['rate']:g}/s with it running (the Job mix "
        "of the default run; quota for all). The stand-in for HAMi's scheduler places every "
        f"admitted Job's pods on the pool's cards (first fit; {result['unplaced']} gangs found "
        f"no cards, {result['failed']} pods refused). Backlog: Kueue reserved quota for all in "
        f"{a['reserved_s']:.1f} s with the controller down; every watch had listed "
        f"{a['synced_s']:.1f} s after its start, the last decision {a['cleared_s']:.1f} s after "
        f"that, {args.write_concurrency} status writes in flight. Controller CPU per "
        "decision: the backlog's from the controller's start (listing included), a stream's "
        "over that phase. Controller: "
        f"{m.get('unitscale_admission_passes_total', 0):.0f} passes, "
        f"{m.get('unitscale_admission_pass_seconds_sum', 0):.1f} s in passes, status writes "
        f"applied/conflict/error {writes}. What the stand-in does not model: HAMi's own "
        "scoring (it takes the first node that fits), a kubelet (pods stay Pending, never "
        "finish or free cards), node churn. kube-apiserver, etcd, Kueue, the controller and "
        "this process share the machine. "
        + _machine(args.workloads, a, [("the stream", b), ("the burst", c)])
    )
    print(table)
    print(notes)
    if args.record:
        append(
            "Admission check at the pool's real size (bench/admission.py --real-pool)", table, notes
        )
    return {
        "nodes": args.nodes,
        "cards": cards,
        "backlog": args.workloads,
        "backlog_per_s": round(a["per_s"], 2),
        "stream_latency_p99_s": round(b["p99_s"], 3),
        "burst_latency_p99_s": round(c["p99_s"], 3),
        "cpu_ms_per_decision": {
            k: round(1000 * r["cpu_s"] / max(r["decided"], 1), 2)
            for k, r in (("backlog", a), ("stream", b), ("burst", c))
        },
        "rss_mb": round(result["rss_mb"], 1),
        "machine_cpu_ms_per_workload": {
            "reserving": a["reserving"].ms(args.workloads),
            "backlog": a["spent"].ms(args.workloads),
            "stream": b["spent"].ms(b["decided"]),
            "burst": c["spent"].ms(c["decided"]),
        },
        "goals_met": met,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads", type=int, help="Jobs in each phase (1,000; --real-pool: the backlog, 5,000)"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        help="Nodes (8 GPUs each) per pool; default: 0.18 per Job, cards for about 9 Jobs in 10",
    )
    parser.add_argument("--rate", type=float, default=50.0, help="Jobs a second in the stream")
    parser.add_argument(
        "--kueue-qps", type=float, default=500.0, help="Kueue's client QPS (its default: 20)"
    )
    parser.add_argument(
        "--real-pool",
        action="store_true",
        help="the 10,000-card pool: 1,250 nodes, a backlog of 5,000, streams at 50/s and 200/s",
    )
    parser.add_argument("--stream", type=int, help="Jobs in each stream of --real-pool (500)")
    parser.add_argument("--burst-rate", type=float, default=200.0, help="the burst's Jobs a second")
    parser.add_argument("--no-record", dest="record", action="store_false")
    parser.add_argument(
        "--write-concurrency",
        type=int,
        default=AdmissionConfig().write_concurrency,
        help="the controller's status writes in flight (default: its own, %(default)s)",
    )
    parser.add_argument(
        "--profile", type=Path, help="run the controller under cProfile, its stats to FILE"
    )
    args = parser.parse_args()
    if args.real_pool:
        args.nodes = args.nodes or 1250
        args.workloads = args.workloads or 5000
        args.stream = args.stream or 500
    args.workloads = args.workloads or 1000
    args.nodes = args.nodes or max(1, round(0.18 * args.workloads))
    with tempfile.TemporaryDirectory(prefix="admission-bench-") as tmp:
        plane = ControlPlane(binaries(), Path(tmp) / "plane")
        plane.start()
        # Kueue's client allows 20 requests/s by default (burst 30), about 4 Workloads
        # reserved a second: too few to load the check at --rate.
        connection = {"qps": args.kueue_qps, "burst": int(2 * args.kueue_qps)}
        kueue = Kueue(plane, Path(tmp) / "kueue", overrides={"clientConnection": connection})
        try:
            module, version = versions.MODULES["kueue"]
            plane.apply_crds(
                sorted((module_dir(module, version) / "config/components/crd/bases").glob("*.yaml"))
            )
            plane.apply_crds([ROOT / "deploy" / "admission" / "crd.yaml"])
            kueue.start()
            assert kueue.process is not None and kueue.process.popen is not None
            pids = {
                "API server": plane.processes["kube-apiserver"].popen,
                "etcd": plane.processes["etcd"].popen,
                "Kueue": kueue.process.popen,
            }
            meter = CpuMeter({k: p.pid for k, p in pids.items() if p is not None})
            meter.pids["this process"] = os.getpid()
            if args.write_concurrency != AdmissionConfig().write_concurrency:
                meter.config = Path(tmp) / "admission.yaml"
                meter.config.write_text(f"write-concurrency: {args.write_concurrency}\n")
            runner = run_pool if args.real_pool else run
            result = asyncio.run(runner(plane, args, meter))
        finally:
            kueue.stop()
            plane.stop()
    print(json.dumps(report_pool(args, result) if args.real_pool else report(args, result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
