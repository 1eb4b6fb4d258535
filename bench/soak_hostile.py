"""For bench/soak.py: what the soak's hostile neighbours answer.

- A hostile scrape target, serving broken expositions made from a real one: each body
  starts from a real simulated replica's ``/metrics`` (so the engine's names are there and
  the exporter gets past "is this vLLM?") and breaks it one way. Served on 127.0.0.1 from
  the bench's own process at ``/<kind>/metrics``.
- A hostile Prometheus, which the scaler's Prometheus source polls: one deployment's
  steady signals, hostile answers on a schedule (issue 27, classes 1 to 3).
- The admission controller (``admission.controller.Controller``, in this process: the
  served class, its status writes recorded instead of sent) told of a pool of HAMi nodes
  by watch events, whose register or a pod's allocation turns hostile on a schedule
  (issue 27, class 4); new gangs arrive and the last pass's go each pass, a scrape reads
  the view between passes, and a resync decides from scratch beside the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from admission import annotations as names
from admission import incremental
from admission.config import AdmissionConfig
from admission.controller import WATCHES, Controller
from admission.hami import unreadable
from foundation.heap import PassHeap
from foundation.kube import KubeAccess

NO_API: Any = None
"""The controller's API client: never used, its writes are recorded (``_Recording``)."""

HUGE_BYTES = 8 * 1024**2
"""The huge exposition's size: far above a replica's (~13 kB), small enough for 2 cores."""


def hostile_bodies(real: bytes) -> dict[str, bytes]:
    """Kind -> the broken exposition; ``real`` is a replica's ``/metrics`` body."""
    lines = real.splitlines(keepends=True)
    # A series line cut in half and garbage after it, as a crashed writer leaves it.
    invalid = (
        b"".join(lines[: len(lines) // 2]) + b'vllm:num_requests_running{engine="0\n}}} 1 2 3\n'
    )
    # Valid, but a million-label family: the size a runaway label would make.
    filler = []
    size, i = len(real), 0
    while size < HUGE_BYTES:
        line = f'vllm:soak_filler{{engine="0",series="{i}"}} {i}.0\n'.encode()
        filler.append(line)
        size += len(line)
        i += 1
    huge = real + b"# TYPE vllm:soak_filler gauge\n" + b"".join(filler)
    # Bytes that are not UTF-8 inside a label value and a comment.
    binary = real.replace(b'model_name="', b'model_name="\xff\xfe\x80', 1) + b"# \xc3\x28\xa0\xa1\n"
    # A histogram bucket bound that is not a number.
    bad_le = re.sub(rb'le="0\.0*1"', b'le="soon"', real, count=1)
    return {"invalid": invalid, "huge": huge, "binary": binary, "bad-le": bad_le}


class HostileTarget:
    """An HTTP server on 127.0.0.1 serving ``/<kind>/metrics`` for every hostile body."""

    def __init__(self) -> None:
        self._bodies: dict[str, bytes] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.scrapes: dict[str, int] = {}

    async def start(self, bodies: dict[str, bytes]) -> None:
        self._bodies = bodies
        self.scrapes = dict.fromkeys(bodies, 0)
        app = web.Application()
        app.router.add_get("/{kind}/metrics", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def url(self, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{kind}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        body = self._bodies.get(kind)
        if body is None:
            raise web.HTTPNotFound()
        self.scrapes[kind] += 1
        # The content type a real replica sends: it claims UTF-8 whatever the bytes are.
        return web.Response(body=body, content_type="text/plain", charset="utf-8")


# --- a hostile Prometheus, polled by the scaler's Prometheus source --------------------------

PROM_DEPLOYMENT = "promsoak"
"""The deployment only the fake Prometheus knows (no hyphen: its pod regex stays plain)."""
PROM_KINDS = (
    "deep-json", "value-object", "huge-int", "infinite", "negative", "future", "zero-replicas",
)  # fmt: skip
"""Hostile answers, each played for a while: what issue 27 found, and two of its cousins."""
_EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}
_DEEP = b'{"status": "success", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
# Steady engine signals of two replicas under a steady load: any change of the scaler's
# answer for this deployment comes from a hostile answer, not from the load.
_GOOD = {
    "replicas": "2", "replicas-up": "2", "replicas-sleeping": "0", "queue-depth": "0",
    "running": "12", "kv-usage": "0.3", "request-rate": "1.5", "prompt-token-rate": "150",
    "generation-token-rate": "600", "ttft-p95": "0.2", "itl-p95": "0.03",
    "mean-prompt-tokens": "100", "mean-output-tokens": "400", "running-mean": "12",
}  # fmt: skip
_LOAD = ("queue-depth", "running", "request-rate", "prompt-token-rate", "generation-token-rate",
         "running-mean", "replicas", "replicas-up")  # fmt: skip
# The default queries' metric names, most specific first: which signal a query asks for.
_SIGNAL_OF = (
    ("timestamp(", "signal-time"), ("count(up", "replicas"), ("sum(up", "replicas-up"),
    ("engine_sleep_state", "replicas-sleeping"), ("num_requests_waiting", "queue-depth"),
    ("avg_over_time", "running-mean"), ("num_requests_running", "running"),
    ("cache_usage_perc", "kv-usage"), ("request_success_total", "request-rate"),
    ("prompt_tokens_total", "prompt-token-rate"),
    ("generation_tokens_total", "generation-token-rate"),
    ("time_to_first_token", "ttft-p95"), ("inter_token_latency", "itl-p95"),
    ("request_prompt_tokens", "mean-prompt-tokens"),
    ("request_generation_tokens", "mean-output-tokens"),
)  # fmt: skip


def signal_of(promql: str) -> str:
    """Which default query ``promql`` is (``?`` for none)."""
    return next((name for needle, name in _SIGNAL_OF if needle in promql), "?")


def prometheus_answer(signal: str, kind: str | None, now: float) -> bytes:
    """The body answering ``signal``'s query for the deployment, good or ``kind``."""
    value: object = f"{now - 0.2:.3f}" if signal == "signal-time" else _GOOD.get(signal, "1")
    if kind == "deep-json":
        return _DEEP
    if kind == "value-object":
        value = {}
    elif kind == "huge-int":
        value = 10**400  # a JSON integer no float holds
    elif kind == "infinite":
        value = "+Inf"
    elif kind == "negative" and signal in _LOAD:
        value = "-5"
    elif kind == "future" and signal == "signal-time":
        value = f"{now + 86_400:.3f}"
    elif kind == "zero-replicas" and signal in ("replicas", "replicas-up"):
        value = "0"
    sample = {"metric": {}, "value": [now, value]}
    body = {"status": "success", "data": {"resultType": "vector", "result": [sample]}}
    return json.dumps(body).encode()


class HostilePrometheus:
    """Prometheus's query API on 127.0.0.1: ``PROM_DEPLOYMENT``'s series, hostile on demand.

    Every other deployment has no series here (its signals come from the exporter).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.kind: str | None = None
        """The hostile answer now; None: good answers."""
        self.hostile: Counter[str] = Counter()
        """Hostile answers served, by kind."""
        self.queries = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _query(self, request: web.Request) -> web.Response:
        promql = request.query.get("query", "")
        self.queries += 1
        if f'pod=~"{PROM_DEPLOYMENT}-' not in promql:
            return web.json_response(_EMPTY)
        kind = self.kind
        if kind is not None:
            self.hostile[kind] += 1
        body = prometheus_answer(signal_of(promql), kind, self.clock())
        return web.Response(body=body, content_type="application/json")


# --- the admission controller's pass over a pool that turns hostile --------------------------

ADMISSION_KINDS = (
    "register-5000-digits", "register-deep-json", "allocation-5000-digits",
    "allocation-deep-json",
)  # fmt: skip
"""Hostile annotations, each on one node (its register) or one of its pods (allocation)."""
ADMISSION_NODES = 4
CARDS = 8
HELD = 4
"""Cards a serving pod holds on each node: every node has room for one 4-card gang."""
GANG_GPUS = 4
H200_MIB = 143771
_HUGE = "9" * 5000
_DEEP_TEXT = "[" * 100_000 + "]" * 100_000


def admission_node(i: int, kind: str | None = None) -> dict[str, Any]:
    """A HAMi node ``soak-gpu-<i>`` as its device plugin leaves it; its register ``kind``."""
    cards = [
        {"id": f"GPU-soak-gpu-{i}-{c}", "index": c, "count": 10, "devmem": H200_MIB,
         "devcore": 100, "type": "NVIDIA-NVIDIA H200", "mode": "hami-core", "health": True}
        for c in range(CARDS)
    ]  # fmt: skip
    register = json.dumps(cards)
    if kind == "register-5000-digits":
        register = register.replace(f'"devmem": {H200_MIB}', f'"devmem": {_HUGE}', 1)
    elif kind == "register-deep-json":
        register = _DEEP_TEXT
    name = f"soak-gpu-{i}"
    return {
        "metadata": {
            "name": name,
            "labels": {names.HOSTNAME: name},
            "annotations": {
                names.HAMI_NODE_REGISTER: register,
                names.HAMI_NODE_HANDSHAKE: "Reported 2026-01-01 00:00:00",
            },
        },
        "spec": {},
        "status": {},
    }


def serving_pod(i: int, kind: str | None = None) -> dict[str, Any]:
    """The serving pod HAMi placed on node ``i`` holding ``HELD`` cards; its allocation ``kind``."""
    on = f"soak-gpu-{i}"
    allocated = "".join(f"GPU-{on}-{c},NVIDIA,{H200_MIB},100:" for c in range(HELD)) + ";"
    if kind == "allocation-5000-digits":
        allocated = f"GPU-{on}-0,NVIDIA,{_HUGE},100:;"
    elif kind == "allocation-deep-json":
        allocated = _DEEP_TEXT
    return {
        "metadata": {
            "name": f"serve-{i}", "namespace": "serve", "uid": f"uid-serve-{i}",
            "ownerReferences": [{"uid": "uid-serving"}],
            "annotations": {names.HAMI_VGPU_NODE: on, names.HAMI_DEVICES_ALLOCATED: allocated},
        },
        "spec": {"nodeName": on},
        "status": {"phase": "Running"},
    }  # fmt: skip


def gang(i: int) -> dict[str, Any]:
    """A pending Workload of one pod asking ``GANG_GPUS`` whole cards, quota reserved."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"train-{i}", "namespace": "train", "uid": f"uid-wl-{i}",
            "creationTimestamp": "2026-01-01T00:00:00Z", "ownerReferences": [{"uid": f"uid-{i}"}],
            "annotations": {},
        },
        "spec": {"priority": 0, "podSets": [{
            "name": "workers", "count": 1,
            "template": {"metadata": {"annotations": {}}, "spec": {"containers": [
                {"name": "main", "resources": {"limits": {names.GPU: str(GANG_GPUS)}}},
            ]}},
        }]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admissionChecks": [{"name": ADMISSION_CHECK, "state": "Pending",
                                 "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""}],
        },
    }  # fmt: skip


ADMISSION_CHECK = "soak-capacity"


RESYNC_SECONDS = 20.0
"""The controller's resync in the soak (300 s served): a few within the load's minutes."""


class _Recording(Controller):
    """The served controller, its status writes recorded: there is no API server here."""

    def __init__(self) -> None:
        super().__init__(KubeAccess(), AdmissionConfig(), heap=PassHeap())
        self.written: dict[str, dict[str, Any]] = {}

    async def _apply(self, api: Any, resource: Any, name: str, key: str, body: Any) -> bool:
        if name == "workloads":
            self.written[key] = body["status"]["admissionChecks"][0]
        return True

    async def _event(self, api: Any, event: Any) -> None:
        return None


def _unit_failures(controller: Controller) -> float:
    sample = controller.metrics.registry.get_sample_value
    return sum(
        sample("unitscale_admission_unit_failures_total", {"unit": unit}) or 0.0
        for unit in ("workload", "pool", "resync")
    )


def _resync_differences(controller: Controller) -> float:
    sample = controller.metrics.registry.get_sample_value
    return sum(
        sample("unitscale_admission_resync_differences_total", {"kind": kind}) or 0.0
        for kind in ("decision", "plan", "inventory")
    )


@dataclass
class AdmissionSoak:
    """The served admission controller, pass after pass, over a pool of HAMi nodes.

    ``hostile`` is (kind, node) while one object of that node is hostile. The view is
    kept by watch events, as served: each pass, one 4-card gang per node arrives and
    the last pass's gangs go; a node or pod turning hostile or back is an event too, and
    a ``/metrics`` scrape reads the view before each pass. A Ready is a decision on
    missing data when it counts the hostile node's cards (its message names it) or
    admits more gangs than the readable nodes hold.
    """

    hostile: tuple[str, int] | None = None
    passes: int = 0
    raised: Counter[str] = field(default_factory=Counter)
    """Passes that raised, by exception class: the loop survives them, the goal is none."""
    failed_decisions: int = 0
    """Units that failed their round alone (``unit_failures``): isolated, nothing written."""
    wrong: list[str] = field(default_factory=list)
    """Decisions on missing data, described."""
    hostile_seen: Counter[str] = field(default_factory=Counter)
    """Passes run over a hostile object, by kind."""
    hostile_counted: Counter[str] = field(default_factory=Counter)
    """Of those, the passes where the controller's check (``unreadable``) named it."""
    ready_while_hostile: int = 0
    resyncs: int = 0
    """Resyncs (a pass decided from scratch beside the loop) started."""
    resync_differences: float = 0.0
    """Answers the kept state gave otherwise than a pass from scratch (the goal is none)."""
    controller: _Recording = field(default_factory=_Recording)
    _shown: dict[str, dict[str, Any]] = field(default_factory=dict)
    _gangs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check = {"metadata": {"name": ADMISSION_CHECK},
                 "spec": {"controllerName": self.controller.name}}  # fmt: skip
        for name in WATCHES:
            self.controller._changed(name, {})
        self.controller._changed("admissionchecks", {ADMISSION_CHECK: check})

    async def one_pass(self, now: float) -> None:
        kind, bad = self.hostile if self.hostile is not None else (None, -1)
        on_node = kind if kind is not None and kind.startswith("register") else None
        on_pod = kind if kind is not None and kind.startswith("allocation") else None
        c = self.controller
        for i in range(ADMISSION_NODES):
            node = admission_node(i, on_node if i == bad else None)
            pod = serving_pod(i, on_pod if i == bad else None)
            for watch, key, obj in (("nodes", node["metadata"]["name"], node),
                                    ("pods", f"serve/serve-{i}", pod)):  # fmt: skip
                if self._shown.get(key) != obj:  # an event only when it changed
                    self._shown[key] = obj
                    c._heard(watch, key, obj)
        for key in self._gangs:  # the last pass's gangs are done
            c._heard("workloads", key, None)
        self._gangs = []
        for i in range(ADMISSION_NODES):
            w = gang(self.passes * ADMISSION_NODES + i)
            key = f"train/{w['metadata']['name']}"
            w["metadata"]["resourceVersion"] = str(self.passes + 1)
            self._gangs.append(key)
            c._heard("workloads", key, w)
        self.passes += 1
        if kind is not None:
            self.hostile_seen[kind] += 1
            objects = [("node", admission_node(bad, on_node)), ("pod", serving_pod(bad, on_pod))]
            if any(unreadable(k, o) is not None for k, o in objects):
                self.hostile_counted[kind] += 1
        if c._resynced is not None and c._clock() - c._resynced >= RESYNC_SECONDS:
            c._resynced = c._clock() - incremental.RESYNC_SECONDS  # due: this pass resyncs
        failed = _unit_failures(c)
        resync = c.resync
        try:
            c.observe()  # a scrape between passes reads the view too
            await c.reconcile(NO_API)
        except Exception as err:  # the controller's loop would go on, warned of once
            self.raised[type(err).__name__] += 1
            return
        if c.resync is not resync:  # this pass started one
            self.resyncs += 1
        self.failed_decisions += int(_unit_failures(c) - failed)
        self.resync_differences = _resync_differences(c)
        decided = [(key, c.written.get(key)) for key in self._gangs]
        self._judge(decided, kind, bad)

    def _judge(
        self, decided: list[tuple[str, dict[str, Any] | None]], kind: str | None, bad: int
    ) -> None:
        ready = [(k, e) for k, e in decided if e is not None and e.get("state") == "Ready"]
        readable = ADMISSION_NODES - (kind is not None)
        if kind is None:
            if len(ready) != ADMISSION_NODES:
                states = Counter(e.get("state") if e else "unwritten" for _, e in decided)
                self.wrong.append(f"a calm pass admitted {len(ready)}: {dict(states)}")
            return
        self.ready_while_hostile += len(ready)
        hostile_name = f"soak-gpu-{bad}"
        for key, entry in ready:
            if re.search(rf"\b{hostile_name}\b", str(entry.get("message", ""))):
                self.wrong.append(f"{kind}: {key} Ready on {hostile_name}: {entry['message']}")
        if len(ready) > readable:
            self.wrong.append(f"{kind}: {len(ready)} Ready where {readable} nodes are readable")


async def run_admission(
    soak: AdmissionSoak,
    clock: Callable[[], float],
    start_at: float,
    slot: float,
    hold: float,
    stop: asyncio.Event,
    every: float = 0.5,
) -> list[tuple[str, float, float]]:
    """Passes every ``every`` s until ``stop``; each kind hostile on its own node for ``hold``
    s at the start of its slot. Returns (kind, from, until) of each hostile span."""
    spans: list[tuple[str, float, float]] = []
    schedule = [
        (kind, i % ADMISSION_NODES, start_at + i * slot) for i, kind in enumerate(ADMISSION_KINDS)
    ]
    while not stop.is_set():
        now = clock()
        soak.hostile = None
        for kind, node, at in schedule:
            if at <= now < at + hold:
                soak.hostile = (kind, node)
                if not spans or spans[-1][0] != kind:
                    spans.append((kind, at, at + hold))
        await soak.one_pass(time.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
    return spans
