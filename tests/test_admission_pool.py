"""The capacity manager's core: training's allowance on a pool, and what to take back.

Inference is forecast to need whole cards; training may hold the rest. When inference
needs more than it holds and the pool has free, the manager reclaims admitted training
(lowest priority, then most recently admitted) that is preemptible and has run its
minimum time, and only workloads whose eviction frees a whole card.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.pool import (
    Admitted,
    InferenceNeed,
    ManagerPolicy,
    PoolPlan,
    PoolState,
    plan_pool,
    within_allowance,
)

NOW = 1_800_000_000.0
MIN = 60.0
POLICY = ManagerPolicy(reclaim=True, min_run_seconds=10 * MIN)


def job(
    key: str,
    cards: Iterable[str] | Mapping[str, float],
    *,
    priority: int = 0,
    minutes: float = 60,
    preemptible: bool = True,
) -> Admitted:
    """An admitted workload, ``minutes`` after its admission; whole cards unless shares given."""
    shares = dict(cards) if isinstance(cards, Mapping) else dict.fromkeys(cards, 1.0)
    return Admitted(f"team-a/{key}", priority, NOW - minutes * MIN, preemptible, shares)


def pool(
    cards: int, jobs: Sequence[Admitted], others: Mapping[str, float] | None = None
) -> PoolState:
    """The pool's taken shares: the jobs' and ``others`` (inference's, jobs not listed)."""
    taken: dict[str, float] = dict(others or {})
    for workload in jobs:
        for card, share in workload.shares.items():
            taken[card] = taken.get(card, 0.0) + share
    return PoolState(cards=cards, taken=taken, pool="h200")


def gpus(*ids: int) -> list[str]:
    return [f"n0/g{i}" for i in ids]


def inference(*ids: int) -> dict[str, float]:
    return dict.fromkeys(gpus(*ids), 1.0)


def keys(plan: PoolPlan) -> list[str]:
    return [r.key.removeprefix("team-a/") for r in plan.reclaim]


# --- the behaviour table ----------------------------------------------------------------

RISING = [
    job("a", gpus(2, 3), minutes=30),
    job("b", gpus(4, 5), minutes=90),
    job("c", gpus(6), priority=1, minutes=20),
    job("d", gpus(7), minutes=60),
]
HALVES = [
    job("half", {"n0/g2": 0.5}, minutes=20),
    job("kept", {"n0/g2": 0.5}, minutes=90, preemptible=False),
    job("whole", gpus(3), priority=1, minutes=90),
]


@pytest.mark.parametrize(
    ("state", "need", "jobs", "policy", "want", "allowance", "uncovered", "said"),
    [
        pytest.param(
            pool(8, RISING, inference(0, 1)), InferenceNeed(2, 5), RISING, POLICY,
            ["a", "d"], 3, 0, "reclaiming 2 workloads",
            id="inference need rising reclaims the lowest-priority most recent preemptible first",
        ),
        pytest.param(
            pool(8, RISING[:2], inference(0, 1)), InferenceNeed(2, 3.5), RISING[:2], POLICY,
            [], 4, 0, "the 2 more inference needs fit in them: nothing reclaimed",
            id="a burst that fits in the free cards reclaims nothing",
        ),
        pytest.param(
            pool(8, RISING, inference(0, 1)), None, RISING, POLICY,
            [], None, 0, "the inference forecast is missing (scaler unreachable)",
            id="nothing is reclaimed on a missing forecast",
        ),
        pytest.param(
            pool(4, [job("young", gpus(0), minutes=5), job("old", gpus(1), minutes=60)],
                 inference(2, 3)),
            InferenceNeed(2, 3),
            [job("young", gpus(0), minutes=5), job("old", gpus(1), minutes=60)], POLICY,
            ["old"], 1, 0, "reclaiming 1 workload (team-a/old)",
            id="a job younger than its minimum run time is spared",
        ),
        pytest.param(
            pool(4, [job("keep", gpus(0), priority=-1, preemptible=False),
                     job("take", gpus(1), priority=5)], inference(2, 3)),
            InferenceNeed(2, 3),
            [job("keep", gpus(0), priority=-1, preemptible=False),
             job("take", gpus(1), priority=5)], POLICY,
            ["take"], 1, 0, "frees 1 GPU",
            id="a non-preemptible job is never chosen, whatever its priority",
        ),
        pytest.param(
            pool(4, HALVES, inference(0, 1)), InferenceNeed(2, 3), HALVES, POLICY,
            ["whole"], 1, 0, "reclaiming 1 workload (team-a/whole)",
            id="a fractional job sharing a card with a non-chosen job frees nothing, is not chosen",
        ),
        pytest.param(
            pool(4, HALVES[:2], inference(0, 1, 3)), InferenceNeed(3, 4), HALVES[:2], POLICY,
            [], 0, 1, "the 1 preemptible workloads old enough free only 0 whole GPUs",
            id="a half sharing its card with work not reclaimable leaves the shortfall open",
        ),
        pytest.param(
            pool(4, [job("x", {"n0/g2": 0.5}, minutes=20), job("y", {"n0/g2": 0.5})],
                 inference(0, 1, 3)),
            InferenceNeed(3, 4),
            [job("x", {"n0/g2": 0.5}, minutes=20), job("y", {"n0/g2": 0.5})], POLICY,
            ["x", "y"], 0, 0, "frees 1 GPU",
            id="two preemptible halves of one card are reclaimed together",
        ),
        pytest.param(
            pool(8, RISING, inference(0, 1)), InferenceNeed(2, 4), RISING, POLICY,
            ["a"], 4, 0, "reclaiming 1 workload (team-a/a) frees 2 GPUs",
            id="reclaim stops once the shortfall is covered",
        ),
        pytest.param(
            pool(8, RISING, inference(0, 1)), InferenceNeed(2, 5), RISING,
            ManagerPolicy(reclaim=False), [], 3, 3, "reclaim is off: nothing taken back",
            id="reclaim disabled publishes the allowance only",
        ),
        pytest.param(
            pool(8, RISING, inference(0, 1)), InferenceNeed(2, 12), RISING, POLICY,
            ["a", "d", "b", "c"], 0, 4, "preemptible workloads old enough free only 6",
            id="the allowance is never negative, and reclaim takes all it can",
        ),
        pytest.param(
            pool(4, [job("y1", gpus(0), minutes=1), job("y2", gpus(1), minutes=9)],
                 inference(2, 3)),
            InferenceNeed(2, 3),
            [job("y1", gpus(0), minutes=1), job("y2", gpus(1), minutes=9)], POLICY,
            [], 1, 1, "1 GPU still short: all 2 preemptible workloads were admitted less than",
            id="a shortfall with every preemptible job too young says so",
        ),
        pytest.param(
            pool(4, [job("p", gpus(0, 1), preemptible=False)], inference(2, 3)),
            InferenceNeed(2, 3), [job("p", gpus(0, 1), preemptible=False)], POLICY,
            [], 1, 1, "none of the 1 admitted training workloads is preemptible",
            id="a shortfall with nothing preemptible says so",
        ),
        pytest.param(
            pool(4, [], inference(0, 1, 2, 3)), InferenceNeed(4, 5), [], POLICY,
            [], 0, 1, "no training is admitted on the pool",
            id="a shortfall with no training on the pool says so",
        ),
    ],
)  # fmt: skip
def test_the_manager_plans_the_pool(state, need, jobs, policy, want, allowance, uncovered, said):
    plan = plan_pool(state, need, jobs, NOW, policy, missing="scaler unreachable")
    assert keys(plan) == want
    assert plan.allowance == allowance
    assert plan.uncovered == uncovered
    assert said in plan.reason, plan.reason
    assert plan.known is (need is not None)
    assert plan.training_held == pytest.approx(sum(j.cards for j in jobs))


def test_a_reclaim_says_what_kueue_shows_and_what_it_costs():
    jobs = [job("a", gpus(2, 3), minutes=42), job("b", gpus(4), minutes=120)]
    state = pool(5, jobs, inference(0, 1))
    need = InferenceNeed(held=2, needed=5, cost_per_million_tokens=0.42)
    plan = plan_pool(state, need, jobs, NOW, POLICY)
    first, second = plan.reclaim
    assert first.message == (
        "reclaimed for inference on pool h200: it needs 3 more whole GPUs within its forecast "
        "(5 needed, 2 held, 0 free); priority 0, admitted 42 min ago; frees 2 GPUs"
    )
    assert (first.cards_freed, second.cards_freed) == (2, 1)
    assert first.accelerator_hours_lost == pytest.approx(2 * 42 / 60)
    assert second.accelerator_hours_lost == pytest.approx(1 * 2.0)
    assert plan.reclaimed_accelerator_hours == pytest.approx(1.4 + 2.0)
    assert plan.cost_per_million_tokens == 0.42
    assert plan.reason == (
        "pool h200: inference holds 2 and is forecast to need 5 (5 whole) of 5 GPUs, so "
        "training may hold 0 (it holds 3); 0 whole GPUs free; inference needs 3 more: 3 short; "
        "reclaiming 2 workloads (team-a/a, team-a/b) frees 3 GPUs, 3.40 accelerator-hours of "
        "work lost; inference costs 0.42 per million tokens"
    )


def test_halves_reclaimed_together_name_each_other_and_count_the_card_once():
    jobs = [job("x", {"n0/g2": 0.5}, minutes=20), job("y", {"n0/g2": 0.5})]
    plan = plan_pool(pool(3, jobs, inference(0, 1)), InferenceNeed(2, 3), jobs, NOW, POLICY)
    assert [r.cards_freed for r in plan.reclaim] == [0, 1]
    assert plan.reclaim[0].message.endswith("frees 1 GPU together with team-a/y")
    assert plan.reclaim[1].message.endswith("frees 1 GPU together with team-a/x")


def test_a_missing_forecast_reports_no_allowance_and_keeps_the_other_figures():
    jobs = [job("a", gpus(0, 1))]
    plan = plan_pool(pool(4, jobs), None, jobs, NOW, POLICY, missing="scaler unreachable")
    assert plan == PoolPlan(
        known=False,
        allowance=None,
        training_held=2.0,
        free_cards=2,
        shortfall=0,
        reclaim=(),
        reason="pool h200: the inference forecast is missing (scaler unreachable): "
        "no allowance, nothing reclaimed",
        pool="h200",
        cards=4,
    )
    assert plan.needed_cards is None


@pytest.mark.parametrize(
    ("shares", "freed"),
    [
        pytest.param([0.1, 0.2, 0.7], 1, id="shares summing to a card in floats free it"),
        pytest.param([0.1, 0.2, 0.69], 0, id="a hundredth of a card left is not whole"),
    ],
)
def test_a_card_is_whole_again_when_its_shares_are_gone_to_a_millionth(shares, freed):
    jobs = [job(f"s{i}", {"n0/g1": s}, minutes=30 + i) for i, s in enumerate(shares)]
    taken = {"n0/g0": 1.0, "n0/g1": sum(shares) if freed else 1.0}
    state = PoolState(cards=2, taken=taken)
    plan = plan_pool(state, InferenceNeed(1, 2), jobs, NOW, POLICY)
    assert sum(r.cards_freed for r in plan.reclaim) == freed
    assert len(plan.reclaim) == (3 if freed else 0)


def test_a_forecast_a_hair_above_a_whole_number_is_that_number():
    plan = plan_pool(PoolState(8, {}), InferenceNeed(0, 5.0000000001), [], NOW, POLICY)
    assert plan.needed_cards == 5
    assert plan.allowance == 3


# --- what inference holds: the scalers' count or the inventory's -------------------------

STARTING = [job("a", gpus(3), minutes=60)]


def counted(inventory: float | None) -> PoolState:
    """Inference's pods on cards 0-2 (one of them a replica still starting), a job on 3."""
    state = pool(4, STARTING, inference(0, 1, 2))
    return PoolState(state.cards, state.taken, state.pool, inference_cards=inventory)


@pytest.mark.parametrize(
    ("inventory", "want", "said"),
    [
        pytest.param(
            3.0, [], "inference holds 3 (the inventory's cards; the scalers count 2 serving)",
            id="a starting replica is not a shortfall: its card is counted held",
        ),
        pytest.param(
            None, ["a"], "inference holds 2 and is forecast",
            id="without the inventory the scalers' serving count is all there is",
        ),
        pytest.param(
            1.0, ["a"], "inference holds 2 (the scalers' count; the inventory shows 1)",
            id="an inventory below the scalers' count does not lower it",
        ),
    ],
)  # fmt: skip
def test_inference_holds_the_larger_of_the_scalers_and_the_inventorys_count(inventory, want, said):
    plan = plan_pool(counted(inventory), InferenceNeed(held=2, needed=3), STARTING, NOW, POLICY)
    assert keys(plan) == want
    assert said in plan.reason, plan.reason
    assert plan.allowance == 1  # the forecast alone sets it, whichever count is used


# --- headroom for bursts ------------------------------------------------------------------

FULL = [job("a", gpus(4, 5, 6, 7), minutes=60)]


@pytest.mark.parametrize(
    ("policy", "allowance", "headroom", "said"),
    [
        pytest.param(
            POLICY, 12, 0, "of 16 GPUs, so training may hold 12",
            id="no headroom by default: the allowance is the forecast's complement",
        ),
        pytest.param(
            ManagerPolicy(headroom_fraction=0.25), 11, 1,
            "of 16 GPUs, 1 more kept free for bursts, so training may hold 11",
            id="a headroom fraction keeps a share of the forecast more free, rounded up",
        ),
        pytest.param(
            ManagerPolicy(headroom_cards=2), 10, 2, "2 more kept free for bursts",
            id="headroom cards are kept free on top of the forecast",
        ),
        pytest.param(
            ManagerPolicy(headroom_fraction=0.1, headroom_cards=1), 10, 2,
            "2 more kept free for bursts",
            id="a fraction and cards add up (ceil(4 x 1.1) = 5, plus 1)",
        ),
        pytest.param(
            ManagerPolicy(headroom_cards=30), 0, 30, "so training may hold 0",
            id="headroom beyond the pool leaves training nothing, never less",
        ),
    ],
)  # fmt: skip
def test_headroom_lowers_the_allowance(policy, allowance, headroom, said):
    state = pool(16, FULL, inference(0, 1, 2, 3))
    plan = plan_pool(state, InferenceNeed(held=4, needed=4), FULL, NOW, policy)
    assert (plan.allowance, plan.headroom_cards, plan.needed_cards) == (allowance, headroom, 4)
    assert said in plan.reason, plan.reason
    assert plan.reclaim == () and plan.shortfall == 0


def test_headroom_is_never_reclaimed_for():
    # Inference holds what it is forecast to need, no card is free, training sits past the
    # headroom's allowance: the check admits no more, but nothing running is evicted.
    state = pool(8, FULL, inference(0, 1, 2, 3))
    policy = ManagerPolicy(headroom_cards=3, min_run_seconds=0)
    plan = plan_pool(state, InferenceNeed(held=4, needed=4), FULL, NOW, policy)
    assert (plan.allowance, plan.free_cards, plan.shortfall, plan.reclaim) == (1, 0, 0, ())
    assert within_allowance(plan, 1) == (
        False,
        "admitting 1 GPU would take training to 5 of its 1-GPU allowance on pool h200 "
        "(inference forecast to need 4 of 8, 3 more kept for bursts)",
    )
    # A real shortfall is reclaimed for as before, and only it: 2 cards, not 2 + 3.
    short = plan_pool(state, InferenceNeed(held=4, needed=6), FULL, NOW, policy)
    assert (short.shortfall, keys(short)) == (2, ["a"])


# --- the admission check's question -------------------------------------------------------


def _plan(cards: int, needed: float, training: float) -> PoolPlan:
    jobs = [job("t", {f"n0/g{i}": 1.0 for i in range(int(training))})]
    return plan_pool(
        PoolState(cards, dict(jobs[0].shares), pool="h200"),
        InferenceNeed(0, needed),
        jobs,
        NOW,
        ManagerPolicy(reclaim=False),
    )


@pytest.mark.parametrize(
    ("plan", "gang", "admits", "said"),
    [
        pytest.param(
            _plan(64, 8, 54), 4, False,
            "admitting 4 GPUs would take training to 58 of its 56-GPU allowance on pool h200 "
            "(inference forecast to need 8 of 64)",
            id="a gang past the allowance is refused, with the figures",
        ),
        pytest.param(
            _plan(64, 8, 52), 4, True,
            "admitting 4 GPUs keeps training at 56 of its 56-GPU allowance on pool h200 "
            "(inference forecast to need 8 of 64)",
            id="a gang filling the allowance exactly is admitted",
        ),
        pytest.param(
            _plan(64, 8, 10), 0.5, True, "keeps training at 10.5 of its 56-GPU allowance",
            id="a fractional gang counts its share",
        ),
        pytest.param(
            plan_pool(PoolState(8, {}, pool="h200"), None, [], NOW, POLICY, missing="timeout"),
            64, True, "no allowance known: pool h200: the inference forecast is missing (timeout)",
            id="an unknown plan admits and says why",
        ),
    ],
)  # fmt: skip
def test_within_allowance(plan, gang, admits, said):
    ok, reason = within_allowance(plan, gang)
    assert ok is admits
    assert said in reason, reason


@pytest.mark.parametrize("gang", [-1.0, math.nan, math.inf])
def test_within_allowance_refuses_a_gang_size_that_is_no_size(gang):
    with pytest.raises(ValueError, match="gang_cards"):
        within_allowance(_plan(8, 2, 0), gang)


# --- bad input --------------------------------------------------------------------------

A = job("a", gpus(0))


@pytest.mark.parametrize(
    ("state", "need", "jobs", "policy", "match"),
    [
        pytest.param(PoolState(-1, {}), InferenceNeed(0, 1), [], POLICY, "cards",
                     id="a negative card count is refused"),
        pytest.param(PoolState(2, {"n0/g0": 0.0}), InferenceNeed(0, 1), [], POLICY, "taken",
                     id="a taken share of 0 is refused (an untaken card is absent)"),
        pytest.param(PoolState(2, {"n0/g0": 1.5}), InferenceNeed(0, 1), [], POLICY, "taken",
                     id="a taken share above a card is refused"),
        pytest.param(PoolState(2, {}), InferenceNeed(math.nan, 1), [], POLICY, "held",
                     id="a NaN forecast is refused, not read as a number"),
        pytest.param(PoolState(2, {}), InferenceNeed(0, -1), [], POLICY, "needed",
                     id="a negative forecast is refused"),
        pytest.param(PoolState(2, {}, inference_cards=-1.0), InferenceNeed(0, 1), [], POLICY,
                     "inference_cards", id="a negative inventory count is refused"),
        pytest.param(PoolState(2, {}, inference_cards=math.nan), InferenceNeed(0, 1), [],
                     POLICY, "inference_cards", id="a NaN inventory count is refused"),
        pytest.param(PoolState(2, {}), InferenceNeed(0, 1), [],
                     ManagerPolicy(headroom_fraction=-0.1), "headroom_fraction",
                     id="a negative headroom fraction is refused"),
        pytest.param(PoolState(2, {}), InferenceNeed(0, 1), [],
                     ManagerPolicy(headroom_fraction=math.inf), "headroom_fraction",
                     id="an infinite headroom fraction is refused"),
        pytest.param(PoolState(2, {}), InferenceNeed(0, 1), [],
                     ManagerPolicy(headroom_cards=-1), "headroom_cards",
                     id="negative headroom cards are refused"),
        pytest.param(PoolState(2, {}), InferenceNeed(0, 1), [],
                     ManagerPolicy(headroom_cards=1.5), "headroom_cards",  # type: ignore[arg-type]
                     id="headroom in fractions of a card is refused"),
        pytest.param(pool(2, [A]), InferenceNeed(0, 1), [A, A], POLICY, "two admitted",
                     id="two workloads with one key are refused"),
        pytest.param(pool(2, []), InferenceNeed(0, 1), [job("z", {"n0/g0": -0.5})], POLICY,
                     "shares", id="a negative share of a workload is refused"),
        pytest.param(pool(2, []), InferenceNeed(0, 1), [],
                     ManagerPolicy(min_run_seconds=-1), "min_run_seconds",
                     id="a negative minimum run time is refused"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_the_field_named(state, need, jobs, policy, match):
    with pytest.raises(ValueError, match=match):
        plan_pool(state, need, jobs, NOW, policy)


# --- properties ---------------------------------------------------------------------------


@st.composite
def pools(draw: st.DrawFn) -> tuple[PoolState, list[Admitted], InferenceNeed, ManagerPolicy]:
    """A consistent pool: each card free, inference's, one job's, or split between jobs."""
    cards = draw(st.integers(min_value=1, max_value=10))
    count = draw(st.integers(min_value=0, max_value=6))
    shares: list[dict[str, float]] = [{} for _ in range(count)]
    taken: dict[str, float] = {}
    for i in range(cards):
        card = f"n{i // 4}/g{i % 4}"
        kind = draw(st.sampled_from(["free", "other", "whole", "split"] if count else ["free"]))
        if kind == "other":
            taken[card] = draw(st.sampled_from([0.25, 0.5, 1.0]))
        elif kind == "whole":
            shares[draw(st.integers(0, count - 1))][card] = 1.0
            taken[card] = 1.0
        elif kind == "split":
            owners = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=3, unique=True))
            part = draw(st.sampled_from([0.1, 0.25, 1 / 3]))
            for owner in owners:
                shares[owner][card] = part
            extra = draw(st.sampled_from([0.0, 0.0, 0.05]))  # someone else's sliver
            taken[card] = min(1.0, part * len(owners) + extra)
    jobs = [
        Admitted(
            key=f"ns/j{j}",
            priority=draw(st.integers(0, 2)),
            admitted_at=NOW - draw(st.integers(0, 7200)),
            preemptible=draw(st.booleans()),
            shares=held,
        )
        for j, held in enumerate(shares)
        if held
    ]
    held = draw(st.floats(min_value=0, max_value=cards))
    need = InferenceNeed(held, held + draw(st.floats(min_value=0, max_value=cards)))
    policy = ManagerPolicy(reclaim=True, min_run_seconds=draw(st.sampled_from([0, 600, 3600])))
    return PoolState(cards, taken, pool="p"), jobs, need, policy


def whole_after(taken: Mapping[str, float], evicted: Iterable[Admitted]) -> set[str]:
    """The test's own count: cards nothing is left on once ``evicted`` are gone."""
    left = dict(taken)
    touched: set[str] = set()
    for workload in evicted:
        for card, share in workload.shares.items():
            left[card] -= share
            touched.add(card)
    return {card for card in touched if left[card] <= 1e-6}


def eligible(jobs: Sequence[Admitted], policy: ManagerPolicy) -> list[Admitted]:
    return [j for j in jobs if j.preemptible and NOW - j.admitted_at >= policy.min_run_seconds]


@settings(max_examples=400, deadline=None)
@given(pools())
def test_reclaims_free_the_shortfall_whenever_the_eligible_can(case):
    state, jobs, need, policy = case
    plan = plan_pool(state, need, jobs, NOW, policy)
    by_key = {j.key: j for j in jobs}
    chosen = [by_key[r.key] for r in plan.reclaim]
    freed = whole_after(state.taken, chosen)
    freeable = whole_after(state.taken, eligible(jobs, policy))
    assert len(freed) >= min(plan.shortfall, len(freeable))
    assert sum(r.cards_freed for r in plan.reclaim) == len(freed)
    assert plan.uncovered == max(0, plan.shortfall - len(freed))
    if plan.reclaim:
        # It stopped once covered: without the last eviction the shortfall stays open.
        assert len(whole_after(state.taken, chosen[:-1])) < plan.shortfall


@settings(max_examples=300, deadline=None)
@given(pools())
def test_every_reclaimed_workload_is_preemptible_old_enough_and_needed(case):
    state, jobs, need, policy = case
    plan = plan_pool(state, need, jobs, NOW, policy)
    if plan.shortfall == 0:
        assert plan.reclaim == ()
    by_key = {j.key: j for j in jobs}
    assert len({r.key for r in plan.reclaim}) == len(plan.reclaim)
    for reclaim in plan.reclaim:
        workload = by_key[reclaim.key]
        assert workload.preemptible
        assert NOW - workload.admitted_at >= policy.min_run_seconds
        assert not evicted_for_nothing(state, workload, plan, by_key)
    assert plan.allowance is not None and 0 <= plan.allowance <= state.cards


def evicted_for_nothing(
    state: PoolState, workload: Admitted, plan: PoolPlan, by_key: Mapping[str, Admitted]
) -> bool:
    """True when ``workload`` shares no card with what the plan frees: evicted for nothing."""
    freed = whole_after(state.taken, [by_key[r.key] for r in plan.reclaim])
    return freed.isdisjoint(workload.shares)


@settings(max_examples=200, deadline=None)
@given(pools(), st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_input_order(case, rng: random.Random):
    state, jobs, need, policy = case
    items = list(state.taken.items())
    rng.shuffle(items)
    shuffled = list(jobs)
    rng.shuffle(shuffled)
    again = plan_pool(PoolState(state.cards, dict(items), state.pool), need, shuffled, NOW, policy)
    assert again == plan_pool(state, need, jobs, NOW, policy)


@settings(max_examples=200, deadline=None)
@given(pools())
def test_reclaim_off_or_a_missing_forecast_takes_nothing(case):
    state, jobs, need, policy = case
    off = plan_pool(state, need, jobs, NOW, ManagerPolicy(reclaim=False))
    assert off.reclaim == ()
    assert off.uncovered == off.shortfall
    missing = plan_pool(state, None, jobs, NOW, policy, missing="x")
    assert (missing.known, missing.allowance, missing.reclaim) == (False, None, ())


@settings(max_examples=200, deadline=None)
@given(pools(), st.floats(min_value=0, max_value=10))
def test_knowing_more_cards_held_never_reclaims_more(case, extra):
    state, jobs, need, policy = case
    blind = plan_pool(state, need, jobs, NOW, policy)
    inventory = PoolState(state.cards, state.taken, state.pool, need.held + extra)
    seen = plan_pool(inventory, need, jobs, NOW, policy)
    assert seen.shortfall <= blind.shortfall
    assert len(seen.reclaim) <= len(blind.reclaim)
    assert seen.allowance == blind.allowance


@settings(max_examples=200, deadline=None)
@given(pools(), st.floats(min_value=0, max_value=2), st.integers(0, 4))
def test_headroom_only_lowers_the_allowance_and_changes_no_reclaim(case, fraction, cards):
    state, jobs, need, policy = case
    plain = plan_pool(state, need, jobs, NOW, policy)
    padded = ManagerPolicy(policy.reclaim, policy.min_run_seconds, fraction, cards)
    kept = plan_pool(state, need, jobs, NOW, padded)
    assert kept.reclaim == plain.reclaim and kept.shortfall == plain.shortfall
    assert kept.allowance is not None and plain.allowance is not None
    assert 0 <= kept.allowance <= plain.allowance
    assert kept.allowance == max(0, plain.allowance - kept.headroom_cards)
    assert kept.headroom_cards >= cards
