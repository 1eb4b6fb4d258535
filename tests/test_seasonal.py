"""The seasonal forecast on synthetic weeks: time of day, weekdays apart from weekends."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.core.seasonal import (
    SeasonalPolicy,
    SeasonalState,
    clock,
    expected_return,
    observe,
    seasonal_forecast,
    weekend,
)

DAY = 86_400.0
HOUR = 3_600.0
MONDAY = (4 + 7 * 52) * DAY
"""1971-01-04, a Monday (1970-01-05 was the first Monday after the epoch)."""
POLICY = SeasonalPolicy()
LEAD = 900.0


def office_weeks(
    weeks: int, replicas: float = 4.0, skip: frozenset[int] = frozenset()
) -> list[tuple[float, float]]:
    """Samples every 5 min: ``replicas`` needed 09:00-17:00 on weekdays, none otherwise.

    Days in ``skip`` (counted from the first Monday) had no traffic at all.
    """
    samples = []
    for day in range(7 * weeks):
        working = day % 7 < 5 and day not in skip
        for minute in range(0, 24 * 60, 5):
            t = MONDAY + day * DAY + minute * 60.0
            busy = working and 9 * 60 <= minute < 17 * 60
            samples.append((t, replicas if busy else 0.0))
    return samples


AFTER_TWO_WEEKS = MONDAY + 14 * DAY


@pytest.mark.parametrize(
    ("history", "now", "peak", "confident"),
    [
        pytest.param(
            office_weeks(2),
            AFTER_TWO_WEEKS + 8.9 * HOUR,
            4.0,
            True,
            id="a Monday at 08:54 expects the 09:00 return from the weekdays before it",
        ),
        pytest.param(
            office_weeks(2),
            AFTER_TWO_WEEKS + 5 * DAY + 8.9 * HOUR,
            0.0,
            False,
            id="a Saturday at 08:54 expects nothing: weekends had no traffic",
        ),
        pytest.param(
            office_weeks(2),
            AFTER_TWO_WEEKS + 3 * HOUR,
            0.0,
            False,
            id="a Monday at 03:00 expects nothing: no earlier night had traffic",
        ),
        pytest.param(
            office_weeks(2, skip=frozenset(range(0, 14, 2))),
            AFTER_TWO_WEEKS + 8.9 * HOUR,
            2.0,
            False,
            id="traffic on half the weekdays is a forecast, not a confident one",
        ),
        pytest.param(
            office_weeks(1)[: 288 * 1],
            MONDAY + 1 * DAY + 8.9 * HOUR,
            None,
            False,
            id="one earlier weekday is too little history to forecast at all",
        ),
        pytest.param(
            [],
            MONDAY,
            None,
            False,
            id="no history gives no forecast, not a zero",
        ),
    ],
)
def test_forecast(
    history: list[tuple[float, float]], now: float, peak: float | None, confident: bool
) -> None:
    forecast = seasonal_forecast(history, now, LEAD, POLICY)
    if peak is None:
        assert forecast.peak is None
        assert forecast.reason.startswith("no forecast")
    else:
        assert forecast.peak == pytest.approx(peak)
    assert forecast.confident is confident


def test_days_alike_when_not_weekly() -> None:
    history = office_weeks(2)
    saturday = AFTER_TWO_WEEKS + 5 * DAY + 8.9 * HOUR
    forecast = seasonal_forecast(history, saturday, LEAD, SeasonalPolicy(weekly=False))
    # 20 of the 28 earlier days had office hours (the lookback is 4 weeks; 14 days held)
    assert forecast.days == 14
    assert forecast.confidence == pytest.approx(10 / 14)
    assert not forecast.confident


def test_compressed_days_replay_the_same_week() -> None:
    scale = 24.0  # an hour a day
    history = [(t / scale, v) for t, v in office_weeks(2)]
    policy = SeasonalPolicy(day_seconds=DAY / scale)
    forecast = seasonal_forecast(
        history, (AFTER_TWO_WEEKS + 8.9 * HOUR) / scale, LEAD / scale, policy
    )
    assert forecast.confident and forecast.peak == pytest.approx(4.0)


def test_the_reason_says_how_sure() -> None:
    forecast = seasonal_forecast(office_weeks(2), AFTER_TWO_WEEKS + 8.9 * HOUR, LEAD, POLICY)
    assert forecast.reason == (
        "confident: 100% of 10 earlier weekdays had traffic in the next 900s,"
        " needing 4.0 replicas on average"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"day_seconds": 0.0}, "day_seconds", id="a day must last"),
        pytest.param({"confidence": 0.0}, "confidence", id="a confidence of 0 is refused"),
        pytest.param({"min_days": 0}, "min_days", id="at least one earlier day is needed"),
    ],
)
def test_bad_policies_are_refused(changes: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SeasonalPolicy(**changes)  # type: ignore[arg-type]


def test_a_negative_lead_is_refused() -> None:
    with pytest.raises(ValueError, match="lead_seconds"):
        seasonal_forecast([], MONDAY, -1.0, POLICY)


def test_the_epoch_week() -> None:
    assert not weekend(MONDAY, DAY)
    assert weekend(MONDAY + 5 * DAY, DAY) and weekend(MONDAY + 6 * DAY + 1, DAY)
    assert not weekend(MONDAY + 7 * DAY, DAY)


@settings(deadline=None)
@given(
    values=st.lists(st.floats(0, 50), min_size=1, max_size=60),
    now_day=st.integers(3, 40),
)
def test_the_peak_is_within_the_history(values: list[float], now_day: int) -> None:
    history = [(MONDAY + i * DAY / 2, v) for i, v in enumerate(values)]
    forecast = seasonal_forecast(
        history, MONDAY + now_day * DAY, DAY / 2, SeasonalPolicy(min_days=1)
    )
    if forecast.peak is not None:
        assert 0 <= forecast.peak <= max(values)
        assert 0 <= forecast.confidence <= 1
        assert forecast.confident == (forecast.confidence >= 0.75)


# --- the compact state the decision carries (observe, expected_return) -------------------

STEP = 300.0
"""The synthetic weeks are observed every 5 min."""


def learned(
    days: int,
    busy: Callable[[int, float], float],
    policy: SeasonalPolicy = POLICY,
    start: float = MONDAY,
) -> SeasonalState:
    """The state after ``days`` days from ``start``, ``busy(day, hour)`` replicas at each step."""
    state = SeasonalState()
    for i in range(int(days * DAY / STEP)):
        t = start + i * STEP
        day, into = divmod(i * STEP, DAY)
        state = observe(state, t, busy(int(day), into / HOUR), policy)
    return state


def office(day: int, hour: float) -> float:
    """4 replicas 09:00-17:00 on weekdays (day 0 a Monday)."""
    return 4.0 if day % 7 < 5 and 9 <= hour < 17 else 0.0


def with_spike(day: int, hour: float) -> float:
    """The office, and once (the first Tuesday) 2 replicas from 03:00 to 03:30."""
    return 2.0 if day == 1 and 3 <= hour < 3.5 else office(day, hour)


def with_holiday(day: int, hour: float) -> float:
    """The office, but the second Wednesday idle all day."""
    return 0.0 if day == 9 else office(day, hour)


def late_start(day: int, hour: float) -> float:
    """Weekdays from 09:10 (mid-slot) to 17:00."""
    return 3.0 if day % 7 < 5 and 9 + 10 / 60 <= hour < 17 else 0.0


def varying(day: int, hour: float) -> float:
    """Weekdays from 09:00 on even days, 09:10 on odd ones, to 17:00."""
    start = 9 + (10 / 60 if day % 2 else 0)
    return 3.0 if day % 7 < 5 and start <= hour < 17 else 0.0


def half_the_days(day: int, hour: float) -> float:
    return office(day, hour) if day % 2 == 0 else 0.0


NEW_YORK = SeasonalPolicy(utc_offset_seconds=-5 * HOUR)


@pytest.mark.parametrize(
    ("days", "busy", "now", "policy", "expected", "confident"),
    [
        pytest.param(
            2,
            office,
            MONDAY + 2 * DAY + 8.95 * HOUR,
            POLICY,
            "09:00",
            True,
            id="two office days are learnt: the Wednesday's 09:00 return is expected at 08:57",
        ),
        pytest.param(
            1,
            office,
            MONDAY + 1 * DAY + 8.95 * HOUR,
            POLICY,
            None,
            False,
            id="one day of history is too little: no forecast, not a confident one",
        ),
        pytest.param(
            12,
            office,
            MONDAY + 12 * DAY + 8.95 * HOUR,
            POLICY,
            None,
            False,
            id="the weekend stays idle: a Saturday 08:57 after two weeks expects nothing",
        ),
        pytest.param(
            14,
            office,
            MONDAY + 14 * DAY + 8.95 * HOUR,
            POLICY,
            "09:00",
            True,
            id="the Monday after a weekend expects its return from the weekdays",
        ),
        pytest.param(
            14,
            with_spike,
            MONDAY + 14 * DAY + 2.95 * HOUR,
            POLICY,
            None,
            False,
            id="a one-off spike at 03:00 does not become a pattern",
        ),
        pytest.param(
            10,
            with_holiday,
            MONDAY + 10 * DAY + 8.95 * HOUR,
            POLICY,
            "09:00",
            True,
            id="one idle weekday (a holiday) does not unlearn the week",
        ),
        pytest.param(
            14,
            half_the_days,
            MONDAY + 14 * DAY + 8.95 * HOUR,
            POLICY,
            None,
            False,
            id="traffic on half the days is no confident return",
        ),
        pytest.param(
            4,
            late_start,
            MONDAY + 4 * DAY + 9.1 * HOUR,
            POLICY,
            "09:10",
            True,
            id="a return within a slot is expected when it came (09:10), not at the slot's start",
        ),
        pytest.param(
            4,
            varying,
            MONDAY + 4 * DAY + 8.95 * HOUR,
            POLICY,
            "08:54",
            True,
            id="a return that comes at 09:00 or 09:10 is expected from 08:54: early enough",
        ),
        pytest.param(
            2,
            office,
            MONDAY + 2 * DAY + 8.7 * HOUR,
            POLICY,
            None,
            False,
            id="18 minutes ahead of the return is beyond the 15-minute lead: nothing yet",
        ),
        pytest.param(
            3,
            office,
            MONDAY + 2 * DAY + 11 * HOUR,
            POLICY,
            None,
            False,
            id="at noon the traffic never stopped in the pattern: no return to expect",
        ),
        pytest.param(
            2,
            office,
            MONDAY + 2 * DAY + 13.95 * HOUR,
            NEW_YORK,
            "09:00",
            True,
            id="business hours in UTC-5: 09:00 local is expected at 13:57 UTC",
        ),
    ],
)
def test_expected_return(
    days: int,
    busy: Callable[[int, float], float],
    now: float,
    policy: SeasonalPolicy,
    expected: str | None,
    confident: bool,
) -> None:
    # New York's weeks start at Monday 00:00 local, five hours after 00:00 UTC
    start = MONDAY - policy.utc_offset_seconds
    state = learned(days, busy, policy, start)
    forecast = expected_return(state, now, LEAD, 120.0, policy)
    assert forecast.confident is confident, forecast.reason
    if expected is None:
        assert forecast.expected_at is None
    else:
        assert forecast.expected_at is not None
        assert clock(forecast.expected_at, policy) == expected
        assert forecast.reason.startswith(f"traffic expected at {expected} (confidence")
        # the holiday's zero is one of the days the mean of the peaks counts
        peaks: dict[Callable[[int, float], float], float] = {
            office: 4.0,
            with_holiday: 0.8 * 4.0,
            late_start: 3.0,
            varying: 3.0,
        }
        assert forecast.peak == pytest.approx(peaks[busy])
    if days == 1:
        assert forecast.peak is None and forecast.reason.startswith("no forecast")


def test_the_expected_time_is_in_utc_under_an_offset() -> None:
    state = learned(2, office, NEW_YORK, MONDAY + 5 * HOUR)
    forecast = expected_return(state, MONDAY + 2 * DAY + 13.95 * HOUR, LEAD, 120.0, NEW_YORK)
    assert forecast.expected_at == pytest.approx(MONDAY + 2 * DAY + 14 * HOUR)


def test_a_late_return_is_waited_for_a_grace_then_given_up() -> None:
    state = learned(2, office, POLICY)
    nine = MONDAY + 2 * DAY + 9 * HOUR
    assert expected_return(state, nine + 100, LEAD, 120.0, POLICY).confident
    assert not expected_return(state, nine + 200, LEAD, 120.0, POLICY).confident


def test_the_confidence_follows_the_days() -> None:
    week = learned(5, office, POLICY)
    friday = MONDAY + 4 * DAY + 8.95 * HOUR
    assert expected_return(week, friday, LEAD, 120.0, POLICY).confidence == pytest.approx(1.0)
    holiday = learned(10, with_holiday, POLICY)
    thursday = MONDAY + 10 * DAY + 8.95 * HOUR
    # a plain mean over the first five days, then the newest day weighs 0.2
    assert expected_return(holiday, thursday, LEAD, 120.0, POLICY).confidence == pytest.approx(0.8)


def test_a_changed_layout_starts_afresh() -> None:
    state = learned(2, office, POLICY)
    coarse = SeasonalPolicy(slots_per_day=24)
    again = observe(state, MONDAY + 2 * DAY, 0.0, coarse)
    assert len(again.slots) == 2 * 24 and again.open_slot is not None
    assert not any(stats.days for stats in again.slots)


def test_an_older_observation_is_ignored() -> None:
    state = learned(1, office, POLICY)
    assert observe(state, MONDAY, 9.0, POLICY) == state


@pytest.mark.parametrize(
    ("demand", "now"),
    [
        pytest.param(-1.0, MONDAY, id="a negative demand is refused"),
        pytest.param(math.nan, MONDAY, id="a NaN demand is refused, not taken as idle"),
        pytest.param(1.0, math.inf, id="an infinite time is refused"),
    ],
)
def test_bad_observations_are_refused(demand: float, now: float) -> None:
    with pytest.raises(ValueError, match="demand must be finite"):
        observe(SeasonalState(), now, demand, POLICY)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"slots_per_day": 0}, "slots_per_day", id="a day needs a slot"),
        pytest.param({"smoothing": 0.0}, "smoothing", id="a smoothing of 0 would learn nothing"),
        pytest.param({"utc_offset_seconds": 2 * DAY}, "utc_offset", id="an offset over a day"),
    ],
)
def test_bad_compact_policies_are_refused(changes: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SeasonalPolicy(**changes)  # type: ignore[arg-type]


def test_a_negative_grace_is_refused() -> None:
    with pytest.raises(ValueError, match="grace"):
        expected_return(SeasonalState(), MONDAY, LEAD, -1.0, POLICY)


observations = st.lists(
    st.tuples(st.floats(0, 3 * DAY), st.one_of(st.none(), st.floats(0, 64))),
    max_size=80,
)


def replayed(points: list[tuple[float, float | None]], policy: SeasonalPolicy) -> SeasonalState:
    state = SeasonalState()
    for t, demand in sorted(points, key=lambda p: p[0]):
        state = observe(state, MONDAY + t, demand, policy)
    return state


@settings(deadline=None, max_examples=60)
@given(points=observations, weekly=st.booleans(), slots=st.integers(1, 96))
def test_the_state_is_bounded_whatever_the_history(
    points: list[tuple[float, float | None]], weekly: bool, slots: int
) -> None:
    policy = SeasonalPolicy(weekly=weekly, slots_per_day=slots)
    state = replayed(points, policy)
    assert len(state.slots) in (0, (2 if weekly else 1) * slots)
    top = max((d for _, d in points if d is not None), default=0.0)
    for stats in state.slots:
        assert 0 <= stats.busy <= 1 and 0 <= stats.peak <= top + 1e-9
        assert 0 <= stats.onset <= DAY / slots + 1e-6
        assert 0 <= stats.spread <= DAY / slots + 1e-6
        assert stats.busy_days <= stats.days <= len(points)


@settings(deadline=None, max_examples=60)
@given(points=observations, now=st.floats(0, 4 * DAY), lead=st.floats(0, 3600))
def test_the_forecast_is_never_negative(
    points: list[tuple[float, float | None]], now: float, lead: float
) -> None:
    policy = SeasonalPolicy(min_days=1, slots_per_day=24)
    forecast = expected_return(replayed(points, policy), MONDAY + now, lead, 120.0, policy)
    assert forecast.peak is None or forecast.peak >= 0
    assert 0 <= forecast.confidence <= 1
    if forecast.confident:
        assert forecast.expected_at is not None
        assert forecast.expected_at - lead <= MONDAY + now


@settings(deadline=None, max_examples=60)
@given(points=observations)
def test_missing_observations_do_not_count_as_idle(
    points: list[tuple[float, float | None]],
) -> None:
    measured: list[tuple[float, float | None]] = [(t, d) for t, d in points if d is not None]
    assert replayed(points, POLICY) == replayed(measured, POLICY)
