"""The gateway's pressure wakes (``serving.routing``), and the replay that models them."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.replica_model import LLAMA3_8B_H200, warm_tiers
from replay.policies import StaticPeak
from replay.simulate import SLEEPING, WOKEN, SimConfig, _Replay, simulate
from replay.trace import Trace
from scaler.core.tiers import StandbyInputs, StandbyPolicy, plan_standby
from serving.routing import ReplicaView, WakePressure, choose, sleepers_to_wake


def view(name: str, outstanding: int, surplus: bool = False) -> ReplicaView:
    return ReplicaView(f"http://{name}", True, outstanding, frozenset(), surplus=surplus)


@pytest.mark.parametrize(
    ("args", "wake"),
    [
        pytest.param((0, 0, 0, 0, 0, 8.0), 0, id="at zero with nothing waiting nothing wakes"),
        pytest.param((0, 0, 0, 0, 3, None), 1, id="at zero without pressure one wakes"),
        pytest.param((0, 0, 0, 1, 3, None), 0, id="at zero a wake under way takes the buffer"),
        pytest.param((0, 0, 0, 0, 20, 8.0), 3, id="at zero the buffer wakes one per threshold"),
        pytest.param((4, 7, 30, 0, 0, 8.0), 0, id="one replica below the threshold: no wake"),
        pytest.param((4, 8, 40, 0, 0, 8.0), 1, id="every replica at the threshold wakes one"),
        pytest.param(
            (4, 20, 96, 0, 0, 8.0), 8, id="a burst wakes enough that the load fits the threshold"
        ),
        pytest.param((4, 20, 96, 8, 0, 8.0), 0, id="wakes under way count as replicas there"),
        pytest.param((4, 20, 96, 0, 0, None), 0, id="without a threshold ready replicas wake none"),
        pytest.param(
            (4, 20, 96, 0, 0, 8.0, 6.0),
            12,
            id="a burst wakes enough that the load is back at the fill per replica",
        ),
        pytest.param((4, 7, 30, 0, 0, 8.0, 2.0), 0, id="below the threshold the fill wakes none"),
        pytest.param((0, 0, 0, 0, 20, 8.0, 2.0), 3, id="at zero the fill does not size the wake"),
    ],
)
def test_sleepers_to_wake(args: tuple[int, int, int, int, int, float | None], wake: int) -> None:
    assert sleepers_to_wake(*args) == wake


@given(
    ready=st.integers(1, 64),
    per=st.integers(0, 200),
    waking=st.integers(0, 64),
    threshold=st.floats(1.0, 256.0),
    share=st.floats(0.01, 1.0),
)
def test_woken_and_ready_replicas_hold_the_load_at_the_fill(
    ready: int, per: int, waking: int, threshold: float, share: float
) -> None:
    fill = max(1.0, threshold * share)
    total = ready * per
    wake = sleepers_to_wake(ready, per, total, waking, 0, threshold, fill)
    assert wake >= 0
    if wake:  # only under pressure, and the fewest that bring the load to the fill
        assert per >= threshold
        assert total / (ready + waking + wake) <= fill
        assert wake == 1 or total / (ready + waking + wake - 1) > fill


@given(
    ready=st.integers(1, 64),
    per=st.integers(0, 200),
    waking=st.integers(0, 64),
    threshold=st.floats(1.0, 256.0),
)
def test_woken_and_ready_replicas_hold_the_load_under_the_threshold(
    ready: int, per: int, waking: int, threshold: float
) -> None:
    total = ready * per
    wake = sleepers_to_wake(ready, per, total, waking, 0, threshold)
    assert wake >= 0
    if wake:  # only under pressure, and the fewest that fit the load under the threshold
        assert per >= threshold
        assert total / (ready + waking + wake) <= threshold
        assert wake == 1 or total / (ready + waking + wake - 1) > threshold


@pytest.mark.parametrize(
    ("replicas", "above", "chosen"),
    [
        pytest.param(
            [view("a", 5), view("b", 0, surplus=True)],
            8.0,
            "a",
            id="below the threshold the running replica takes it though the surplus is idle",
        ),
        pytest.param(
            [view("a", 8), view("b", 2, surplus=True)],
            8.0,
            "b",
            id="at the threshold the idle surplus takes it",
        ),
        pytest.param(
            [view("a", 9), view("b", 9, surplus=True)],
            8.0,
            "a",
            id="a tie above the threshold goes to the running replica",
        ),
        pytest.param(
            [view("b", 3, surplus=True)], 8.0, "b", id="with only the surplus ready it serves"
        ),
        pytest.param(
            [view("a", 5), view("b", 0)],
            math.inf,
            "b",
            id="without a surplus the fewest outstanding wins as before",
        ),
    ],
)
def test_choose_prefers_the_running_replicas(
    replicas: list[ReplicaView], above: float, chosen: str
) -> None:
    assert choose(replicas, None, above) == f"http://{chosen}"


@pytest.mark.parametrize(
    ("kwargs", "baseline", "running", "threshold", "fill"),
    [
        pytest.param({"floor": 8}, None, 1, 8.0, 8.0, id="with no history the floor holds"),
        pytest.param(
            {"floor": 8}, 10.0, 1, 20.0, 10.0, id="twice the last minute's load above the floor"
        ),
        pytest.param(
            {"floor": 8}, 200.0, 5, 80.0, 40.0, id="the load's share of each running replica"
        ),
        pytest.param(
            {"floor": 8, "ratio": 3.0}, 2.0, 1, 8.0, 8.0, id="a quiet fleet keeps the floor"
        ),
        pytest.param({"floor": 8}, 200.0, 0, 400.0, 200.0, id="no running replica counts as one"),
    ],
)
def test_the_threshold_and_the_fill(
    kwargs: dict[str, float], baseline: float | None, running: int, threshold: float, fill: float
) -> None:
    pressure = WakePressure(**kwargs)  # type: ignore[arg-type]
    assert pressure.threshold(baseline, running) == threshold
    assert pressure.fill(baseline, running) == fill


def test_a_scale_down_is_the_same_load_on_fewer_replicas_not_a_burst() -> None:
    # 19 replicas carried 380 requests for a minute; the scaler keeps 8 and the rest sleep.
    pressure, load = WakePressure(8), 380.0
    threshold = pressure.threshold(load, 8)
    per = int(load // 8)  # 47 on each of the 8
    assert per < threshold  # a share of the load the fleet carried is no pressure
    assert sleepers_to_wake(8, per, 8 * per, 0, 0, threshold) == 0
    # Per replica (the mean of the 19, 20 each), 40 was the threshold: 47 woke the 11.
    assert per > 2 * (load / 19)


def test_the_baseline_is_the_worked_example() -> None:
    pressure = WakePressure(8)
    assert pressure.baseline(None, 80.0, 0.2) == 80.0
    assert pressure.baseline(40.0, 80.0, 6.0) == pytest.approx(44.0)
    assert pressure.baseline(40.0, 80.0, 600.0) == 80.0


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"floor": 0}, id="a floor of zero would wake at every request"),
        pytest.param({"floor": 8, "ratio": 0.5}, id="a ratio below one wakes under the mean"),
        pytest.param({"floor": 8, "ratio": math.nan}, id="a NaN ratio"),
        pytest.param({"floor": 8, "window_seconds": 0.0}, id="an empty window"),
    ],
)
def test_an_impossible_pressure_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="wake pressure"):
        WakePressure(**kwargs)  # type: ignore[arg-type]


def test_the_plan_holds_burst_sleepers_per_running_replica() -> None:
    tiers = warm_tiers(LLAMA3_8B_H200, 38.5)
    inputs = StandbyInputs(0.0, 3, (3.0,) * 10, 0.0, 2.0)
    assert plan_standby(inputs, tiers, StandbyPolicy()).sleeping == 0
    plan = plan_standby(inputs, tiers, StandbyPolicy(max_sleeping=16, burst_sleepers=2.0))
    assert plan.sleeping == 6
    assert "2 per running replica for a burst" in plan.reason
    capped = plan_standby(inputs, tiers, StandbyPolicy(max_sleeping=4, burst_sleepers=2.0))
    assert capped.sleeping == 4


def burst(rate: float, start: float, seconds: float) -> Trace:
    arrival = start + np.arange(0.0, seconds, 1.0 / rate)
    n = len(arrival)
    return Trace("burst", arrival, np.full(n, 2048, np.int64), np.full(n, 64, np.int64))


CONFIG = SimConfig(
    LLAMA3_8B_H200,
    max_replicas=16,
    tail=120.0,
    standby=StandbyPolicy(max_sleeping=8, burst_sleepers=2.0),
)


@pytest.mark.parametrize(
    ("pressure", "woken"),
    [
        pytest.param(None, 0, id="without a pressure setting no sleeper wakes beside one ready"),
        pytest.param(WakePressure(4), 2, id="under pressure the gateway wakes the sleepers"),
    ],
)
def test_a_burst_on_a_static_replica_wakes_the_sleepers(
    pressure: WakePressure | None, woken: int
) -> None:
    config = dataclasses.replace(CONFIG, wake_pressure=pressure)
    result = simulate(burst(40.0, 60.0, 30.0), StaticPeak(1), config, initial_replicas=1)
    assert result.metrics["gateway_wakes"] >= woken
    assert (result.metrics["gateway_wakes"] > 0) == (woken > 0)


def test_woken_replicas_sleep_again_once_idle_and_the_count_never_includes_them() -> None:
    config = dataclasses.replace(CONFIG, wake_pressure=WakePressure(4))
    run = _Replay(burst(40.0, 0.0, 20.0), config)
    run.scale_to(1, "start", instant=True)
    run.hold_standby(2, False, "two sleepers")
    assert np.count_nonzero(run.slot == SLEEPING) == 2
    seen_woken = False
    while run.now < 120.0:
        run.start_ready()
        run.admit_arrivals()
        run.advance_fleet()
        assert run.running() == 1
        seen_woken = seen_woken or bool(np.any(run.slot == WOKEN))
        run.now += config.dt
    assert seen_woken
    assert np.count_nonzero(run.slot == SLEEPING) == 2
    assert not np.any(run.slot == WOKEN)
