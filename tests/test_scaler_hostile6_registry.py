"""Every way into a served decision is gated by the push gap; more triggers than two are caught.

Issue 27, hostile pass 6:

- S6-H1: pass 5 gated decisions on pushed signals (``PUSH_DECISION_GAP``), but KEDA's
  calls (IsActive, GetMetrics, and GetInferenceDemand, GetStandbyPlan that refresh as
  they do) still decided on every snapshot not yet seen. Each decision copies its
  windows (``Recent``), so a fast source and a fast caller cost 0.24 ms a call after 1 s
  and 3.4 ms after 10 s, growing with the window. A decision less than the gap old
  now stands and one trailing decision sees the newest, as for pushes.
- S6-M1: three unitscale triggers on one ScaledObject (KEDA sends them all under its one
  name) cycled A, B, C: the two-trigger guard remembered only the map just replaced,
  so every call was an edit (two INFO lines a call, the metadata swapped each call).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from foundation.errors import MetadataError
from scaler.registry import MAX_RIVALS, ScaledObject, ScaledObjectRegistry
from scaler.server import _call_later
from scaler.signals import SignalStore
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals, gateway_signals
from tests.test_scaler_hostile5_registry import idle_at_zero

GAP = 0.05
"""A short gap keeps the test quick; the served one is ``PUSH_DECISION_GAP``."""

META = {"scalerAddress": "x:1", "deployment": "llama"}


def served(
    later: Callable[[float, Callable[[], None]], bool] = _call_later,
) -> tuple[FakeClock, SignalStore, ScaledObjectRegistry, ScaledObject]:
    """A served registry (push gap, a loop's timer) with one idle ScaledObject decided."""
    return idle_at_zero(GAP, later)


async def test_calls_on_new_snapshots_within_the_gap_are_one_trailing_decision() -> None:
    clock, store, registry, scaled = served()
    activated = asyncio.Event()
    registry.add_activation_listener(scaled, activated.set)
    before = scaled.state.decisions
    for n in range(1, 2001):  # each call has a snapshot it has not seen
        clock.now = T0 + n * 1e-6
        receive(store, gateway_signals(at=clock.now, buffered=n, arrival_rate=1.0))
        registry.current(scaled)
    assert scaled.state.decisions == before  # the decision within the gap stands
    async with asyncio.timeout(30):  # a cap against hangs, not a timing check
        await activated.wait()
    assert scaled.state.decisions == before + 1
    signals = store.get(scaled.target)
    assert signals is not None and scaled.signals_version == signals.version
    assert registry.current(scaled).active


def test_a_call_after_the_gap_decides_on_the_newest_at_once() -> None:
    clock, store, registry, scaled = served()
    clock.now += 2 * GAP
    store_version = scaled.signals_version
    receive(store, gateway_signals(at=clock.now, buffered=3, arrival_rate=1.0))
    assert registry.current(scaled).active
    assert scaled.signals_version != store_version


def test_without_a_loop_a_call_still_decides_at_once() -> None:
    clock, store, registry, scaled = served(later=lambda delay, call: False)
    receive(store, gateway_signals(at=clock.now, buffered=3, arrival_rate=1.0))
    assert registry.current(scaled).active


def test_stale_signals_are_answered_unavailable_at_once_within_the_gap() -> None:
    clock, _, registry, scaled = served()
    clock.now += 31.0  # past max-signal-age: no decision stands
    with pytest.raises(Exception, match="stale"):
        registry.current(scaled)


def test_metadata_edits_each_call_are_one_trailing_decision() -> None:
    timers: list[Callable[[], None]] = []  # the loop's call_later, run by hand

    def later(delay: float, call: Callable[[], None]) -> bool:
        timers.append(call)
        return True

    clock, _, registry, scaled = served(later)
    registry.resolve("llama", "team-a", {**META, "maxReplicas": "7"})  # an edit decides at once
    assert scaled.decision is not None and scaled.policy.max_replicas == 7
    before = scaled.state.decisions
    for n in range(8, 1008):  # a client with new metadata each call
        clock.now += 1e-6
        registry.resolve("llama", "team-a", {**META, "maxReplicas": str(n)})
    assert scaled.state.decisions == before and len(timers) == 1
    timers.pop()()
    assert scaled.state.decisions == before + 1
    assert scaled.policy.max_replicas == 1007


def test_a_call_within_the_gap_of_an_edit_is_answered_on_its_own_metadata() -> None:
    # Hostile pass 60: a caller sending other metadata under KEDA's ScaledObject just
    # before each of KEDA's calls (an idle deployment, a new maxReplicas each time) had
    # KEDA answered the edit's decision: 0 for a busy deployment, in 19 calls of 20.
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock, push_gap=GAP, later=lambda d, c: True)
    receive(store, engine_signals(at=T0, running=32.0))
    idle = engine_signals("idle", at=T0, queue=0.0, running=0.0)
    idle.engine.replicas_up = idle.engine.replicas_scraped = 0
    receive(store, idle)
    keda = {**META, "targetConcurrency": "16", "maxReplicas": "50"}
    scaled = registry.resolve("llama", "team-a", keda)
    busy = registry.current(scaled).desired_replicas
    assert busy > 0
    for n in range(1, 21):
        clock.now = T0 + n
        stranger = {**META, "deployment": "idle", "maxReplicas": str(n), "idleGrace": "0s"}
        assert registry.current(registry.resolve("llama", "team-a", stranger)).desired_replicas == 0
        clock.now += GAP / 10  # KEDA's call, within the gap of the stranger's edit
        assert registry.current(registry.resolve("llama", "team-a", keda)).desired_replicas == busy


def test_signals_dated_at_the_edge_of_their_age_keep_a_decision_once_a_gap() -> None:
    # Hostile pass 61: one source's snapshots dated just inside max-signal-age expire a
    # moment after they come (the other's fresh), and a decision past its signals' age
    # was kept at once on each call: a window sample a call, what the gap exists to stop.
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock, push_gap=GAP, later=lambda d, c: True)
    scaled = registry.resolve("llama", "team-a", META)
    receive(store, engine_signals(at=T0, running=8.0))
    assert receive(store, gateway_signals(at=T0 - 30.0 + 5e-4, in_flight=8))
    assert registry.current(scaled).active
    before = scaled.state.decisions
    for n in range(1, 201):  # 0.2 s of calls, a millisecond apart
        clock.now = T0 + n * 1e-3
        receive(store, engine_signals(at=clock.now, running=8.0))
        assert receive(store, gateway_signals(at=clock.now - 30.0 + 5e-4, in_flight=8))
        clock.now += 1e-4  # the last decision's signals aged a moment ago: it looks again
        assert registry.current(scaled).active  # every call answered
    assert scaled.state.decisions - before <= 0.2 / GAP + 1


def _cycle(registry: ScaledObjectRegistry, clock: FakeClock, maps: list[dict[str, str]], n: int):
    """``n`` calls cycling ``maps``: the metadata each was refused with, or None."""
    refused: list[str | None] = []
    for i in range(n):
        clock.now += 1.0
        try:
            registry.resolve("llama", "team-a", maps[i % len(maps)])
            refused.append(None)
        except MetadataError:
            refused.append(maps[i % len(maps)]["deployment"])
    return refused


@pytest.mark.parametrize(
    "triggers",
    [
        pytest.param(2, id="two triggers: the second is refused, the first keeps its own"),
        pytest.param(3, id="three triggers cycling A B C: both others are refused"),
        pytest.param(5, id="five triggers: every other is refused"),
    ],
)
def test_more_triggers_than_one_settle_on_the_first_with_the_others_refused(
    triggers: int, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    maps = [{**META, "deployment": f"d{k}"} for k in range(triggers)]
    with caplog.at_level(logging.INFO, logger="scaler.registry"):
        refused = _cycle(registry, clock, maps, 300)
    settled = refused[-triggers * 10 :]
    scaled = registry.get("team-a", "llama")
    assert scaled is not None
    current = scaled.raw_metadata["deployment"]
    others = [m["deployment"] for m in maps if m["deployment"] != current]
    assert sorted(r for r in settled if r is not None) == sorted(others * 10)
    assert settled.count(None) == 10  # the current one is answered every time
    changes = [r for r in caplog.records if "metadata changed" in r.getMessage()]
    assert len(changes) <= 1 and len(caplog.records) < 3 * triggers + 5


def test_rivals_are_bounded_and_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    maps = [{**META, "deployment": f"d{k}"} for k in range(MAX_RIVALS * 3)]
    with caplog.at_level(logging.WARNING, logger="scaler.registry"):
        _cycle(registry, clock, maps, 2000)
    scaled = registry.get("team-a", "llama")
    assert scaled is not None
    assert len(scaled.rivals) <= MAX_RIVALS and len(scaled.replaced) <= MAX_RIVALS
    assert len(caplog.records) <= MAX_RIVALS


def test_an_edit_and_its_revert_minutes_apart_stay_edits() -> None:
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    a, b = {**META, "deployment": "a"}, {**META, "deployment": "b"}
    for metadata in (a, b, a, b, a):
        clock.now += 3600.0
        assert registry.resolve("llama", "team-a", metadata).raw_metadata == metadata
