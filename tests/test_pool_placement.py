"""replay.pool.placement: HAMi's binpack and spread, FGD, and FGD's unallocatable GPUs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.pool.cluster import Node, Task, read_nodes, read_tasks
from replay.pool.placement import (
    POLICIES,
    Placement,
    PlacementPolicy,
    Pool,
    TaskMix,
    TaskShape,
)
from tests.shared_data import shared

HALF = TaskMix(((TaskShape(1, 500, ()), 1.0),))
"""A target workload of 0.5-GPU tasks only."""


def node(name: str, gpus: int, model: str = "G2", cpu: int = 64_000, mem: int = 262_144) -> Node:
    return Node(name, model, gpus, cpu, mem)


def task(
    name: str,
    gpus: int = 1,
    milli: int = 1000,
    types: tuple[str, ...] = (),
    cpu: int = 1000,
    mem: int = 1024,
) -> Task:
    return Task(name, 0.0, 60.0, gpus, milli if gpus else 0, types, "BE", cpu, mem)


Where = tuple[str, tuple[tuple[str, int], ...]]


def where(pool: Pool, placement: Placement | None) -> Where | None:
    if placement is None:
        return None
    ids = pool.card_ids()
    return pool.nodes[placement.node].name, tuple((ids[g], m) for g, m in placement.gpus)


TWO_MODELS = (node("a", 2, "T4"), node("b", 2, "G2"))

PLACEMENTS = [
    pytest.param(
        TWO_MODELS,
        [task("load", milli=500, types=("G2",))],
        task("t", milli=250),
        "binpack",
        ("b", (("b/0", 250),)),
        id="binpack fills the fullest node first, on its least free GPU that fits",
    ),
    pytest.param(
        TWO_MODELS,
        [task("load", milli=500, types=("G2",))],
        task("t", milli=250),
        "spread",
        ("a", (("a/0", 250),)),
        id="spread takes the emptiest node",
    ),
    pytest.param(
        (node("a", 2),),
        [task("load", milli=500)],
        task("t", milli=250),
        "spread",
        ("a", (("a/1", 250),)),
        id="spread takes the most free GPU of a node",
    ),
    pytest.param(
        (node("a", 2),),
        [task("load", milli=700)],
        task("t", milli=500),
        "binpack",
        ("a", (("a/1", 500),)),
        id="binpack skips a GPU with too little free for the share",
    ),
    pytest.param(
        (node("a", 2),),
        [task("load", milli=400)],
        task("t", milli=200),
        "binpack",
        ("a", (("a/0", 200),)),
        id="binpack leaves a 0.4-GPU hole (it packs the shared GPU)",
    ),
    pytest.param(
        (node("a", 2),),
        [task("load", milli=400)],
        task("t", milli=200),
        "fgd",
        ("a", (("a/1", 200),)),
        id="fgd avoids leaving a 0.4-GPU hole when the mix has 0.5-GPU tasks",
    ),
    pytest.param(
        (node("a", 2),),
        [task("load", milli=400)],
        task("t", milli=600),
        "fgd",
        ("a", (("a/0", 600),)),
        id="fgd fills the 0.6 left on a shared GPU instead of cutting an idle one to 0.4",
    ),
    pytest.param(
        (node("v", 8, "V100M16"), node("t", 2, "T4")),
        [task("load", milli=100, types=("V100M16",))],
        task("t4-only", types=("T4",)),
        "binpack",
        ("t", (("t/0", 1000),)),
        id="a T4-only task never lands on the busier V100 node",
    ),
    pytest.param(
        (node("v", 8, "V100M16"),),
        [],
        task("t4-only", milli=100, types=("T4",)),
        "fgd",
        None,
        id="a T4-only task does not fit a pool without T4",
    ),
    pytest.param(
        (node("a", 4), node("b", 4)),
        [],
        task("eight", gpus=8),
        "binpack",
        None,
        id="an 8-GPU task does not take 4 + 4 GPUs of two nodes",
    ),
    pytest.param(
        (node("a", 8),),
        [task("load", milli=100)],
        task("eight", gpus=8),
        "fgd",
        None,
        id="an 8-GPU task does not fit a node with one GPU shared",
    ),
    pytest.param(
        (node("a", 8),),
        [],
        task("eight", gpus=8),
        "spread",
        ("a", tuple((f"a/{i}", 1000) for i in range(8))),
        id="an 8-GPU task takes the 8 whole GPUs of one node",
    ),
    pytest.param(
        (node("a", 4),),
        [task("load", milli=500)],
        task("two", gpus=2),
        "binpack",
        ("a", (("a/1", 1000), ("a/2", 1000))),
        id="a 2-GPU task takes whole idle GPUs, never the shared one",
    ),
    pytest.param(
        (node("a", 1),),
        [task("load", milli=100)],
        task("whole"),
        "binpack",
        None,
        id="a whole-GPU task needs an idle GPU, not 0.9 of one",
    ),
    pytest.param(
        (node("a", 2, cpu=8000), node("b", 2)),
        [task("load", milli=500, types=("G2",), cpu=100)],
        task("t", milli=100, cpu=16_000),
        "binpack",
        ("b", (("b/0", 100),)),
        id="the task's CPU must fit the node",
    ),
    pytest.param(
        (node("a", 2, mem=4096),),
        [],
        task("t", milli=100, mem=8192),
        "spread",
        None,
        id="the task's memory must fit the node",
    ),
    pytest.param(
        (node("a", 2),),
        [],
        task("cpu-only", gpus=0),
        "fgd",
        ("a", ()),
        id="a CPU-only task takes a node's CPU and no GPU",
    ),
]


@pytest.mark.parametrize(("nodes", "before", "new", "policy", "expected"), PLACEMENTS)
def test_placement(nodes, before, new, policy, expected):
    pool = Pool.of(nodes)
    for earlier in before:
        assert pool.place(earlier, "binpack", HALF) is not None, earlier
    free = pool.free_milli().copy()
    placement = pool.place(new, policy, HALF)
    assert where(pool, placement) == expected
    if placement is None:
        assert (pool.free_milli() == free).all()  # a miss changes nothing


# Two nodes at the same share (0.5 of one GPU), one with one task on it, one with two.
SAME_SHARE_NODES = (node("one", 1, "T4"), node("two", 1, "G2"))
SAME_SHARE_LOAD = [
    task("x", milli=500, types=("T4",)),
    task("y", milli=250, types=("G2",)),
    task("z", milli=250, types=("G2",)),
]
# One node whose two GPUs are both half free: a/0 holds one task, a/1 two (spread puts
# y and z on the emptier a/1).
SAME_SHARE_GPUS = (node("a", 2),)
SAME_SHARE_GPU_LOAD = [task("x", milli=500), task("y", milli=250), task("z", milli=250)]


@pytest.mark.parametrize(
    ("nodes", "before", "policy", "expected"),
    [
        pytest.param(
            SAME_SHARE_NODES,
            SAME_SHARE_LOAD,
            "binpack",
            ("two", (("two/0", 250),)),
            id="binpack prefers, at equal shares, the node with more tasks (HAMi's slots)",
        ),
        pytest.param(
            SAME_SHARE_NODES,
            SAME_SHARE_LOAD,
            "spread",
            ("one", (("one/0", 250),)),
            id="spread prefers, at equal shares, the node with fewer tasks",
        ),
        pytest.param(
            SAME_SHARE_GPUS,
            SAME_SHARE_GPU_LOAD,
            "binpack",
            ("a", (("a/1", 250),)),
            id="binpack prefers, at equal shares, the GPU with more tasks, not the lower index",
        ),
        pytest.param(
            SAME_SHARE_GPUS,
            SAME_SHARE_GPU_LOAD,
            "spread",
            ("a", (("a/0", 250),)),
            id="spread prefers, at equal shares, the GPU with fewer tasks",
        ),
    ],
)
def test_hamis_slot_term_breaks_equal_shares(nodes, before, policy, expected):
    pool = Pool.of(nodes)
    for earlier in before:
        assert pool.place(earlier, "spread", HALF) is not None, earlier
    assert where(pool, pool.place(task("t", milli=250), policy, HALF)) == expected


@pytest.mark.parametrize("policy", POLICIES)
def test_a_typed_task_lands_only_on_its_models_under_every_policy(policy):
    pool = Pool.of([node(f"n{i}", 2, model) for i, model in enumerate(["V100M16", "T4"] * 3)])
    for i in range(6):
        placement = pool.place(task(f"t{i}", types=("T4",)), policy, HALF)
        assert placement is not None
        assert pool.nodes[placement.node].model == "T4"
    assert pool.place(task("t6", types=("T4",)), policy, HALF) is None


@pytest.mark.parametrize(
    ("nodes", "before", "mix", "expected"),
    [
        pytest.param((node("a", 2), node("b", 8)), [], HALF, 0.0, id="0 on an empty pool"),
        pytest.param(
            (node("a", 2),),
            [task("x"), task("y")],
            HALF,
            0.0,
            id="0 on a full pool",
        ),
        pytest.param(
            (node("a", 2),),
            [task("x", milli=600)],
            HALF,
            0.4,
            id="a 0.4 hole against 0.5-GPU tasks is 0.4 cards",
        ),
        pytest.param(
            (node("a", 2),),
            [task("x", milli=600)],
            TaskMix(((TaskShape(1, 300, ()), 1.0),)),
            0.0,
            id="the same 0.4 is no fragment for 0.3-GPU tasks",
        ),
        pytest.param(
            (node("a", 4),),
            [],
            TaskMix(((TaskShape(8, 1000, ()), 0.5), (TaskShape(1, 500, ()), 0.5))),
            2.0,
            id="an empty node too small for the 8-GPU half of the mix counts half its GPUs",
        ),
        pytest.param(
            (node("a", 2, cpu=4000),),
            [],
            TaskMix(((TaskShape(1, 500, (), cpu_milli=8000), 1.0),)),
            2.0,
            id="a node without the CPU for the class strands its GPUs",
        ),
        pytest.param(
            (node("a", 2, "T4"),),
            [],
            TaskMix(((TaskShape(1, 500, ("V100M16",)), 1.0),)),
            2.0,
            id="a model the class may not use is fragmented for it",
        ),
    ],
)
def test_unallocatable_cards(nodes, before, mix, expected):
    pool = Pool.of(nodes)
    for earlier in before:
        assert pool.place(earlier, "binpack", mix) is not None
    assert pool.unallocatable_cards(mix) == pytest.approx(expected)


def test_release_restores_exactly():
    pool = Pool.of((node("a", 4), node("b", 8, "T4", cpu=32_000)))
    fresh = Pool.of(pool.nodes)
    fresh.unallocatable_cards(HALF)
    steps: list[tuple[Task, PlacementPolicy]] = [
        (task("a", milli=300), "fgd"),
        (task("b", gpus=2), "binpack"),
        (task("c", gpus=0, cpu=5000, mem=7000), "spread"),
        (task("d", milli=800, types=("T4",)), "spread"),
    ]
    placements = [pool.place(t, p, HALF) for t, p in steps]
    assert all(p is not None for p in placements)
    for placement in reversed(placements):
        assert placement is not None
        pool.release(placement)
    assert (pool.free_milli() == 1000).all()
    assert pool.taken() == {} and pool.allocated_cards() == 0
    assert (pool.free_cpu_milli() == fresh.free_cpu_milli()).all()
    assert (pool.free_memory_mib() == fresh.free_memory_mib()).all()
    assert pool.unallocatable_cards(HALF) == fresh.unallocatable_cards(HALF)
    again = task("e", milli=300)
    assert pool.place(again, "fgd", HALF) == fresh.place(again, "fgd", HALF)


def release_twice(pool: Pool, placement: Placement | None) -> None:
    assert placement is not None
    pool.release(placement)
    pool.release(placement)


@pytest.mark.parametrize(
    ("act", "message"),
    [
        pytest.param(
            lambda pool: pool.place(task("t"), "first-fit", HALF),
            "not one of binpack, spread, fgd",
            id="an unknown policy is refused",
        ),
        pytest.param(
            lambda pool: [pool.place(task("t"), "fgd", HALF) for _ in range(2)],
            "placed already",
            id="a task placed twice is refused",
        ),
        pytest.param(
            lambda pool: release_twice(pool, pool.place(task("t"), "fgd", HALF)),
            "not live",
            id="a placement released twice is refused",
        ),
        pytest.param(
            lambda pool: pool.release(Placement("ghost", 0, ((0, 500),))),
            "not live",
            id="a placement never made is refused",
        ),
    ],
)
def test_misuse_is_refused_with_a_clear_error(act, message):
    pool = Pool.of((node("a", 2),))
    with pytest.raises(ValueError, match=message):
        act(pool)


def test_free_milli_is_a_read_only_view():
    pool = Pool.of((node("a", 2),))
    with pytest.raises(ValueError, match="read-only"):
        pool.free_milli()[0] = 0


def test_an_empty_pool_is_refused():
    with pytest.raises(ValueError, match="at least one node"):
        Pool.of(())


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        pytest.param(
            [task("a", milli=500), task("b", milli=500), task("c", gpus=2), task("d", gpus=0)],
            {(1, 500, ()): 2 / 3, (2, 1000, ()): 1 / 3},
            id="popularity of the GPU shapes, CPU-only tasks left out",
        ),
        pytest.param(
            [task(f"t{i}", milli=100 * (1 + i % 3)) for i in range(7)] + [task("x", gpus=8)],
            {(1, 100, ()): 3 / 7, (1, 200, ()): 2 / 7, (1, 300, ()): 2 / 7},
            id="only the top shapes are kept and renormalised",
        ),
    ],
)
def test_task_mix_of(tasks, expected):
    mix = TaskMix.of(tasks, top=3)
    got = {(s.gpus, s.gpu_milli, s.gpu_types): w for s, w in mix.classes}
    assert got == pytest.approx(expected)
    assert sum(got.values()) == pytest.approx(1)


def test_a_mix_class_carries_its_tasks_median_cpu_and_memory():
    mix = TaskMix.of([task(f"t{i}", cpu=1000 * i, mem=10 * i) for i in (1, 2, 9)])
    ((shape, weight),) = mix.classes
    assert (shape.cpu_milli, shape.memory_mib, weight) == (2000, 20, 1.0)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: TaskMix.of([task("cpu", gpus=0)]), id="a mix of no GPU task"),
        pytest.param(lambda: TaskMix(()), id="an empty mix"),
        pytest.param(lambda: TaskMix(((TaskShape(1, 500, ()), 0.5),)), id="weights not 1"),
        pytest.param(lambda: TaskShape(2, 500, ()), id="a shared multi-GPU class"),
    ],
)
def test_a_bad_mix_is_refused(build):
    with pytest.raises(ValueError):
        build()


MODELS = ("G2", "T4")
nodes_strategy = st.lists(
    st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8])), min_size=1, max_size=4
)
task_strategy = st.one_of(
    st.tuples(st.just(1), st.integers(1, 1000)),
    st.tuples(st.sampled_from([0, 2, 4, 8]), st.just(1000)),
).flatmap(
    lambda shape: st.tuples(
        st.just(shape),
        st.sampled_from([(), ("T4",), ("G2", "T4")]),
        st.integers(0, 40_000),
        st.sampled_from(POLICIES),
    )
)


def build(nodes_spec, tasks_spec):
    pool = Pool.of([node(f"n{i}", g, m, cpu=64_000) for i, (m, g) in enumerate(nodes_spec)])
    tasks = [
        task(f"t{i}", gpus=g, milli=milli, types=types, cpu=cpu, mem=cpu)
        for i, ((g, milli), types, cpu, _) in enumerate(tasks_spec)
    ]
    mix = TaskMix.of([*tasks, task("floor", milli=500)])
    return pool, tasks, mix


@settings(max_examples=150, deadline=None)
@given(nodes_strategy, st.lists(task_strategy, max_size=25), st.randoms(use_true_random=False))
def test_place_then_release_in_any_order_is_identity(nodes_spec, tasks_spec, rng):
    pool, tasks, mix = build(nodes_spec, tasks_spec)
    cpu, memory = pool.free_cpu_milli().copy(), pool.free_memory_mib().copy()
    placed = []
    for new, (_, _, _, policy) in zip(tasks, tasks_spec, strict=True):
        placement = pool.place(new, policy, mix)
        if placement is not None:
            placed.append(placement)
            assert len(placement.gpus) == new.gpus
            assert all(milli == new.gpu_milli for _, milli in placement.gpus)
            assert len({g for g, _ in placement.gpus}) == new.gpus
            assert all(pool.nodes[placement.node].gpus > 0 for _ in placement.gpus)
        free = pool.free_milli()
        assert (free >= 0).all() and (free <= 1000).all()
        assert (pool.free_cpu_milli() >= 0).all() and (pool.free_memory_mib() >= 0).all()
        assert pool.allocated_cards() == pytest.approx(sum(p.cards for p in placed))
        assert sum(pool.taken().values()) == pytest.approx(pool.allocated_cards())
        assert 0 <= pool.unallocatable_cards(mix) <= pool.cards - pool.allocated_cards() + 1e-9
    rng.shuffle(placed)
    for placement in placed:
        pool.release(placement)
    assert (pool.free_milli() == 1000).all()
    assert (pool.free_cpu_milli() == cpu).all() and (pool.free_memory_mib() == memory).all()
    assert pool.allocated_cards() == 0 and pool.taken() == {}


@settings(max_examples=150, deadline=None)
@given(nodes_strategy, st.lists(task_strategy, min_size=1, max_size=20))
def test_fgds_choice_never_leaves_more_unallocatable_than_the_others(nodes_spec, tasks_spec):
    # The measure is a sum over nodes, so the choice with the least increase leaves the least.
    _, tasks, mix = build(nodes_spec, tasks_spec)
    history = [(t, spec[3]) for t, spec in zip(tasks[:-1], tasks_spec, strict=False)]
    after = {}
    for policy in POLICIES:
        replica, _, _ = build(nodes_spec, tasks_spec)
        for earlier, how in history:
            replica.place(earlier, how, mix)
        placed = replica.place(tasks[-1], policy, mix)
        after[policy] = None if placed is None else replica.unallocatable_cards(mix)
    if after["fgd"] is None:
        assert after["binpack"] is None and after["spread"] is None
    else:
        assert after["fgd"] <= min(v for v in after.values() if v is not None) + 1e-9


def test_the_typed_trace_lands_every_task_on_an_allowed_model_with_room():
    nodes = read_nodes(shared("traces", "alibaba-gpu-2023", "openb_node_list_gpu_node.csv"), 0.2)
    tasks = read_tasks(shared("traces", "alibaba-gpu-2023", "openb_pod_list_gpuspec33.csv"), 0.2)
    mix = TaskMix.of(tasks)
    pool = Pool.of(nodes)
    before = pool.unallocatable_cards(mix)
    placed = 0
    for new in tasks:
        placement = pool.place(new, "fgd", mix)
        if placement is None:
            continue
        placed += 1
        chosen = pool.nodes[placement.node]
        assert not new.gpu_types or chosen.model in new.gpu_types, new
    assert placed > len(tasks) // 2
    assert (pool.free_cpu_milli() >= 0).all() and (pool.free_memory_mib() >= 0).all()
    assert pool.allocated_cards() > 0.5 * pool.cards
    assert np.isfinite(pool.unallocatable_cards(mix)) and before >= 0
