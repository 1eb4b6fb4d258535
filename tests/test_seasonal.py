"""The seasonal forecast on synthetic weeks: time of day, weekdays apart from weekends."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.core.seasonal import SeasonalPolicy, seasonal_forecast, weekend

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
