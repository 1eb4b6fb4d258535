"""The gateway asks every replica for a plain answer and takes nothing else (hostile pass 55).

A replica answering a stream with ``Content-Encoding: gzip``, endless empty events inside,
was inflated by the proxy's session on the event loop faster than any read could yield:
the whole gateway froze for 55 s, its ``/health`` and another replica's request with it.
The gateway reads every body it relays (tokens, usage, SSE events), so it now asks for
``identity``, never inflates, and counts any other encoding as the replica's broken
answer: a 502 before a byte is relayed. Real servers on 127.0.0.1 port 0.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib

import aiohttp
import pytest
from aiohttp import web

from serving.gateway import check_encoding
from tests.conftest import eventually
from tests.test_gateway import completion, start_gateway, wait_ready
from tests.test_gateway_faults import Fake, assert_api_error, upstream_errors
from tests.test_gateway_isolation import gateway_for
from tests.test_serving_hostile import JSON_BODY, raw_answer, raw_replica


@pytest.mark.parametrize(
    ("encoding", "refused"),
    [
        pytest.param(None, False, id="no encoding is plain"),
        pytest.param("identity", False, id="identity is plain"),
        pytest.param(" Identity ", False, id="identity in any case and spacing is plain"),
        pytest.param("gzip", True, id="gzip is refused"),
        pytest.param("br", True, id="brotli is refused"),
        pytest.param("deflate, gzip", True, id="two encodings are refused"),
    ],
)
def test_only_a_plain_answer_is_taken(encoding: str | None, refused: bool) -> None:
    headers = {} if encoding is None else {"Content-Encoding": encoding}
    assert bool(check_encoding(headers)) == refused


class GzipFlood:
    """Answers a completion with an endless gzip stream of token-less SSE events."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        """Each completion's ``Accept-Encoding``."""
        self.written = 0

    async def __call__(self, request: web.Request, fake: Fake) -> web.StreamResponse:
        self.asked.append(request.headers.get("Accept-Encoding", ""))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
        )
        await response.prepare(request)
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        events = b'data: {"choices":[{"text":""}]}\n\n' * 20_000
        try:
            for _ in range(2_000):  # a cap for the test: about 1.3 GB inflated
                await response.write(packer.compress(events) + packer.flush(zlib.Z_SYNC_FLUSH))
                self.written += 1
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass
        return response


async def test_a_compressed_stream_is_a_502_and_the_gateway_serves_on():
    flood = GzipFlood()
    bad = await Fake(flood).start()
    gateway = await start_gateway([bad.url])
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            async with asyncio.timeout(20):  # a cap against the freeze, not a timing check
                async with client.post(
                    f"http://127.0.0.1:{gateway.port}/v1/completions",
                    json=completion(stream=True),
                    headers={"Accept-Encoding": "gzip"},
                ) as response:
                    await assert_api_error(response, 502, "could not be relayed")
                async with client.get(f"http://127.0.0.1:{gateway.port}/health") as health:
                    assert health.status == 200
        assert flood.asked == ["identity"]  # whatever the client takes
        assert upstream_errors(gateway) == {"bad-headers": 1.0}
    finally:
        await gateway.stop()
        await bad.stop()


async def test_a_compressed_answer_is_a_502_not_inflated_and_relayed():
    """Before, a gzip answer was inflated and relayed without its encoding header."""
    answer = raw_answer(b"Content-Encoding: gzip\r\n", gzip.compress(JSON_BODY))
    async with raw_replica(answer) as url, gateway_for([url]) as gateway:
        await eventually(lambda: gateway.gateway.replicas[0].routable, "ready")
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            async with client.post(url, json={"model": "sim-llama"}) as response:
                await assert_api_error(response, 502, "could not be relayed")
