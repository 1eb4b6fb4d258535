from __future__ import annotations

import datetime

import pytest
from pydantic import TypeAdapter, ValidationError

from foundation.durations import Seconds, format_duration, parse_duration


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
        pytest.param(None, id="null-is-not-a-duration"),
        pytest.param([1], id="a-list-is-not-a-duration"),
        pytest.param({"a": 1}, id="a-mapping-is-not-a-duration"),
        pytest.param(datetime.date(2024, 1, 1), id="a-date-is-not-a-duration"),
        pytest.param(10**400, id="an-integer-beyond-floats-is-refused"),
        pytest.param("\u0663s", id="arabic-indic-digits-are-not-go"),
        pytest.param("\u0661", id="a-bare-non-ascii-number-is-refused"),
        pytest.param("5_0s", id="underscores-inside-a-go-duration-are-refused"),
        pytest.param("5_0", id="underscores-inside-a-bare-number-are-refused"),
        pytest.param("inf", id="infinity-spelled-out-is-refused"),
        pytest.param(float("inf"), id="an-infinite-float-is-refused"),
        pytest.param("1e400", id="an-exponent-is-not-a-duration"),
        pytest.param("2562048h", id="beyond-go-s-int64-nanoseconds-is-refused"),
        pytest.param(1e10, id="a-number-beyond-go-s-limit-is-refused"),
    ],
)
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(None, id="null"),
        pytest.param([], id="a-list"),
        pytest.param({}, id="a-mapping"),
        pytest.param(datetime.datetime(2024, 1, 1, 10, 0), id="a-timestamp"),
        pytest.param(b"30s", id="bytes"),
    ],
)
def test_a_seconds_field_turns_a_wrong_type_into_a_validation_error(value):
    """pydantic wraps only ValueError: anything else would escape config validation."""
    with pytest.raises(ValidationError, match="expected a duration"):
        TypeAdapter(Seconds).validate_python(value)


def test_the_message_quotes_a_long_value_with_a_cap():
    with pytest.raises(ValueError, match="duration") as caught:
        parse_duration("9" * 1_000_000 + "x")
    message = str(caught.value)
    assert len(message) < 300
    assert "(1000001 characters)" in message


def test_go_s_own_limit_is_accepted():
    assert parse_duration("2562047h") == 2562047 * 3600.0


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
