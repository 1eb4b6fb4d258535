"""A vLLM-compatible replica whose timing comes from the replica model.

It speaks vLLM's OpenAI API (``/v1/completions``, ``/v1/chat/completions`` with SSE
streaming, ``/v1/models``, ``/health``) and exposes ``/metrics`` with vLLM 0.32's metric
names, labels and histogram buckets, rendered by prometheus_client as vLLM renders them,
so the exporter cannot tell it from vLLM by format. Inside, an engine loop runs
continuous batching with chunked prefill, each step lasting what
``serving.replica_model`` says (divided by ``speedup``), and emits one token per step to
every decoding request.

**Keeping wall-clock pace.** The engine keeps its own ideal clock: a step ends exactly one
model step (divided by ``speedup``) after the previous one ended; an idle engine's clock
restarts at the arrival of the request that wakes it. It sleeps only while that clock is
ahead of the wall clock, and hands a step's tokens out only once the wall clock has
reached the step's end: a client may get a token slightly late (a loaded process, a
coarse timer), never early. A late engine runs its next steps back to back, yielding to
the event loop between them, until it has caught up, so its throughput stays what the
model says. Latency metrics (TTFT, ITL, e2e, queue time) are differences on the ideal
clock, i.e. what the engine model says, even while the process runs a little late. A
request's arrival is the wall clock at submit; it joins the first step that starts
(ideally) at or after it, so no request is served in a step that began before it came.

Per step the work is small: one bulk observation for the inter-token latencies of the
whole batch (``BulkHistogram``), cached metric children, and queue items only for
streaming requests (a non-streaming request is woken once, when it finishes). At
``--speedup 20`` an 8B model steps every ~0.4 ms of wall time, so this matters.

Tokens are counted, not computed: a text prompt is ~1.3 tokens per word (+1 for BOS), a
token-id prompt is exactly as long as its list, and a request generates exactly
``max_tokens`` (default 16) tokens of filler text.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from serving import vllm_buckets
from serving.replica_model import PROFILES, Profile

log = logging.getLogger(__name__)

WORDS = ("the", "model", "token", "cache", "replica", "scale", "quick", "answer")

MIN_SLEEP = 0.001
"""Shortest sleep (s) when the engine is ahead of the wall clock. Event-loop timers are
millisecond-grained (uvloop rounds to the nearest ms, so a shorter sleep may return at once
and spin); sleeping at least 1 ms caps wake-ups at ~1,000/s, and the steps it oversleeps are
run back to back afterwards."""


class BulkHistogram:
    """One labelled histogram child, observed in bulk; a prometheus_client collector.

    ``observe(value, count)`` records ``count`` observations of ``value`` in O(log buckets),
    where ``Histogram.labels(...).observe`` takes one call (and a lock) per observation: one
    engine step gives every decoding request the same inter-token latency, so one call per
    step does. The exposition is the same as prometheus_client's ``Histogram`` with one
    child: buckets, ``_count``, ``_sum``, then ``_created``.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: dict[str, str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = dict(labels)
        self.bounds = tuple(float(b) for b in buckets)
        go_string = cast(Callable[[float], str], floatToGoString)  # untyped upstream
        self._le = [go_string(b) for b in self.bounds] + ["+Inf"]
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.created = time.time()
        registry.register(self)

    def observe(self, value: float, count: int = 1) -> None:
        """Record ``count`` observations of ``value``."""
        # Prometheus buckets are upper-inclusive: 0.01 falls in le="0.01".
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        cumulative = list(itertools.accumulate(self.counts))
        family.add_metric(
            list(self.labels.values()),
            [(le, float(n)) for le, n in zip(self._le, cumulative, strict=True)],
            self.sum,
        )
        family.samples.append(Sample(self.name + "_created", dict(self.labels), self.created))
        return [family]


class VllmMetrics:
    """vLLM's Prometheus families for one engine (``engine="0"``)."""

    def __init__(self, model: str) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["engine", "model_name"]
        self.labels = ("0", model)
        child = dict(zip(labels, self.labels, strict=True))
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
        self.ttft = BulkHistogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            child,
            vllm_buckets.TTFT,
            r,
        )
        self.itl = BulkHistogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            child,
            vllm_buckets.ITL,
            r,
        )
        self.e2e = BulkHistogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            child,
            vllm_buckets.E2E,
            r,
        )
        self.queue = BulkHistogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            child,
            vllm_buckets.E2E,
            r,
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
        ):
            metric.labels(*self.labels)

    def render(self) -> bytes:
        """The exposition text, as vLLM's /metrics serves it."""
        return generate_latest(self.registry)


def token_text(index: int) -> str:
    """The filler text of a request's ``index``-th output token."""
    return " " + WORDS[index % len(WORDS)]


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the simulated engine; times are on the engine's ideal clock."""

    prompt_tokens: int
    max_tokens: int
    arrived: float
    """Wall clock (``time.monotonic``) at submit."""
    done: asyncio.Future[None]
    """Set when the last token is out."""
    tokens: asyncio.Queue[str | None] | None = None
    """Streaming requests only: each token as it is generated, then None."""
    prefilled: int = 0
    generated: int = 0
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    aborted: bool = False


class SimEngine:
    """Continuous batching on an ideal clock that keeps pace with the wall clock / ``speedup``."""

    def __init__(self, profile: Profile, model: str, speedup: float = 1.0) -> None:
        self.profile = profile
        self.model = model
        self.speedup = speedup
        self.metrics = VllmMetrics(model)
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        """Admitted, prompt not fully prefilled yet (in admission order)."""
        self.decoding: list[SimRequest] = []
        """Admitted, first token out: one more token every step."""
        self.clock = time.monotonic()
        """The ideal clock: when the last step ended (``time.monotonic`` seconds)."""
        self._kv_used = 0
        """KV tokens reserved by admitted requests (prompt + max_tokens each)."""
        self._context = 0
        """Tokens in the decoding requests' contexts (prompt + generated)."""
        self._wake = asyncio.Event()
        m, labels = self.metrics, self.metrics.labels
        self._m_running = m.running.labels(*labels)
        self._m_waiting = m.waiting.labels(*labels)
        self._m_kv = m.kv.labels(*labels)
        self._m_prompt = m.prompt.labels(*labels)
        self._m_generation = m.generation.labels(*labels)
        self._m_length = m.success.labels(*labels, "length")
        self._m_abort = m.success.labels(*labels, "abort")

    @property
    def running(self) -> int:
        """Requests in the batch (prefilling or decoding)."""
        return len(self.prefilling) + len(self.decoding)

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        """Whether a request fits in the KV cache at all (else it could never be admitted)."""
        return prompt_tokens + max_tokens <= self.profile.kv_capacity_tokens

    def submit(self, prompt_tokens: int, max_tokens: int, stream: bool = False) -> SimRequest:
        """Queue a request.

        ``request.done`` is set when it finishes; a streaming request's tokens arrive on
        ``request.tokens`` (None ends it).
        """
        request = SimRequest(
            prompt_tokens,
            max_tokens,
            time.monotonic(),
            asyncio.get_running_loop().create_future(),
            asyncio.Queue() if stream else None,
        )
        self.waiting.append(request)
        self._m_waiting.set(len(self.waiting))
        self._wake.set()
        return request

    def abort(self, request: SimRequest) -> None:
        """The client went away: drop the request."""
        # Not ``done.done()``: cancelling a handler that awaits ``done`` cancels it too.
        if request.aborted:
            return
        request.aborted = True
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.prefilling:
            self.prefilling.remove(request)
            self._kv_used -= request.prompt_tokens + request.max_tokens
        elif request in self.decoding:
            self.decoding.remove(request)
            self._kv_used -= request.prompt_tokens + request.max_tokens
            self._context -= request.prompt_tokens + request.generated
        else:
            return
        self._m_abort.inc()
        self._update_gauges()

    async def run(self) -> None:
        """Step forever; sleep while idle or ahead of the wall clock."""
        while True:
            if not (self.waiting or self.prefilling or self.decoding):
                self._wake.clear()
                await self._wake.wait()
                continue
            start = self.clock
            if not self.prefilling and not self.decoding and self.waiting[0].arrived > start:
                # Idle until it arrived: the clock restarts at its arrival (the wall clock
                # at submit), not at the wake-up a little later, which is scheduling noise.
                start = self.waiting[0].arrived
            duration = self._schedule(start) / self.speedup
            if duration <= 0:  # nothing admissible (cannot happen with fits() checked)
                self.clock = start
                self._wake.clear()
                await self._wake.wait()
                continue
            end = start + duration
            slept = False
            while (ahead := end - time.monotonic()) > 0:
                await asyncio.sleep(max(ahead, MIN_SLEEP))
                slept = True
            self.clock = end
            self._emit(end, duration)
            self._update_gauges()
            if not slept:
                await asyncio.sleep(0)  # a late engine still lets the HTTP handlers run

    def _schedule(self, start: float) -> float:
        """Admit what arrived by ``start`` and fits; plan prefill chunks. Model seconds."""
        p = self.profile
        while self.waiting and self.running < p.max_num_seqs:
            candidate = self.waiting[0]
            if candidate.arrived > start:
                break  # it arrived after this step (ideally) began: the engine runs late
            need = candidate.prompt_tokens + candidate.max_tokens
            if self._kv_used + need > p.kv_capacity_tokens:
                break
            self.waiting.popleft()
            candidate.admitted = start
            self.metrics.queue.observe(start - candidate.arrived)
            self._kv_used += need
            self.prefilling.append(candidate)
        budget = max(p.max_num_batched_tokens - len(self.decoding), 0)
        chunk = 0
        for request in self.prefilling:
            take = min(request.prompt_tokens - request.prefilled, budget - chunk)
            if take <= 0:
                break
            request.prefilled += take
            chunk += take
        return p.mixed_step_seconds(len(self.decoding), self._context, chunk)

    def _emit(self, end: float, duration: float) -> None:
        """The step ended at ``end``: hand its tokens out.

        A token to every decoding request, the first token to each request whose prompt
        is now prefilled; finished requests leave.
        """
        finished = False
        if self.decoding:
            # Each had its last token when this step began: one ITL of ``duration`` each.
            self.metrics.itl.observe(duration, len(self.decoding))
            self._context += len(self.decoding)
            for request in self.decoding:
                request.last_token = end
                if request.tokens is not None:
                    request.tokens.put_nowait(token_text(request.generated))
                request.generated += 1
                finished = finished or request.generated >= request.max_tokens
        if self.prefilling and self.prefilling[0].prefilled >= self.prefilling[0].prompt_tokens:
            still = []
            for request in self.prefilling:
                if request.prefilled < request.prompt_tokens:
                    still.append(request)
                    continue
                # The first token comes with the last chunk.
                request.first_token = request.last_token = end
                self.metrics.ttft.observe(end - request.arrived)
                if request.tokens is not None:
                    request.tokens.put_nowait(token_text(0))
                request.generated = 1
                self._context += request.prompt_tokens + 1
                self.decoding.append(request)
                finished = finished or request.max_tokens <= 1
            self.prefilling = still
        if finished:
            self._finish(end)

    def _finish(self, end: float) -> None:
        prompt = generation = requests = 0
        still = []
        for request in self.decoding:
            if request.generated < request.max_tokens:
                still.append(request)
                continue
            self._kv_used -= request.prompt_tokens + request.max_tokens
            self._context -= request.prompt_tokens + request.generated
            prompt += request.prompt_tokens
            generation += request.generated
            requests += 1
            self.metrics.e2e.observe(end - request.arrived)
            if request.tokens is not None:
                request.tokens.put_nowait(None)
            if not request.done.done():
                request.done.set_result(None)
        self.decoding = still
        self._m_prompt.inc(prompt)
        self._m_generation.inc(generation)
        self._m_length.inc(requests)

    def _update_gauges(self) -> None:
        self._m_running.set(self.running)
        self._m_waiting.set(len(self.waiting))
        self._m_kv.set(self._kv_used / self.profile.kv_capacity_tokens)


def count_tokens(text: str) -> int:
    """About 1.3 tokens per word, plus BOS."""
    return 1 + max(1, round(len(text.split()) * 1.3))


class RequestError(Exception):
    """A request vLLM would refuse.

    Answered in vLLM 0.32's error shape: ``{"error": {"message", "type", "param", "code"}}``.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        kind: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param

    def response(self) -> web.Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }
        return web.json_response(body, status=self.status)


def _invalid(loc: str, kind: str, message: str, value: object) -> RequestError:
    """What vLLM's request validation answers (pydantic's first error, its ``loc`` cleaned)."""
    shown = value
    if isinstance(value, list | dict):
        shown = f"<{type(value).__name__} of {len(value)} items>"
    error = {"type": kind, "loc": loc, "msg": message, "input": str(shown)}
    return RequestError(f"1 validation error:\n  {error}", kind="Bad Request", param=loc)


def prompt_length(prompt: object) -> int:
    """Prompt tokens of a ``/v1/completions`` ``prompt``.

    A string is estimated from its words; a list of token ids counts exactly its length.

    vLLM also takes a list of prompts (strings or token-id lists) and answers each; the
    simulated replica serves one prompt per request and refuses those with a 400 too.

    Raises:
        RequestError: what vLLM 0.32 answers for that prompt (messages as vLLM words them).
    """
    if prompt is None or prompt == "":
        raise RequestError(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
            param="prompt",
        )
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if not isinstance(prompt, list):
        raise _invalid("body.prompt", "string_type", "Input should be a valid string", prompt)
    if not prompt:
        raise RequestError("You must pass at least one prompt")
    if all(isinstance(p, str | list) for p in prompt):
        raise RequestError(
            f"prompt is a list of {len(prompt)} prompts: the simulated replica serves one"
            " prompt (a string or a list of token ids) per request",
            param="prompt",
        )
    for i, token in enumerate(prompt):
        # JSON numbers as pydantic's lax int takes them: true/false and 3.0 are ids too.
        if isinstance(token, float) and not token.is_integer():
            raise _invalid(
                f"body.prompt.{i}",
                "int_from_float",
                "Input should be a valid integer, got a number with a fractional part",
                token,
            )
        if not isinstance(token, int | float):
            raise _invalid(f"body.prompt.{i}", "int_type", "Input should be a valid integer", token)
        if token < 0:
            raise _invalid(
                f"body.prompt.{i}",
                "greater_than_equal",
                "Input should be greater than or equal to 0",
                token,
            )
    return len(prompt)


class SimReplica:
    """The HTTP face of a ``SimEngine``: the parts of vLLM's OpenAI server we use."""

    def __init__(self, profile: Profile, model: str = "sim-llama", speedup: float = 1.0) -> None:
        self.engine = SimEngine(profile, model, speedup)
        self.model = model
        self.app = web.Application(middlewares=[_request_errors])
        self.app.router.add_post("/v1/completions", self._completions)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.cleanup_ctx.append(self._engine_task)
        self._ids = itertools.count(1)

    async def _engine_task(self, app: web.Application) -> AsyncIterator[None]:
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
        self._check_model(body)
        return await self._serve(request, body, prompt_length(body.get("prompt")), chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a list of objects", param="messages")
        text = " ".join(str(m.get("content", "")) for m in messages)
        return await self._serve(request, body, count_tokens(text) + 4 * len(messages), chat=True)

    def _check_model(self, body: dict[str, object]) -> None:
        model = body.get("model", self.model)
        if model != self.model:
            raise RequestError(
                f"The model `{model}` does not exist. Valid aliases: {self.model}.",
                status=404,
                kind="NotFoundError",
                param="model",
            )

    async def _serve(
        self, request: web.Request, body: dict[str, object], prompt_tokens: int, chat: bool
    ) -> web.StreamResponse:
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError("max_tokens must be a positive integer", param="max_tokens")
        if not self.engine.fits(prompt_tokens, max_tokens):
            capacity = self.engine.profile.kv_capacity_tokens
            raise RequestError(
                f"This model's KV cache holds {capacity} tokens. However, you requested"
                f" {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt,"
                f" {max_tokens} in the completion).",
                param="input_tokens",
            )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim{next(self._ids)}"
        stream = bool(body.get("stream"))
        sim = self.engine.submit(prompt_tokens, max_tokens, stream)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        try:
            if sim.tokens is None:
                await sim.done
                text = "".join(token_text(i) for i in range(max_tokens))
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


@web.middleware
async def _request_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as err:
        return err.response()


async def _json_body(request: web.Request) -> dict[str, object]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body


def profile_named(name: str) -> Profile:
    """A replica profile by name (``serving.replica_model.PROFILES``)."""
    return PROFILES[name]
