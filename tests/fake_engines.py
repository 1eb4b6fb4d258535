"""vLLM-format replicas for exporter tests: real aiohttp servers, metrics you control.

The exposition is rendered by prometheus_client with vLLM 0.32's metric names, labels
and buckets, the way vLLM renders its own; tests drive the numbers (``finish``) and
the failure modes (``mode``): slow, HTTP errors, garbage, and the hostile bodies of
``HOSTILE`` (each a good body made bad in one way).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
from collections.abc import Callable

from aiohttp import web

from serving.vllm_metrics import VllmMetrics

RUNNING = b"vllm:num_requests_running"
LONG_LINE = 1_000_000
"""Characters in the ``long-malformed-line`` mode's one bad line."""


def _bad_bucket_bound(body: bytes) -> bytes:
    return body + b'vllm:time_to_first_token_seconds_bucket{le="fast",model_name="m"} 1.0\n'


def _non_utf8_comment(body: bytes) -> bytes:
    return b"# HELP process_extra caf\xe9 cr\xe8me (latin-1, not UTF-8)\n" + body


def _non_utf8_label(body: bytes) -> bytes:
    return body + b'vllm:num_requests_running{engine="1",model_name="caf\xe9"} 1.0\n'


def _series(count: int) -> bytes:
    return b"".join(
        b'vllm:num_requests_running{engine="%d",model_name="tiny-llama"} 1.0\n' % i
        for i in range(count)
    )


def _negative_gauges(body: bytes) -> bytes:
    lines = []
    for line in body.splitlines():
        if line.startswith((RUNNING + b"{", b"vllm:num_requests_waiting{")):
            name, _, _ = line.rpartition(b" ")
            line = name + (b" -5.0" if line.startswith(RUNNING) else b" -3.0")
        lines.append(line)
    return b"\n".join(lines) + b"\n"


def _duplicate_series(body: bytes) -> bytes:
    return body + b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 40.0\n'


def _long_malformed_line(body: bytes) -> bytes:
    return body + RUNNING + b"{" + b"x" * LONG_LINE + b"\n"


@functools.cache
def gzip_bomb() -> bytes:
    """About 8 MB of wanted series, gzip-compressed to a few tens of kB."""
    line = b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 1.0\n'
    return gzip.compress(line * 130_000, compresslevel=9)


HOSTILE: dict[str, Callable[[bytes], bytes]] = {
    "bad-bucket-bound": _bad_bucket_bound,
    "non-utf8-comment": _non_utf8_comment,
    "non-utf8-label": _non_utf8_label,
    "too-large": lambda body: body + _series(40_000),  # about 2.4 MB
    "too-many-series": lambda body: body + _series(2_000),
    "negative-gauges": _negative_gauges,
    "duplicate-series": _duplicate_series,
    "long-malformed-line": _long_malformed_line,
}
"""Hostile bodies by mode: a good body in, the bad one out."""


class FakeVllm:
    """One replica's metrics in vLLM's names (``serving.vllm_metrics.VllmMetrics``), driven
    by the test; ``restart()`` zeroes them like a new process."""

    def __init__(self, model: str = "tiny-llama") -> None:
        self.model = model
        # ok | slow | http-500 | garbage | not-vllm | chunked-too-large | gzip-bomb | HOSTILE
        self.mode = "ok"
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
        m.prompt_length.observe(prompt, requests)
        m.output_length.observe(output, requests)
        m.ttft.observe(ttft, requests)
        m.e2e.observe(e2e, requests)
        m.queue.observe(0.0, requests)
        m.itl.observe(itl, requests * (output - 1))

    def body(self) -> str:
        return self.metrics.render().decode()

    def served(self) -> bytes:
        """What ``/metrics`` answers in the current mode (a hostile one made bad)."""
        body = self.metrics.render()
        hostile = HOSTILE.get(self.mode)
        return body if hostile is None else hostile(body)


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

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        replica = self.replicas[int(request.match_info["index"])]
        if replica.mode == "slow":
            await asyncio.sleep(2)  # well past the tests' scrape timeouts (300 ms, 1 s)
        if replica.mode == "http-500":
            return web.Response(status=500, text="engine dead")
        if replica.mode == "garbage":
            return web.Response(text='vllm:num_requests_running{engine="0" oops\n')
        if replica.mode == "not-vllm":
            return web.Response(text="process_cpu_seconds_total 1.0\n")
        if replica.mode == "gzip-bomb":
            # A small Content-Length: only counting the decompressed bytes can stop it.
            return web.Response(
                body=gzip_bomb(), headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"}
            )
        if replica.mode == "chunked-too-large":
            # No Content-Length: only counting what arrives can stop it.
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            body = HOSTILE["too-large"](replica.metrics.render())
            try:
                for start in range(0, len(body), 65536):
                    await response.write(body[start : start + 65536])
                await response.write_eof()
            except ConnectionError:
                pass  # the exporter stopped reading at its cap and hung up
            return response
        return web.Response(body=replica.served(), content_type="text/plain")
