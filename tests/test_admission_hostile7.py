"""Admission under the seventh hostile pass (issue 27): its HTTP port bounds what a client holds.

The controller's ``/metrics`` and ``/healthz`` were served with aiohttp's defaults after
the sixth pass put the exporter's and the scaler's ports behind
``foundation.http_guard`` (S6-H3): 300 connections trickling unfinished request heads
were all still open 12 s later (~2 MiB each at aiohttp's 128 lines of 8,190 bytes, held
for good), and each malformed request wrote an ERROR with a traceback. It now listens
through the same guard: ``HEAD_TIMEOUT`` for a whole head, ``MAX_HEADERS`` lines of
``MAX_FIELD_SIZE`` bytes, at most ``max_connections`` open, a malformed request one
DEBUG line, each refusal counted in ``unitscale_admission_http_refused_total{reason}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from admission.metrics import AdmissionMetrics, MetricsServer
from foundation.http_guard import MAX_FIELD_SIZE, MAX_HEADERS


@pytest.fixture
async def served() -> AsyncIterator[MetricsServer]:
    """The admission controller's HTTP port on 127.0.0.1:0, its guard quick and small."""
    server = MetricsServer(AdmissionMetrics(), "127.0.0.1:0", lambda: (True, {"problem": None}))
    server.guard.head_timeout = 0.2  # quick; the served one is HEAD_TIMEOUT
    server.guard.max_connections = 4
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _send(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    async with asyncio.timeout(30):  # a cap against hangs, not a timing check
        return await reader.read()


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: b", id="a scrape's head left open"),
        pytest.param(b"GET /healthz HTTP/1.1\r\n", id="a probe's head left open"),
        pytest.param(b"", id="a connection that sends nothing"),
    ],
)
async def test_an_unfinished_head_is_closed_at_the_head_timeout(
    served: MetricsServer, head: bytes
) -> None:
    reader, writer = await _send(served.port, head)
    assert await _answer(reader) == b""  # closed, nothing answered
    writer.close()
    assert served.guard.refused["slow-head"] == 1


async def test_connections_past_the_cap_are_answered_503(served: MetricsServer) -> None:
    held = [await _send(served.port, b"GET /metrics HTTP/1.1\r\n") for _ in range(4)]
    reader, writer = await _send(served.port, b"")
    assert (await _answer(reader)).startswith(b"HTTP/1.1 503")
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
            b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * (MAX_HEADERS + 8) + b"\r\n",
            id="more header lines than MAX_HEADERS is a 400",
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", id="a malformed header is a 400"
        ),
    ],
)
async def test_a_malformed_or_oversized_head_is_a_400_counted_with_no_traceback(
    served: MetricsServer, head: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    reader, writer = await _send(served.port, head)
    assert (await _answer(reader)).startswith(b"HTTP/1.")
    writer.close()
    assert served.guard.refused["malformed-http"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_metrics_and_health_are_served_and_count_what_was_refused(
    served: MetricsServer,
) -> None:
    reader, writer = await _send(served.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    assert await _answer(reader) == b""  # a slow head, refused
    writer.close()
    answers = {}
    for path in ("/metrics", "/healthz"):
        reader, writer = await _send(
            served.port, b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode()
        )
        answers[path] = await _answer(reader)
        writer.close()
    assert answers["/healthz"].startswith(b"HTTP/1.1 200")
    assert answers["/metrics"].startswith(b"HTTP/1.1 200")
    assert b'unitscale_admission_http_refused_total{reason="slow-head"} 1.0' in answers["/metrics"]
