"""The windows every decision, and every replica's scrapes, keep samples for are bounded.

Issue 27, hostile pass 5, S5-H4: ``policy.scale-down-window`` and ``policy.demand-window``
took any duration; each decision keeps a sample for the window and copies them all, so
Go's largest duration (2562047h) kept every sample for good: 23 ms a decision after six
hours at the usual rate, growing until the event loop could not keep up. Past an hour
(the HPA's own bound on a stabilization window) the config is refused naming the key.
The exporter's ``stable-window`` is the sibling: each replica keeps every scrape of it
(2562047h: 1,000 scrapes after 1,000 cycles, each cycle's windows walking them all); it
is an hour at most and at most ``MAX_WINDOW_SCRAPES`` intervals. So is ``maxSignalAge``
(and the config's ``max-signal-age``), S5-M3: 2562047h decided a day later on a day-old
snapshot from sources that had gone, and KEDA's fallback never acted.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.config import (
    MAX_BODY_BYTES_LIMIT,
    MAX_DEPLOYMENTS,
    MAX_SERIES_LIMIT,
    MAX_STABLE_WINDOW,
    MAX_WINDOW_SCRAPES,
)
from exporter.config import parse_config as parse_exporter_config
from foundation.errors import ConfigError, MetadataError, StaleSignalError
from scaler.config import MAX_WINDOW_SECONDS, parse_config
from scaler.metadata import parse_metadata
from scaler.registry import ScaledObjectRegistry
from scaler.signals import SignalStore
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals, gateway_signals

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


@pytest.mark.parametrize(
    ("window", "interval", "taken"),
    [
        pytest.param("60s", "5s", True, id="the exporter's default window is taken"),
        pytest.param("1h", "5s", True, id="an hour at 5 s, 720 scrapes, is taken"),
        pytest.param("60s", "100ms", True, id="a minute at 100 ms, 600 scrapes, is taken"),
        pytest.param("3601s", "10s", False, id="a window past an hour is refused"),
        pytest.param("2562047h", "5s", False, id="Go's largest duration is refused"),
        pytest.param("1h", "1s", False, id="an hour at 1 s, 3,600 scrapes, is refused"),
    ],
)
def test_the_exporter_keeps_a_bounded_window_of_scrapes_per_replica(
    window: str, interval: str, taken: bool
) -> None:
    text = f"interval: {interval}\ntimeout: 50ms\nstable-window: {window}\n"
    if taken:
        assert parse_exporter_config(text).stable_window <= MAX_STABLE_WINDOW
    else:
        with pytest.raises(ConfigError) as caught:
            parse_exporter_config(text)
        assert "stable-window" in str(caught.value)


@given(
    window=st.floats(min_value=1.0, max_value=1e7),
    interval=st.floats(min_value=0.1, max_value=60.0),
)
def test_an_exporter_config_taken_keeps_at_most_the_bounded_scrapes(
    window: float, interval: float
) -> None:
    try:
        config = parse_exporter_config(
            f"interval: {interval}s\ntimeout: 50ms\nstable-window: {window}s\n"
            f"panic-window: {min(window, 1.0)}s\n"
        )
    except ConfigError:
        return
    assert config.stable_window <= MAX_STABLE_WINDOW
    assert config.stable_window <= MAX_WINDOW_SCRAPES * config.interval


def _deployments(count: int) -> str:
    return "deployments:\n" + "".join(
        f"- {{namespace: n, deployment: d{i}, endpoint-slices: {{service: s{i}, port: 8000}}}}\n"
        for i in range(count)
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(_deployments(MAX_DEPLOYMENTS + 1), "deployments", id="a deployment past 256"),
        pytest.param("max-body-bytes: 1000000000000\n", "max-body-bytes", id="a terabyte body"),
        pytest.param("max-series: 1000000000000\n", "max-series", id="10^12 wanted samples"),
    ],
)
def test_an_exporter_size_past_its_bound_is_refused_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_exporter_config(text)
    assert f"'{key}'" in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_deployments(MAX_DEPLOYMENTS), id="256 deployments are taken"),
        pytest.param(f"max-body-bytes: {MAX_BODY_BYTES_LIMIT}\n", id="a 64 MiB body cap is taken"),
        pytest.param(f"max-series: {MAX_SERIES_LIMIT}\n", id="a million wanted samples are taken"),
    ],
)
def test_an_exporter_size_at_its_bound_is_taken(text: str) -> None:
    parse_exporter_config(text)


@pytest.mark.parametrize(
    ("value", "taken"),
    [
        pytest.param("30s", True, id="the default signal age is taken"),
        pytest.param("1h", True, id="an hour-old signal may still count"),
        pytest.param("3601s", False, id="a second past an hour is refused"),
        pytest.param("2562047h", False, id="Go's largest duration is refused"),
    ],
)
def test_a_signal_age_past_an_hour_is_refused_in_metadata_and_config(
    value: str, taken: bool
) -> None:
    raw = {"scalerAddress": "x:1", "deployment": "llama", "maxSignalAge": value}
    if taken:
        assert (
            parse_metadata(raw).max_signal_age
            == parse_config(f"max-signal-age: {value}\n").max_signal_age
        )
        return
    with pytest.raises(MetadataError, match="maxSignalAge"):
        parse_metadata(raw)
    with pytest.raises(ConfigError, match="max-signal-age"):
        parse_config(f"max-signal-age: {value}\n")


def test_a_day_old_snapshot_is_stale_at_the_longest_signal_age() -> None:
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    raw = {"scalerAddress": "x:1", "deployment": "llama", "maxSignalAge": "1h"}
    scaled = registry.resolve("llama", "team-a", raw)
    receive(store, engine_signals(at=T0, queue=0.0, running=0.0))
    receive(store, gateway_signals(at=T0, arrival_rate=0.0))
    registry.current(scaled)
    clock.now = T0 + 86_400  # the sources went away a day ago
    with pytest.raises(StaleSignalError):
        registry.current(scaled)
