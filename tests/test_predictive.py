"""The seasonal forecast in the decision: prewarm and the first replica before the return."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace

import pytest

from foundation.errors import ConfigError, MetadataError
from scaler.config import parse_config
from scaler.core import Decision, DecisionState, Observation, Policy, decide
from scaler.core.predictive import demand_seen
from scaler.metadata import parse_metadata
from scaler.prewarm import plan

DAY = 86_400.0
HOUR = 3_600.0
MONDAY = (4 + 7 * 52) * DAY
"""1971-01-04, a Monday."""
STEP = 60.0
FLOOR = Policy(seasonal_floor=True)
NO_FLOOR = Policy(seasonal_floor=False)


def seen(t: float, in_flight: int) -> Observation:
    """The gateway's view: ``in_flight`` requests (and arrivals while there are any)."""
    return Observation(
        now=t,
        signal_time=t,
        gateway_arrival_rate=2.0 if in_flight else 0.0,
        gateway_buffered=0,
        gateway_in_flight=in_flight,
    )


def office(day: int, hour: float) -> int:
    """20 requests in flight 09:00-17:00 on weekdays (day 0 a Monday), none otherwise."""
    return 20 if day % 7 < 5 and 9 <= hour < 17 else 0


def decided(
    days: float, busy: Callable[[int, float], int], policy: Policy
) -> tuple[DecisionState, Decision]:
    """The state (and last decision) after ``days`` of decisions every minute from Monday."""
    state, decision = DecisionState(), None
    for i in range(int(days * DAY / STEP)):
        day, into = divmod(i * STEP, DAY)
        decision = decide(seen(MONDAY + i * STEP, busy(int(day), into / HOUR)), policy, state)
        state = decision.state
    assert decision is not None
    return state, decision


@pytest.fixture(scope="module")
def two_days() -> DecisionState:
    """Monday and Tuesday at the office, decided without the floor."""
    return decided(2, office, NO_FLOOR)[0]


WEDNESDAY = MONDAY + 2 * DAY


@pytest.mark.parametrize(
    ("policy", "at", "desired", "prewarm", "reason"),
    [
        pytest.param(
            FLOOR,
            WEDNESDAY + 9 * HOUR - 50,
            2,
            True,
            "forecast: traffic expected at 09:00 (confidence 1.00, 2 days, 1.8 replicas):"
            " 2 started",
            id="50 s before the return the floor starts the replicas the forecast expects",
        ),
        pytest.param(
            FLOOR,
            WEDNESDAY + 9 * HOUR - 240,
            0,
            True,
            "scale to zero (forecast: traffic expected at 09:00",
            id="4 min before it only the prewarm starts (its lead is 5 min, a cold start's 1)",
        ),
        pytest.param(
            NO_FLOOR,
            WEDNESDAY + 9 * HOUR - 50,
            0,
            True,
            "scale to zero (forecast: traffic expected at 09:00",
            id="without the floor the forecast only prewarms",
        ),
        pytest.param(
            FLOOR,
            WEDNESDAY + 9 * HOUR - 600,
            0,
            False,
            "scale to zero",
            id="10 min before it nothing is asked yet",
        ),
        pytest.param(
            FLOOR,
            WEDNESDAY + 9 * HOUR + 180,
            0,
            False,
            "scale to zero",
            id="traffic 3 min late (past the idle grace) is given up on",
        ),
        pytest.param(
            replace(FLOOR, seasonal_prewarm_lead_seconds=0.0),
            WEDNESDAY + 9 * HOUR - 240,
            0,
            False,
            "scale to zero",
            id="a prewarm lead of 0 asks for no prewarm",
        ),
        pytest.param(
            replace(FLOOR, seasonal_utc_offset_hours=-1.0),
            WEDNESDAY + 9 * HOUR - 50,
            0,
            False,
            "scale to zero",
            id="another UTC offset reads the same slots an hour apart: no return at 08:59",
        ),
    ],
)
def test_at_zero_before_the_return(
    two_days: DecisionState,
    policy: Policy,
    at: float,
    desired: int,
    prewarm: bool,
    reason: str,
) -> None:
    # the Wednesday's night so far, idle every minute, then the moment itself
    state = two_days
    for t in range(int(WEDNESDAY), int(at), int(STEP)):
        state = decide(seen(float(t), 0), policy, state).state
    decision = decide(seen(at, 0), policy, state)
    assert decision.desired_replicas == desired
    assert decision.active is (desired > 0)
    assert reason in decision.reason, decision.reason
    assert ("forecast" in decision.reason) is (prewarm or desired > 0)
    assert (decision.prewarm_forecast is not None) is prewarm
    if prewarm:
        assert decision.prewarm_forecast == pytest.approx(20 / 16 / 0.7)


def test_the_first_request_meets_a_running_replica(two_days: DecisionState) -> None:
    state = two_days
    for t in range(int(WEDNESDAY), int(WEDNESDAY + 9 * HOUR), int(STEP)):
        state = decide(seen(float(t), 0), FLOOR, state).state
    assert state.desired == 2
    decision = decide(seen(WEDNESDAY + 9 * HOUR, 20), FLOOR, state)
    assert decision.desired_replicas == 2 and decision.active
    assert not decision.reason.startswith("forecast")


def test_a_wrong_forecast_counts_against_it_and_its_own_replica_is_no_traffic() -> None:
    # Monday and Tuesday at the office, Wednesday a holiday, the floor on throughout
    def holiday(day: int, hour: float) -> int:
        return 0 if day == 2 else office(day, hour)

    state, _ = decided(3, holiday, FLOOR)
    thursday = MONDAY + 3 * DAY
    for t in range(int(thursday), int(thursday + 9 * HOUR - 50), int(STEP)):
        state = decide(seen(float(t), 0), FLOOR, state).state
    decision = decide(seen(thursday + 9 * HOUR - 50, 0), FLOOR, state)
    # busy on 2 of 3 days is below the 0.75 confidence: the held replica taught nothing
    assert decision.desired_replicas == 0
    assert decision.prewarm_forecast is None


def test_the_forecast_is_carried_bounded(two_days: DecisionState) -> None:
    # two kinds of day x 96 slots, whatever the history's length
    assert len(two_days.season.slots) == 2 * 96
    week, _ = decided(7, office, NO_FLOOR)
    assert len(week.season.slots) == 2 * 96


def test_a_missing_load_teaches_nothing() -> None:
    assert demand_seen(False, False, 0.0) is None
    assert demand_seen(False, True, 3.0) == 0.0
    assert demand_seen(True, True, 2.5) == 2.5
    # the first request after idle, before any rate is known, is the return itself
    assert demand_seen(True, True, 0.0) == 1.0


def test_no_forecast_on_the_first_day() -> None:
    state, _ = decided(1, office, FLOOR)
    decision = decide(seen(MONDAY + DAY + 9 * HOUR - 50, 0), FLOOR, state)
    assert decision.desired_replicas == 0 and decision.prewarm_forecast is None
    assert math.isfinite(decision.state.season.open_peak)


BASE = {"scalerAddress": "s:1", "deployment": "llama"}


@pytest.mark.parametrize(
    ("keys", "field", "value"),
    [
        pytest.param(
            {"seasonalPrewarmLead": "10m"},
            "seasonal_prewarm_lead_seconds",
            600.0,
            id="seasonalPrewarmLead is a Go duration",
        ),
        pytest.param(
            {"seasonalUtcOffsetHours": "-5"},
            "seasonal_utc_offset_hours",
            -5.0,
            id="seasonalUtcOffsetHours may be west of UTC",
        ),
        pytest.param({}, "seasonal_prewarm_lead_seconds", 300.0, id="absent: the default"),
    ],
)
def test_the_trigger_keys(keys: dict[str, str], field: str, value: object) -> None:
    policy = parse_metadata({**BASE, **keys}).policy()
    assert getattr(policy, field) == value


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        pytest.param(
            {"seasonalUtcOffsetHours": "15"},
            "key 'seasonalUtcOffsetHours'='15'",
            id="an offset beyond UTC+14 is refused naming the key",
        ),
        pytest.param(
            {"seasonalFloor": "false"},
            "unknown key 'seasonalFloor'",
            id="seasonalFloor is no key: the floor is always on",
        ),
        pytest.param(
            {"seasonalPrewarmLead": "-1m"},
            "key 'seasonalPrewarmLead'",
            id="a negative prewarm lead is refused",
        ),
    ],
)
def test_bad_trigger_keys_are_refused(keys: dict[str, str], message: str) -> None:
    with pytest.raises(MetadataError, match=re.escape(message)):
        parse_metadata({**BASE, **keys})


def test_the_config_keys() -> None:
    config = parse_config(
        "policy: {seasonal-prewarm-lead: 2m, seasonal-utc-offset-hours: 5.5, seasonal-day: 1h}"
    )
    policy = config.policy.policy()
    assert (policy.seasonal_floor, policy.seasonal_prewarm_lead_seconds) == (True, 120.0)
    with pytest.raises(ConfigError, match="seasonal-floor: removed"):
        parse_config("policy: {seasonal-floor: false}")
    assert (policy.seasonal_utc_offset_hours, policy.seasonal_day_seconds) == (5.5, 3600.0)
    with pytest.raises(ConfigError, match="seasonal-utc-offset-hours"):
        parse_config("policy: {seasonal-utc-offset-hours: -15}")


def test_the_forecast_prewarms_the_fluid_cache_before_the_first_request(
    two_days: DecisionState,
) -> None:
    # the decision 4 minutes before Wednesday's return, as the prewarm shell reads it
    from tests.test_prewarm_plan import KEY, SPEC, dataset, view

    state, track = two_days, plan.Track(idle_since=MONDAY + DAY + 17 * HOUR)
    made = None
    for t in range(int(WEDNESDAY), int(WEDNESDAY + 9 * HOUR - 240), int(STEP)):
        decision = decide(seen(float(t), 0), NO_FLOOR, state)
        state = decision.state
        forecast = (decision.prewarm_forecast or 0.0) > 0
        made = plan.plan(
            KEY,
            SPEC,
            track,
            active=decision.active,
            desired=decision.desired_replicas,
            fluid=view(dataset("0.0%")),
            now=float(t),
            forecast=forecast,
        )
        track = made.track
        if made.create is not None:
            break
    assert made is not None and made.create is not None, made and made.reason
    # created within the prewarm lead (5 min) of the 09:00 return, not earlier
    assert WEDNESDAY + 9 * HOUR - 300 <= t < WEDNESDAY + 9 * HOUR
    assert made.track.wait_for == "forecast return of traffic"
