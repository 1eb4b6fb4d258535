"""Signals decide at once only what cannot wait for KEDA's call (issue 27, hostile pass 59).

Every snapshot of a target decided each ScaledObject naming it. With the scaler unable to
list ScaledObjects (no RBAC, or the list failing), 16 made-up ones on each of 200 busy
targets held it at a core: another target's calls UNAVAILABLE. Now a snapshot decides at
once only a ScaledObject at zero with an open StreamIsActive (its activation is pushed);
the rest are decided when KEDA asks, on the newest signals, as the replay judges them.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from foundation.errors import NoDataError
from scaler.registry import MAX_PER_TARGET, RegistryFullError, ScaledObject, ScaledObjectRegistry
from scaler.signals import SignalStore, shows_load
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals, gateway_signals, ref


def at_zero(at: float) -> Any:
    """The engines' message of a deployment at zero replicas, nothing asked of it."""
    message = engine_signals(at=at, queue=0.0, running=0.0)
    message.engine.replicas_scraped = message.engine.replicas_up = 0
    for window in (message.engine.stable, message.engine.panic):
        window.request_rate = window.prompt_token_rate = window.generation_token_rate = 0.0
    return message


def served_only() -> Any:
    """Engines whose gauges are unknown while their window served requests."""
    message = engine_signals(queue=None, running=None)
    message.engine.stable.request_rate = 2.0
    return message


def registry_with(clock: FakeClock) -> tuple[SignalStore, ScaledObjectRegistry]:
    store = SignalStore(clock)
    return store, ScaledObjectRegistry(store, 30.0, clock)


def decisions(scaled: ScaledObject) -> int:
    return scaled.state.decisions


@pytest.mark.parametrize(
    ("streaming", "busy_before", "decided_at_once"),
    [
        pytest.param(
            True, False, True, id="at zero with a stream open it is decided on the snapshot"
        ),
        pytest.param(False, False, False, id="at zero without a stream it waits for KEDA's poll"),
        pytest.param(True, True, False, id="active with a stream KEDA has its replicas and asks"),
        pytest.param(False, True, False, id="active without a stream it is decided when asked"),
    ],
)
def test_a_snapshot_decides_at_once_only_a_listened_to_scaled_object_at_zero(
    streaming: bool, busy_before: bool, decided_at_once: bool
) -> None:
    clock = FakeClock(T0)
    store, registry = registry_with(clock)
    scaled = registry.resolve("llama", "team-a", {**ref().scalerMetadata, "idleGrace": "0s"})
    first = engine_signals(at=T0, running=32.0) if busy_before else at_zero(T0)
    receive(store, first)
    assert registry.current(scaled).active is busy_before
    pushed: list[bool] = []
    if streaming:
        registry.add_activation_listener(scaled, lambda: pushed.append(True))
    before = decisions(scaled)
    clock.now = T0 + 1
    receive(store, engine_signals(at=clock.now, running=4.0))
    assert decisions(scaled) == before + decided_at_once
    assert pushed == ([True] if decided_at_once else [])
    assert registry.current(scaled).active  # KEDA's call sees the newest, decided once
    assert decisions(scaled) == before + 1


def test_many_scaled_objects_on_a_busy_target_cost_nothing_until_asked() -> None:
    clock = FakeClock(T0)
    store, registry = registry_with(clock)
    own = [
        registry.resolve(f"so-{n}", "team-a", {**ref("busy").scalerMetadata})
        for n in range(MAX_PER_TARGET)
    ]
    theirs = [
        registry.resolve("so", f"tenant-{n}", {**ref("busy").scalerMetadata, "namespace": "team-a"})
        for n in range(MAX_PER_TARGET)
    ]
    every = own + theirs
    assert len({s.target for s in every}) == 1
    for step in range(100):
        clock.now = T0 + step
        receive(store, engine_signals("busy", at=clock.now, running=32.0))
    assert [decisions(s) for s in every] == [0] * len(every)
    assert registry.current(own[0]).desired_replicas == 2  # the one asked, on the last
    assert [decisions(s) for s in every] == [1] + [0] * (len(every) - 1)
    signals = store.get(own[0].target)
    assert signals is not None and own[0].signals_version == signals.version


def test_a_stream_that_saw_the_fall_to_zero_is_pushed_the_next_rise() -> None:
    clock = FakeClock(T0)
    store, registry = registry_with(clock)
    scaled = registry.resolve("llama", "team-a", {**ref().scalerMetadata, "idleGrace": "0s"})
    receive(store, engine_signals(at=T0, running=8.0))
    assert registry.current(scaled).active
    pushed: list[float] = []
    registry.add_activation_listener(scaled, lambda: pushed.append(clock.now))
    clock.now = T0 + 1
    receive(store, at_zero(clock.now))
    assert not registry.current(scaled).active  # KEDA's poll: it falls to zero
    for step, running in ((2, 0.0), (3, 3.0), (4, 9.0)):
        clock.now = T0 + step
        receive(store, engine_signals(at=clock.now, running=running))
    assert pushed == [T0 + 3]  # the rise, once, the moment its signals came


def test_asking_about_a_scaled_object_without_signals_holds_no_more_each_call() -> None:
    # Hostile pass 60: its kept "no signals yet" error was raised as it was, and each
    # raise added the caller's frames to its traceback: 5.5 KB a call, held for good.
    clock = FakeClock(T0)
    _, registry = registry_with(clock)
    scaled = registry.resolve("llama", "team-a", {**ref().scalerMetadata})

    def frames_after(calls: int) -> int:
        for _ in range(calls):
            with pytest.raises(NoDataError) as refused:
                registry.current(scaled)
        depth, tb = 0, refused.value.__traceback__
        while tb is not None:
            depth, tb = depth + 1, tb.tb_next
        return depth

    assert frames_after(1) == frames_after(1_000) <= 3
    assert scaled.error is not None and scaled.error.__traceback__ is None  # kept bare


def test_a_deployments_scaled_objects_are_found_without_a_walk_over_all() -> None:
    clock = FakeClock(T0)
    _, registry = registry_with(clock)
    for n in range(50):
        registry.resolve(f"other-{n}", "team-a", {**ref(f"dep-{n}").scalerMetadata})
    theirs = registry.resolve("b", "tenant", {**ref("llama").scalerMetadata, "namespace": "team-a"})
    own = registry.resolve("a", "team-a", {**ref().scalerMetadata, "model": "m"})
    assert registry.naming("team-a", "llama") == [own, theirs]  # by key, whatever model
    assert registry.naming("team-a", "nothing") == []


def test_scaled_objects_naming_one_deployment_are_bounded_whatever_model() -> None:
    # Hostile pass 60: the bound counted per model, so 8,000 ScaledObjects each naming
    # another model of one deployment were kept, each in every GetStandbyPlan answer of
    # it (256 ms of the event loop a call). KEDA itself takes one per workload.
    clock = FakeClock(T0)
    _, registry = registry_with(clock)
    for n in range(MAX_PER_TARGET):
        registry.resolve(f"so-{n}", "team-a", {**ref("busy").scalerMetadata, "model": f"m{n}"})
    with pytest.raises(RegistryFullError, match=r"team-a/busy is named by 8 .*\(whatever model\)"):
        registry.resolve("so-x", "team-a", {**ref("busy").scalerMetadata, "model": "other"})
    moved = registry.resolve("so-0", "team-a", {**ref("busy").scalerMetadata, "model": "m9"})
    assert moved.target == ("team-a", "busy", "m9")  # one of its own changes model
    registry.resolve("so-0", "team-a", {**ref("elsewhere").scalerMetadata})
    registry.resolve("so-x", "team-a", {**ref("busy").scalerMetadata, "model": "other"})
    assert registry.errors["target-full"] == 1


def test_quiet_snapshots_of_an_idle_target_decide_no_streamed_scaled_object() -> None:
    # Hostile pass 60: 16 ScaledObjects with open streams on each of 300 idle targets
    # were decided on every quiet snapshot: 94% of a core. Load decides them at once.
    clock = FakeClock(T0)
    store, registry = registry_with(clock)
    receive(store, at_zero(T0))
    waiting = [registry.resolve(f"so-{n}", "team-a", {**ref().scalerMetadata}) for n in range(8)]
    pushed: list[str] = []
    for scaled in waiting:
        assert not registry.current(scaled).active
        registry.add_activation_listener(scaled, functools.partial(pushed.append, scaled.key[1]))
    for step in range(1, 101):
        clock.now = T0 + step
        receive(store, at_zero(clock.now))
    assert [decisions(s) for s in waiting] == [1] * len(waiting) and not pushed
    clock.now += 1
    receive(store, engine_signals(at=clock.now, queue=2.0, running=0.0))
    assert [decisions(s) for s in waiting] == [2] * len(waiting)
    assert sorted(pushed) == sorted(s.key[1] for s in waiting)


@pytest.mark.parametrize(
    ("engine", "gateway", "load"),
    [
        pytest.param(None, None, False, id="no snapshot shows nothing"),
        pytest.param(at_zero(T0), None, False, id="engines at zero show nothing"),
        pytest.param(
            at_zero(T0),
            gateway_signals(buffered=1),
            True,
            id="the gateway buffering one at zero shows load",
        ),
        pytest.param(
            None,
            gateway_signals(in_flight=0, arrival_rate=0.5),
            True,
            id="arrivals alone show load",
        ),
        pytest.param(
            served_only(),
            None,
            True,
            id="requests served in the window show load with gauges unknown",
        ),
        pytest.param(
            None, gateway_signals(arrival_rate=None), False, id="an unmeasured rate is no load"
        ),
    ],
)
def test_what_shows_load(engine: Any, gateway: Any, load: bool) -> None:
    clock = FakeClock(T0)
    store = SignalStore(clock)
    for message in (engine, gateway):
        if message is not None:
            receive(store, message)
    assert shows_load(store.get(("team-a", "llama", ""))) is load
