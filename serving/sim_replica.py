"""A vLLM-compatible replica whose timing comes from the replica model.

It speaks vLLM's OpenAI API (``/v1/completions``, ``/v1/chat/completions`` with SSE
streaming, ``/v1/models``, ``/health``) and exposes ``/metrics`` with vLLM 0.32's metric
names, labels and histogram buckets, rendered by prometheus_client as vLLM renders them,
so the exporter cannot tell it from vLLM by format. Inside, an engine loop runs
continuous batching with chunked prefill, each step lasting what
``serving.replica_model`` says (optionally sped up for tests), and emits one token per
step to every decoding request.

Tokens are counted, not computed: a prompt is ~1.3 tokens per word (+1 for BOS), and a
request generates exactly ``max_tokens`` (default 16) tokens of filler text.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from serving import vllm_buckets
from serving.replica_model import PROFILES, Profile

log = logging.getLogger(__name__)

WORDS = ("the", "model", "token", "cache", "replica", "scale", "quick", "answer")


class VllmMetrics:
    """vLLM's Prometheus families for one engine (``engine="0"``)."""

    def __init__(self, model: str) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["engine", "model_name"]
        self.labels = ("0", model)
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=r,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            registry=r,
        )
        self.kv = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels,
            registry=r,
        )
        self.prompt = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        )
        self.generation = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.preemptions = Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            labels,
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=vllm_buckets.TTFT,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=vllm_buckets.ITL,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=vllm_buckets.E2E,
            registry=r,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels,
            buckets=vllm_buckets.E2E,
            registry=r,
        )
        # vLLM creates every child at start-up: every series exists from the first scrape.
        for reason in ("stop", "length", "abort", "error", "repetition"):
            self.success.labels(*self.labels, reason)
        for metric in (
            self.running,
            self.waiting,
            self.kv,
            self.prompt,
            self.generation,
            self.preemptions,
            self.ttft,
            self.itl,
            self.e2e,
            self.queue,
        ):
            metric.labels(*self.labels)

    def render(self) -> bytes:
        """The exposition text, as vLLM's /metrics serves it."""
        return generate_latest(self.registry)


@dataclass(eq=False)
class SimRequest:
    """One request inside the simulated engine."""

    prompt_tokens: int
    max_tokens: int
    arrived: float
    prefilled: int = 0
    generated: int = 0
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)


class SimEngine:
    """Continuous batching in real time (divided by ``speedup``)."""

    def __init__(self, profile: Profile, model: str, speedup: float = 1.0) -> None:
        self.profile = profile
        self.model = model
        self.speedup = speedup
        self.metrics = VllmMetrics(model)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self._wake = asyncio.Event()
        self._words = itertools.cycle(WORDS)

    def submit(self, prompt_tokens: int, max_tokens: int) -> SimRequest:
        """Queue a request; its tokens arrive on ``request.tokens`` (None ends it)."""
        request = SimRequest(prompt_tokens, max_tokens, time.monotonic())
        self.waiting.append(request)
        self._update_gauges()
        self._wake.set()
        return request

    def abort(self, request: SimRequest) -> None:
        """The client went away: drop the request."""
        for queue in (self.waiting, self.running):
            if request in queue:
                queue.remove(request)
                self.metrics.success.labels(*self.metrics.labels, "abort").inc()
        self._update_gauges()

    async def run(self) -> None:
        """Step forever; sleep while idle."""
        p = self.profile
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            kv_used = sum(r.prompt_tokens + r.max_tokens for r in self.running)
            while self.waiting and len(self.running) < p.max_num_seqs:
                candidate = self.waiting[0]
                if kv_used + candidate.prompt_tokens + candidate.max_tokens > p.kv_capacity_tokens:
                    break
                self.waiting.pop(0)
                candidate.admitted = time.monotonic()
                self.metrics.queue.labels(*self.metrics.labels).observe(
                    candidate.admitted - candidate.arrived
                )
                kv_used += candidate.prompt_tokens + candidate.max_tokens
                self.running.append(candidate)
            decoding = [r for r in self.running if r.prefilled >= r.prompt_tokens]
            prefilling = [r for r in self.running if r.prefilled < r.prompt_tokens]
            budget = max(p.max_num_batched_tokens - len(decoding), 0)
            chunk = 0
            for request in prefilling:
                take = min(request.prompt_tokens - request.prefilled, budget - chunk)
                if take <= 0:
                    break
                request.prefilled += take
                chunk += take
            context = sum(r.prompt_tokens + r.generated for r in decoding)
            step = p.mixed_step_seconds(len(decoding), context, chunk) / self.speedup
            await asyncio.sleep(step)
            now = time.monotonic()
            for request in decoding:
                self._emit(request, now)
            for request in prefilling:
                if request.prefilled >= request.prompt_tokens and request.generated == 0:
                    self._emit(request, now)  # the first token comes with the last chunk
            self.metrics.kv.labels(*self.metrics.labels).set(kv_used / p.kv_capacity_tokens)
            self._update_gauges()

    def _emit(self, request: SimRequest, now: float) -> None:
        labels = self.metrics.labels
        if request.first_token is None:
            request.first_token = now
            self.metrics.ttft.labels(*labels).observe(now - request.arrived)
        elif request.last_token is not None:
            self.metrics.itl.labels(*labels).observe(now - request.last_token)
        request.last_token = now
        request.generated += 1
        request.tokens.put_nowait(" " + next(self._words))
        if request.generated >= request.max_tokens:
            self.running.remove(request)
            request.tokens.put_nowait(None)
            self.metrics.prompt.labels(*labels).inc(request.prompt_tokens)
            self.metrics.generation.labels(*labels).inc(request.generated)
            self.metrics.success.labels(*labels, "length").inc()
            self.metrics.e2e.labels(*labels).observe(now - request.arrived)

    def _update_gauges(self) -> None:
        self.metrics.running.labels(*self.metrics.labels).set(len(self.running))
        self.metrics.waiting.labels(*self.metrics.labels).set(len(self.waiting))


def count_tokens(text: str) -> int:
    """About 1.3 tokens per word, plus BOS."""
    return 1 + max(1, round(len(text.split()) * 1.3))


class SimReplica:
    """The HTTP face of a ``SimEngine``: the parts of vLLM's OpenAI server we use."""

    def __init__(self, profile: Profile, model: str = "sim-llama", speedup: float = 1.0) -> None:
        self.engine = SimEngine(profile, model, speedup)
        self.model = model
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self._completions)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.cleanup_ctx.append(self._engine_task)
        self._ids = itertools.count(1)

    async def _engine_task(self, app: web.Application):  # type: ignore[no-untyped-def]
        task = asyncio.create_task(self.engine.run())
        yield
        task.cancel()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "owned_by": "unitscale-sim"}],
            }
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            raise web.HTTPBadRequest(
                text=_error("prompt must be a string"), content_type="application/json"
            )
        return await self._serve(request, body, count_tokens(prompt), chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise web.HTTPBadRequest(
                text=_error("messages must be a list of objects"), content_type="application/json"
            )
        text = " ".join(str(m.get("content", "")) for m in messages)
        return await self._serve(request, body, count_tokens(text) + 4 * len(messages), chat=True)

    async def _serve(
        self, request: web.Request, body: dict[str, object], prompt_tokens: int, chat: bool
    ) -> web.StreamResponse:
        model = body.get("model", self.model)
        if model != self.model:
            raise web.HTTPNotFound(
                text=_error(f"The model `{model}` does not exist."), content_type="application/json"
            )
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise web.HTTPBadRequest(
                text=_error("max_tokens must be a positive integer"),
                content_type="application/json",
            )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim{next(self._ids)}"
        sim = self.engine.submit(prompt_tokens, max_tokens)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        try:
            if not body.get("stream"):
                parts = []
                while (token := await sim.tokens.get()) is not None:
                    parts.append(token)
                text = "".join(parts)
                choice: dict[str, object] = (
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length",
                    }
                    if chat
                    else {"index": 0, "text": text, "finish_reason": "length"}
                )
                return web.json_response(
                    {
                        "id": rid,
                        "object": "chat.completion" if chat else "text_completion",
                        "created": int(time.time()),
                        "model": self.model,
                        "choices": [choice],
                        "usage": usage,
                    }
                )
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            while (token := await sim.tokens.get()) is not None:
                delta: dict[str, object] = (
                    {"index": 0, "delta": {"content": token}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": token, "finish_reason": None}
                )
                chunk = {
                    "id": rid,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "model": self.model,
                    "choices": [delta],
                }
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                final: dict[str, object] = {
                    "id": rid,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "model": self.model,
                    "choices": [],
                    "usage": usage,
                }
                await response.write(f"data: {json.dumps(final)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.engine.abort(sim)
            raise


async def _json_body(request: web.Request) -> dict[str, object]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=_error("request body is not valid JSON"), content_type="application/json"
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=_error("request body must be a JSON object"), content_type="application/json"
        )
    return body


def _error(message: str) -> str:
    return json.dumps(
        {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
    )


def profile_named(name: str) -> Profile:
    """A replica profile by name (``serving.replica_model.PROFILES``)."""
    return PROFILES[name]
