"""``replay.workloads``: the built-in business-day trace and the trace sources replay reads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from replay.trace import TraceError
from replay.workloads import (
    BUILTINS,
    BusinessDay,
    business_day,
    day_rate,
    load_trace,
)

DAY = BusinessDay()
HOUR = DAY.length / 24  # 150 s of trace time
LUNCH = DAY.lunch_hour * HOUR


@pytest.mark.parametrize(
    ("t", "rate"),
    [
        pytest.param(0.0, 0.0, id="midnight-is-idle"),
        pytest.param(3 * HOUR, 0.0, id="three-in-the-morning-is-idle"),
        pytest.param(7.5 * HOUR, 40.0, id="halfway-up-the-morning-ramp-is-half-the-base"),
        pytest.param(11 * HOUR, 80.0, id="late-morning-runs-at-the-base-rate"),
        pytest.param(10 * HOUR + 1, 160.0, id="a-short-spike-doubles-the-rate"),
        pytest.param(10 * HOUR + 16, 80.0, id="the-spike-is-over-after-15-seconds"),
        pytest.param(LUNCH, 320.0, id="the-lunch-burst-starts-at-noon-at-4x"),
        pytest.param(LUNCH + 119.0, 320.0, id="the-lunch-burst-still-runs-after-119-seconds"),
        pytest.param(LUNCH + 120.0, 80.0, id="the-lunch-burst-ends-after-2-minutes"),
        pytest.param(LUNCH - 1.0, 80.0, id="just-before-lunch-is-the-base-rate"),
        pytest.param(19.5 * HOUR, 40.0, id="halfway-down-the-evening-decline-is-half-the-base"),
        pytest.param(23 * HOUR, 0.0, id="late-night-is-idle"),
        pytest.param(DAY.length, 0.0, id="nothing-at-the-end"),
        pytest.param(-1.0, 0.0, id="nothing-before-the-start"),
    ],
)
def test_the_day_rate_follows_the_documented_shape(t: float, rate: float) -> None:
    assert float(day_rate(np.array([t]), DAY)[0]) == pytest.approx(rate)


def test_the_day_stretches_to_any_length_with_the_burst_in_trace_seconds() -> None:
    short = BusinessDay(length=1200.0, base_rate=10.0)
    noon = 12 * short.length / 24
    assert float(day_rate(np.array([7.5 * 50]), short)[0]) == pytest.approx(5.0)
    assert float(day_rate(np.array([noon + 119]), short)[0]) == pytest.approx(40.0)
    assert float(day_rate(np.array([noon + 121]), short)[0]) == pytest.approx(10.0)


def test_the_day_is_reproducible_for_a_seed_and_differs_across_seeds() -> None:
    a, b, c = business_day(DAY, 5), business_day(DAY, 5), business_day(DAY, 6)
    assert np.array_equal(a.arrival, b.arrival)
    assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.output, b.output)
    assert len(a) != len(c) or not np.array_equal(a.arrival, c.arrival)


def test_the_lunch_burst_is_4x_the_base_for_2_minutes() -> None:
    trace = business_day(DAY, 0)
    edges = np.arange(LUNCH - 120, LUNCH + 240 + 1, 10.0)  # 10 s bins around lunch
    per_second = np.histogram(trace.arrival, edges)[0] / 10.0
    high = edges[:-1][per_second > 2.5 * DAY.base_rate]
    assert high[0] == LUNCH and high[-1] == LUNCH + 110  # 12 bins: exactly 120 s
    assert len(high) == 12
    burst = ((trace.arrival >= LUNCH) & (trace.arrival < LUNCH + 120)).sum() / 120
    before = ((trace.arrival >= LUNCH - 120) & (trace.arrival < LUNCH)).sum() / 120
    assert burst == pytest.approx(4 * DAY.base_rate, rel=0.03)
    assert before == pytest.approx(DAY.base_rate, rel=0.06)


def test_the_day_has_the_expected_volume_an_idle_night_and_conversation_lengths() -> None:
    trace = business_day(DAY, 0)
    grid = np.linspace(0, DAY.length, 200_001)
    expected = float(np.trapezoid(day_rate(grid, DAY), grid))
    assert abs(len(trace) - expected) < 5 * math.sqrt(expected)  # Poisson: 5 sigma
    assert trace.arrival.min() >= 6 * HOUR and trace.arrival.max() < 22 * HOUR
    assert np.all(np.diff(trace.arrival) >= 0)
    assert trace.prompt.min() >= DAY.prompt_range[0] and trace.prompt.max() <= DAY.prompt_range[1]
    assert trace.output.min() >= DAY.output_range[0] and trace.output.max() <= DAY.output_range[1]
    assert np.median(trace.prompt) == pytest.approx(1020, rel=0.03)
    assert np.median(trace.output) == pytest.approx(129, rel=0.03)
    assert trace.name == "business-day"


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        pytest.param(BusinessDay(length=0.0), "length=0", id="a-day-of-no-seconds"),
        pytest.param(BusinessDay(base_rate=-1.0), "base_rate=-1", id="a-negative-base-rate"),
        pytest.param(BusinessDay(lunch_seconds=4000.0), "lunch_seconds=4000", id="a-long-lunch"),
        pytest.param(BusinessDay(lunch_multiple=0.0), "lunch_multiple=0", id="no-lunch-rate"),
        pytest.param(BusinessDay(spike_hours=(25.0,)), "spike_hours", id="a-spike-after-midnight"),
    ],
)
def test_a_day_that_cannot_be_generated_is_refused_naming_the_field(
    shape: BusinessDay, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        business_day(shape, 0)


def test_a_builtin_source_generates_its_trace_for_the_seed() -> None:
    assert "business-day" in BUILTINS
    trace = load_trace("builtin:business-day", seed=3)
    assert np.array_equal(trace.arrival, business_day(DAY, 3).arrival)


def test_an_unknown_builtin_is_refused_naming_the_builtins() -> None:
    with pytest.raises(TraceError, match=r"builtin:weekend.*business-day"):
        load_trace("builtin:weekend")


def test_a_path_source_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:00.0000000,512,16\n2023-11-16 18:17:02.5000000,256,8\n"
    )
    trace = load_trace(str(path))
    assert list(trace.arrival) == [0.0, 2.5] and list(trace.prompt) == [512, 256]
