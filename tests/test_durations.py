from __future__ import annotations

import pytest

from foundation.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("30s", 30.0, id="seconds"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("2m3s", 123.0, id="minutes-and-seconds-combine"),
        pytest.param("1h", 3600.0, id="hours"),
        pytest.param("1.5m", 90.0, id="fractions-of-a-unit"),
        pytest.param("90", 90.0, id="a-bare-number-is-seconds"),
        pytest.param(15, 15.0, id="an-int-is-seconds"),
        pytest.param(" 10s ", 10.0, id="surrounding-spaces-are-ignored"),
    ],
)
def test_durations_parse(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("10 s", id="space-inside"),
        pytest.param("5d", id="days-are-not-a-go-unit"),
        pytest.param("-5s", id="negative"),
        pytest.param("s", id="unit-without-number"),
        pytest.param("nan", id="not-a-number"),
        pytest.param(True, id="a-boolean"),
    ],
)
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0.25, "250ms", id="sub-second"),
        pytest.param(45, "45s", id="seconds"),
        pytest.param(90, "1m30s", id="minutes-and-seconds"),
        pytest.param(300, "5m", id="whole-minutes"),
    ],
)
def test_durations_format_the_way_users_write_them(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)
