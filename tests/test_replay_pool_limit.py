"""A stepwise replay whose replicas compete for a shared pool's accelerators (issue #19).

``Simulation`` advanced in steps is ``simulate``; a limit leaves replicas beyond it
pending (in the Deployment's count, holding nothing, costing nothing) until it allows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.replica_model import LLAMA3_8B_H200
from replay.policies import Policy, Scheduled, StaticPeak, unitscale_policy
from replay.simulate import Result, SimConfig, Simulation, cold_start_seconds, simulate
from replay.trace import Trace
from scaler.core.model import Policy as CorePolicy
from scaler.core.tiers import StandbyPolicy

CONFIG = SimConfig(LLAMA3_8B_H200, max_replicas=8, tail=120.0)
COLD = cold_start_seconds(LLAMA3_8B_H200, "local-disk")
WAKE = LLAMA3_8B_H200.wake_seconds(1)
PENDING_KEYS = {"pending_replica_seconds", "max_pending"}


def steady(rate: float, seconds: float, start: float = 0.0) -> Trace:
    """``rate`` requests a second of 512-token prompts and 16-token outputs."""
    n = int(rate * seconds)
    arrival = start + np.arange(n) / rate
    return Trace("steady", arrival, np.full(n, 512, np.int64), np.full(n, 16, np.int64))


def two_bursts() -> Trace:
    """A minute at 1 request/s, 400 s of nothing (the replica sleeps), then 30 s more."""
    first = steady(1, 60)
    second = steady(1, 30, start=460.0)
    return Trace(
        "two-bursts",
        np.r_[first.arrival, second.arrival],
        np.r_[first.prompt, second.prompt],
        np.r_[first.output, second.output],
    )


def fingerprint(result: Result) -> str:
    """Every number a result holds, hashed: equal fingerprints are bit-identical runs."""
    digest = hashlib.sha256()
    digest.update(json.dumps(result.metrics, sort_keys=True).encode())
    digest.update(json.dumps(result.series, sort_keys=True).encode())
    digest.update(json.dumps(result.decisions).encode())
    for values in (result.ttft, result.e2e, result.met, result.slo_ratio):
        digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()


def without_pending(result: Result) -> Result:
    """The result as an unlimited run reports it (no pending series or metrics)."""
    metrics = {k: v for k, v in result.metrics.items() if k not in PENDING_KEYS}
    series = {k: v for k, v in result.series.items() if k != "pending"}
    return dataclasses.replace(result, metrics=metrics, series=series)


def first_sample(result: Result, series: str, value: float) -> float:
    """The time of the first 10 s sample at which ``series`` reached ``value``."""
    return next(
        t for t, v in zip(result.series["t"], result.series[series], strict=True) if v >= value
    )


@dataclass(frozen=True)
class Seen:
    """The Deployment as the pool sees it just before a limit changes."""

    now: float
    held: int
    pending: int
    wanted: int


@dataclass(frozen=True)
class Run:
    result: Result
    seen: list[Seen]
    unlimited: Result
    """The same replay under ``simulate`` (no limit)."""


def replay(
    trace: Trace,
    policy: Callable[[], Policy],
    limits: list[tuple[float | None, int | None]],
    config: SimConfig = CONFIG,
) -> Run:
    """Run to each ``(time, limit)`` (None: before the first tick), set it, then to the end."""
    sim = Simulation(trace, policy(), config)
    seen = []
    for at, limit in limits:
        if at is not None:
            sim.advance(at)
        seen.append(Seen(sim.now, sim.accelerators_held(), sim.pending(), sim.replicas_wanted()))
        sim.set_accelerator_limit(limit)
    sim.advance(math.inf)
    assert sim.finished
    unlimited = simulate(trace, policy(), config)
    return Run(sim.result(), seen, unlimited)


def unitscale() -> Policy:
    return unitscale_policy(16, CONFIG.max_replicas)


def no_limit_is_simulate(run: Run) -> None:
    assert fingerprint(run.result) == fingerprint(run.unlimited)
    assert "pending" not in run.result.series
    assert not PENDING_KEYS & set(run.result.metrics)


def a_limit_never_reached_only_adds_the_pending_report(run: Run) -> None:
    assert fingerprint(without_pending(run.result)) == fingerprint(run.unlimited)
    m = run.result.metrics
    assert m["pending_replica_seconds"] == 0.0 and m["max_pending"] == 0
    assert run.result.series["pending"] == [0.0] * len(run.result.series["t"])


def nothing_starts_and_nothing_is_billed(run: Run) -> None:
    m = run.result.metrics
    assert m["gpu_hours"] == 0.0 and m["cost"] == 0.0 and m["cold_starts"] == 0
    assert m["dropped"] == m["requests"] > 0
    # the Deployment asked (the replicas series counts pending ones) and kept waiting
    assert m["max_pending"] >= 1 and m["max_replicas"] == m["max_pending"]
    assert m["pending_replica_seconds"] > 0.9 * (run.result.series["t"][-1] - 1.0)
    assert run.result.series["ready"] == [0.0] * len(run.result.series["t"])


def the_cold_start_counts_from_the_raise(run: Run) -> None:
    raised = run.seen[-1]
    assert raised.held == 0 and raised.pending == 1 and raised.wanted == 1
    m = run.result.metrics
    assert m["cold_starts"] == 1 and m["dropped"] == 0
    # the first request (arrived at 0) waited for the raise, then a whole cold start
    assert raised.now + COLD <= run.result.ttft[0] <= raised.now + COLD + 1.0
    # billed from the raise, not from the request
    assert m["gpu_hours"] * 3600.0 <= run.result.series["t"][-1] - raised.now + 10.0
    assert raised.now + COLD <= first_sample(run.result, "ready", 1) <= raised.now + COLD + 10.0
    assert m["pending_replica_seconds"] == pytest.approx(raised.now, abs=1.0)


def the_running_replicas_keep_serving(run: Run) -> None:
    lowered = run.seen[-1]
    assert lowered.held == 2 and lowered.pending == 0
    assert fingerprint(without_pending(run.result)) == fingerprint(run.unlimited)
    assert run.result.metrics["dropped"] == 0


def pending_replicas_go_first(run: Run) -> None:
    before = run.seen[-1]
    assert (before.held, before.pending, before.wanted) == (2, 1, 3)
    m = run.result.metrics
    # 3 -> 2 dropped the pending replica: the two ready ones kept serving, nothing
    # restarted (draining a ready one first would have cold-started the pending one)
    assert m["cold_starts"] == 0 and m["max_pending"] == 1
    assert run.result.series["pending"][-1] == 0.0
    # the pending one cost nothing: unlimited, the third replica ran its first 20 s
    saved = (run.unlimited.metrics["gpu_hours"] - m["gpu_hours"]) * 3600.0
    assert saved == pytest.approx(20.0, abs=1.0)  # plus its drain of in-flight requests


def the_start_waits_too(run: Run) -> None:
    first, lifted = run.seen[1], run.seen[-1]
    assert (first.held, first.pending, first.wanted) == (1, 2, 3)
    assert (lifted.held, lifted.pending, lifted.wanted) == (1, 2, 3)
    m = run.result.metrics
    # the two pending ones cold start once the limit is lifted at 30 s
    assert m["cold_starts"] == 2 and m["max_pending"] == 2
    assert lifted.now + COLD <= first_sample(run.result, "ready", 3) <= lifted.now + COLD + 10.0


def the_wake_waits_for_an_accelerator(run: Run) -> None:
    asleep = run.seen[1]
    assert (asleep.held, asleep.pending) == (0, 0)  # a sleeper holds no accelerator
    raised = run.seen[-1]
    assert raised.pending == 1 and raised.held == 0
    m = run.result.metrics
    assert m["wakes"] == 1 and m["cold_starts"] == run.unlimited.metrics["cold_starts"] == 1
    # the second burst's first request waited for the raise, then a level-1 wake
    second = np.flatnonzero(two_bursts().arrival >= 460.0)[0]
    assert raised.now - 460.0 + WAKE <= run.result.ttft[second] <= raised.now - 460.0 + WAKE + 1.0


TIERED = dataclasses.replace(
    SimConfig(LLAMA3_8B_H200, max_replicas=4, tail=120.0), standby=StandbyPolicy(cache=False)
)

ROWS = [
    pytest.param(
        steady(2, 60), unitscale, [(None, None)], CONFIG, no_limit_is_simulate,
        id="no limit is today's simulate",
    ),
    pytest.param(
        steady(2, 60), unitscale, [(None, 8)], CONFIG,
        a_limit_never_reached_only_adds_the_pending_report,
        id="a limit never reached changes nothing but adds the pending report",
    ),
    pytest.param(
        steady(1, 30), unitscale, [(None, 0)], CONFIG, nothing_starts_and_nothing_is_billed,
        id="a limit of 0 from the start keeps every replica pending, drops requests, costs nothing",
    ),
    pytest.param(
        steady(1, 90), unitscale, [(None, 0), (60.0, 1)], CONFIG,
        the_cold_start_counts_from_the_raise,
        id="a limit raised mid-run starts the pending replica, its cold start from the raise",
    ),
    pytest.param(
        steady(2, 60), lambda: StaticPeak(2), [(None, None), (20.0, 0)], CONFIG,
        the_running_replicas_keep_serving,
        id="lowering the limit below what is held never stops a running replica",
    ),
    pytest.param(
        steady(2, 60), lambda: Scheduled(lambda t: 3 if t < 20.0 else 2),
        [(None, 2), (19.0, 2)], CONFIG, pending_replicas_go_first,
        id="a scale-down removes pending replicas first",
    ),
    pytest.param(
        steady(2, 120), lambda: StaticPeak(3), [(None, 1), (0.0, 1), (30.0, None)], CONFIG,
        the_start_waits_too,
        id="a fleet started beyond a limit set before the first tick waits pending too",
    ),
    pytest.param(
        two_bursts(), lambda: unitscale_policy(16, 4, CorePolicy(idle_grace_seconds=30.0)),
        [(None, None), (400.0, 0), (480.0, 1)], TIERED, the_wake_waits_for_an_accelerator,
        id="a sleeper holds no accelerator and its wake waits for one",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("trace", "policy", "limits", "config", "check"), ROWS)
def test_a_shared_pools_limit(
    trace: Trace,
    policy: Callable[[], Policy],
    limits: list[tuple[float | None, int | None]],
    config: SimConfig,
    check: Callable[[Run], None],
) -> None:
    check(replay(trace, policy, limits, config))


SHORT = steady(2, 30, start=5.0)
SHORT_CONFIG = SimConfig(LLAMA3_8B_H200, max_replicas=4, tail=60.0)
STEPPED: dict[str, tuple[Callable[[], Policy], int]] = {
    "unitscale, from zero": (lambda: unitscale_policy(16, 4), 0),
    "unitscale, warm": (lambda: unitscale_policy(16, 4), 2),
    "a schedule": (lambda: Scheduled(lambda t: 1 if t < 12.0 else 3), 0),
}
WHOLE = {
    name: fingerprint(simulate(SHORT, policy(), SHORT_CONFIG, initial_replicas=initial))
    for name, (policy, initial) in STEPPED.items()
}


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from(sorted(STEPPED)),
    st.lists(
        st.one_of(st.floats(0.01, 25.0), st.integers(0, 40).map(lambda k: k * CONFIG.dt)),
        min_size=1,
        max_size=40,
    ),
)
def test_many_small_advances_are_one_simulate(name: str, steps: list[float]) -> None:
    policy, initial = STEPPED[name]
    sim = Simulation(SHORT, policy(), SHORT_CONFIG, initial_replicas=initial)
    until = 0.0
    for step in steps:
        until += step
        sim.advance(until)
        assert sim.finished or sim.now > until
    sim.advance(math.inf)
    assert sim.finished
    assert fingerprint(sim.result()) == WHOLE[name]


def test_advancing_to_now_runs_that_one_tick() -> None:
    sim = Simulation(SHORT, unitscale_policy(16, 4), SHORT_CONFIG)
    sim.advance(0.0)
    assert sim.now == SHORT_CONFIG.dt


def test_advancing_to_a_time_already_past_runs_no_tick() -> None:
    sim = Simulation(SHORT, unitscale_policy(16, 4), SHORT_CONFIG)
    sim.advance(10.0)
    now = sim.now
    sim.advance(5.0)
    assert sim.now == now and not sim.finished


@pytest.mark.parametrize(
    "limit",
    [
        pytest.param(-1, id="a negative limit is refused"),
        pytest.param(True, id="a boolean is not a count"),
        pytest.param(2.5, id="a fraction is not truncated to a count"),
        pytest.param(math.nan, id="NaN is refused naming the limit"),
    ],
)
def test_a_bad_limit_is_refused_with_a_clear_error(limit: int) -> None:
    sim = Simulation(SHORT, unitscale_policy(16, 4), SHORT_CONFIG)
    with pytest.raises(ValueError, match="accelerator limit"):
        sim.set_accelerator_limit(limit)


def test_advancing_to_nan_is_refused() -> None:
    sim = Simulation(SHORT, unitscale_policy(16, 4), SHORT_CONFIG)
    with pytest.raises(ValueError, match="NaN"):
        sim.advance(math.nan)


def test_the_pool_reads_the_policy_it_passed_in() -> None:
    policy = unitscale_policy(16, 4)
    assert Simulation(SHORT, policy, SHORT_CONFIG).policy is policy


def test_run_tail_keeps_the_fleet_ticking_after_the_last_request() -> None:
    end = SHORT.duration + SHORT_CONFIG.tail
    stopped = simulate(SHORT, unitscale_policy(16, 4), SHORT_CONFIG)
    sim = Simulation(SHORT, unitscale_policy(16, 4), SHORT_CONFIG, run_tail=True)
    sim.advance(math.inf)
    assert sim.finished and sim.now > end
    tail = sim.result()
    # simulate stops at the last request; run_tail samples on to the end of the tail
    assert stopped.series["t"][-1] < SHORT.duration + 10.0 <= end - 10.0 <= tail.series["t"][-1]
    # the same requests, served alike: only the fleet's time after them is added
    assert np.array_equal(tail.ttft, stopped.ttft) and np.array_equal(tail.met, stopped.met)
    assert tail.metrics["gpu_hours"] >= stopped.metrics["gpu_hours"]
