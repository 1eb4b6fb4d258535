"""The exporter's and the scaler's HTTP ports bound their connections and request heads.

Issue 27, hostile pass 6, S6-H3: both served ``/metrics`` (and the exporter ``/healthz``)
with aiohttp's defaults: 128 header lines of 8,190 bytes, no deadline on a request head,
no cap on connections, and an ERROR with a traceback per malformed request. 200
connections trickling unfinished heads grew the exporter from 112 to 506 MiB, every one
still open 20 s later (the gateway's guard, pass 3's T-2, did not cover these ports).
Both now listen through ``foundation.http_guard``: a head has ``HEAD_TIMEOUT`` to arrive
whole and ``MAX_HEADERS`` lines of ``MAX_FIELD_SIZE`` bytes, at most ``max_connections``
are open, a malformed request is one DEBUG line; each refusal is counted and exported.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from exporter.app import ExporterServer
from exporter.config import ExporterConfig
from foundation.errors import ConfigError
from foundation.http_guard import MAX_FIELD_SIZE, ConnectionGuard
from scaler.config import ScalerConfig
from scaler.server import ScalerServer
from tests.conftest import FakeClock, read_until_closed, send_raw


class _Port:
    """A running server's HTTP port and the guard in front of it."""

    def __init__(self, port: int, guard: ConnectionGuard) -> None:
        self.port, self.guard = port, guard


@pytest.fixture(params=["exporter", "scaler"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[_Port]:
    """The exporter's HTTP port, or the scaler's --metrics-listen, on 127.0.0.1:0."""
    if request.param == "exporter":
        exporter = ExporterServer(ExporterConfig(), "127.0.0.1:0", "127.0.0.1:0")
        exporter.http_guard.head_timeout = 0.2  # quick; the served one is HEAD_TIMEOUT
        exporter.http_guard.max_connections = 4
        http_port, _ = await exporter.start()
        try:
            yield _Port(http_port, exporter.http_guard)
        finally:
            await exporter.stop(0)
    else:
        scaler = ScalerServer(
            ScalerConfig(), "127.0.0.1:0", clock=FakeClock(), metrics_listen="127.0.0.1:0"
        )
        scaler.metrics_guard.head_timeout = 0.2
        scaler.metrics_guard.max_connections = 4
        await scaler.start()
        try:
            yield _Port(scaler.metrics_port, scaler.metrics_guard)
        finally:
            await scaler.stop(0)


async def test_an_unfinished_head_is_closed_at_the_head_timeout(served: _Port) -> None:
    reader, writer = await send_raw(served.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: b")
    assert await read_until_closed(reader) == b""  # closed, nothing answered
    writer.close()
    assert served.guard.refused["slow-head"] == 1


async def test_connections_past_the_cap_are_answered_503(served: _Port) -> None:
    held = [await send_raw(served.port, b"GET /metrics HTTP/1.1\r\n") for _ in range(4)]
    reader, writer = await send_raw(served.port, b"")
    assert (await read_until_closed(reader)).startswith(b"HTTP/1.1 503")
    writer.close()
    for _, held_writer in held:
        held_writer.close()
    assert served.guard.refused["too-many-connections"] == 1


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_FIELD_SIZE + 1) + b"\r\n\r\n",
            id="a header line over MAX_FIELD_SIZE is a 400",
        ),
        pytest.param(
            b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * 40 + b"\r\n",
            id="more header lines than MAX_HEADERS is a 400",
        ),
        pytest.param(
            b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", id="a malformed header is a 400"
        ),
    ],
)
async def test_a_malformed_or_oversized_head_is_a_400_counted_with_no_traceback(
    served: _Port, head: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    reader, writer = await send_raw(served.port, head)
    assert (await read_until_closed(reader)).startswith(b"HTTP/1.")
    writer.close()
    assert served.guard.refused["malformed-http"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_metrics_are_served_and_count_what_was_refused(served: _Port) -> None:
    reader, writer = await send_raw(served.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    assert await read_until_closed(reader) == b""  # a slow head, refused
    writer.close()
    reader, writer = await send_raw(
        served.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    body = await read_until_closed(reader)
    writer.close()
    assert body.startswith(b"HTTP/1.1 200")
    assert b'_http_refused_total{reason="slow-head"} 1.0' in body


async def test_a_metrics_listen_host_that_does_not_resolve_is_named_plainly() -> None:
    scaler = ScalerServer(ScalerConfig(), "127.0.0.1:0", metrics_listen="nonexistent.invalid:0")
    with pytest.raises(ConfigError, match=r"--metrics-listen 'nonexistent\.invalid:0'") as caught:
        await scaler.start()
    assert "Unknown error" not in str(caught.value)  # gaierror's own words, not errno -2's
    await scaler.stop(0)
