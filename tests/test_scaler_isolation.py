"""The scaler's last two loops that one unit's exception could stop (issue 27, class 1).

- The registry tells every activation listener (an open StreamIsActive) of an
  inactive-to-active transition: one listener that raises is counted and warned of, the
  others are told and the decision stands.
- The demo source publishes each deployment's snapshots as its own round: one that raises
  fails that deployment's round only, the loop goes on and the deployment recovers.

And class 3 from the Prometheus source: what it unmeasures is counted by signal, and a
signal time it cannot use is named as impossible, not as "no series match".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import pytest
from aiohttp import web

from scaler.config import DemoSourceConfig
from scaler.registry import ScaledObjectRegistry
from scaler.signals import SignalStore
from scaler.sources import demo_source, prometheus_source, receive
from tests.conftest import T0, FakeClock, engine_signals, ref
from tests.test_scaler_hostile_inputs import (
    BAD,
    GOOD,
    HostilePrometheus,
    SurpriseError,
    drain,
    engine,
    prometheus_config,
    sample,
    until,
    vector,
)

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


# --- the Prometheus source counts what it unmeasures (issue 27, class 3) ------------------


class ImpossibleTime(HostilePrometheus):
    """The bad target's signal time is ``time_value``; its other answers as told."""

    time_value = "1700000000"

    async def _query(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        if "timestamp(" in query and 'pod=~"bad-' in query:
            return web.json_response(vector(sample(self.time_value)))
        return await super()._query(request)


async def run_source(server: HostilePrometheus, store: SignalStore, rounds: int) -> None:
    """The source over GOOD and BAD until BAD's answers were served ``rounds`` times."""
    task = asyncio.create_task(
        prometheus_source(prometheus_config(server.url), store, lambda: [GOOD, BAD])
    )
    try:
        await until(lambda: server.bad_answers >= rounds, f"{rounds} bad answers")
        await until(lambda: engine(store, GOOD) is not None, "the good target's signals")
        assert not task.done()
    finally:
        await drain(task)
        await server.stop()


async def test_negative_load_from_prometheus_is_unmeasured_and_counted_by_signal(caplog):
    caplog.set_level(logging.WARNING, logger="scaler.sources")
    server = await HostilePrometheus().start()
    server.bad_body = json.dumps(vector(sample("-5"))).encode()
    store = SignalStore()
    await run_source(server, store, 3 * 16)  # three rounds of the 16 after the time and sleepers
    bad = engine(store, BAD)
    assert bad is not None and bad.running is None and bad.queue_depth is None
    assert store.unmeasured[("prometheus", "running")] >= 2
    assert store.unmeasured[("prometheus", "replicas")] >= 2
    warnings = [r.getMessage() for r in caplog.records if "team-a/bad" in r.getMessage()]
    assert len(warnings) == 1 and "running is negative" in warnings[0], warnings


@pytest.mark.parametrize(
    "time_value",
    [
        pytest.param("-1", id="a negative signal time leaves no signals, named as impossible"),
        pytest.param("NaN", id="a signal time of NaN leaves no signals, as no series"),
    ],
)
async def test_an_impossible_signal_time_is_said_so_not_no_series(time_value, caplog):
    caplog.set_level(logging.WARNING, logger="scaler.sources")
    server = ImpossibleTime()
    server.time_value = time_value
    await server.start()
    server.bad_body = json.dumps(vector(sample("3"))).encode()
    store = SignalStore()
    await run_source(server, store, 3 * 16)
    assert engine(store, BAD) is None  # nothing to date it by: it ages, KEDA: UNAVAILABLE
    warnings = [r.getMessage() for r in caplog.records if "team-a/bad" in r.getMessage()]
    assert len(warnings) == 1, warnings
    if time_value == "-1":
        assert store.errors[("prometheus", "impossible")] >= 2
        assert store.unmeasured[("prometheus", "signal-time")] >= 2
        assert "signal-time is negative" in warnings[0]
    else:  # NaN is Prometheus's own "no value" (a quantile over nothing): no sample
        assert store.errors[("prometheus", "no-series")] >= 2
