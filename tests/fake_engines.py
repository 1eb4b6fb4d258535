"""vLLM-format replicas for exporter tests: real aiohttp servers, metrics you control.

The exposition is rendered by prometheus_client with vLLM 0.32's metric names, labels
and buckets, the way vLLM renders its own; tests drive the numbers (``finish``) and
the failure modes (``mode``).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from serving.vllm_metrics import VllmMetrics


class FakeVllm:
    """One replica's metrics in vLLM's names (``serving.vllm_metrics.VllmMetrics``), driven
    by the test; ``restart()`` zeroes them like a new process."""

    def __init__(self, model: str = "tiny-llama") -> None:
        self.model = model
        self.mode = "ok"  # ok | slow | http-500 | garbage | not-vllm
        self.restart()

    def restart(self) -> None:
        self.metrics = VllmMetrics(self.model)
        self.set_load(0, 0, 0.0)

    def set_load(self, running: float, waiting: float, kv: float) -> None:
        m = self.metrics
        m.running.labels(*m.labels).set(running)
        m.waiting.labels(*m.labels).set(waiting)
        m.kv.labels(*m.labels).set(kv)

    def finish(
        self, requests: int, prompt: int, output: int, ttft: float, itl: float, e2e: float
    ) -> None:
        """``requests`` finished, each with ``prompt`` and ``output`` tokens."""
        m = self.metrics
        m.prompt.labels(*m.labels).inc(requests * prompt)
        m.generation.labels(*m.labels).inc(requests * output)
        m.success.labels(*m.labels, "stop").inc(requests)
        m.ttft.observe(ttft, requests)
        m.e2e.observe(e2e, requests)
        m.queue.observe(0.0, requests)
        m.itl.observe(itl, requests * (output - 1))

    def body(self) -> str:
        return self.metrics.render().decode()


class FakeReplicaServer:
    """A real HTTP server on 127.0.0.1 serving one ``FakeVllm`` per path /rN/metrics."""

    def __init__(self, count: int) -> None:
        self.replicas = [FakeVllm() for _ in range(count)]
        self.port = 0
        self._runner: web.AppRunner | None = None

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.port}/r{index}/metrics"

    async def start(self) -> FakeReplicaServer:
        app = web.Application()
        app.router.add_get("/r{index}/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        replica = self.replicas[int(request.match_info["index"])]
        if replica.mode == "slow":
            await asyncio.sleep(2)  # well past the tests' 300 ms scrape timeout
        if replica.mode == "http-500":
            return web.Response(status=500, text="engine dead")
        if replica.mode == "garbage":
            return web.Response(text='vllm:num_requests_running{engine="0" oops\n')
        if replica.mode == "not-vllm":
            return web.Response(text="process_cpu_seconds_total 1.0\n")
        return web.Response(text=replica.body(), content_type="text/plain")
