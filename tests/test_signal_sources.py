"""Signals reach the scaler over a real SignalsService watch, and survive a restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
import pytest

from foundation.signals import EngineSignals, GatewaySignals, WindowSignals
from protos.unitscale.v1 import signals_pb2 as sig
from protos.unitscale.v1 import signals_pb2_grpc as sig_grpc
from scaler.config import DemoSourceConfig, SignalSourceConfig
from scaler.signals import SignalStore, TargetSignals, observe
from scaler.sources import demo_concurrency, demo_signals, receive, watch_signals
from tests.conftest import T0, FakeClock, engine_signals


class Publisher(sig_grpc.SignalsServiceServicer):
    """A stand-in exporter: serves whatever the test queues."""

    def __init__(self):
        self.queue: asyncio.Queue[sig.Signals] = asyncio.Queue()

    async def WatchSignals(self, request, context):
        while True:
            yield sig.WatchSignalsResponse(signals=await self.queue.get())


async def start_publisher(port=0):
    server = grpc.aio.server()
    publisher = Publisher()
    sig_grpc.add_SignalsServiceServicer_to_server(publisher, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, publisher, port


def running(store):
    signals = store.get(("team-a", "llama", ""))
    assert signals is not None and signals.engine is not None
    return signals.engine.running


def version(store):
    signals = store.get(("team-a", "llama", ""))
    return signals.version if signals else 0


async def wait_for(store, predicate, within=5.0):
    updated = asyncio.Event()
    store.add_listener(lambda key: updated.set())
    async with asyncio.timeout(within):
        while not predicate():
            await updated.wait()
            updated.clear()


async def test_watch_feeds_the_store_and_reconnects_after_the_source_restarts():
    server, publisher, port = await start_publisher()
    store = SignalStore(FakeClock())
    config = SignalSourceConfig(address=f"127.0.0.1:{port}", reconnect_min=0.05, reconnect_max=0.2)
    task = asyncio.create_task(watch_signals(config, store))
    try:
        await publisher.queue.put(engine_signals(running=3.0, at=T0))
        await wait_for(store, lambda: store.get(("team-a", "llama", "")) is not None)
        assert running(store) == 3.0

        await server.stop(grace=0)
        server, publisher, _ = await start_publisher(port)
        await publisher.queue.put(engine_signals(running=7.0, at=T0 + 5))
        await wait_for(store, lambda: version(store) == 2)
        assert running(store) == 7.0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop(grace=0)


@pytest.mark.parametrize(
    ("first", "second", "kept"),
    [
        pytest.param(T0, T0 + 1, 2, id="a-newer-snapshot-replaces-the-older"),
        pytest.param(T0 + 1, T0, 1, id="an-older-snapshot-after-a-reconnect-is-dropped"),
    ],
)
def test_store_keeps_the_newest_snapshot_per_source(first, second, kept):
    store = SignalStore(FakeClock())
    assert receive(store, engine_signals(running=1.0, at=first))
    assert receive(store, engine_signals(running=2.0, at=second)) is (kept == 2)
    assert running(store) == kept


def test_store_refuses_snapshots_it_cannot_attribute(caplog):
    store = SignalStore(FakeClock())
    assert not receive(store, sig.Signals(source=sig.SOURCE_EXPORTER, engine=sig.EngineSignals()))
    assert not receive(store, sig.Signals(target=sig.Target(namespace="a", deployment="b")))
    assert store.keys() == []


@pytest.mark.parametrize(
    ("share", "load"),
    [
        pytest.param(0.0, 0.0, id="the-cycle-starts-idle"),
        pytest.param(0.25, 40.0, id="the-ramp-reaches-forty-percent"),
        pytest.param(0.4, 100.0, id="the-burst-peaks"),
        pytest.param(0.8, 0.0, id="the-idle-stretch-lets-it-scale-to-zero"),
    ],
)
def test_demo_load_cycle(share, load):
    assert demo_concurrency(share * 60, 60, 100) == pytest.approx(load)


def test_demo_signals_split_demand_between_running_and_queued():
    config = DemoSourceConfig(peak_concurrency=100, period=60)
    engine, gateway = demo_signals("demo", "llama", T0, 0.4 * 60, config)
    assert isinstance(engine.signals, EngineSignals)
    assert isinstance(gateway.signals, GatewaySignals)
    assert engine.signals.running + engine.signals.queue_depth == pytest.approx(100)  # type: ignore[operator]
    assert gateway.signals.in_flight == 100
    assert int(engine.time) == int(T0)


def exported(at, stable_mix, panic_mix=(100.0, 10.0)):
    stable = WindowSignals(60.0, mean_prompt_tokens=stable_mix[0], mean_output_tokens=stable_mix[1])
    panic = WindowSignals(10.0, mean_prompt_tokens=panic_mix[0], mean_output_tokens=panic_mix[1])
    return EngineSignals(at, 2, 2, 0.0, 4.0, 0.3, panic, stable, None, None, False, False)


@pytest.mark.parametrize(
    ("engine", "mix"),
    [
        pytest.param(
            exported(T0, (812.5, 96.0)), (812.5, 96.0), id="the-stable-windows-mix-is-observed"
        ),
        pytest.param(exported(T0, (None, None)), (None, None), id="an-unknown-mix-stays-unknown"),
        pytest.param(
            exported(T0 - 120, (812.5, 96.0)),
            (None, None),
            id="a-stale-exporters-mix-is-not-observed",
        ),
    ],
)
def test_observe_takes_the_request_mix_from_the_stable_window(engine, mix):
    gateway = GatewaySignals(T0, arrival_rate=1.0, buffered=0, in_flight=0)
    observation, _ = observe(("team-a", "llama", ""), TargetSignals(1, engine, gateway), T0, 60.0)
    assert (observation.mean_prompt_tokens, observation.mean_output_tokens) == mix


class OneThenClose(sig_grpc.SignalsServiceServicer):
    """A flapping source: every stream sends one snapshot, then ends (or fails)."""

    def __init__(self, abort: bool) -> None:
        self.abort = abort
        self.calls = 0

    async def WatchSignals(self, request, context):
        self.calls += 1
        yield sig.WatchSignalsResponse(signals=engine_signals(running=1.0, at=T0 + self.calls))
        if self.abort:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"going away #{self.calls}")


class RecordedSleeps:
    """``asyncio`` for ``scaler.sources`` with every sleep recorded and made at once."""

    def __init__(self, wanted: int) -> None:
        self.delays: list[float] = []
        self.wanted = wanted
        self.enough = asyncio.Event()

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        if len(self.delays) >= self.wanted:
            self.enough.set()
        await asyncio.sleep(0)

    def __getattr__(self, name: str):
        return getattr(asyncio, name)


@pytest.mark.parametrize(
    "abort",
    [
        pytest.param(False, id="a source ending each stream after one message backs off"),
        pytest.param(True, id="a source failing each stream after one message backs off"),
    ],
)
async def test_a_source_that_sends_one_message_per_stream_backs_off_and_warns_once(
    abort, monkeypatch, caplog
):
    server = grpc.aio.server()
    source = OneThenClose(abort)
    sig_grpc.add_SignalsServiceServicer_to_server(source, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sleeps = RecordedSleeps(6)
    monkeypatch.setattr("scaler.sources.asyncio", sleeps)
    store = SignalStore(FakeClock(T0 + 100))
    config = SignalSourceConfig(address=f"127.0.0.1:{port}", reconnect_min=0.5, reconnect_max=4.0)
    caplog.set_level(logging.DEBUG, logger="scaler.sources")
    task = asyncio.create_task(watch_signals(config, store))
    try:
        async with asyncio.timeout(30):  # a cap against hangs, not a timing check
            await sleeps.enough.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop(grace=0)
    # Each message no longer resets the backoff: it doubles to the cap.
    assert sleeps.delays[:6] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # one per change of why
    assert store.errors[("watch", "reconnect")] >= 6
