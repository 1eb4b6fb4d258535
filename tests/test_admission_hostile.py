"""What one hostile object can do to an admission pass: nothing beyond itself (issue 27).

Class 4 (one bad object poisons the pass): a node's HAMi register, a pod's allocation,
the scaler's demand and a workload's decision each fail alone; the object is unmeasured
(its GPUs are not offered, its figures not used), named in one WARNING and counted, and
every other node, pool and workload is decided. Class 5 (sizes from input): a gang, a
node's cards and a card's share count are bounded before anything is built per item,
with an error naming the object and the limit.

Property tests at the annotation and quantity boundary: any string either reads as a
bounded value HAMi could have written, or is refused with ``HamiFormatError``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any, cast

import pytest
from aiohttp import web
from hypothesis import example, given
from hypothesis import strategies as st
from kubernetes_asyncio import client

from admission import annotations as names
from admission import fit, fluid, requests
from admission import manager as manager_module
from admission.cluster import Cluster, Pending, PoolDemand
from admission.config import AdmissionConfig
from admission.controller import WORKLOADS, Controller
from admission.decide import decide_all
from admission.demand import MAX_ACCELERATORS, _result
from admission.fit import (
    fit_gang,
    fits_ever,
)
from admission.hami import (
    INT32_MAX,
    INT64_MAX,
    MAX_ANNOTATION_CHARS,
    MAX_DEVICES_PER_NODE,
    MAX_SPLIT_COUNT,
    HamiFormatError,
    inventory,
    parse_devices_allocated,
    parse_node_register,
    parse_quantity,
    unreadable,
)
from admission.manager import plan_pools
from admission.parameters import Headroom, Parameters, ReclaimParameters
from admission.requests import (
    MAX_GANG_PODS,
    MAX_GPU_CONTAINERS,
    MAX_GPU_TYPE_CHARS,
    MAX_GPU_TYPES,
    workload_demand,
)
from foundation.kube import KubeAccess
from protos.unitscale.v1 import capacity_pb2
from tests.test_admission_decide import CHECK, MIB, NOW, node, running, workload
from tests.test_scaler_hostile5_kube import api_server

NO_API = cast(client.ApiClient, None)  # the recording controller never calls the API
HUGE = "9" * 5000
"""A 5,000-digit integer: ``int()`` of it raises ValueError (Python's 4,300-digit limit)."""
DEEP = "[" * 100_000 + "]" * 100_000
"""JSON nested past Python's recursion limit: ``json.loads`` raises RecursionError."""


def register_entry(i: int, **fields: Any) -> dict[str, Any]:
    entry = {
        "id": f"GPU-bad-{i}",
        "index": i,
        "count": 10,
        "devmem": MIB,
        "devcore": 100,
        "type": "NVIDIA-NVIDIA H200",
        "mode": "hami-core",
        "health": True,
    }
    return {**entry, **fields}


def with_register(name: str, register: str) -> dict[str, Any]:
    obj = node(name)
    obj["metadata"]["annotations"][names.HAMI_NODE_REGISTER] = register
    return obj


BAD_REGISTERS = [
    pytest.param(f"GPU-a,10,{HUGE},100,NVIDIA,0,true:", id="a 5000-digit text integer"),
    pytest.param(f'[{{"id":"GPU-a","count":10,"devmem":{HUGE}}}]', id="a 5000-digit JSON integer"),
    pytest.param(json.dumps([register_entry(0, devmem=10**4000)]), id="a 4000-digit JSON integer"),
    pytest.param(DEEP, id="JSON nested a hundred thousand deep"),
    pytest.param('[{"id": "GPU-a", "count": [[[[[]]]]]}]', id="a nested list for a count"),
    pytest.param(
        json.dumps([register_entry(i) for i in range(MAX_DEVICES_PER_NODE + 1)]),
        id="more cards than a node may register",
    ),
    pytest.param(
        json.dumps([register_entry(0, count=MAX_SPLIT_COUNT + 1)]),
        id="a card shared by more containers than the share limit",
    ),
    pytest.param("x" * (MAX_ANNOTATION_CHARS + 1), id="a value longer than kubernetes allows"),
    pytest.param("\x00\udcff:,,,,,,:", id="control characters and a lone surrogate"),
]


@pytest.mark.parametrize("register", BAD_REGISTERS)
def test_a_hostile_register_leaves_only_its_node_unmeasured(register):
    inv = inventory([with_register("bad", register), node("gpu-1")], [], now=NOW)
    assert [n.name for n in inv.nodes] == ["gpu-1"]
    assert len(inv.node("gpu-1").devices) == 8  # type: ignore[union-attr]
    assert [p.subject for p in inv.problems] == ["node/bad"]
    assert unreadable("node", with_register("bad", register)) is not None


BAD_ALLOCATIONS = [
    pytest.param(f"GPU-gpu-1-0,NVIDIA,{HUGE},100:;", id="a 5000-digit memory"),
    pytest.param(f"GPU-gpu-1-0,NVIDIA,{10**12},100:;", id="memory beyond int32"),
    pytest.param("GPU-gpu-1-0,NVIDIA,lots,100:;", id="a word for memory"),
    pytest.param(DEEP, id="brackets nested a hundred thousand deep"),
    pytest.param("y" * (MAX_ANNOTATION_CHARS + 1), id="a value longer than kubernetes allows"),
]


@pytest.mark.parametrize("allocated", BAD_ALLOCATIONS)
def test_a_hostile_allocation_leaves_its_node_unmeasured_and_the_others_offered(allocated):
    """What the pod holds is unknown: its node's cards are never counted as free."""
    bad = running("bad", "gpu-1", range(1))
    bad["metadata"]["annotations"][names.HAMI_DEVICES_ALLOCATED] = allocated
    inv = inventory([node("gpu-1"), node("gpu-2")], [bad], now=NOW)
    assert [n.name for n in inv.nodes] == ["gpu-2"]
    assert [n.name for n in inv.pool] == ["gpu-1", "gpu-2"]
    assert [p.subject for p in inv.problems] == ["pod/serve/bad"]
    assert unreadable("pod", bad) is not None


def test_a_gang_is_never_admitted_onto_the_node_of_an_unreadable_allocation():
    bad = running("bad", "gpu-1", range(1))
    bad["metadata"]["annotations"][names.HAMI_DEVICES_ALLOCATED] = f"GPU-gpu-1-0,N,{HUGE},1:;"
    pending = [workload("a", pods=1, gpus=8)]
    (decision,) = decide_all(
        [Pending(pending[0], CHECK, Parameters(), NOW - 10)],
        Cluster([node("gpu-1")], [bad], pending, [], [], demand={}),
        NOW,
    )
    assert decision.state == "Retry", decision.message


def test_a_hostile_node_and_pod_never_stop_the_other_workloads_being_decided():
    nodes = [with_register("bad", DEEP), node("gpu-1"), node("gpu-2")]
    bad = running("bad", "gpu-2", range(1))
    bad["metadata"]["annotations"][names.HAMI_DEVICES_ALLOCATED] = f"GPU-gpu-2-0,N,{HUGE},1:;"
    pending = [workload("a", pods=1, gpus=8), workload("b", pods=1, gpus=8)]
    decisions = decide_all(
        [Pending(w, CHECK, Parameters(), NOW - 10) for w in pending],
        Cluster(nodes, [bad], pending, [], [], demand={}),
        NOW,
    )
    assert [(d.workload, d.state) for d in decisions] == [("a", "Ready"), ("b", "Retry")]
    assert "gpu-1" in decisions[0].message


# --- sizes from input (class 5) --------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "words"),
    [
        pytest.param([10**6], "1000000 pods", id="a gang of a million pods is refused"),
        pytest.param(
            [MAX_GANG_PODS, 1], f"{MAX_GANG_PODS + 1} pods", id="the limit counts every podset"
        ),
        pytest.param([-1], "count -1", id="a negative count is refused, not read as none"),
        pytest.param([True], "count True", id="a boolean count is refused"),
    ],
)
def test_a_gang_beyond_the_limit_is_rejected_naming_the_limit(counts, words):
    w = workload("huge")
    template = w["spec"]["podSets"][0]
    w["spec"]["podSets"] = [{**template, "name": f"s{i}", "count": c} for i, c in enumerate(counts)]
    with pytest.raises(ValueError, match=words):
        workload_demand(w)
    (decision,) = decide_all(
        [Pending(w, CHECK, Parameters(), NOW - 10)],
        Cluster([node("gpu-1")], [], [w], [], [], demand={}),
        NOW,
    )
    assert decision.state == "Rejected"
    assert words in decision.message
    if counts[0] == 10**6:
        assert str(MAX_GANG_PODS) in decision.message


def test_a_gang_at_the_limit_is_read():
    w = workload("big", pods=MAX_GANG_PODS)
    assert sum(d.count for d in workload_demand(w)) == MAX_GANG_PODS


def test_a_node_of_a_thousand_or_ten_million_cards_is_refused_naming_the_limit():
    register = ":".join(f"GPU-{i},10,{MIB},100,H200,0,true" for i in range(1000)) + ":"
    with pytest.raises(HamiFormatError, match=f"more than the {MAX_DEVICES_PER_NODE}"):
        parse_node_register(register)
    text = "GPU-0,10,1,100,H200,0,true:" * 10**7
    with pytest.raises(HamiFormatError, match=f"more than the {MAX_ANNOTATION_CHARS}"):
        parse_node_register(text)


# --- the parsers never raise anything else (properties) ---------------------------------

_TEXT_NUMBER = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from([HUGE, "-" + HUGE, "", "+", "1e9", "0x10", "١٢"]),
)
_TEXT_DEVICE = st.builds(
    lambda u, c, m, k, t, n, h: f"{u},{c},{m},{k},{t},{n},{h}",
    st.sampled_from(["GPU-a", "GPU-b", ""]),
    _TEXT_NUMBER,
    _TEXT_NUMBER,
    _TEXT_NUMBER,
    st.text(max_size=5),
    _TEXT_NUMBER,
    st.sampled_from(["true", "false", "maybe"]),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_JSON_DEVICE = st.fixed_dictionaries(
    {"id": st.sampled_from(["GPU-a", "GPU-b"])},
    optional={
        k: _JSON | st.integers()
        for k in ("index", "count", "devmem", "devcore", "numa", "health", "type", "mode")
    },
)
REGISTERS = st.one_of(
    st.text(),
    st.lists(_TEXT_DEVICE, max_size=4).map(lambda ds: ":".join(ds) + ":"),
    st.lists(_JSON_DEVICE, max_size=4).map(json.dumps),
    _JSON.map(json.dumps),
)


@given(REGISTERS)
@example(f"GPU-a,10,{HUGE},100,NVIDIA,0,true:")
@example(DEEP)
@example(json.dumps([{"id": "GPU-a", "count": 10**40}]))
def test_any_register_string_reads_as_bounded_cards_or_is_refused(value):
    try:
        devices = parse_node_register(value)
    except HamiFormatError:
        return
    assert len(devices) <= MAX_DEVICES_PER_NODE
    for d in devices:
        assert 0 <= d.split_count <= MAX_SPLIT_COUNT
        assert 0 <= d.memory_mib <= INT32_MAX and 0 <= d.cores <= INT32_MAX
        assert 0 <= d.index <= INT32_MAX and abs(d.numa) <= INT32_MAX


ALLOCATIONS = st.one_of(
    st.text(),
    st.lists(
        st.builds(
            lambda u, m, c: f"{u},NVIDIA,{m},{c}:",
            st.sampled_from(["GPU-a", "GPU-b[1-2]", ""]),
            _TEXT_NUMBER,
            _TEXT_NUMBER,
        ),
        max_size=4,
    ).map(lambda ds: "".join(ds) + ";"),
)


@given(ALLOCATIONS)
@example(f"GPU-a,NVIDIA,{HUGE},100:;")
@example(DEEP)
def test_any_allocation_string_reads_as_bounded_uses_or_is_refused(value):
    try:
        uses = parse_devices_allocated(value)
    except HamiFormatError:
        return
    for use in uses:
        assert 0 <= use.memory_mib <= INT32_MAX and 0 <= use.cores <= INT32_MAX


QUANTITIES = st.one_of(
    st.text(max_size=80),
    st.from_regex(
        r"[+-]?[0-9]{0,30}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,12}|Ki|Mi|Gi|Ei|m|k|E)?", fullmatch=True
    ),
    st.integers(),
    st.floats(),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@given(QUANTITIES)
@example("1e999999999")
@example("1e5000")
@example(HUGE)
@example(10**5000)
@example(float("inf"))
def test_any_quantity_reads_as_an_int64_or_none(value):
    read = parse_quantity(value)
    assert read is None or (isinstance(read, int) and abs(read) <= INT64_MAX)


# --- the scaler's demand as admission reads it ----------------------------------------


def answer(held: float, needed: float) -> capacity_pb2.GetInferenceDemandResponse:
    return capacity_pb2.GetInferenceDemandResponse(
        pools=[
            capacity_pb2.PoolDemand(
                pool="h200", accelerators_held=held, accelerators_needed=needed
            ),
            capacity_pb2.PoolDemand(pool="l4", accelerators_held=1.0, accelerators_needed=2.0),
        ]
    )


@pytest.mark.parametrize(
    ("held", "needed", "field"),
    [
        pytest.param(1.0, math.nan, "accelerators_needed is nan", id="a nan forecast is unknown"),
        pytest.param(math.inf, 2.0, "accelerators_held is inf", id="an infinite count is unknown"),
        pytest.param(1.0, -3.0, "accelerators_needed is -3.0", id="a negative need is refused"),
        pytest.param(1.0, 1e300, "accelerators_needed is 1e+300", id="a need beyond any pool"),
    ],
)
def test_an_impossible_demand_leaves_its_pool_unknown_and_names_the_field(held, needed, field):
    every = _result(answer(held, needed), "")
    assert every.demand == {"l4": PoolDemand("l4", 1.0, 2.0)}
    assert field in every.error
    one = _result(answer(held, needed), "h200")
    assert one.demand is None and field in one.error


@given(st.floats(), st.floats())
def test_any_demand_figures_are_used_only_when_possible(held, needed):
    result = _result(answer(held, needed), "h200")
    possible = all(math.isfinite(x) and 0 <= x <= MAX_ACCELERATORS for x in (held, needed))
    assert (result.demand is not None) == possible


HOLD = Parameters(inference_headroom=Headroom("scaler:9090", "h200"))


def test_an_impossible_demand_holds_the_gang_instead_of_admitting_it():
    w = workload("a", pods=1, gpus=1)
    demand = _result(answer(1.0, -3.0), "")
    (decision,) = decide_all(
        [Pending(w, CHECK, HOLD, NOW - 10)],
        Cluster([node("gpu-1")], [], [w], [], [], demand=demand.demand, demand_error=demand.error),
        NOW,
    )
    assert decision.state == "Retry"
    assert "accelerators_needed is -3.0" in decision.message


# --- one workload or pool fails alone (the pass's units) --------------------------------

ERRORS = [
    pytest.param(KeyError("value"), id="a KeyError"),
    pytest.param(RecursionError("deep"), id="a RecursionError"),
    pytest.param(OverflowError("int too large"), id="an OverflowError"),
    pytest.param(ZeroDivisionError("0"), id="a ZeroDivisionError"),
    pytest.param(AttributeError("'list' object has no attribute 'get'"), id="an AttributeError"),
]


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch):
    """``fluid.readiness`` raising ``error`` for the workload named ``bad`` while set."""
    real = fluid.readiness
    broken: dict[str, BaseException] = {}

    def readiness(w: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        if w["metadata"]["name"] in broken:
            raise broken[w["metadata"]["name"]]
        return real(w, *args, **kwargs)

    monkeypatch.setattr(fluid, "readiness", readiness)
    return broken


@pytest.mark.parametrize("error", ERRORS)
def test_a_workload_whose_decision_raises_fails_alone_and_is_decided_once_it_stops(poisoned, error):
    pending = [workload("a", gpus=4), workload("bad", gpus=4), workload("c", gpus=4)]
    cluster = Cluster([node("gpu-1")], [], pending, [], [], demand={})
    units = [Pending(w, CHECK, Parameters(), NOW - 10) for w in pending]
    poisoned["bad"] = error
    decisions = decide_all(units, cluster, NOW)
    assert [(d.workload, d.state, bool(d.failed)) for d in decisions] == [
        ("a", "Ready", False),
        ("bad", "Pending", True),
        ("c", "Ready", False),
    ]
    assert type(error).__name__ in decisions[1].failed
    del poisoned["bad"]
    assert [d.state for d in decide_all(units, cluster, NOW)] == ["Ready", "Ready", "Retry"]


RECLAIMING = Parameters(
    inference_headroom=Headroom("scaler:9090", "h200"),
    reclaim=ReclaimParameters(enabled=True),
)


@pytest.mark.parametrize("error", ERRORS)
def test_a_pool_whose_plan_raises_fails_alone_and_never_admits_on_it(monkeypatch, error):
    other = Parameters(
        inference_headroom=Headroom("scaler:9090", "l4"),
        reclaim=ReclaimParameters(enabled=True),
        pool_node_selector={"pool": "l4"},
    )
    real = manager_module.plan_pool  # type: ignore[attr-defined]

    def plan_pool(state: Any, *args: Any) -> Any:
        if state.pool == "h200":
            raise error
        return real(state, *args)

    monkeypatch.setattr("admission.manager.plan_pool", plan_pool)
    nodes = [node("gpu-1"), node("l4-1", labels={"pool": "l4"})]
    a, b = workload("a", gpus=1), workload("b", gpus=1)
    demand = {"h200": PoolDemand("h200", 0, 0), "l4": PoolDemand("l4", 0, 0)}
    cluster = Cluster(
        nodes, [], [a, b], [], [], demand=demand, check_parameters={"h": RECLAIMING, "l": other}
    )
    plans = plan_pools(cluster, NOW)
    assert plans["h"].failed and not plans["h"].plan.known and plans["h"].plan.reclaim == ()
    assert not plans["l"].failed and plans["l"].plan.known
    decisions = decide_all(
        [Pending(a, "h", RECLAIMING, NOW - 10), Pending(b, "l", other, NOW - 10)], cluster, NOW
    )
    assert [(d.workload, d.state, bool(d.failed)) for d in decisions] == [
        ("a", "Pending", True),
        ("b", "Ready", False),
    ]
    monkeypatch.setattr("admission.manager.plan_pool", real)
    assert [d.state for d in decide_all([Pending(a, "h", RECLAIMING, NOW - 10)], cluster, NOW)] == [
        "Ready"
    ]


# --- the controller: one WARNING and a counter per unit, the pass goes on ---------------


class Recording(Controller):
    """A controller whose API writes land in ``written`` (the pass is the real one)."""

    def __init__(self) -> None:
        super().__init__(KubeAccess(), AdmissionConfig(resync=3600), clock=lambda: NOW)
        self.written: list[str] = []

    async def _apply(self, api: Any, resource: Any, name: str, key: str, body: Any) -> bool:
        if name == "workloads":
            entry = body["status"]["admissionChecks"][0]
            self.written.append(f"{key} {entry['state']}")
        return True

    async def _event(self, api: Any, event: Any) -> None:
        return None


def view(controller: Controller, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    check = {
        "metadata": {"name": CHECK},
        "spec": {"controllerName": controller.name},
        "status": {"conditions": [{"type": "Active", "status": "True"}]},
    }
    pending = [workload(n, gpus=4) for n in ("a", "bad", "c")]
    for i, obj in enumerate([*nodes, *pods]):
        obj["metadata"]["resourceVersion"] = str(i + 1)
    controller._changed("admissionchecks", {CHECK: check})
    controller._changed("workloads", {f"train/{w['metadata']['name']}": w for w in pending})
    controller._changed("nodes", {n["metadata"]["name"]: n for n in nodes})
    controller._changed("pods", {p["metadata"]["name"]: p for p in pods})


def counted(controller: Controller, name: str, **labels: str) -> float:
    value = controller.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_a_pass_with_a_hostile_node_pod_and_workload_decides_all_the_others(poisoned, caplog):
    controller = Recording()
    bad_pod = running("bad", "gpu-2", range(1))
    bad_pod["metadata"]["annotations"][names.HAMI_DEVICES_ALLOCATED] = f"G,N,{HUGE},1:;"
    view(controller, [with_register("bad", DEEP), node("gpu-1"), node("gpu-2")], [bad_pod])
    poisoned["bad"] = KeyError("value")
    with caplog.at_level(logging.WARNING, logger="admission.controller"):
        await controller.reconcile(api=NO_API)
        assert controller.written == ["train/a Ready", "train/c Ready"]
        await controller.reconcile(api=NO_API)  # the same failures again: no second WARNING
        # HAMi rewrites the handshake: a new version with the same bad register, no WARNING
        again = with_register("bad", DEEP)
        again["metadata"]["resourceVersion"] = "99"
        controller._changed("nodes", {**controller.watched["nodes"].objects, "bad": again})
        await controller.reconcile(api=NO_API)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3, warnings
    assert any(w.startswith("node/bad: ") for w in warnings)
    assert any(w.startswith("pod/serve/bad: ") for w in warnings)
    assert any("workload train/bad check capacity" in w and "KeyError" in w for w in warnings)
    unreadable_total = "unitscale_admission_unreadable_objects_total"
    assert counted(controller, unreadable_total, kind="node") == 1
    assert counted(controller, unreadable_total, kind="pod") == 1
    failures = "unitscale_admission_unit_failures_total"
    assert counted(controller, failures, unit="workload") == 3  # one per failed round
    del poisoned["bad"]
    controller.written.clear()
    await controller.reconcile(api=NO_API)
    assert "train/bad Ready" in controller.written  # the unit recovers


class FailingWrites(Recording):
    """Writes to the workloads in ``broken`` raise their exception."""

    def __init__(self) -> None:
        super().__init__()
        self.broken: dict[str, BaseException] = {}

    async def _apply(self, api: Any, resource: Any, name: str, key: str, body: Any) -> bool:
        if key in self.broken:
            raise self.broken[key]
        return await super()._apply(api, resource, name, key, body)


@pytest.mark.parametrize("error", ERRORS)
async def test_a_write_that_raises_fails_alone_and_lands_once_it_stops(error, caplog):
    controller = FailingWrites()
    view(controller, [node("gpu-1"), node("gpu-2")], [])
    controller.broken["train/bad"] = error
    with caplog.at_level(logging.WARNING, logger="admission.controller"):
        await controller.reconcile(api=NO_API)
    assert controller.written == ["train/a Ready", "train/c Ready"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "write train/bad check capacity" in warning and type(error).__name__ in warning
    assert counted(controller, "unitscale_admission_unit_failures_total", unit="write") == 1
    controller.broken.clear()
    controller.written.clear()
    await controller.reconcile(api=NO_API)
    assert "train/bad Ready" in controller.written


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"[]", id="a JSON list"),
        pytest.param(b"null", id="null"),
        pytest.param(b'"ok"', id="a JSON string"),
        pytest.param(b"<html>a proxy</html>", id="no JSON at all"),
        pytest.param(b'{"metadata": {"name": "other", "namespace": "train"}}', id="another object"),
    ],
)
async def test_a_status_write_answered_with_no_object_fails_alone_and_every_pass_still_reads(
    tmp_path, answer
):
    """Hostile pass 12: a 2xx answer of ``[]`` to a Workload's status apply was kept as
    its fresher copy, and every later view (each pass, each /metrics) raised until a
    restart; a non-JSON one to a check's Active write failed every pass whole."""

    async def handle(request: Any) -> Any:
        return web.Response(body=answer, content_type="application/json")

    controller = Controller(KubeAccess(), AdmissionConfig(resync=3600), clock=lambda: NOW)
    w = workload("w", gpus=4)
    w["metadata"]["resourceVersion"] = "5"
    controller._changed("workloads", {"train/w": w})
    body = {"metadata": {"name": "w", "namespace": "train"}, "status": {}}
    async with api_server(tmp_path, handle) as access, await access.client() as api:
        landed = await controller._apply(api, WORKLOADS, "workloads", "train/w", body)
    assert landed == answer.startswith(b'{"metadata"')  # another object's answer: landed
    assert controller._fresh == {}
    later = {**w, "metadata": {**w["metadata"], "resourceVersion": "6"}}
    controller._changed("workloads", {"train/w": later})
    assert controller.snapshot().workloads["train/w"] is later


async def test_a_check_whose_parameters_raise_is_inactive_and_the_pass_goes_on(monkeypatch, caplog):
    def check_parameters(check: Any, objects: Any) -> Parameters:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("admission.controller.params.check_parameters", check_parameters)
    controller = Recording()
    view(controller, [node("gpu-1")], [])
    with caplog.at_level(logging.WARNING, logger="admission.controller"):
        await controller.reconcile(api=NO_API)
    assert controller.written == []  # no usable check: nothing is decided on it
    assert any("check capacity" in r.getMessage() for r in caplog.records)
    assert counted(controller, "unitscale_admission_unit_failures_total", unit="check") == 1


# --- a pod template's size and shares (class 5, class 3) --------------------------------


def with_containers(
    w: dict[str, Any], limits: Mapping[str, str], n: int, field: str = "containers"
) -> dict[str, Any]:
    spec = w["spec"]["podSets"][0]["template"]["spec"]
    spec[field] = [{"name": f"c{i}", "resources": {"limits": dict(limits)}} for i in range(n)]
    return w


ONE_GPU = {names.GPU: "1"}
ONE_SHARE = {names.GPU: "1", names.GPU_MEMORY_PERCENT: "10", names.GPU_CORES: "1"}


def decide_one(w: dict[str, Any], nodes: list[dict[str, Any]]) -> Any:
    (decision,) = decide_all(
        [Pending(w, CHECK, Parameters(), NOW - 10)],
        Cluster(nodes, [], [w], [], [], demand={}),
        NOW,
    )
    return decision


@pytest.mark.parametrize(
    ("field", "n"),
    [
        pytest.param("containers", MAX_GPU_CONTAINERS + 1, id="one gpu container past the limit"),
        pytest.param("containers", 10_000, id="ten thousand gpu containers are refused at once"),
        pytest.param("initContainers", MAX_GPU_CONTAINERS + 1, id="init containers count apart"),
    ],
)
def test_a_template_past_the_gpu_container_limit_is_rejected_naming_it(field, n):
    w = with_containers(workload("wide", pods=MAX_GANG_PODS), ONE_GPU, n, field)
    with pytest.raises(ValueError, match=f"{field}: more than the {MAX_GPU_CONTAINERS}"):
        workload_demand(w)
    decision = decide_one(w, [node("gpu-1")])
    assert decision.state == "Rejected"
    assert f"more than the {MAX_GPU_CONTAINERS} GPU containers" in decision.message


def test_a_template_at_the_gpu_container_limit_is_read():
    w = with_containers(workload("wide"), ONE_GPU, MAX_GPU_CONTAINERS)
    with_containers(w, ONE_GPU, MAX_GPU_CONTAINERS, "initContainers")
    (demand,) = workload_demand(w)
    assert len(demand.pod.containers) == len(demand.pod.init_containers) == MAX_GPU_CONTAINERS


def test_pods_of_many_alike_containers_are_bounded_by_the_slots_they_need_together():
    """16 one-share containers need 16 of a node's 80 slots: five pods, not eighty, a node."""
    w = with_containers(workload("wide", pods=11), ONE_SHARE, MAX_GPU_CONTAINERS)
    (demand,) = workload_demand(w)
    devices = inventory([node("gpu-1")], [], now=NOW).nodes[0].devices
    assert fit._node_bound(devices, demand.pod) == 5
    # 11 pods on two nodes: never fits, known from the bounds (this search took minutes)
    ever = fits_ever([demand], inventory([node("gpu-1"), node("gpu-2")], [], now=NOW))
    assert not ever.fits and not ever.undecided
    assert "10 of 11 pods fit" in ever.reason


def test_pods_of_many_unlike_containers_end_undecided_within_the_budget():
    """Containers of 16 sizes share a node's cards in many ways: visits are bounded too."""
    w = workload("unlike", pods=9)
    spec = w["spec"]["podSets"][0]["template"]["spec"]
    spec["containers"] = [
        {
            "name": f"c{i}",
            "resources": {"limits": {names.GPU: str(1 + i % 4), names.GPU_MEMORY: str(1000 + i)}},
        }
        for i in range(MAX_GPU_CONTAINERS)
    ]
    demand = workload_demand(w)
    result = fit_gang(demand, inventory([node("gpu-1")], [], now=NOW), budget=50)
    assert not result.fits and result.undecided


@pytest.mark.parametrize(
    ("value", "words"),
    [
        pytest.param(
            ",".join(f"T{i}" for i in range(40_000)) + ",H200",
            f"lists 40001 types, more than the {MAX_GPU_TYPES}",
            id="forty thousand types are refused naming the annotation",
        ),
        pytest.param(
            "H" * (MAX_GPU_TYPE_CHARS + 1),
            f"longer than {MAX_GPU_TYPE_CHARS} characters",
            id="a type longer than any card model is refused",
        ),
    ],
)
@pytest.mark.parametrize("key", [names.HAMI_USE_GPUTYPE, names.HAMI_NOUSE_GPUTYPE])
def test_a_gpu_type_list_past_the_caps_is_rejected_naming_the_annotation(key, value, words):
    w = workload("typed", pods=1000, gpus=1, template_annotations={key: value})
    decision = decide_one(w, [node(f"gpu-{i}") for i in range(100)])
    assert decision.state == "Rejected"
    assert key in decision.message and words in decision.message
    assert len(decision.message) < 300


def test_a_gpu_type_list_at_the_caps_is_read_and_decided_once_per_card_type():
    types = ",".join(f"T{i:0{MAX_GPU_TYPE_CHARS - 1}d}" for i in range(MAX_GPU_TYPES - 1))
    w = workload("typed", gpus=1, template_annotations={names.HAMI_USE_GPUTYPE: f"{types},H200"})
    (demand,) = workload_demand(w)
    assert len(demand.pod.use_types) == MAX_GPU_TYPES
    assert decide_one(w, [node("gpu-1")]).state == "Ready"
    assert demand.pod._accepted == {}
    card = inventory([node("gpu-1")], [], now=NOW).nodes[0].devices[0].device
    assert demand.pod.accepts(card) and demand.pod._accepted == {card.type: True}


@pytest.mark.parametrize(
    ("limits", "words"),
    [
        pytest.param(
            {names.GPU_MEMORY_PERCENT: "-100"},
            "nvidia.com/gpumem-percentage '-100' is not a whole number 1 to 100",
            id="a negative memory percentage reserves nothing and is refused",
        ),
        pytest.param(
            {names.GPU_MEMORY_PERCENT: "1000"},
            "gpumem-percentage '1000' is not a whole number 1 to 100",
            id="a percentage above a hundred is refused",
        ),
        pytest.param(
            {names.GPU_MEMORY_PERCENT: "0"},
            "gpumem-percentage '0' is not",
            id="no memory at all is refused",
        ),
        pytest.param(
            {names.GPU_MEMORY_PERCENT: "50m"},
            "gpumem-percentage '50m' is not",
            id="a fraction of a percent is refused",
        ),
        pytest.param(
            {names.GPU_CORES: "-5"},
            "nvidia.com/gpucores '-5' is not a whole number >= 0",
            id="negative cores are refused",
        ),
        pytest.param(
            {names.GPU_CORES: "lots"},
            "gpucores 'lots' is not",
            id="cores that are no number are refused",
        ),
    ],
)
def test_a_share_out_of_range_rejects_the_workload_naming_the_resource(limits, words):
    w = with_containers(workload("odd"), {names.GPU: "1", **limits}, 1)
    decision = decide_one(w, [node("gpu-1", cards=1)])
    assert decision.state == "Rejected"
    assert words in decision.message and "podSet workers: containers 'c0'" in decision.message


def test_a_negative_percentage_never_lets_two_full_card_gangs_onto_one_card():
    def gang(name: str, percent: str) -> dict[str, Any]:
        limits = {names.GPU: "1", names.GPU_MEMORY_PERCENT: percent, names.GPU_CORES: "0"}
        return with_containers(workload(name), limits, 1)

    pending = [gang("a-neg", "-100"), gang("b-full", "100"), gang("c-full", "100")]
    decisions = decide_all(
        [Pending(w, CHECK, Parameters(), NOW - 10) for w in pending],
        Cluster([node("gpu-1", cards=1)], [], pending, [], [], demand={}),
        NOW,
    )
    assert [d.state for d in decisions] == ["Rejected", "Ready", "Retry"]


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_any_whole_percentage_is_read_within_bounds_or_refused(percent):
    limits = {names.GPU: "1", names.GPU_MEMORY_PERCENT: str(percent)}
    try:
        request = requests.container_request({"name": "c", "resources": {"limits": limits}})
    except ValueError as err:
        assert not 1 <= percent <= 100
        assert names.GPU_MEMORY_PERCENT in str(err)
    else:
        assert request is not None and request.memory_percent == percent
