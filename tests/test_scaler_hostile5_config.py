"""The windows every decision keeps a sample for are an hour at most.

Issue 27, hostile pass 5, S5-H4: ``policy.scale-down-window`` and ``policy.demand-window``
took any duration; each decision keeps a sample for the window and copies them all, so
Go's largest duration (2562047h) kept every sample for good: 23 ms a decision after six
hours at the usual rate, growing until the event loop could not keep up. Past an hour
(the HPA's own bound on a stabilization window) the config is refused naming the key.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.errors import ConfigError
from scaler.config import MAX_WINDOW_SECONDS, parse_config

KEYS = ("scale-down-window", "demand-window")


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize(
    ("value", "kept"),
    [
        pytest.param("5m", 300.0, id="the default's order of magnitude is taken"),
        pytest.param("1h", 3600.0, id="an hour, the HPA's bound, is taken"),
    ],
)
def test_a_window_up_to_an_hour_is_taken(key: str, value: str, kept: float) -> None:
    policy = parse_config(f"policy:\n  {key}: {value}\n").policy
    assert getattr(policy, key.replace("-", "_")) == kept


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize(
    "value",
    [
        pytest.param("3601s", id="a second past an hour is refused"),
        pytest.param("168h", id="a week is refused"),
        pytest.param("2562047h", id="Go's largest duration is refused"),
    ],
)
def test_a_window_past_an_hour_is_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"policy:\n  {key}: {value}\n")
    assert f"policy.{key}" in str(caught.value)


@given(seconds=st.integers(min_value=1, max_value=10 * int(MAX_WINDOW_SECONDS)))
def test_a_window_is_taken_exactly_when_it_is_an_hour_or_less(seconds: int) -> None:
    try:
        parse_config(f"policy:\n  scale-down-window: {seconds}s\n  demand-window: {seconds}s\n")
    except ConfigError:
        assert seconds > MAX_WINDOW_SECONDS
    else:
        assert seconds <= MAX_WINDOW_SECONDS
