"""The fourth hostile pass, the scaler's side (issue 27): finite values no deployment has.

An impossible or missing value is never a zero and never lowers a replica count: it is
unmeasured (the count holds) and counted.

- S4-H1: an engine request rate above its generation token rate (under one output token a
  request), or far above the gateway's arrivals, was read as a one-token mix and scaled a
  loaded deployment down to ``minReplicas``.
- S4-M2: a backlog of 4294967295, a queue or arrival rate of 1e300, a 10^12-token mean
  prompt were taken as facts and pinned ``maxReplicas`` silently.
- S4-M3: a source naming ``max_targets`` junk targets every round kept a target a
  ScaledObject is bound to out of the store for good.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.signals import (
    MAX_LATENCY,
    MAX_MEAN_TOKENS,
    MAX_REQUEST_RATE,
    MAX_REQUESTS,
    MAX_TOKEN_RATE,
    EngineSignals,
    GatewaySignals,
    Quantiles,
    Snapshot,
    WindowSignals,
    checked,
)
from scaler.registry import ScaledObjectRegistry
from scaler.signals import SignalStore
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals, gateway_signals

KEY = ("team-a", "llama", "")


def loaded(request_rate: float, at: float, means: bool = False):
    """10 replicas serving 40 requests/s of 2000 prompt and 300 output tokens each."""
    message = engine_signals(running=80.0, queue=2.0, at=at)
    message.engine.replicas_scraped = message.engine.replicas_up = 10
    for window in (message.engine.stable, message.engine.panic):
        window.prompt_token_rate = 40 * 2000.0
        window.generation_token_rate = 40 * 300.0
        window.request_rate = request_rate
        window.requests_running_mean = 80.0
        if means:
            window.mean_prompt_tokens, window.mean_output_tokens = 2000.0, 300.0
    return message


@pytest.mark.parametrize(
    ("request_rate", "profile"),
    [
        pytest.param(1e6, True, id="a million finished a second beside 12,000 tokens holds"),
        pytest.param(1e6, False, id="the same on the priors holds"),
    ],
)
def test_a_request_rate_no_mix_has_never_lowers_a_loaded_deployment(request_rate, profile):
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    metadata = {"scalerAddress": "x:1", "deployment": "llama", "maxReplicas": "100"}
    if profile:
        metadata["profile"] = "llama3-8b-h200"
    scaled = registry.resolve("llama", "team-a", metadata)
    at = T0
    for step in range(45):  # 30 s of truth, then 7 minutes past any scale-down window
        receive(store, loaded(40.0 if step < 3 else request_rate, at))
        gateway = gateway_signals(at=at, arrival_rate=40.0, in_flight=82)
        gateway.gateway.slo_within_rate, gateway.gateway.slo_outside_rate = 39.0, 1.0
        receive(store, gateway)
        clock.now = at
        decision = registry.current(scaled)
        if step == 2:
            before = decision.desired_replicas
        elif step > 2:
            assert decision.desired_replicas >= before, decision.reason
        at += 10
    assert store.unmeasured[("exporter", "request_rate")] > 0


def window(**values: Any) -> WindowSignals:
    return WindowSignals(seconds=60.0, **values)


def engine(stable: WindowSignals, **values: object) -> EngineSignals:
    fields: dict[str, object] = {
        "time": T0, "replicas": 4, "replicas_up": 4, "queue_depth": 0.0, "running": 8.0,
        "kv_usage": 0.1, "panic": window(), "stable": stable,
        "cost_per_million_tokens": None, "cost_per_million_output_tokens": None,
        "price_is_default": True, "partial": False,
    }  # fmt: skip
    return EngineSignals(**{**fields, **values})  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    requests=st.floats(0, MAX_REQUEST_RATE),
    generated=st.floats(0, MAX_TOKEN_RATE),
)
def test_a_request_rate_is_kept_only_at_or_under_the_tokens_generated(requests, generated):
    signals, impossible = checked(
        engine(window(request_rate=requests, generation_token_rate=generated))
    )
    assert isinstance(signals, EngineSignals)
    if requests <= generated:
        assert signals.stable.request_rate == requests and not impossible
    else:  # each request ends with a token generated in the window: more is no rate
        assert signals.stable.request_rate is None
        assert impossible == (("stable.request_rate", requests),)
    assert signals.stable.generation_token_rate == generated


BOUNDED = [
    pytest.param("gateway", "buffered", MAX_REQUESTS, id="a gateway backlog past the bound"),
    pytest.param("gateway", "in_flight", MAX_REQUESTS, id="gateway in-flight past the bound"),
    pytest.param("gateway", "arrival_rate", MAX_REQUEST_RATE, id="arrivals past 10^6 a second"),
    pytest.param("engine", "queue_depth", MAX_REQUESTS, id="an engine queue past the bound"),
    pytest.param("engine", "running", MAX_REQUESTS, id="requests running past the bound"),
    pytest.param(
        "stable", "mean_prompt_tokens", MAX_MEAN_TOKENS, id="a mean prompt past any context"
    ),
    pytest.param("stable", "mean_output_tokens", MAX_MEAN_TOKENS, id="a mean output past any"),
    pytest.param(
        "stable", "prompt_token_rate", MAX_TOKEN_RATE, id="prompt tokens past every replica"
    ),
    pytest.param("stable", "request_rate", MAX_REQUEST_RATE, id="finished past 10^6 a second"),
    pytest.param("stable", "ttft", MAX_LATENCY, id="a TTFT p95 past a day"),
]


def _signals(where: str, name: str, value: float) -> EngineSignals | GatewaySignals:
    if where == "gateway":
        fields = {"time": T0, "arrival_rate": 1.0, "buffered": 0, "in_flight": 8, name: value}
        return GatewaySignals(**fields)  # type: ignore[arg-type]
    if where == "engine":
        return engine(window(), **{name: value})
    if name == "ttft":
        return engine(replace(window(), ttft=Quantiles(p95=value)))
    return engine(window(generation_token_rate=MAX_TOKEN_RATE, **{name: value}))


def _read(signals: EngineSignals | GatewaySignals, where: str, name: str) -> object:
    if where != "stable":
        return getattr(signals, name)
    assert isinstance(signals, EngineSignals)
    return signals.stable.ttft.p95 if name == "ttft" else getattr(signals.stable, name)


@pytest.mark.parametrize(("where", "name", "bound"), BOUNDED)
@settings(max_examples=60, deadline=None)
@given(over=st.floats(1.0, 1e300) | st.sampled_from([4294967295.0]))
def test_a_load_figure_past_its_domain_is_unmeasured_not_a_fact(where, name, bound, over):
    value = bound + over if bound + over > bound else math.nextafter(bound, math.inf)
    whole = name in ("buffered", "in_flight")
    signals, impossible = checked(_signals(where, name, int(value) if whole else value))
    assert _read(signals, where, name) is None
    assert [field.split(".")[1 if where == "stable" else 0] for field, _ in impossible] == [name]
    kept, nothing = checked(_signals(where, name, int(bound) if whole else bound))
    assert _read(kept, where, name) == bound and not nothing


@pytest.mark.parametrize(
    ("gateway", "engine_values"),
    [
        pytest.param({"buffered": 4294967295}, {}, id="a uint32 backlog does not pin the maximum"),
        pytest.param({"arrival_rate": 1e300}, {}, id="1e300 arrivals do not pin the maximum"),
        pytest.param({}, {"queue_depth": 1e300}, id="a queue of 1e300 does not pin the maximum"),
        pytest.param(
            {},
            {"stable.mean_prompt_tokens": 1e12, "panic.mean_prompt_tokens": 1e12},
            id="a 10^12-token mean prompt does not pin the maximum",
        ),
    ],
)
def test_an_impossible_load_figure_is_counted_and_leaves_the_count_where_it_was(
    gateway, engine_values
):
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    metadata = {"scalerAddress": "x:1", "deployment": "llama", "maxReplicas": "100"}
    scaled = registry.resolve("llama", "team-a", {**metadata, "profile": "llama3-8b-h200"})
    message = engine_signals(running=8.0, queue=0.0, at=T0)
    message.engine.replicas_scraped = message.engine.replicas_up = 4
    for part in (message.engine.stable, message.engine.panic):
        part.prompt_token_rate, part.generation_token_rate, part.request_rate = 1000.0, 200.0, 1.0
        part.mean_prompt_tokens, part.mean_output_tokens = 1000.0, 200.0
        part.requests_running_mean = 8.0
    for name, value in engine_values.items():
        part_name, _, field = name.rpartition(".")
        setattr(getattr(message.engine, part_name) if part_name else message.engine, field, value)
    receive(store, message)
    wire = gateway_signals(at=T0, arrival_rate=1.0, in_flight=8)
    for name, value in gateway.items():
        setattr(wire.gateway, name, value)
    receive(store, wire)
    decision = registry.current(scaled)
    assert decision.desired_replicas < 100, decision.reason
    assert len(decision.reason) < 300
    assert sum(store.unmeasured.values()) >= 1


def _engine_at(deployment: str, at: float) -> Snapshot:
    return Snapshot(("junk", deployment, ""), engine(window(), time=at))


@pytest.mark.parametrize(
    ("bound", "kept", "evicted"),
    [
        pytest.param(True, True, "junk/d0", id="a bound target takes the stalest junk's place"),
        pytest.param(False, False, None, id="an unbound new target is still refused when full"),
    ],
)
def test_a_full_store_admits_a_target_a_scaled_object_scales(bound, kept, evicted):
    clock = FakeClock(T0)
    store = SignalStore(clock, max_targets=3)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    for round_ in range(3):  # the flood is refreshed every round: evict_idle frees nothing
        for i in range(3):
            clock.now = T0 + round_ * 300 + i
            assert store.update(_engine_at(f"d{i}", clock.now))
    if bound:
        registry.resolve("new", "junk", {"scalerAddress": "x:1", "deployment": "new"})
    assert store.update(_engine_at("new", clock.now)) is kept
    keys = {f"{key[0]}/{key[1]}" for key in store.keys()}
    assert len(keys) == 3 and ("junk/new" in keys) is kept
    assert (evicted is None) or evicted not in keys
    assert store.evicted == (1 if kept else 0)
    assert store.refused[("exporter", "full")] == (0 if kept else 1)


def test_a_full_store_of_bound_targets_evicts_none_of_them():
    clock = FakeClock(T0)
    store = SignalStore(clock, max_targets=2)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    for name in ("d0", "d1", "new"):
        registry.resolve(name, "junk", {"scalerAddress": "x:1", "deployment": name})
    assert store.update(_engine_at("d0", T0)) and store.update(_engine_at("d1", T0))
    assert not store.update(_engine_at("new", T0))
    assert store.refused[("exporter", "full")] == 1 and store.evicted == 0
