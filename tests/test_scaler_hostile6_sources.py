"""A silent signal stream is reconnected; the sources' waits are bounded.

Issue 27, hostile pass 6:

- S6-H2: a ``WatchSignals`` stream that goes silent and stays open (a hung source, a
  connection whose peer's node died without a FIN, a proxy forwarding nothing) held
  ``watch_signals`` for good: no deadline, no keepalive, no reconnect, so it never reached
  the recovered source while the target's signals went stale (KEDA: UNAVAILABLE) and
  health said SERVING. A stream with no message for ``idle-timeout`` is now broken:
  reconnected, counted (``watch``/``silent``), one WARNING per change of why.
- S6-M2: the waits of the sources took any duration: ``reconnect-max: 2562047h`` made a
  watch broken for nine hours wait nine more (the backoff doubles up to it), a Prometheus
  ``interval`` of 292 years queried once, ``scaled-object-ttl`` kept deleted
  ScaledObjects until the registry's bound refused every new one; the exporter's
  ``interval`` scraped once. Each is refused naming the key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from exporter.config import MAX_INTERVAL
from exporter.config import parse_config as parse_exporter_config
from foundation.errors import ConfigError
from protos.unitscale.v1 import signals_pb2 as pb
from protos.unitscale.v1 import signals_pb2_grpc as pb_grpc
from scaler.config import (
    MAX_SCALED_OBJECT_TTL,
    MAX_SOURCE_SECONDS,
    MAX_WINDOW_SECONDS,
    SignalSourceConfig,
    parse_config,
)
from scaler.signals import SignalStore
from scaler.sources import watch_signals
from tests.conftest import engine_signals


class GoesSilent(pb_grpc.SignalsServiceServicer):
    """Sends ``messages`` snapshots ``gap`` seconds apart on each stream, then nothing."""

    def __init__(self, messages: int, gap: float = 0.0) -> None:
        self.messages, self.gap = messages, gap
        self.streams = 0
        self.opened = asyncio.Event()
        """Set on every stream opened after the first."""

    async def WatchSignals(
        self, request: pb.WatchSignalsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchSignalsResponse]:
        self.streams += 1
        if self.streams > 1:
            self.opened.set()
        for _ in range(self.messages):
            yield pb.WatchSignalsResponse(signals=engine_signals(at=time.time()))
            await asyncio.sleep(self.gap)  # the source's own pace, not a test's wait
        await asyncio.Event().wait()  # then silent, the stream held open


async def _serve(servicer: GoesSilent) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_SignalsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _config(port: int, idle: float) -> SignalSourceConfig:
    # model_construct: an idle-timeout under the 1 s floor keeps the test quick.
    return SignalSourceConfig.model_construct(
        address=f"127.0.0.1:{port}", reconnect_min=0.01, reconnect_max=0.02, idle_timeout=idle
    )


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param(1, id="a stream silent after its first message is reconnected"),
        pytest.param(0, id="a stream that never sends is reconnected"),
    ],
)
async def test_a_silent_stream_is_reconnected_counted_and_warned_of_once(
    messages: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="scaler.sources")
    servicer = GoesSilent(messages)
    server, port = await _serve(servicer)
    store = SignalStore(time.time)
    task = asyncio.create_task(watch_signals(_config(port, 0.2), store))
    try:
        for _ in range(3):  # three reconnects: the watch is not held by the silence
            servicer.opened.clear()
            async with asyncio.timeout(30):  # a cap against hangs, not a timing check
                await servicer.opened.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)
    assert store.errors[("watch", "silent")] >= 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sent nothing for 0.2s (idle-timeout)" in warnings[0].message


async def test_a_stream_that_keeps_sending_within_the_idle_timeout_is_kept() -> None:
    servicer = GoesSilent(messages=20, gap=0.02)  # 0.4 s of messages, 0.02 s apart
    server, port = await _serve(servicer)
    store = SignalStore(time.time)
    kept = asyncio.Event()
    received: list[object] = []

    def heard(target: object) -> None:
        received.append(target)
        if len(received) >= 20:
            kept.set()

    store.add_listener(heard)
    task = asyncio.create_task(watch_signals(_config(port, 0.3), store))
    try:
        async with asyncio.timeout(30):
            await kept.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)
    assert servicer.streams == 1 and store.errors[("watch", "silent")] == 0


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(
            "signal-sources:\n  - {address: 'e:1', reconnect-max: 2562047h}\n",
            "reconnect-max",
            id="a reconnect-max of 292 years is refused",
        ),
        pytest.param(
            "signal-sources:\n  - {address: 'e:1', reconnect-min: 11m, reconnect-max: 10m}\n",
            "reconnect-min",
            id="a reconnect-min past ten minutes is refused",
        ),
        pytest.param(
            "signal-sources:\n  - {address: 'e:1', reconnect-min: 5m, reconnect-max: 1m}\n",
            "must not exceed reconnect-max",
            id="a reconnect-min above reconnect-max is refused",
        ),
        pytest.param(
            "signal-sources:\n  - {address: 'e:1', idle-timeout: 2h}\n",
            "idle-timeout",
            id="an idle-timeout past an hour is refused",
        ),
        pytest.param(
            "signal-sources:\n  - {address: 'e:1', idle-timeout: 100ms}\n",
            "idle-timeout",
            id="an idle-timeout under a second is refused",
        ),
        pytest.param(
            "prometheus-source: {url: 'http://p:9090', interval: 2562047h}\n",
            "prometheus-source.interval",
            id="a prometheus round every 292 years is refused",
        ),
        pytest.param(
            "prometheus-source: {url: 'http://p:9090', timeout: 1h}\n",
            "prometheus-source.timeout",
            id="a prometheus query allowed an hour is refused",
        ),
        pytest.param(
            "prometheus-source: {url: 'http://p:9090', stable-window: 2h}\n",
            "prometheus-source.stable-window",
            id="a prometheus window past an hour is refused",
        ),
        pytest.param(
            "scaled-object-ttl: 2562047h\n",
            "scaled-object-ttl",
            id="a scaled-object-ttl past a week is refused",
        ),
        pytest.param("grace-period: 2562047h\n", "grace-period", id="a grace of 292 years"),
    ],
)
def test_a_source_wait_past_its_bound_is_refused_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_config(text)


def test_the_bounds_themselves_are_taken() -> None:
    config = parse_config(
        f"signal-sources:\n  - {{address: 'e:1', reconnect-min: {MAX_SOURCE_SECONDS:g}s,"
        f" reconnect-max: {MAX_SOURCE_SECONDS:g}s, idle-timeout: 1h}}\n"
        f"prometheus-source: {{url: 'http://p:9090', interval: 10m, timeout: 10m,"
        f" stable-window: {MAX_WINDOW_SECONDS:g}s, panic-window: 1h}}\n"
        f"scaled-object-ttl: {MAX_SCALED_OBJECT_TTL:g}s\ngrace-period: 10m\n"
    )
    assert config.signal_sources[0].idle_timeout == 3600.0
    assert config.scaled_object_ttl == MAX_SCALED_OBJECT_TTL
    assert SignalSourceConfig(address="e:1").idle_timeout == 60.0  # the default


@pytest.mark.parametrize(
    ("interval", "taken"),
    [
        pytest.param("10m", True, id="an exporter interval of ten minutes is taken"),
        pytest.param("601s", False, id="an exporter interval past ten minutes is refused"),
        pytest.param("2562047h", False, id="an exporter interval of 292 years is refused"),
    ],
)
def test_the_exporter_interval_is_bounded(interval: str, taken: bool) -> None:
    text = f"interval: {interval}\nstable-window: 1h\n"
    if taken:
        assert parse_exporter_config(text).interval == MAX_INTERVAL
    else:
        with pytest.raises(ConfigError, match="'interval'"):
            parse_exporter_config(text)
