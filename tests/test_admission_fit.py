"""Whether a Kueue Workload's gang fits HAMi's GPUs at once (admission.fit).

Requests are read from pod templates the way HAMi's webhook and scheduler read them;
the fit tables say where each gang lands, and why it does not when it does not, in the
words an SRE reads in the Workload's admission-check message.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission import fit, hami
from admission.fit import (
    fit_gang,
    fits_ever,
    whole_free_gpus,
)
from admission.hami import (
    Device,
    DeviceState,
    Inventory,
    NodeGpus,
    inventory,
)
from admission.requests import (
    GpuRequest,
    PodRequest,
    PodSetDemand,
    pod_request,
    workload_demand,
)
from tests.admission_reference import straightforward
from tests.test_admission_decide import workload as decide_workload

NOW = 1_767_000_000.0
H200 = "NVIDIA-NVIDIA H200"
A100 = "NVIDIA-NVIDIA A100-SXM4-80GB"
H200_MIB = 143771


def uuid(node: str, i: int) -> str:
    return f"GPU-{node}-{i}"


def register(node: str, cards: int = 8, *, type: str = H200, mib: int = H200_MIB) -> str:
    return json.dumps(
        [
            {
                "id": uuid(node, i),
                "index": i,
                "count": 10,
                "devmem": mib,
                "devcore": 100,
                "type": type,
                "mode": "hami-core",
                "health": True,
            }
            for i in range(cards)
        ]
    )


def node(name: str, cards: int = 8, *, type: str = H200, mib: int = H200_MIB, **extra: Any):
    annotations = {
        names.HAMI_NODE_REGISTER: extra.pop("register", None)
        or register(name, cards, type=type, mib=mib),
        names.HAMI_NODE_HANDSHAKE: extra.pop("handshake", "Reported 2025-12-29 09:19:00"),
    }
    return {
        "metadata": {"name": name, "labels": {}, "annotations": annotations},
        "spec": {"unschedulable": extra.pop("unschedulable", False)},
        "status": {},
    }


def holding(name: str, on: str, takes: list[tuple[str, int, int]]) -> dict[str, Any]:
    """A running pod HAMi placed on ``on``, one container holding ``takes``."""
    allocated = "".join(f"{u},NVIDIA,{mem},{cores}:" for u, mem, cores in takes) + ";"
    return {
        "metadata": {
            "name": name,
            "namespace": "serve",
            "uid": f"uid-{name}",
            "annotations": {names.HAMI_VGPU_NODE: on, names.HAMI_DEVICES_ALLOCATED: allocated},
        },
        "spec": {},
        "status": {"phase": "Running"},
    }


def whole(on: str, *cards: int) -> list[tuple[str, int, int]]:
    return [(uuid(on, i), H200_MIB, 100) for i in cards]


def build(nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None) -> Inventory:
    return inventory(nodes, pods or [], now=NOW)


def container(where: str = "limits", name: str = "main", **resources: Any) -> dict[str, Any]:
    keys = {
        "gpu": names.GPU,
        "mem": names.GPU_MEMORY,
        "pct": names.GPU_MEMORY_PERCENT,
        "cores": names.GPU_CORES,
    }
    return {"name": name, "resources": {where: {keys[k]: v for k, v in resources.items()}}}


def template(*containers: dict[str, Any], annotations: dict[str, str] | None = None, init=()):
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"annotations": annotations or {}}, "spec": spec}


def gang(count: int, *containers: dict[str, Any], name: str = "workers", **kw: Any) -> PodSetDemand:
    return PodSetDemand(name=name, count=count, pod=pod_request(template(*containers, **kw)))


def whole_gpus(n: int) -> dict[str, Any]:
    return container(gpu=str(n))


# --- requests as HAMi reads them -------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param(
            container(gpu="1"),
            GpuRequest("main", gpus=1, memory_percent=100, cores=100),
            id="a-bare-gpu-count-takes-whole-cards-exclusively",
        ),
        pytest.param(
            container(gpu="2", mem="40960"),
            GpuRequest("main", gpus=2, memory_mib=40960, cores=0),
            id="a-memory-share-in-mib-shares-the-cores",
        ),
        pytest.param(
            container(mem="40960"),
            GpuRequest("main", gpus=1, memory_mib=40960, cores=0),
            id="memory-without-a-gpu-count-gets-one-gpu-from-the-webhook",
        ),
        pytest.param(
            container(cores="30"),
            GpuRequest("main", gpus=1, memory_percent=100, cores=30),
            id="cores-without-memory-take-all-of-the-memory",
        ),
        pytest.param(
            container(gpu="1", pct="50"),
            GpuRequest("main", gpus=1, memory_percent=50, cores=0),
            id="a-memory-percentage",
        ),
        pytest.param(
            container(gpu="1", pct="100"),
            GpuRequest("main", gpus=1, memory_percent=100, cores=100),
            id="a-hundred-percent-of-memory-is-exclusive",
        ),
        pytest.param(
            container("requests", gpu="2"),
            GpuRequest("main", gpus=2, memory_percent=100, cores=100),
            id="a-count-only-in-requests-is-read-as-hami-reads-it",
        ),
        pytest.param(
            container(gpu="1", mem="1024", pct="50"),
            GpuRequest("main", gpus=1, memory_mib=1024, cores=0),
            id="mib-wins-over-a-percentage",
        ),
        pytest.param(
            container(gpu="1", cores="150"),
            GpuRequest("main", gpus=1, memory_percent=100, cores=100),
            id="cores-above-a-hundred-are-capped-as-hami-caps-them",
        ),
        pytest.param(
            container(gpu=2, mem=40960, cores=50),
            GpuRequest("main", gpus=2, memory_mib=40960, cores=50),
            id="numbers-instead-of-quantity-strings",
        ),
    ],
)
def test_a_container_request_reads_as_hamis_webhook_and_scheduler_read_it(resources, expected):
    assert pod_request(template(resources)).containers == (expected,)


@pytest.mark.parametrize(
    "resources",
    [
        pytest.param(container("requests", mem="40960"), id="memory-only-in-requests-asks-no-gpu"),
        pytest.param(container(gpu="0"), id="zero-gpus-ask-no-gpu"),
        pytest.param(container(gpu="500m"), id="a-fractional-count-asks-no-gpu"),
        pytest.param({"name": "main", "resources": {"limits": {"cpu": "4"}}}, id="a-cpu-container"),
        pytest.param({"name": "main"}, id="a-container-without-resources"),
    ],
)
def test_containers_that_ask_hami_for_no_gpu(resources):
    request = pod_request(template(resources))
    assert request.containers == ()
    assert request.gpus == 0


def test_limits_win_over_requests():
    resources = {
        "name": "main",
        "resources": {"limits": {names.GPU: "2"}, "requests": {names.GPU: "1"}},
    }
    assert pod_request(template(resources)).gpus == 2


def test_type_constraints_come_from_the_template_annotations():
    annotations = {names.HAMI_USE_GPUTYPE: "H200, B200,", names.HAMI_NOUSE_GPUTYPE: "a100"}
    request = pod_request(template(whole_gpus(1), annotations=annotations))
    assert (request.use_types, request.nouse_types) == (("H200", "B200"), ("a100",))


def test_init_containers_are_kept_apart_from_the_containers():
    request = pod_request(template(whole_gpus(4), init=[container(name="warm", gpu="1")]))
    assert [c.container for c in request.init_containers] == ["warm"]
    assert request.gpus == 4


def test_a_workloads_pod_sets_become_the_demand_with_kueue_defaults():
    workload = {
        "spec": {
            "podSets": [
                {"name": "launcher", "template": template({"name": "main"})},
                {"name": "workers", "count": 4, "template": template(whole_gpus(8))},
                {"template": template(whole_gpus(1))},
            ]
        },
        "status": {"admission": {"podSetAssignments": [{"name": "workers", "count": 3}]}},
    }
    demand = workload_demand(workload)
    assert [(d.name, d.count, d.pod.gpus) for d in demand] == [
        ("launcher", 1, 0),
        ("workers", 3, 8),
        ("main", 1, 1),
    ]


# --- the gang fit ----------------------------------------------------------------------


def test_one_pod_with_one_whole_gpu_lands_on_the_only_node():
    result = fit_gang([gang(1, whole_gpus(1))], build([node("gpu-1")]))
    assert result.fits
    (placement,) = result.placements
    assert (placement.pod_set, placement.index, placement.node) == ("workers", 0, "gpu-1")
    ((take,),) = placement.containers
    assert (take.memory_mib, take.cores) == (H200_MIB, 100)
    assert result.gpu_types == (H200,)


def test_a_gang_of_four_eight_gpu_pods_spans_four_free_nodes():
    nodes = [node(f"gpu-{i}") for i in range(1, 6)]
    result = fit_gang(
        [gang(4, whole_gpus(8))], build(nodes, [holding("busy", "gpu-3", whole("gpu-3", 0))])
    )
    assert result.fits, result.reason
    assert sorted(p.node for p in result.placements) == ["gpu-1", "gpu-2", "gpu-4", "gpu-5"]
    assert result.reason == "4 pods fit on 4 nodes: gpu-1, gpu-2, gpu-4, gpu-5"


def test_a_gang_one_node_short_says_how_many_pods_fit():
    nodes = [node(f"gpu-{i}") for i in range(1, 4)]
    annotations = {names.HAMI_USE_GPUTYPE: "H200"}
    result = fit_gang(
        [gang(4, container(gpu="8", mem="100000"), annotations=annotations)], build(nodes)
    )
    assert not result.fits
    assert result.placements == ()
    assert result.reason == (
        "podSet workers: 3 of 4 pods fit; each needs 8 GPUs of 100000 MiB (type H200); "
        "at most 8 such GPUs free on one node"
    )


def test_a_pod_never_splits_its_containers_over_two_nodes():
    nodes = [node("gpu-1"), node("gpu-2")]
    pods = [
        holding("a", "gpu-1", whole("gpu-1", 0, 1, 2, 3)),
        holding("b", "gpu-2", whole("gpu-2", 0, 1, 2, 3)),
    ]
    two_halves = gang(1, container(name="a", gpu="4"), container(name="b", gpu="4"))
    result = fit_gang([two_halves], build(nodes, pods))
    assert not result.fits
    assert "each needs 4 whole GPUs + 4 whole GPUs" in result.reason


def test_memory_shares_pack_three_to_a_card():
    result = fit_gang([gang(12, container(gpu="2", mem="40960"))], build([node("gpu-1")]))
    assert result.fits, result.reason
    per_card: dict[str, int] = {}
    for take in (t for p in result.placements for t in p.takes()):
        per_card[take.uuid] = per_card.get(take.uuid, 0) + 1
    assert sorted(per_card.values()) == [3] * 8
    assert not fit_gang([gang(13, container(gpu="2", mem="40960"))], build([node("gpu-1")])).fits


@pytest.mark.parametrize(
    ("request_", "fits"),
    [
        pytest.param(
            container(gpu="1", pct="40"), True, id="forty-percent-of-a-card-fits-its-free-memory"
        ),
        pytest.param(
            container(gpu="1", pct="50"),
            False,
            id="fifty-percent-of-a-card-is-more-than-it-has-free",
        ),
        pytest.param(container(gpu="1", mem="63771"), True, id="exactly-the-free-mib-fits"),
        pytest.param(container(gpu="1", mem="63772"), False, id="one-mib-more-does-not"),
    ],
)
def test_memory_in_mib_or_as_a_share_of_the_card(request_, fits):
    inv = build([node("gpu-1", cards=1)], [holding("a", "gpu-1", [(uuid("gpu-1", 0), 80000, 10)])])
    assert fit_gang([gang(1, request_)], inv).fits is fits


@pytest.mark.parametrize(
    ("held", "request_", "fits"),
    [
        pytest.param(
            [(10, 10)],
            container(gpu="1"),
            False,
            id="an-exclusive-request-needs-a-card-nobody-uses",
        ),
        pytest.param(
            [(0, 0)],
            container(gpu="1", mem="1024", cores="100"),
            False,
            id="an-exclusive-request-refuses-a-card-whose-only-user-holds-nothing-but-a-slot",
        ),
        pytest.param([], container(gpu="1"), True, id="an-exclusive-request-on-an-untouched-card"),
        pytest.param(
            [(10, 90)],
            container(gpu="1", mem="1024"),
            True,
            id="a-share-without-cores-runs-beside-others",
        ),
        pytest.param(
            [(10, 100)],
            container(gpu="1", mem="1024"),
            False,
            id="a-card-whose-cores-are-all-given-takes-no-share",
        ),
        pytest.param(
            [(10, 60), (10, 60)],
            container(gpu="1", mem="1024"),
            False,
            id="a-card-over-committed-in-cores-takes-no-share-either",
        ),
        pytest.param(
            [(10, 70)],
            container(gpu="1", mem="1024", cores="30"),
            True,
            id="thirty-cores-fit-in-thirty-free",
        ),
        pytest.param(
            [(10, 71)],
            container(gpu="1", mem="1024", cores="30"),
            False,
            id="thirty-cores-miss-twenty-nine-free",
        ),
    ],
)
def test_cores_and_exclusive_cards(held, request_, fits):
    pods = [holding(f"p{i}", "gpu-1", [(uuid("gpu-1", 0), m, c)]) for i, (m, c) in enumerate(held)]
    assert fit_gang([gang(1, request_)], build([node("gpu-1", cards=1)], pods)).fits is fits


def test_a_card_with_every_slot_taken_takes_no_more():
    pods = [holding(f"p{i}", "gpu-1", [(uuid("gpu-1", 0), 1, 1)]) for i in range(10)]
    assert not fit_gang(
        [gang(1, container(gpu="1", mem="1"))], build([node("gpu-1", cards=1)], pods)
    ).fits


@pytest.mark.parametrize(
    ("annotations", "where"),
    [
        pytest.param(
            {names.HAMI_USE_GPUTYPE: "h200"},
            "h200-node",
            id="use-gputype-matches-a-substring-in-any-case",
        ),
        pytest.param(
            {names.HAMI_NOUSE_GPUTYPE: "H200"},
            "a100-node",
            id="nouse-gputype-keeps-the-gang-off-that-type",
        ),
        pytest.param(
            {names.HAMI_USE_GPUTYPE: "A100,H100"}, "a100-node", id="use-gputype-takes-any-of-a-list"
        ),
        pytest.param({names.HAMI_USE_GPUTYPE: "B200"}, None, id="no-card-of-the-type-is-no-fit"),
    ],
)
def test_gpu_type_constraints(annotations, where):
    nodes = [node("a100-node", type=A100, mib=81920), node("h200-node")]
    demand = [gang(2, whole_gpus(4), annotations=annotations)]
    result = fit_gang(demand, build(nodes))
    if where is None:
        assert not result.fits
        assert "(type B200)" in result.reason
        assert not fits_ever(demand, build(nodes)).fits
    else:
        assert {p.node for p in result.placements} == {where}


def test_binpack_fills_the_busier_node_and_spread_the_emptier_one():
    inv = build([node("empty"), node("busy")], [holding("a", "busy", whole("busy", 0))])
    demand = [gang(1, whole_gpus(1))]
    assert [p.node for p in fit_gang(demand, inv, policy="binpack").placements] == ["busy"]
    assert [
        p.node for p in fit_gang(demand, inv, policy="spread", node_policy="spread").placements
    ] == ["empty"]


def test_binpack_shares_the_card_already_shared_and_spread_a_fresh_one():
    inv = build([node("gpu-1", cards=2)], [holding("a", "gpu-1", [(uuid("gpu-1", 1), 1024, 0)])])
    demand = [gang(1, container(gpu="1", mem="1024"))]
    (packed,) = fit_gang(demand, inv, policy="binpack").placements
    (spread,) = fit_gang(demand, inv, policy="spread").placements
    assert [t.uuid for t in packed.takes()] == [uuid("gpu-1", 1)]
    assert [t.uuid for t in spread.takes()] == [uuid("gpu-1", 0)]


def test_an_unknown_policy_is_a_caller_error():
    with pytest.raises(ValueError, match="'mutex'"):
        fit_gang([gang(1, whole_gpus(1))], build([node("gpu-1")]), policy="mutex")


def test_a_packing_the_greedy_pass_misses_is_found_by_the_search():
    # Card 0 has one slot left and the most use, so binpack gives it to the first pod,
    # leaving card 1 too little memory for the second; swapping them fits both.
    cards = json.dumps(
        [
            {
                "id": uuid("n", i),
                "index": i,
                "count": 10,
                "devmem": 100,
                "devcore": 100,
                "type": H200,
                "health": True,
            }
            for i in range(2)
        ]
    )
    pods = [holding(f"s{i}", "n", [(uuid("n", 0), 5, 0)]) for i in range(9)]
    pods.append(holding("big", "n", [(uuid("n", 1), 60, 50)]))
    inv = build([node("n", register=cards)], pods)
    demand = [
        gang(1, container(gpu="1", mem="50"), name="a"),
        gang(1, container(gpu="1", mem="10", cores="50"), name="b"),
    ]
    result = fit_gang(demand, inv)
    assert result.fits, result.reason
    where = {p.pod_set: [t.uuid for t in p.takes()] for p in result.placements}
    assert where == {"a": [uuid("n", 0)], "b": [uuid("n", 1)]}


def test_pods_without_a_gpu_request_fit_trivially():
    demand = [gang(3, {"name": "launcher"}, name="launcher"), gang(1, whole_gpus(1))]
    result = fit_gang(demand, build([node("gpu-1")]))
    assert result.fits
    assert [p.pod_set for p in result.placements] == ["workers"]
    assert fit_gang([gang(2, {"name": "cpu"})], Inventory()).reason == "no pod asks for a GPU"


def test_an_init_container_fits_on_its_own_and_takes_nothing_after():
    request = template(whole_gpus(8), init=[container(name="warm", gpu="1")])
    result = fit_gang([PodSetDemand("workers", 1, pod_request(request))], build([node("gpu-1")]))
    assert result.fits, result.reason
    assert len(list(result.placements[0].takes())) == 8
    too_big = template(whole_gpus(1), init=[container(name="warm", gpu="9")])
    assert not fit_gang([PodSetDemand("w", 1, pod_request(too_big))], build([node("gpu-1")])).fits


def test_a_gang_that_does_not_fit_now_would_fit_an_idle_pool():
    nodes = [node("gpu-1"), node("gpu-2"), node("gpu-3", unschedulable=True)]
    pods = [holding("serve", "gpu-1", whole("gpu-1", 0, 1))]
    demand = [gang(3, whole_gpus(8))]
    now = fit_gang(demand, build(nodes, pods))
    ever = fits_ever(demand, build(nodes, pods))
    assert not now.fits
    assert ever.fits and not ever.undecided


def test_a_gang_that_never_fits_the_pool_says_so():
    demand = [gang(2, whole_gpus(9))]
    result = fits_ever(demand, build([node("gpu-1"), node("gpu-2")]))
    assert not result.fits
    assert result.reason == (
        "never fits the pool (16 GPUs on 2 nodes) even with nothing else running: "
        "podSet workers: 0 of 2 pods fit; each needs 9 whole GPUs; "
        "at most 8 such GPUs free on one node"
    )
    empty = fits_ever(demand, Inventory())
    assert (empty.fits, empty.undecided) == (True, True)
    assert empty.reason.startswith("no HAMi GPU node in the pool")


def test_reserving_a_fitting_gang_leaves_no_room_for_its_twin():
    inv = build([node("gpu-1"), node("gpu-2")])
    demand = [gang(2, whole_gpus(8))]
    first = fit_gang(demand, inv)
    assert first.fits
    after = inv.reserve(first.placements)
    assert not fit_gang(demand, after).fits
    assert whole_free_gpus(after) == 0
    assert whole_free_gpus(inv) == 16


def test_whole_free_gpus_counts_cards_nobody_holds_anything_on():
    pods = [
        holding("a", "gpu-1", [(uuid("gpu-1", 0), 1024, 0)]),
        holding("b", "gpu-1", whole("gpu-1", 1)),
    ]
    assert whole_free_gpus(build([node("gpu-1")], pods)) == 6


def test_a_search_that_runs_out_of_steps_is_undecided_not_a_rejection():
    # Three pods of 2 GPUs on two nodes of 3: 6 GPUs of 6, each pod kind within the
    # pool's bound alone and all within its cards together, yet each node takes one such
    # pod. Only a search refutes it, and with no steps beyond the greedy pass's it cannot.
    inv = build([node(f"gpu-{i}", cards=3) for i in range(2)])
    h200 = {names.HAMI_USE_GPUTYPE: "H200"}
    demand = [gang(2, whole_gpus(2), name="a"), gang(1, whole_gpus(2), name="b", annotations=h200)]
    now = fit_gang(demand, inv, budget=0)
    ever = fits_ever(demand, inv, budget=0)
    assert not now.fits and now.undecided
    assert "could not decide" in now.reason
    assert ever.fits and ever.undecided


WHOLE = GpuRequest("c", 1, memory_percent=100, cores=100)


@pytest.mark.parametrize(
    ("nodes", "demand", "short"),
    [
        pytest.param(
            1_500,
            [
                PodSetDemand("a", 6_000, PodRequest((WHOLE,), use_types=("H200",))),
                PodSetDemand("b", 6_500, PodRequest((WHOLE,))),
            ],
            "need 12,500 whole cards' worth of cores and the cards they may use have 12,000",
            id="two kinds of whole-card pods each within the pool alone, 12,500 of 12,000",
        ),
        pytest.param(
            150,
            [
                PodSetDemand("a", 1_200, PodRequest((GpuRequest("c", 1, 50_000, None, 0),))),
                PodSetDemand(
                    "b",
                    1_200,
                    PodRequest((GpuRequest("c", 1, 100_000, None, 0),), use_types=("H200",)),
                ),
            ],
            "need 180,000,000 MiB of GPU memory and the cards they may use have 172,525,200",
            id="two kinds of memory shares each within the pool alone, not together",
        ),
        pytest.param(
            15,
            [
                PodSetDemand("a", 600, PodRequest((GpuRequest("c", 1, 1, None, 0),))),
                PodSetDemand(
                    "b", 601, PodRequest((GpuRequest("c", 1, 1, None, 0),), use_types=("H200",))
                ),
            ],
            "need 1,201 GPU slots and the cards they may use have 1,200",
            id="two kinds of slivers each within the cards' slots alone, not together",
        ),
    ],
)
def test_a_large_gang_short_of_the_pool_together_is_decided_not_searched(nodes, demand, short):
    # Hostile pass 14: each kind of pod within the pool's bound alone but not together
    # searched to the end of its budget on every pass (2.5 s for fits_ever, as much for
    # fit_gang) and stayed undecided, never rejected. What the gang needs together is
    # checked against what the cards have left before a search.
    pool = inventory([node(f"n{i:04d}") for i in range(nodes)], [], now=NOW)
    now, ever = fit_gang(demand, pool), fits_ever(demand, pool)
    assert not now.fits and not now.undecided, now.reason
    assert not ever.fits and not ever.undecided, ever.reason
    assert short in now.reason and short in ever.reason


KINDS = st.tuples(st.integers(1, 3), st.integers(0, 2), st.booleans())


@settings(max_examples=200, deadline=None)
@given(st.lists(KINDS, min_size=1, max_size=3), st.integers(1, 3))
def test_the_capacity_check_never_refutes_a_gang_that_fits(kinds, nodes):
    # A necessary condition only: whatever it refutes, a search refutes too.
    pool = build([node(f"n{i}", cards=2) for i in range(nodes)])
    demand = []
    for n, (count, share, typed) in enumerate(kinds):
        request = GpuRequest("c", 1 + n % 2, memory_percent=40 * share or 100, cores=30 * share)
        pod = PodRequest((request,), use_types=("H200",) if typed else ())
        demand.append(PodSetDemand(f"p{n}", count, pod))
    keys = pool.columns.keys
    shapes = {id(k): (k, keys.count(k)) for k in keys}
    if fit_gang(demand, pool, budget=100_000).fits:
        assert fit._short_of(fit._items(demand), shapes) == ""


# --- properties ------------------------------------------------------------------------

MIBS = st.sampled_from([100, 200])


@st.composite
def cards(draw: st.DrawFn, node: str) -> tuple[DeviceState, ...]:
    states = []
    for i in range(draw(st.integers(1, 3))):
        split = draw(st.sampled_from([1, 2, 4]))
        mib = draw(MIBS)
        device = Device(
            uuid(node, i),
            i,
            draw(st.sampled_from([H200, A100])),
            split,
            mib,
            100,
            0,
            True,
            "hami-core",
        )
        slots = draw(st.integers(0, split))
        mem = draw(st.integers(0, mib)) if slots else 0
        cores = draw(st.sampled_from([0, 30, 50, 100])) if slots else 0
        states.append(DeviceState(device, slots, mem, cores))
    return tuple(states)


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    nodes = tuple(NodeGpus(f"n{i}", draw(cards(f"n{i}"))) for i in range(draw(st.integers(1, 3))))
    return Inventory(nodes=nodes)


requests = st.builds(
    GpuRequest,
    container=st.just("main"),
    gpus=st.integers(1, 2),
    memory_mib=st.sampled_from([None, 20, 50, 100]),
    cores=st.sampled_from([0, 30, 100]),
).map(lambda r: r if r.memory_mib else GpuRequest(r.container, r.gpus, None, 50, r.cores))

demands = st.lists(
    st.builds(
        PodSetDemand,
        name=st.sampled_from(["a", "b", "c"]),
        count=st.integers(1, 3),
        pod=st.builds(
            PodRequest,
            containers=st.lists(requests, min_size=1, max_size=2).map(tuple),
            use_types=st.sampled_from([(), ("H200",)]),
        ),
    ),
    min_size=1,
    max_size=2,
    unique_by=lambda d: d.name,
)


def within_capacity(inv: Inventory) -> None:
    for n in inv.nodes:
        for d in n.devices:
            assert d.used_slots <= d.device.split_count, d
            assert d.used_memory_mib <= d.device.memory_mib, d
            assert d.used_cores <= d.device.cores, d


@settings(max_examples=150, deadline=None)
@given(inv=inventories(), demand=demands)
def test_reserving_what_fits_and_fitting_again_never_double_books_a_card(inv, demand):
    for _ in range(2):
        result = fit_gang(demand, inv)
        if not result.fits:
            return
        before = {(n.name, d.device.uuid): d for n in inv.nodes for d in n.devices}
        inv = inv.reserve(result.placements)
        within_capacity(inv)
        for placement in result.placements:
            for take in placement.takes():
                if take.cores == 100:
                    assert before[(placement.node, take.uuid)].used_slots == 0


@settings(max_examples=150, deadline=None)
@given(inv=inventories(), demand=demands, data=st.data())
def test_more_free_capacity_never_turns_a_fit_into_a_miss(inv, demand, data):
    result = fit_gang(demand, inv)
    assume(result.fits)
    freed = []
    for n in inv.nodes:
        devices = []
        for d in n.devices:
            keep = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
            slots = int(d.used_slots * keep)
            devices.append(
                DeviceState(
                    d.device,
                    slots,
                    int(d.used_memory_mib * keep) if slots else 0,
                    int(d.used_cores * keep) if slots else 0,
                )
            )
        freed.append(NodeGpus(n.name, tuple(devices)))
    if data.draw(st.booleans()):
        freed.append(NodeGpus("extra", data.draw(cards("extra"))))
    more = fit_gang(demand, Inventory(nodes=tuple(freed)))
    assume(not more.undecided)
    assert more.fits, more.reason


def hami_allows(
    device: Device, held: tuple[int, int, int], request: GpuRequest, pod: PodRequest
) -> bool:
    """HAMi's card checks, written out again for the oracle below."""
    slots, memory, cores = held
    card = device.type.upper()
    if pod.use_types and not any(t.upper() in card for t in pod.use_types):
        return False
    wanted = request.memory_mib or device.memory_mib * (request.memory_percent or 100) // 100
    return (
        slots < device.split_count
        and device.memory_mib - memory >= wanted
        and device.cores - cores >= request.cores
        and not (device.cores == 100 and request.cores == 100 and slots > 0)
        and not (device.cores and cores >= device.cores and request.cores == 0)
    )


_Held = dict[tuple[str, str], tuple[int, int, int]]
"""What each (node, card) holds: slots, MiB, cores."""


def oracle(demand: list[PodSetDemand], inv: Inventory) -> bool:
    """Every way to place every pod, tried one after another (memo on the exact state)."""
    pods = [d.pod for d in demand for _ in range(d.count) if d.pod.containers]
    cards = {(n.name, d.device.uuid): d.device for n in inv.nodes for d in n.devices}
    start = {
        (n.name, d.device.uuid): (d.used_slots, d.used_memory_mib, d.used_cores)
        for n in inv.nodes
        for d in n.devices
    }
    refuted: set[tuple[int, tuple[tuple[int, int, int], ...]]] = set()

    def containers(node: NodeGpus, pod: PodRequest, c: int, held: _Held) -> Iterator[_Held]:
        if c == len(pod.containers):
            yield held
            return
        request = pod.containers[c]
        for chosen in itertools.combinations([d.device.uuid for d in node.devices], request.gpus):
            if all(
                hami_allows(cards[(node.name, u)], held[(node.name, u)], request, pod)
                for u in chosen
            ):
                after = dict(held)
                for u in chosen:
                    slots, memory, cores = after[(node.name, u)]
                    after[(node.name, u)] = (
                        slots + 1,
                        memory + request.memory_on(cards[(node.name, u)]),
                        cores + request.cores,
                    )
                yield from containers(node, pod, c + 1, after)

    def place(i: int, held: _Held) -> bool:
        if i == len(pods):
            return True
        key = (i, tuple(held[k] for k in sorted(held)))
        if key in refuted:
            return False
        for node in inv.nodes:
            for after in containers(node, pods[i], 0, held):
                if place(i + 1, after):
                    return True
        refuted.add(key)
        return False

    return place(0, start)


@settings(max_examples=300, deadline=None)
@given(inv=inventories(), demand=demands)
def test_the_search_finds_a_placement_exactly_when_one_exists(inv, demand):
    result = fit_gang(demand, inv)
    assume(not result.undecided)
    assert result.fits is oracle(demand, inv), result.reason
    held = {
        (n.name, d.device.uuid): (d.used_slots, d.used_memory_mib, d.used_cores)
        for n in inv.nodes
        for d in n.devices
    }
    cards = {(n.name, d.device.uuid): d.device for n in inv.nodes for d in n.devices}
    pods = {(d.name, i): d.pod for d in demand for i in range(d.count)}
    for placement in result.placements:
        pod = pods[(placement.pod_set, placement.index)]
        for request, takes in zip(pod.containers, placement.containers, strict=True):
            assert len({t.uuid for t in takes}) == request.gpus
            for take in takes:
                key = (placement.node, take.uuid)
                assert hami_allows(cards[key], held[key], request, pod)
            for take in takes:
                slots, memory, cores = held[(placement.node, take.uuid)]
                held[(placement.node, take.uuid)] = (
                    slots + 1,
                    memory + take.memory_mib,
                    cores + take.cores,
                )


# --- the shortcuts decide as the plain computation does ---------------------------------


def idle(inv: Inventory) -> Inventory:
    """``inv`` with its pool: every node's cards, none held."""
    pool = tuple(
        NodeGpus(n.name, tuple(DeviceState(d.device) for d in n.devices)) for n in inv.nodes
    )
    return Inventory(nodes=inv.nodes, pool=pool)


single_kind = st.builds(
    lambda pod, counts: [PodSetDemand(f"s{i}", c, pod) for i, c in enumerate(counts)],
    pod=st.builds(
        PodRequest,
        containers=requests.map(lambda r: (r,)),
        use_types=st.sampled_from([(), ("H200",)]),
    ),
    counts=st.lists(st.integers(1, 4), min_size=1, max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(inv=inventories(), demand=st.one_of(single_kind, demands))
def test_fits_ever_answers_as_its_search_does(inv, demand):
    """The pool's shapes answer a gang of one kind of pod as searching the pool does."""
    pool = idle(inv)
    quick = fits_ever(demand, pool)
    with straightforward():
        searched = fits_ever(demand, pool)
    assert quick.fits is searched.fits, (quick.reason, searched.reason)
    if not quick.fits or not searched.placements:
        assert quick == searched
    if not searched.undecided:
        assert searched.fits is oracle(demand, Inventory(nodes=pool.pool))


@settings(max_examples=200, deadline=None)
@given(inv=inventories(), first=demands, second=demands)
def test_a_fit_on_cached_state_equals_the_fit_computed_afresh(inv, first, second):
    """Reserving keeps untouched nodes and their cached keys: the next fit is unchanged."""
    taken = fit_gang(first, inv)
    with straightforward():
        plain = fit_gang(first, inv)
    assert taken == plain
    if taken.fits:
        after = inv.reserve(taken.placements)
        with straightforward():
            assert after == inv.reserve(taken.placements)
        inv = after
    for policy, node_policy in (("binpack", "binpack"), ("spread", "spread")):
        result = fit_gang(second, inv, policy, node_policy=node_policy)
        with straightforward():
            assert result == fit_gang(second, inv, policy, node_policy=node_policy)


@settings(max_examples=100, deadline=None)
@given(inv=inventories(), demand=demands)
def test_a_fit_answers_the_same_when_node_keys_are_no_longer_interned_as_one(inv, demand):
    """Once ``hami.MAX_INTERNED_CARDS`` are kept the table starts again, and equal node keys
    made after it are other objects: a search then tells fewer nodes apart by id, and
    must still give the answer it gives with every key interned once."""
    expected = fit_gang(demand, inv)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hami, "MAX_INTERNED_CARDS", 1)
        patch.setattr(hami._Interned, "keys", {})
        fresh = [NodeGpus(n.name, n.devices) for n in inv.nodes]  # keys made anew
        again = fit_gang(demand, Inventory(tuple(fresh), inv.pool, inv.problems))
    assert again == expected


def test_the_interned_node_keys_hold_at_most_their_bound_of_cards() -> None:
    """The table is bounded by the cards its keys hold, not by keys: a 64-card node's
    key is 64 tuples, and every pod allocated makes a new state (issue 27, pass 9)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hami, "MAX_INTERNED_CARDS", 100)
        patch.setattr(hami._Interned, "keys", {})
        patch.setattr(hami._Interned, "cards", 0)
        held = []
        for used in range(60):  # 60 distinct 8-card states: 480 cards made
            devices = tuple(
                DeviceState(
                    Device(f"u{c}", c, H200, 10, 143_771, 100, 0, True, "hami-core"), 1, used
                )
                for c in range(8)
            )
            held.append(hami.node_key(devices))
            table = hami._Interned.keys
            assert hami._Interned.cards == sum(len(k) for k in table) <= 100
        assert held[-1] in hami._Interned.keys  # the newest is kept after a start again
        assert hami.node_key(devices) is held[-1]  # equal keys are one object


@settings(max_examples=100, deadline=None)
@given(inv=inventories(), demand=demands)
def test_every_key_a_search_remembers_by_id_is_held_while_it_runs(inv, demand):
    """The memo remembers states by their keys' ids. With the interned table starting
    again on every key, a key a search dropped would be freed and its id given to another
    state, which the memo would take for one refuted: every id it remembers must stay a
    key the search holds."""
    searches: list[Any] = []

    class Watched(fit._Search):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            searches.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hami, "MAX_INTERNED_CARDS", 1)
        patch.setattr(hami._Interned, "keys", {})
        patch.setattr(fit, "_Search", Watched)
        fresh = [NodeGpus(n.name, n.devices) for n in inv.nodes]
        fit_gang(demand, Inventory(tuple(fresh), inv.pool, inv.problems))
    for search in searches:
        held = {id(k) for k in (*search.used, *search.start_keys)}
        for _, counts in search.refuted:
            assert {key for key, _ in counts} <= held


@settings(max_examples=100, deadline=None)
@given(inv=inventories(), first=demands, second=demands)
def test_the_node_orders_carried_through_reserves_are_those_a_fresh_sort_gives(inv, first, second):
    """A reserve moves only the nodes it touched in the orders the fit reads; after any
    reserves they are the orders of the same nodes sorted anew (and each name's place)."""
    for demand in (first, second):
        for policy in ("binpack", "spread"):  # the orders worked out before the reserve
            fit_gang(demand, inv, policy, node_policy=policy)
        taken = fit_gang(demand, inv)
        if not taken.fits:
            break
        inv = inv.reserve(taken.placements)
        fresh = Inventory(inv.nodes, inv.pool, inv.problems)
        assert inv.__dict__.keys() >= {"fullest_first", "emptiest_first", "positions"}
        assert inv.fullest_first == fresh.fullest_first
        assert inv.emptiest_first == fresh.emptiest_first
        assert all(inv.node(n.name) is n for n in inv.nodes)


# --- scale (issue 27, hostile pass 3, L6) ----------------------------------------------


class _CountingNames(list):  # type: ignore[type-arg]
    """The search's node names, counting each read: the candidates' order reads them."""

    reads = 0

    def __getitem__(self, index: Any) -> Any:
        _CountingNames.reads += 1
        return super().__getitem__(index)


@pytest.mark.parametrize(
    ("nodes", "pods"),
    [
        pytest.param(100, 200, id="200 pods on 100 nodes"),
        pytest.param(300, 100, id="100 pods on 300 nodes"),
    ],
)
def test_the_nodes_are_ordered_once_and_kept_in_order_not_sorted_again_for_each_pod(
    monkeypatch, nodes, pods
):
    """Sorting every node for every pod made one pass over 2,000 nodes and 50 gangs of
    2,000 pods last minutes; a placement now moves its one node in the order."""
    start = fit._Search.__init__

    def counting(self, *args, **kwargs):
        start(self, *args, **kwargs)
        self.names = _CountingNames(self.names)

    monkeypatch.setattr(fit._Search, "__init__", counting)
    _CountingNames.reads = 0
    pool = build([node(f"gpu-{i:03d}") for i in range(nodes)])
    result = fit_gang([gang(pods, container(gpu="1", mem="70000"))], pool)
    assert result.fits
    assert _CountingNames.reads < nodes * pods // 4  # each pod sorting them read N each


@pytest.mark.parametrize(
    "distinct",
    [pytest.param(True, id="each node a share of its own"), pytest.param(False, id="alike")],
)
def test_a_large_gang_that_fits_one_pod_a_node_is_decided_whatever_the_nodes_states(distinct):
    # Hostile pass 12: binpack tries the nodes it filled first; on 300 nodes each holding
    # a small share of a size of its own none was skipped as a duplicate, the greedy pass
    # spent a visit on each (pods^2/2 in all) and this gang, which fits, was undecided.
    n = 300

    def share(i: int) -> int:  # MiB of card 0 a small tenant holds
        return i + 1 if distinct else 1

    pods = [
        {
            "metadata": {
                "name": f"p{i}",
                "namespace": "s",
                "uid": f"u{i}",
                "annotations": {
                    names.HAMI_VGPU_NODE: f"n{i:04d}",
                    names.HAMI_DEVICES_ALLOCATED: f"GPU-n{i:04d}-0,NVIDIA,{share(i)},0:;",
                },
            },
            "spec": {"nodeName": f"n{i:04d}"},
            "status": {"phase": "Running"},
        }
        for i in range(n)
    ]
    pool = inventory([node(f"n{i:04d}") for i in range(n)], pods, now=NOW)
    result = fit_gang(workload_demand(decide_workload("gang", pods=n, gpus=5)), pool)
    assert result.fits and not result.undecided, result.reason


def test_a_gang_of_more_pods_than_the_search_budget_that_fits_is_decided():
    # Hostile pass 13: the greedy pass's one placement a pod counted against the budget,
    # so every gang over 5,000 pods (MAX_GANG_PODS is 10,000) was undecided on an empty pool.
    pods = fit.DEFAULT_BUDGET + 1
    pool = inventory([node(f"n{i:04d}") for i in range(pods // 8 + 1)], [], now=NOW)
    result = fit_gang(workload_demand(decide_workload("gang", pods=pods, gpus=1)), pool)
    assert result.fits and not result.undecided, result.reason
