"""The serving side under hostile input (issue 27's third hostile pass, findings T-1..T-14).

Each test injects what one finding found, at the boundary where it enters: more requests
than a connection pool holds, request heads that never end, a disk write that never
returns, a body labelled gzip, a replica that lists no models or pings forever, SSE lines
sent a few bytes at a time, a config with absurd numbers or URLs. Real servers on
127.0.0.1 port 0; times that matter are injected or are the gateway's own deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from tests.conftest import eventually
from tests.test_gateway_isolation import gateway_for

LABELS = ("a", "llama")


def counter(gateway, metric: str, *labels: str) -> float:
    """A counter of the gateway's metrics, by its attribute on ``GatewayMetrics``."""
    return getattr(gateway.gateway.metrics, metric).labels(*LABELS, *labels)._value.get()


class Held:
    """A replica that answers every completion with stream headers, then holds it open."""

    def __init__(self, models: tuple[str, ...] = ("sim-llama",)) -> None:
        self.models = models
        self.streams = 0
        """Completions that reached it."""
        self.health = 0
        """``GET /health`` calls it answered."""
        self.release = asyncio.Event()
        self.url = ""

    async def _health(self, request: web.Request) -> web.Response:
        self.health += 1
        return web.Response()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": m} for m in self.models]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.streams += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await self.release.wait()
        await response.write(b"data: [DONE]\n\n")
        return response

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Held]:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            self.release.set()
            await runner.cleanup()


# --- T-1: more requests in flight than aiohttp's default pool of 100 ------------------


async def test_past_100_streams_every_request_reaches_its_replica_and_checks_go_on():
    streams = 130
    async with Held().serving() as replica, gateway_for([replica.url]) as gateway:
        g = gateway.gateway
        await eventually(lambda: g.replicas[0].routable, "ready")
        url = f"http://127.0.0.1:{gateway.port}/v1/completions"
        body = {"model": "sim-llama", "prompt": "x", "stream": True}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:

            async def stream() -> int:
                async with client.post(url, json=body) as r:
                    await r.read()
                    return r.status

            tasks = [asyncio.create_task(stream()) for _ in range(streams)]
            # Before: the 101st request waited for a pooled connection (then a 504).
            await eventually(lambda: replica.streams == streams, "every stream reached it")
            checks = replica.health
            # Before: the checks waited behind the streams for a connection, timed out,
            # and the replica serving 100 streams was marked not ready.
            await eventually(lambda: replica.health >= checks + 3, "checks go on")
            assert g.replicas[0].routable
            replica.release.set()
            assert await asyncio.gather(*tasks) == [200] * streams
