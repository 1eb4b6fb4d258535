"""The standby plan: sleeping replicas and a warm cache besides the running ones."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.replica_model import (
    LLAMA3_8B_H200,
    QWEN25_32B_H200,
    WarmTiers,
    cold_start_seconds,
    warm_tiers,
)
from scaler.core.tiers import StandbyInputs, StandbyPolicy, kept_seconds, plan_standby

TIERS = warm_tiers(LLAMA3_8B_H200, cold_start_seconds(LLAMA3_8B_H200, "local-disk"))
POLICY = StandbyPolicy()
BURST = StandbyPolicy(max_sleeping=16, burst_sleepers=2.0)


def inputs(**changes: object) -> StandbyInputs:
    base = StandbyInputs(
        now=1000.0,
        desired_running=2,
        recent_need=(2.0,) * 10,
        last_activity=1000.0,
        slo_ttft_seconds=2.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_figures_follow_their_derivations() -> None:
    # a level-1 wake: 16.06 GB back at 25 GB/s + 1 s; 32B: 3.6 s (llm-d: ~4 s for Qwen3-32B)
    assert TIERS.sleeping_wake_seconds == pytest.approx(16.06 / 25 + 1)
    assert warm_tiers(QWEN25_32B_H200, 95.0).sleeping_wake_seconds == pytest.approx(3.62, abs=0.01)
    assert TIERS.cache_warm_wake_seconds == pytest.approx(25.29, abs=0.01)
    assert TIERS.cold_wake_seconds == pytest.approx(38.5, abs=0.05)
    assert TIERS.sleeping_per_hour / TIERS.running_per_hour == pytest.approx(0.0206, abs=1e-3)


def test_negative_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="not negative"):
        dataclasses.replace(TIERS, sleeping_wake_seconds=-1.0)
    with pytest.raises(ValueError, match="max_sleeping"):
        StandbyPolicy(max_sleeping=-1)


@pytest.mark.parametrize(
    ("case", "policy", "tiers", "running", "sleeping", "cache"),
    [
        pytest.param(
            inputs(),
            POLICY,
            TIERS,
            2,
            0,
            True,
            id="a steady fleet that never needed more holds no sleeper, but keeps the cache",
        ),
        pytest.param(
            inputs(recent_need=(2.0,) * 8 + (3.0, 4.0)),
            POLICY,
            TIERS,
            2,
            2,
            True,
            id="replicas a burst needed 10% of the window sleep (above the 2% break-even)",
        ),
        pytest.param(
            inputs(recent_need=(2.0,) * 99 + (3.0,)),
            POLICY,
            TIERS,
            2,
            0,
            True,
            id="a replica needed 1% of the window is below the break-even: it does not sleep",
        ),
        pytest.param(
            inputs(recent_need=(2.0,) * 99 + (3.0,)),
            POLICY,
            dataclasses.replace(TIERS, sleeping_per_hour=0.01),
            2,
            1,
            True,
            id="the same rare burst pays for a sleeper whose memory is cheaper",
        ),
        pytest.param(
            inputs(desired_running=0, recent_need=(0.0,) * 10, last_activity=400.0),
            POLICY,
            TIERS,
            0,
            1,
            True,
            id="at zero within the release time the first replica of a return sleeps",
        ),
        pytest.param(
            inputs(desired_running=0, recent_need=(0.0,) * 10, last_activity=-3000.0),
            POLICY,
            TIERS,
            0,
            0,
            False,
            id="idle for the release time holds nothing at all",
        ),
        pytest.param(
            inputs(desired_running=0, recent_need=(0.0,) * 10, last_activity=900.0),
            StandbyPolicy(release_after_seconds=60.0),
            TIERS,
            0,
            0,
            False,
            id="the release time is configurable",
        ),
        pytest.param(
            inputs(
                desired_running=0, recent_need=(0.0,) * 10, last_activity=-3000.0, forecast_peak=2.2
            ),
            POLICY,
            TIERS,
            0,
            3,
            True,
            id="a forecast return holds its replicas asleep even after the release time",
        ),
        pytest.param(
            inputs(recent_need=(2.0,) * 5 + (9.0,) * 5),
            POLICY,
            TIERS,
            2,
            4,
            True,
            id="sleepers are capped by max_sleeping",
        ),
        pytest.param(
            inputs(recent_need=(2.0,) * 5 + (9.0,) * 5),
            StandbyPolicy(sleeping=False),
            TIERS,
            2,
            0,
            True,
            id="with sleeping disabled only the cache is held",
        ),
        pytest.param(
            inputs(recent_need=(2.0,) * 5 + (9.0,) * 5),
            POLICY,
            dataclasses.replace(TIERS, cold_wake_seconds=1.5, cache_warm_wake_seconds=1.0),
            2,
            0,
            False,
            id="a cold start within the TTFT SLO makes every standby pointless",
        ),
        pytest.param(
            inputs(recent_need=(2.0,) * 5 + (9.0,) * 5),
            POLICY,
            dataclasses.replace(TIERS, sleeping_wake_seconds=30.0),
            2,
            0,
            True,
            id="a sleeper that wakes no faster than a cache-warm start is not held",
        ),
        pytest.param(
            inputs(desired_running=3, max_pods=8),
            dataclasses.replace(POLICY, burst_sleepers=2.0, max_sleeping=16),
            TIERS,
            3,
            5,
            True,
            id="sleepers are pods: 3 running and 6 burst sleepers fit 8 pods as 3 + 5",
        ),
        pytest.param(
            inputs(desired_running=8, max_pods=8),
            dataclasses.replace(POLICY, burst_sleepers=2.0, max_sleeping=16),
            TIERS,
            8,
            0,
            True,
            id="a fleet running at its maxReplicas holds no sleeper",
        ),
        pytest.param(
            inputs(desired_running=3, max_pods=20),
            dataclasses.replace(POLICY, burst_sleepers=2.0, max_sleeping=16),
            TIERS,
            3,
            6,
            True,
            id="with room for them the burst sleepers are all held",
        ),
        pytest.param(
            inputs(desired_running=5, recent_pods=((990.0, 18),)),
            BURST,
            TIERS,
            5,
            13,
            True,
            id="a count fallen from 6 to 5 keeps its 18 pods: the drained replica sleeps",
        ),
        pytest.param(
            inputs(desired_running=7, recent_pods=((990.0, 33),), pods_held=22),
            BURST,
            TIERS,
            7,
            15,
            True,
            id="a step up from 6 to 7 of 22 pods takes a sleeper and starts none to keep 16",
        ),
        pytest.param(
            inputs(desired_running=9, recent_pods=((990.0, 33),), pods_held=22),
            BURST,
            TIERS,
            9,
            16,
            True,
            id="a step up to 9 starts what the burst tier wants of its own: 2 per running",
        ),
        pytest.param(
            inputs(desired_running=5, recent_pods=((1000.0 - 1300, 18), (995.0, 15))),
            BURST,
            TIERS,
            5,
            10,
            True,
            id="pods held longer ago than a start is worth (1,225 s) are let go",
        ),
        pytest.param(
            inputs(desired_running=5, recent_pods=((990.0, 40),)),
            BURST,
            TIERS,
            5,
            16,
            True,
            id="pods are kept asleep up to max_sleeping only",
        ),
        pytest.param(
            inputs(desired_running=5, recent_pods=((990.0, 18),), max_pods=15),
            BURST,
            TIERS,
            5,
            10,
            True,
            id="pods are kept within maxReplicas only",
        ),
        pytest.param(
            inputs(desired_running=5, recent_pods=((990.0, 18),), last_activity=1000.0 - 4000),
            BURST,
            TIERS,
            5,
            0,
            False,
            id="idle past the release no pod is kept",
        ),
        pytest.param(
            inputs(desired_running=5, recent_pods=((990.0, 18),)),
            dataclasses.replace(BURST, sleeping=False),
            TIERS,
            5,
            0,
            True,
            id="with sleeping off no pod is kept asleep",
        ),
    ],
)
def test_plan(
    case: StandbyInputs,
    policy: StandbyPolicy,
    tiers: WarmTiers,
    running: int,
    sleeping: int,
    cache: bool,
) -> None:
    plan = plan_standby(case, tiers, policy)
    assert (plan.running, plan.sleeping, plan.cache_warm) == (running, sleeping, cache)
    assert plan.reason.startswith(f"running {running};")


def test_a_pod_is_kept_as_long_as_its_start_costs_in_sleeper_time() -> None:
    """8B from the cache: 25.3 s of a US$ 3.50/h accelerator is what a sleeper's host
    memory costs (US$ 0.0723/h) over 1,225 s."""
    start = TIERS.cache_warm_wake_seconds
    assert kept_seconds(TIERS, start) == pytest.approx(1225, abs=5)
    free = dataclasses.replace(TIERS, sleeping_per_hour=0.0)
    assert kept_seconds(free, start) == float("inf")
    plan = plan_standby(inputs(desired_running=5, recent_pods=((990.0, 18),)), TIERS, BURST)
    assert "18 pods wanted within 1225s" in plan.reason


def test_the_reason_names_the_break_even_and_the_wake() -> None:
    plan = plan_standby(inputs(recent_need=(2.0,) * 8 + (3.0, 4.0)), TIERS, POLICY)
    assert "wake 1.6s" in plan.reason
    assert "2.1% break-even" in plan.reason
    assert "25.3s instead of 38.5s" in plan.reason


needs = st.lists(st.floats(0, 20), min_size=0, max_size=40)
policies = st.builds(
    StandbyPolicy,
    sleeping=st.booleans(),
    cache=st.booleans(),
    max_sleeping=st.integers(0, 8),
    release_after_seconds=st.floats(0, 7200),
)


@settings(deadline=None)
@given(
    desired=st.integers(0, 20),
    need=needs,
    idle=st.floats(0, 10_000),
    forecast=st.none() | st.floats(0, 20),
    policy=policies,
    pods=st.none() | st.integers(1, 30),
    held=st.lists(st.tuples(st.floats(-3000, 1000), st.integers(0, 60)), max_size=6),
    last=st.none() | st.integers(0, 60),
)
def test_never_fewer_running_than_desired_and_sleepers_bounded(
    desired: int,
    need: list[float],
    idle: float,
    forecast: float | None,
    policy: StandbyPolicy,
    pods: int | None,
    held: list[tuple[float, int]],
    last: int | None,
) -> None:
    case = inputs(
        desired_running=desired,
        recent_need=tuple(need),
        last_activity=1000.0 - idle,
        forecast_peak=forecast,
        max_pods=pods,
        recent_pods=tuple(sorted(held)),
        pods_held=last,
    )
    plan = plan_standby(case, TIERS, policy)
    assert plan.running == desired
    assert 0 <= plan.sleeping <= policy.max_sleeping
    if last is not None:
        assert plan.running + plan.sleeping <= max(last, plan.wanted_pods), (
            "pods are kept, never started to be kept"
        )
    if pods is not None:
        assert plan.sleeping <= max(pods - desired, 0), "sleepers are pods within maxReplicas"
    idle_for = case.now - case.last_activity  # as the plan computes it, rounding included
    if idle_for >= policy.release_after_seconds and (forecast is None or forecast <= desired):
        assert (plan.sleeping, plan.cache_warm) == (0, False)


@settings(deadline=None)
@given(
    desired=st.integers(0, 10),
    need=needs,
    cheaper=st.floats(0, 1),
    extra=st.floats(0, 5),
)
def test_more_sleepers_when_sleeping_is_cheaper_or_bursts_are_higher(
    desired: int, need: list[float], cheaper: float, extra: float
) -> None:
    case = inputs(desired_running=desired, recent_need=tuple(need))
    base = plan_standby(case, TIERS, POLICY).sleeping
    cheap = dataclasses.replace(TIERS, sleeping_per_hour=TIERS.sleeping_per_hour * cheaper)
    assert plan_standby(case, cheap, POLICY).sleeping >= base
    burstier = inputs(desired_running=desired, recent_need=tuple(n + extra for n in need))
    assert plan_standby(burstier, TIERS, POLICY).sleeping >= base
