"""Signals pushed faster than ``push_gap`` are one trailing decision, not one each.

Issue 27, hostile pass 5, S5-H2: every accepted snapshot was a full decision, and each
decision adds a sample to its state's windows (a tuple copied whole), so a source sending
1,000 snapshots a second cost 6.5 ms a snapshot after 20 s (quadratic CPU on the event
loop; a gateway publishes on every buffered request). The served registry decides on
pushed signals at most once per ``PUSH_DECISION_GAP``; what comes within it is decided
once at its end, so an activation still reaches StreamIsActive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from scaler.registry import PUSH_DECISION_GAP, ScaledObject, ScaledObjectRegistry
from scaler.server import _call_later
from scaler.signals import SignalStore
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals, gateway_signals

GAP = 0.05
"""A short gap keeps the test quick; the served one is ``PUSH_DECISION_GAP``."""


def idle_at_zero(
    push_gap: float,
    later: Callable[[float, Callable[[], None]], bool] = _call_later,
) -> tuple[FakeClock, SignalStore, ScaledObjectRegistry, ScaledObject]:
    """A ScaledObject at zero replicas, idle, decided inactive, with an open
    StreamIsActive (a listener): the one kind decided on signals, not only when asked."""
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock, push_gap=push_gap, later=later)
    scaled = registry.resolve("llama", "team-a", {"scalerAddress": "x:1", "deployment": "llama"})
    engine = engine_signals(at=T0, queue=0.0, running=0.0)
    engine.engine.replicas_scraped = engine.engine.replicas_up = 0
    for window in (engine.engine.stable, engine.engine.panic):
        window.request_rate = window.prompt_token_rate = window.generation_token_rate = 0.0
    receive(store, engine)
    receive(store, gateway_signals(at=T0, arrival_rate=0.0))
    assert not registry.current(scaled).active
    registry.add_activation_listener(scaled, lambda: None)
    return clock, store, registry, scaled


async def test_a_flood_within_the_gap_is_one_trailing_decision_that_sees_the_last() -> None:
    clock, store, registry, scaled = idle_at_zero(GAP)
    activated = asyncio.Event()
    registry.add_activation_listener(scaled, activated.set)
    before = scaled.state.decisions
    for n in range(1, 5001):
        clock.now = T0 + n * 1e-6  # 5,000 snapshots within the gap
        receive(store, gateway_signals(at=clock.now, buffered=n, arrival_rate=1.0))
    assert scaled.state.decisions == before  # none decided at once
    async with asyncio.timeout(30):  # a cap against hangs, not a timing check
        await activated.wait()
    assert scaled.state.decisions == before + 1
    signals = store.get(scaled.target)
    assert signals is not None and scaled.signals_version == signals.version
    assert scaled.decision is not None and scaled.decision.active


async def test_signals_after_the_gap_are_decided_at_once() -> None:
    clock, store, _, scaled = idle_at_zero(GAP)
    clock.now += 2 * GAP
    receive(store, gateway_signals(at=clock.now, buffered=3, arrival_rate=1.0))
    assert scaled.decision is not None and scaled.decision.active


@pytest.mark.parametrize(
    ("snapshots", "buffered", "streaming", "decided"),
    [
        pytest.param(1, 1, True, 1, id="a snapshot showing load at zero with a stream decides"),
        pytest.param(
            50, 1, True, 1, id="fifty showing load are one decision: active, KEDA asks after"
        ),
        pytest.param(50, 0, True, 0, id="fifty quiet ones wait for KEDA's poll, stream or not"),
        pytest.param(50, 1, False, 0, id="fifty showing load without a stream wait for KEDA"),
    ],
)
def test_without_a_gap_a_listened_to_scaled_object_at_zero_decides_on_load(
    snapshots: int, buffered: int, streaming: bool, decided: int
) -> None:
    clock, store, registry, scaled = idle_at_zero(0.0)
    if not streaming:
        scaled.activation_listeners.clear()
    before = scaled.state.decisions
    for _ in range(snapshots):
        receive(store, gateway_signals(at=clock.now, buffered=buffered, arrival_rate=0.0))
    assert scaled.state.decisions == before + decided
    assert registry.current(scaled).active is bool(buffered)  # KEDA's call: the newest
    signals = store.get(scaled.target)
    assert signals is not None and scaled.signals_version == signals.version


async def test_a_trailing_decision_of_a_forgotten_scaled_object_decides_nothing() -> None:
    clock, store, registry, scaled = idle_at_zero(GAP)
    receive(store, gateway_signals(at=clock.now, buffered=3, arrival_rate=1.0))
    assert scaled.push_pending
    scaled.activation_listeners.clear()  # its stream closed: it may be forgotten
    clock.now += 3600
    registry.evict_idle(60)
    before = scaled.signals_version
    registry._decide_due(scaled)  # what the loop's timer calls
    assert scaled.signals_version == before and not scaled.push_pending


def test_the_served_gap_is_short_beside_a_cold_start() -> None:
    assert 0 < PUSH_DECISION_GAP <= 1.0


def test_without_an_event_loop_no_trailing_decision_is_scheduled_and_a_call_decides() -> None:
    clock, store, registry, scaled = idle_at_zero(GAP)
    receive(store, gateway_signals(at=clock.now, buffered=3, arrival_rate=1.0))
    assert not scaled.push_pending  # nothing to run it: KEDA's next call decides
    assert registry.current(scaled).active
