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
import gzip
import itertools
import json
import logging
import socket
import threading
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from yarl import URL

from foundation.errors import ConfigError
from serving.arrival_recorder import ArrivalRecorder, Row, _Files
from serving.arrivals import ArrivalSettings
from serving.config import parse_config
from serving.gateway_settings import GatewaySettings
from serving.server import GatewayServer, gateway_guard
from serving.slo import SSE_LINE_LIMIT, ResponseMeter
from tests.conftest import eventually, served_app
from tests.test_gateway_faults import (
    Behaviour,
    Fake,
    close_before_headers,
    forever,
    upstream_errors,
)
from tests.test_gateway_isolation import StandIn, gateway_for, probe_failures

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


# --- T-2: request heads that never end, and connections past the cap -------------------


@contextlib.asynccontextmanager
async def guarded_gateway(**guard: Any) -> AsyncIterator[GatewayServer]:
    """A gateway with no replica whose connection guard has the bounds given."""
    settings = GatewaySettings(namespace="a", deployment="llama")
    server = GatewayServer([], settings, "127.0.0.1:0", "127.0.0.1:0")
    server.guard = gateway_guard(server.gateway.metrics.client_error, **guard)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def connections(gateway: GatewayServer) -> int:
    """Connections the gateway's HTTP server holds."""
    assert gateway._site is not None and gateway._site.runner.server is not None
    return len(gateway._site.runner.server.connections)


async def closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the gateway sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), 30)


async def test_a_head_that_never_ends_is_closed_at_the_head_deadline_and_counted():
    async with guarded_gateway(head_timeout=0.2) as gateway:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4000)
        await writer.drain()

        async def trickle() -> None:  # one more byte now and then keeps no deadline off
            with contextlib.suppress(ConnectionError):
                while True:
                    writer.write(b"a")
                    await writer.drain()
                    await asyncio.sleep(0.02)

        trickling = asyncio.create_task(trickle())
        try:
            assert await closed(reader) == b""  # before: open for good
        finally:
            trickling.cancel()
            writer.close()
        assert counter(gateway, "_client_errors", "slow-head") == 1


async def test_a_kept_alive_connection_gets_a_deadline_for_its_next_head_too():
    # aiohttp's keep-alive closes it (a head under way or not); the guard's deadline is
    # for the first head, which aiohttp bounds by nothing.
    async with guarded_gateway(head_timeout=100, keepalive_timeout=0.2) as gateway:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: a")  # and no more
        await writer.drain()
        data = await closed(reader)
        writer.close()
        assert b"HTTP/1.1" not in data.split(b"\r\n\r\n", 1)[-1]  # no second answer


async def test_a_connection_past_the_cap_is_answered_503_and_counted():
    async with guarded_gateway(max_connections=3) as gateway:
        held = [await asyncio.open_connection("127.0.0.1", gateway.port) for _ in range(3)]
        for _, writer in held:  # each a request head under way: each is a connection
            writer.write(b"GET /health HTTP/1.1\r\n")
            await writer.drain()
        await eventually(lambda: connections(gateway) == 3, "held")
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        answer = await closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == 503
        assert counter(gateway, "_client_errors", "too-many-connections") == 1
        for _, writer in held:
            writer.close()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param([b"X-A%d: b" % i for i in range(60)], 200, id="sixty-short-headers-pass"),
        pytest.param([b"X-A%d: b" % i for i in range(100)], 400, id="a-hundred-headers-are-a-400"),
        pytest.param([b"X-A: " + b"b" * 4000], 200, id="a-4000-byte-header-passes"),
        pytest.param([b"X-A: " + b"b" * 8000], 400, id="an-8000-byte-header-is-a-400"),
    ],
)
async def test_a_request_head_is_bounded_in_headers_and_bytes(headers, status):
    async with guarded_gateway() as gateway:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        head = b"\r\n".join([b"GET /health HTTP/1.1", b"Host: x", *headers, b"", b""])
        writer.write(head)
        line = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        assert int(line.split()[1]) == status


# --- T-3: a disk write that never returns ----------------------------------------------


class HungFiles(_Files):
    """The file writer, whose writes block until ``release`` (a dead network volume)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, settings: ArrivalSettings, rows: list[Row], now: float) -> None:
        self.release.wait()
        super().write(settings, rows, now)


def recorder_counts(recorder: ArrivalRecorder) -> tuple[float, float, float]:
    """(recorded, dropped, write errors)."""
    return tuple(c._value.get() for c in (recorder._recorded, recorder._dropped, recorder._errors))


async def test_a_write_that_hangs_is_a_counted_failure_and_holds_neither_the_rows_nor_shutdown(
    tmp_path, caplog
):
    recorder = ArrivalRecorder(
        ArrivalSettings(str(tmp_path)), CollectorRegistry(), LABELS, write_timeout=0.05
    )
    files = recorder._files = HungFiles()
    try:
        for _batch in range(3):
            for _ in range(10):
                recorder.record(1.0, 5, 5)
            # Before: the first flush waited for the write for good.
            await asyncio.wait_for(recorder.flush(), 30)
            assert recorder._pending == []  # nothing piles up in memory
        assert recorder.stuck
        # The hung batch is counted when it ends; the next two were dropped at once.
        assert recorder_counts(recorder) == (0, 20, 1)
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "no write ended within 0.05s" in warnings[0].getMessage()
        await asyncio.wait_for(recorder._close(), 30)  # before: waited behind the write
    finally:
        files.release.set()
    await eventually(lambda: recorder_counts(recorder)[0] == 10, "the late write is counted")
    assert [p.name for p in tmp_path.iterdir()] != []


# --- T-4, T-5, T-6: request bodies: declared, mislabelled, compressed ------------------


class Echo:
    """A replica that keeps the headers and body of each completion it gets."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, str], bytes]] = []
        self.url = ""

    async def _completions(self, request: web.Request) -> web.Response:
        self.seen.append((dict(request.headers), await request.read()))
        return web.json_response({"choices": [{"text": "hi"}], "usage": {"completion_tokens": 1}})

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Echo]:
        async def health(request: web.Request) -> web.Response:
            return web.Response()

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "sim-llama"}]})

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", self._completions)
        async with served_app(app) as self.url:
            yield self


BODY = json.dumps({"model": "sim-llama", "prompt": "hello"}).encode()


async def post_raw(gateway: GatewayServer, body: bytes, **headers: str) -> tuple[int, bytes]:
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as client,
        client.post(url, data=body, headers={"Content-Type": "application/json", **headers}) as r,
    ):
        return r.status, await r.read()


async def test_declared_lengths_take_no_budget_before_their_bytes_arrive():
    async with (
        Echo().serving() as replica,
        gateway_for([replica.url], buffer_bytes=1000, max_request_bytes=1000) as gateway,
    ):
        await eventually(lambda: gateway.gateway.replicas[0].routable, "ready")
        held = []
        for _ in range(3):  # each declares the whole budget and sends nothing
            _, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
            )
            await writer.drain()
            held.append(writer)
        try:
            status, _ = await post_raw(gateway, BODY)  # before: 429, the budget "taken"
            assert status == 200
            assert gateway.gateway.stats.reading_bytes == 0
        finally:
            for writer in held:
                writer.close()


@pytest.mark.parametrize(
    ("encoding", "body", "message", "malformed"),
    [
        pytest.param(
            "gzip",
            b"not gzip at all",
            "request body could not be decoded",
            1,
            id="a-body-labelled-gzip-that-is-not-is-a-counted-400",
        ),
        pytest.param(
            "deflate",
            b"\x00\x01garbage",
            "request body could not be decoded",
            1,
            id="a-body-labelled-deflate-that-is-not-is-a-counted-400",
        ),
        pytest.param(
            "gzip",
            gzip.compress(BODY)[:20],
            "request body is not valid JSON",
            0,
            id="a-gzip-body-cut-short-decodes-to-a-part-that-is-not-json-a-400",
        ),
    ],
)
async def test_a_body_its_encoding_cannot_decode_is_the_clients_400_with_no_traceback(
    encoding, body, message, malformed, caplog
):
    async with gateway_for([]) as gateway:
        status, answer = await post_raw(gateway, body, **{"Content-Encoding": encoding})
        assert status == 400  # before: 500 and two ERROR tracebacks
        assert json.loads(answer)["message"] == message
        assert counter(gateway, "_client_errors", "malformed-http") == malformed
        assert counter(gateway, "_rejected", "400") == 1
        assert [r for r in caplog.records if r.levelname == "ERROR"] == []


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        pytest.param("gzip", gzip.compress, id="a-gzip-body-is-forwarded-decoded-and-unlabelled"),
        pytest.param(
            "deflate", zlib.compress, id="a-deflate-body-is-forwarded-decoded-and-unlabelled"
        ),
    ],
)
async def test_a_compressed_request_is_forwarded_as_the_plain_body_it_decoded_to(
    encoding, compress
):
    async with Echo().serving() as replica, gateway_for([replica.url]) as gateway:
        await eventually(lambda: gateway.gateway.replicas[0].routable, "ready")
        status, _ = await post_raw(gateway, compress(BODY), **{"Content-Encoding": encoding})
        assert status == 200
        ((headers, body),) = replica.seen
        assert body == BODY
        assert "content-encoding" not in {k.lower() for k in headers}  # before: "gzip"


# --- T-7: a replica that lists no model ------------------------------------------------


async def test_a_replica_listing_no_model_is_routed_nothing_and_unknown_models_stay_404():
    async with (
        StandIn().serving() as good,
        StandIn(**{"/v1/models": b'{"data": []}'}).serving() as empty,
        gateway_for([good.url, empty.url]) as gateway,
    ):
        g = gateway.gateway
        await eventually(lambda: g.pool.find(good.url).routable, "ready")
        await eventually(lambda: probe_failures(gateway, "wrong-shape") >= 1, "counted")
        assert not g.pool.find(empty.url).routable
        statuses = await asyncio.gather(*(post_raw(gateway, BODY) for _ in range(20)))
        assert [s for s, _ in statuses] == [200] * 20  # before: half were its 404s
        assert "/v1/completions" not in empty.calls
        unknown = json.dumps({"model": "no-such-model", "prompt": "x"}).encode()
        assert (await post_raw(gateway, unknown))[0] == 404  # before: forwarded to it
        assert "/v1/completions" not in empty.calls


# --- T-9, T-10, T-14 and the config's strings: what the gateway config refuses ---------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("upstream-timeout: 1ns", "key 'upstream-timeout'", id="T-9 upstream 1ns"),
        pytest.param("upstream-timeout: 999ms", "key 'upstream-timeout'", id="T-9 upstream <1s"),
        pytest.param("wake-timeout: 1ns", "key 'wake-timeout'", id="T-9 a wake of 1ns"),
        pytest.param("buffer-timeout: 1ns", "key 'buffer-timeout'", id="T-9 a 1ns buffer wait"),
        pytest.param("slo: {ttft: 1ns}", "key 'slo.ttft'", id="T-14 a 1ns ttft target"),
        pytest.param("slo: {itl: 999us}", "key 'slo.itl'", id="T-14 an itl under 1ms"),
        pytest.param("replicas: ['http://a:99999']", "out of range", id="T-10 a port past 65535"),
        pytest.param("replicas: ['http://a:0']", "port 0", id="T-10 port 0"),
        pytest.param("replicas: ['http://[::1']", "Invalid IPv6", id="T-10 an unclosed ipv6"),
        pytest.param(
            'replicas: ["http://a\\r\\nX: y"]', "control character", id="T-10 a CRLF in a URL"
        ),
        pytest.param("replicas: ['http://a b:1']", "a space", id="T-10 a space in the host"),
        pytest.param("replicas: ['https://']", "expected http://", id="T-10 no host"),
        pytest.param("replicas: ['http://h:1/v1']", "a path", id="T-10 a path"),
        pytest.param("replicas: ['http://h:1?x=1']", "query", id="T-10 a query"),
        pytest.param("replicas: ['http://h:1#y']", "fragment", id="T-10 a fragment"),
        pytest.param("replicas: ['http://u:p@h:1']", "user info", id="T-10 user info"),
        pytest.param(
            f"replicas: ['http://{'h' * 3000}:1']", "at most 253", id="a host no resolver takes"
        ),
        pytest.param("models: ['   ']", "key 'models.0'", id="a blank model name"),
        pytest.param(f"models: [{'m' * 513}]", "key 'models.0'", id="a model name over 512"),
        pytest.param("arrivals: {directory: '   '}", "arrivals.directory", id="a blank directory"),
        pytest.param(f"namespace: {'a' * 64}", "key 'namespace'", id="a namespace over 63"),
        pytest.param(f"deployment: {'a' * 254}", "key 'deployment'", id="a deployment over 253"),
    ],
)
def test_the_gateway_config_refuses_what_would_fail_quietly_naming_the_key(text, fragment):
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "gateway.yaml")
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("replicas", "parsed"),
    [
        pytest.param(
            ["http://a:1", "http://a:1/", "https://b"],
            ["http://a:1", "https://b"],
            id="a URL listed twice (with and without its slash) is one replica",
        ),
        pytest.param(["http://[::1]:8000/"], ["http://[::1]:8000"], id="an ipv6 replica"),
    ],
)
def test_replica_urls_are_kept_once_without_their_slash(replicas, parsed):
    assert parse_config(json.dumps({"replicas": replicas}), "gateway.yaml").replicas == parsed


@pytest.mark.parametrize(
    "key", ["upstream-timeout", "wake-timeout", "buffer-timeout", "slo.ttft", "slo.itl"]
)
@given(seconds=st.floats(min_value=0, max_value=1e-3, exclude_max=True))
def test_no_timeout_or_slo_target_under_its_floor_is_taken(key, seconds):
    path = key.split(".")
    data: dict[str, object] = {path[-1]: seconds}
    if len(path) == 2:
        data = {path[0]: data}
    with pytest.raises(ConfigError):
        parse_config(json.dumps(data), "gateway.yaml")


@given(url=st.text(max_size=40).map(lambda tail: "http://" + tail))
def test_a_replica_url_taken_is_a_bare_http_base(url):
    try:
        [parsed] = parse_config(json.dumps({"replicas": [url]}), "gateway.yaml").replicas
    except ConfigError:
        return
    target = URL(parsed)
    assert target.host and not target.query_string and not target.fragment
    assert target.path in ("", "/") and target.user is None
    assert not any(c.isspace() or ord(c) < 32 for c in parsed)


# --- T-12: SSE lines sent a few bytes at a time ----------------------------------------

STREAM = (
    b"".join(b'data: {"choices": [{"text": "%s"}]}\n\n' % (b"x" * n) for n in (1, 300, 5000, 2))
    + b'data: {"usage": {"completion_tokens": 4, "prompt_tokens": 7}}\n\ndata: [DONE]\n\n'
)


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_a_stream_reads_the_same_however_it_is_cut_into_chunks(cuts):
    whole, pieces = ResponseMeter(0.0, 10), ResponseMeter(0.0, 10)
    for meter in (whole, pieces):
        meter.begin(200, True)
    whole.feed(STREAM, 1.0)
    bounds = [0, *sorted(cuts), len(STREAM)]
    for start, end in itertools.pairwise(bounds):
        pieces.feed(STREAM[start:end], 1.0)
    assert (pieces.token_events, pieces.output_tokens(), pieces.prompt_tokens) == (4, 4, 7)
    assert (whole.token_events, whole.output_tokens()) == (4, 4)


def test_a_long_line_in_small_chunks_is_grown_in_place_not_copied_per_chunk():
    meter = ResponseMeter(0.0, 10)
    meter.begin(200, True)
    meter.feed(b'data: {"choices": [{"text": "', 1.0)
    pending = meter._pending
    for _ in range(4000):  # ~1 MB in 256-byte writes: before, each copied the line whole
        meter.feed(b"x" * 256, 1.0)
    assert meter._pending is pending and len(pending) > 1_000_000
    meter.feed(b'"}]}\n\n', 1.0)
    assert meter.token_events == 1


def test_a_line_past_the_limit_is_skipped_and_the_next_one_read():
    meter = ResponseMeter(0.0, 10)
    meter.begin(200, True)
    for _ in range(SSE_LINE_LIMIT // 4096 + 2):
        meter.feed(b"y" * 4096, 1.0)
    assert len(meter._pending) <= SSE_LINE_LIMIT
    meter.feed(b'\ndata: {"choices": [{"text": "a"}]}\n\n', 2.0)
    assert meter.token_events == 1 and meter.first_token == 2.0


# --- T-11: a replica that drops every request ------------------------------------------


@pytest.mark.usefixtures("no_failure_weight")
async def test_a_replica_dropping_every_request_is_logged_once_and_counted_each_time(caplog):
    caplog.set_level(logging.DEBUG, logger="serving.gateway")
    bad = await Fake(close_before_headers).start()
    try:
        async with StandIn().serving() as good, gateway_for([bad.url, good.url]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "ready")

            async def until_dropped_thrice() -> bool:
                assert (await post_raw(gateway, BODY))[0] == 200  # retried on the good one
                return bad.received >= 3

            for _ in range(200):
                if await until_dropped_thrice():
                    break
            assert bad.received >= 3
            drops = [r for r in caplog.records if "dropped the connection" in r.getMessage()]
            # Before: a WARNING per request routed there.
            assert [r.levelname for r in drops].count("WARNING") == 1
            assert len(drops) == bad.received
            assert upstream_errors(gateway)["before-response"] == bad.received
    finally:
        await bad.stop()


# --- T-13: an answer that never ends ---------------------------------------------------


def pings(tokens_every: int | None) -> Behaviour:
    """A stream of keep-alive comments, a token every ``tokens_every`` of them (or none)."""

    async def behaviour(request: web.Request, fake: Fake) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for sent in range(1, 41):
            if tokens_every and sent % tokens_every == 0:
                await response.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            else:
                await response.write(b": ping\n\n")
            await asyncio.sleep(0.02)  # the replica's pace, not a synchronisation
        if tokens_every is None:
            await forever()
        await response.write(b"data: [DONE]\n\n")
        return response

    return behaviour


@pytest.mark.parametrize(
    ("tokens_every", "whole", "stalled"),
    [
        pytest.param(None, False, 1, id="pings-and-never-a-token-are-cut-as-stalled"),
        pytest.param(4, True, 0, id="pings-between-tokens-within-the-timeout-are-relayed-whole"),
    ],
)
async def test_a_stream_must_carry_a_token_within_the_upstream_timeout(
    tokens_every, whole, stalled
):
    fake = await Fake(pings(tokens_every)).start()
    try:
        async with gateway_for([fake.url], upstream_timeout=0.3) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].routable, "ready")
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            body = {"model": "sim-llama", "prompt": "x", "stream": True, "max_tokens": 5}
            async with aiohttp.ClientSession() as client:
                try:
                    async with client.post(url, json=body) as r:
                        text = await r.read()
                    ended = text.endswith(b"data: [DONE]\n\n")
                except aiohttp.ClientPayloadError:
                    ended = False
            assert ended is whole  # before: held open (and in flight) for good
            await eventually(lambda: g.stats.in_flight == 0, "no longer in flight")
            assert upstream_errors(gateway).get("stalled", 0) == stalled
    finally:
        await fake.stop()


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6(), reason="no IPv6 on this host")
async def test_the_gateway_on_every_ipv6_address_leaves_the_ipv4_port_to_another():
    """``[::]:P`` listens on IPv6 only, as asyncio binds it: through ``bind`` the gateway
    took a dual-stack socket and failed (EADDRINUSE) beside a server on ``0.0.0.0:P``
    (hostile pass 44)."""
    with socket.socket(socket.AF_INET) as other:
        other.bind(("0.0.0.0", 0))
        other.listen()
        port = other.getsockname()[1]
        settings = GatewaySettings(namespace="a", deployment="llama")
        server = GatewayServer([], settings, f"[::]:{port}", "127.0.0.1:0")
        await server.start()
        try:
            assert server.port == port
        finally:
            await server.stop()
