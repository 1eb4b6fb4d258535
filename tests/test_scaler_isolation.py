"""The scaler's last two loops that one unit's exception could stop (issue 27, class 1).

- The registry tells every activation listener (an open StreamIsActive) of an
  inactive-to-active transition: one listener that raises is counted and warned of, the
  others are told and the decision stands.
- The demo source publishes each deployment's snapshots as its own round: one that raises
  fails that deployment's round only, the loop goes on and the deployment recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from scaler.config import DemoSourceConfig
from scaler.registry import ScaledObjectRegistry
from scaler.signals import SignalStore
from scaler.sources import demo_source, receive
from tests.conftest import T0, FakeClock, engine_signals, ref
from tests.test_scaler_hostile_inputs import SurpriseError, until

ERRORS = [
    pytest.param(KeyError("value"), id="a KeyError"),
    pytest.param(OverflowError("int too large"), id="an OverflowError"),
    pytest.param(RecursionError("too deep"), id="a RecursionError"),
    pytest.param(RuntimeError("queue closed"), id="a RuntimeError"),
    pytest.param(SurpriseError("nobody expects it"), id="an exception class nobody expects"),
]


@pytest.mark.parametrize("error", ERRORS)
def test_an_activation_listener_that_raises_is_its_own_and_the_others_are_told(error, caplog):
    caplog.set_level(logging.WARNING, logger="scaler.registry")
    clock = FakeClock()
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    first = registry.resolve("first", "team-a", {**ref().scalerMetadata})
    second = registry.resolve("second", "team-a", {**ref().scalerMetadata})  # same target
    told: list[str] = []

    def broken() -> None:
        raise error

    registry.add_activation_listener(first, broken)
    registry.add_activation_listener(first, lambda: told.append("first"))
    registry.add_activation_listener(second, lambda: told.append("second"))

    # The transition reaches the store through a watched message: nothing escapes it.
    assert receive(store, engine_signals(running=32.0, at=T0))
    assert sorted(told) == ["first", "second"]
    assert registry.current(first).active and registry.current(second).active
    assert first.listener_errors == 1 and second.listener_errors == 0
    assert not store.errors  # the message was stored whole
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "team-a/first" in warnings[0], warnings
    assert type(error).__name__ in warnings[0]

    # Active already: a further message is no transition, nobody is told again.
    clock.now += 1
    assert receive(store, engine_signals(running=40.0, at=T0 + 1))
    assert sorted(told) == ["first", "second"] and first.listener_errors == 1


@pytest.mark.parametrize("error", ERRORS)
async def test_a_demo_round_that_raises_fails_that_deployment_only_and_recovers(error, caplog):
    caplog.set_level(logging.INFO, logger="scaler.signals")
    config = DemoSourceConfig(deployments=["good", "bad"], interval=0.01)
    store = SignalStore()
    armed = True
    stored: dict[str, int] = {"good": 0, "bad": 0}

    def listener(key: tuple[str, str, str]) -> None:
        if armed and key[1] == "bad":
            raise error
        stored[key[1]] += 1

    store.add_listener(listener)
    task = asyncio.create_task(demo_source(config, store))
    try:
        await until(lambda: store.errors[("demo", "exception")] >= 3, "three failed rounds")
        good = stored["good"]
        await until(lambda: stored["good"] > good, "the good deployment's next round")
        assert not task.done() and stored["bad"] == 0
        armed = False
        await until(lambda: stored["bad"] >= 2, "the bad deployment recovers")
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    messages = [r.getMessage() for r in caplog.records if "demo/bad" in r.getMessage()]
    failed = [m for m in messages if type(error).__name__ in m]
    assert len(failed) == 1, messages  # once, not once a round
    assert any("usable again" in m for m in messages)
    assert not [r for r in caplog.records if "demo/good" in r.getMessage()]
