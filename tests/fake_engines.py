"""vLLM-format replicas for exporter tests: real aiohttp servers, metrics you control.

The exposition is rendered by prometheus_client with vLLM 0.32's metric names, labels
and buckets, the way vLLM renders its own; tests drive the numbers (``finish``) and
the failure modes (``mode``).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class FakeVllm:
    """One replica's metrics, in vLLM's names; ``restart()`` zeroes them like a new process."""

    def __init__(self, model: str = "tiny-llama") -> None:
        self.model = model
        self.mode = "ok"  # ok | slow | http-500 | garbage | not-vllm
        self.restart()

    def restart(self) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["engine", "model_name"]
        self.running = Gauge("vllm:num_requests_running", "Running.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting.", labels, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV.", labels, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt.", labels, registry=r)
        self.generation = Counter("vllm:generation_tokens", "Gen.", labels, registry=r)
        self.success = Counter(
            "vllm:request_success", "Done.", [*labels, "finished_reason"], registry=r
        )
        self.preemptions = Counter("vllm:num_preemptions", "Preempt.", labels, registry=r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "TTFT.", labels, buckets=TTFT, registry=r
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "ITL.", labels, buckets=ITL, registry=r
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "E2E.", labels, buckets=E2E, registry=r
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "Queue.", labels, buckets=E2E, registry=r
        )
        # vLLM creates every child at start-up, so every series exists from the first scrape.
        for reason in ("stop", "length", "abort", "error"):
            self.success.labels("0", self.model, reason)
        for metric in (
            self.prompt,
            self.generation,
            self.preemptions,
            self.ttft,
            self.itl,
            self.e2e,
            self.queue,
        ):
            metric.labels("0", self.model)
        self.set_load(0, 0, 0.0)

    def set_load(self, running: float, waiting: float, kv: float) -> None:
        self.running.labels("0", self.model).set(running)
        self.waiting.labels("0", self.model).set(waiting)
        self.kv.labels("0", self.model).set(kv)

    def finish(
        self, requests: int, prompt: int, output: int, ttft: float, itl: float, e2e: float
    ) -> None:
        """``requests`` finished, each with ``prompt`` and ``output`` tokens."""
        labels = ("0", self.model)
        self.prompt.labels(*labels).inc(requests * prompt)
        self.generation.labels(*labels).inc(requests * output)
        self.success.labels(*labels, "stop").inc(requests)
        for _ in range(requests):
            self.ttft.labels(*labels).observe(ttft)
            self.e2e.labels(*labels).observe(e2e)
            self.queue.labels(*labels).observe(0.0)
            for _ in range(output - 1):
                self.itl.labels(*labels).observe(itl)

    def body(self) -> str:
        return generate_latest(self.registry).decode()


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
