"""The simulated replica's HTTP face: the parts of vLLM's OpenAI server the project uses.

It speaks vLLM's OpenAI API (``/v1/completions``, ``/v1/chat/completions`` with SSE
streaming, ``/v1/models``, ``/health``) and exposes ``/metrics`` with vLLM 0.32's metric
names, labels and histogram buckets (``serving.vllm_metrics``), so the exporter cannot tell
it from vLLM by format. Requests are checked as vLLM checks them (``serving.sim_validation``)
and served by the engine (``serving.sim_engine``), whose timing comes from the replica model.

A client that leaves (mid-stream, or before its whole answer) has its request aborted, as
vLLM aborts it; that is normal traffic, logged at DEBUG only.

With ``sleep_mode`` (vLLM started with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``;
the default here) it serves vLLM's sleep endpoints: ``POST /sleep?level=0|1|2&mode=
abort|wait|keep`` (defaults 1 and abort), ``POST /wake_up`` (``?tags=weights`` and/or
``?tags=kv_cache`` wake one part), ``GET /is_sleeping``, with vLLM's answers, its 400 for a
bad query, ``vllm:engine_sleep_state`` and the sleep-mode operation metrics. Without it
those paths are 404, as on a vLLM started without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST

from foundation.replica_model import Profile
from serving.sim_engine import PauseMode, SimEngine, token_text
from serving.sim_validation import (
    RequestError,
    chat_prompt_length,
    check_model,
    check_options,
    json_object,
    max_tokens_of,
    prompt_length,
    too_long,
)

log = logging.getLogger(__name__)


class SimReplica:
    """The HTTP face of a ``SimEngine``: the parts of vLLM's OpenAI server we use."""

    def __init__(
        self,
        profile: Profile,
        model: str = "sim-llama",
        speedup: float = 1.0,
        *,
        sleep_mode: bool = True,
    ) -> None:
        self.engine = SimEngine(profile, model, speedup)
        self.model = model
        self.app = web.Application(middlewares=[_request_errors])
        self.app.router.add_post("/v1/completions", self._completions)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/metrics", self._metrics)
        if sleep_mode:
            self.app.router.add_post("/sleep", self._sleep)
            self.app.router.add_post("/wake_up", self._wake_up)
            self.app.router.add_get("/is_sleeping", self._is_sleeping)
        self.app.cleanup_ctx.append(self._engine_task)
        self._engine: asyncio.Task[None] | None = None
        """The engine's stepping task, while the app runs (``_health`` reads it)."""
        self._ids = itertools.count(1)

    async def _engine_task(self, app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(self.engine.run())
        self._engine = task
        task.add_done_callback(_engine_ended)
        yield
        task.cancel()

    async def _health(self, request: web.Request) -> web.Response:
        """200 while the engine steps; 503 once its task ended, as vLLM's dead engine.

        Always 200, a replica whose engine had stopped passed every check and was sent
        requests that waited for good (each a 504 at the gateway's upstream timeout).
        """
        if self._engine is not None and self._engine.done():
            return web.Response(status=503)
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _sleep(self, request: web.Request) -> web.Response:
        level, mode = sleep_query(request.query)
        async with self._operation("sleep"):
            # A client that gives up does not stop the sleep, as for a wake: cancelled
            # in ``wait`` mode (a gateway's timeout while requests drain), it left the
            # engine paused, ``/is_sleeping`` true, and its memory never freed.
            await asyncio.shield(self.engine.sleep(level, mode))
        return web.json_response({"status": "sleeping", "level": level})

    async def _wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", []) or None
        log.info("wake up the engine with tags: %s", tags)
        async with self._operation("wake"):
            # A client that gives up does not stop the wake: vLLM's engine carries it out.
            awake = await asyncio.shield(self.engine.wake_up(tags))
        return web.json_response({"status": "awake" if awake else "sleeping", "tags": tags})

    async def _is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.engine.is_sleeping})

    @contextlib.asynccontextmanager
    async def _operation(self, name: str) -> AsyncIterator[None]:
        """The sleep-mode operation metrics, as vLLM keeps them: in flight, then its duration."""
        duration, in_flight = self.engine.metrics.operation_metrics()
        started = time.perf_counter()
        in_flight.labels(name).inc()
        try:
            yield
        finally:
            in_flight.labels(name).dec()
            duration.labels(name).observe(time.perf_counter() - started)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "owned_by": "unitscale-sim",
                        # vLLM lists each model's context; the sim's is its KV capacity.
                        "max_model_len": self.engine.profile.kv_capacity_tokens,
                    }
                ],
            }
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        check_model(body, self.model)
        return await self._serve(request, body, prompt_length(body.get("prompt")), chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        check_model(body, self.model)
        prompt_tokens = chat_prompt_length(body.get("messages"))
        return await self._serve(request, body, prompt_tokens, chat=True)

    async def _serve(
        self, request: web.Request, body: dict[str, object], prompt_tokens: int, chat: bool
    ) -> web.StreamResponse:
        """Check the request's size, run it on the engine, answer whole or streamed."""
        max_tokens = max_tokens_of(body, chat)
        check_options(body)
        if not self.engine.fits(prompt_tokens, max_tokens):
            raise too_long(prompt_tokens, max_tokens, self.engine.profile.kv_capacity_tokens)
        answer = _Answer(
            f"{'chatcmpl' if chat else 'cmpl'}-sim{next(self._ids)}",
            self.model,
            chat,
            _usage(prompt_tokens, max_tokens),
        )
        sim = self.engine.submit(prompt_tokens, max_tokens, bool(body.get("stream")))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            if sim.tokens is None:
                await sim.done
                whole = answer.whole(sim.generated, int(time.time()), sim.finish_reason)
                return web.json_response(whole)
            await _stream(request, response, sim.tokens, answer, _include_usage(body))
        except asyncio.CancelledError:
            # The client left (the server cancels its handler) or the server stops.
            self.engine.abort(sim)
            raise
        except ConnectionResetError:
            # The client left while its stream was being written.
            log.debug("the client of %s left; aborted", answer.rid)
            self.engine.abort(sim)
        return response


@dataclass(frozen=True, slots=True)
class _Answer:
    """The bodies of one request's answer, in vLLM's OpenAI shapes."""

    rid: str
    model: str
    chat: bool
    usage: dict[str, int]

    def whole(self, tokens: int, created: int, finish_reason: str) -> dict[str, object]:
        """The non-streaming answer: every token's text at once (fewer when aborted)."""
        text = "".join(token_text(i) for i in range(tokens))
        choice: dict[str, object] = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
            if self.chat
            else {"index": 0, "text": text, "finish_reason": finish_reason}
        )
        prompt = self.usage["prompt_tokens"]
        return {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": created,
            "model": self.model,
            "choices": [choice],
            "usage": _usage(prompt, tokens),
        }

    def chunk(self, token: str) -> dict[str, object]:
        """One streamed token."""
        delta: dict[str, object] = (
            {"index": 0, "delta": {"content": token}, "finish_reason": None}
            if self.chat
            else {"index": 0, "text": token, "finish_reason": None}
        )
        return {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "model": self.model,
            "choices": [delta],
        }

    def usage_chunk(self) -> dict[str, object]:
        """The last streamed chunk when the client asked for usage: no choices, the usage."""
        return {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "model": self.model,
            "choices": [],
            "usage": self.usage,
        }


def _engine_ended(task: asyncio.Task[None]) -> None:
    """The engine's task ended: logged once, with why (a cancel is the server stopping)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("the engine stopped; /health answers 503", exc_info=task.exception())


SLEEP_MODES: tuple[PauseMode, ...] = ("abort", "wait", "keep")


def sleep_query(query: Mapping[str, str]) -> tuple[int, PauseMode]:
    """``/sleep``'s ``level`` (0-2, default 1) and ``mode`` (default abort), checked as vLLM.

    Raises:
        RequestError: vLLM's 400 for a query its FastAPI route refuses.
    """
    raw = query.get("level", "1")
    try:
        level = int(raw)
    except ValueError:
        raise _bad_query("level", "int_parsing", "Input should be a valid integer", raw) from None
    if level < 0:
        raise _bad_query(
            "level", "greater_than_equal", "Input should be greater than or equal to 0", raw
        )
    if level > 2:
        raise _bad_query("level", "less_than_equal", "Input should be less than or equal to 2", raw)
    mode = query.get("mode", "abort")
    for known in SLEEP_MODES:
        if mode == known:
            return level, known
    raise _bad_query("mode", "literal_error", "Input should be 'abort', 'wait' or 'keep'", mode)


def _bad_query(name: str, kind: str, message: str, value: str) -> RequestError:
    detail = {"type": kind, "loc": ("query", name), "msg": message, "input": value}
    return RequestError(
        f"1 validation error:\n  {detail}", kind="Bad Request", param=f"query.{name}"
    )


def _usage(prompt_tokens: int, max_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    }


def _include_usage(body: dict[str, object]) -> bool:
    """Whether a streaming request asked for a final usage chunk."""
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


async def _stream(
    request: web.Request,
    response: web.StreamResponse,
    tokens: asyncio.Queue[str | None],
    answer: _Answer,
    include_usage: bool,
) -> None:
    """Server-sent events: a chunk per token as the engine hands it out, then ``[DONE]``."""
    await response.prepare(request)
    while (token := await tokens.get()) is not None:
        await response.write(f"data: {json.dumps(answer.chunk(token))}\n\n".encode())
    if include_usage:
        await response.write(f"data: {json.dumps(answer.usage_chunk())}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


@web.middleware
async def _request_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as err:
        return web.json_response(err.body(), status=err.status)


async def _json_body(request: web.Request) -> dict[str, object]:
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        # Whatever is wrong: malformed, not UTF-8, too many digits, nested too deep.
        raise RequestError("request body is not valid JSON") from None
    except web.RequestPayloadError:
        # Labelled gzip or deflate and not: a 400, not a 500 and two tracebacks (aiohttp
        # would read the rest after the answer, and log the error again).
        request.content.feed_eof()
        raise RequestError("request body could not be decoded") from None
    return json_object(body)
