"""The gateway under faults: replicas that die, hang or stall, bodies too big, unknown models.

Real servers on 127.0.0.1: the gateway, the simulated replica (in process or as a process
that is SIGKILLed) and small aiohttp replicas that misbehave on purpose. Every error the
gateway answers itself is in the API's shape (``{"object": "error", "message", "code"}``);
every upstream failure is counted in ``unitscale_gateway_upstream_errors_total`` and the
``upstream_error_rate`` the scaler reads.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from foundation.net import free_port
from serving.gateway_replicas import ReplicaPool
from serving.gateway_settings import GatewaySettings
from serving.routing import ReplicaView, choose, is_unserved
from tests.conftest import eventually
from tests.test_gateway import completion, start_gateway, start_sim, wait_ready

Behaviour = Callable[[web.Request, "Fake"], Awaitable[web.StreamResponse]]


class Fake:
    """A replica that passes ``/health``, lists ``sim-llama`` and answers completions badly."""

    def __init__(
        self,
        behaviour: Behaviour,
        health: Callable[[web.Request], Awaitable[web.Response]] | None = None,
    ) -> None:
        self.behaviour = behaviour
        self.health = health
        self.received = 0
        """Completion requests that reached it."""
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        """What ``stream_on_demand`` writes next (None ends the response)."""
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Fake:
        app = web.Application()
        app.router.add_get("/health", self.health or _health)
        app.router.add_get("/v1/models", _models)
        app.router.add_post("/v1/completions", self._completions)
        # A handler whose connection is gone is cancelled, so the runner stops at once.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.received += 1
        return await self.behaviour(request, self)


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "sim-llama"}]})


async def forever() -> web.StreamResponse:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def close_before_headers(request: web.Request, fake: Fake) -> web.StreamResponse:
    """The replica's connection drops after it read the request, before any answer."""
    assert request.transport is not None
    request.transport.abort()
    return await forever()


async def garbage_before_headers(request: web.Request, fake: Fake) -> web.StreamResponse:
    """The replica answers something that is not HTTP, then closes."""
    assert request.transport is not None
    request.transport.write(b"this is not HTTP\r\n\r\n")
    request.transport.close()
    return await forever()


async def hang_before_headers(request: web.Request, fake: Fake) -> web.StreamResponse:
    """The replica takes the request and never answers (its /health stays fine)."""
    return await forever()


async def stall_mid_stream(request: web.Request, fake: Fake) -> web.StreamResponse:
    """The replica starts a stream, sends one chunk, then goes silent."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: 1\n\n")
    return await forever()


async def stream_on_demand(request: web.Request, fake: Fake) -> web.StreamResponse:
    """The replica streams what the test hands it, as slowly as the test likes."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    while (chunk := await fake.chunks.get()) is not None:
        await response.write(chunk)
    await response.write_eof()
    return response


async def fakes(*behaviours: Behaviour) -> list[Fake]:
    return [await Fake(b).start() for b in behaviours]


def upstream_errors(gateway) -> dict[str, float]:
    """``unitscale_gateway_upstream_errors_total`` by kind, from the gateway's /metrics."""
    text = gateway.gateway.metrics.render().decode()
    return {
        s.labels["kind"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "unitscale_gateway_upstream_errors"
        for s in family.samples
        if s.name.endswith("_total") and s.value  # every kind exists from the start, at 0
    }


def error_rate(gateway) -> float:
    """The ``upstream_error_rate`` the scaler would read now."""
    rate = gateway.gateway.feed.snapshot(time.time()).signals.upstream_error_rate
    assert rate is not None
    return float(rate)


async def assert_api_error(response: aiohttp.ClientResponse, status: int, fragment: str) -> None:
    assert response.status == status
    assert response.content_type == "application/json"
    body = await response.json()
    assert (body["object"], body["code"]) == ("error", status)
    assert fragment in body["message"], body


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


# --- a replica dropping the connection unanswered: the next one answers; broken HTTP: 502 ---


@asynccontextmanager
async def posted(gateway, secret: str) -> AsyncIterator[aiohttp.ClientResponse]:
    """One completion through ``gateway``, its Authorization header carrying ``secret``
    (which no log line may show)."""
    async with aiohttp.ClientSession() as client:
        async with client.post(
            f"http://127.0.0.1:{gateway.port}/v1/completions",
            json=completion(),
            headers={"Authorization": f"Bearer {secret}"},
        ) as response:
            yield response


class DropFirst:
    """Replicas sharing one fault: the first completion any of them gets is dropped
    unanswered (its connection aborted), every later one is answered."""

    def __init__(self) -> None:
        self.dropped = 0

    async def __call__(self, request: web.Request, fake: Fake) -> web.StreamResponse:
        if self.dropped == 0:
            self.dropped += 1
            return await close_before_headers(request, fake)
        return web.json_response({"object": "text_completion", "choices": [{"text": "ok"}]})


async def test_a_request_whose_replica_drops_it_unanswered_is_answered_by_the_next(caplog):
    caplog.set_level(logging.DEBUG)
    fault = DropFirst()
    replicas = await fakes(fault, fault)
    gateway = await start_gateway([f.url for f in replicas])
    try:
        await wait_ready(gateway, 2)
        async with posted(gateway, "SECRET-MARKER-DROP") as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["choices"][0]["text"] == "ok"
        # One replica each: the one that dropped it is not tried again at once.
        assert [f.received for f in replicas] == [1, 1]
        assert upstream_errors(gateway) == {"before-response": 1.0}
        assert tracebacks(caplog) == []
        assert "SECRET-MARKER" not in caplog.text  # the error's repr carries the headers
    finally:
        await gateway.stop()
        for f in replicas:
            await f.stop()


async def test_replicas_that_all_drop_it_end_in_a_counted_502_after_the_retries(caplog):
    replicas = await fakes(close_before_headers, close_before_headers)
    gateway = await start_gateway([f.url for f in replicas], connect_retries=1)
    try:
        await wait_ready(gateway, 2)
        async with posted(gateway, "SECRET-MARKER-ALL") as r:
            await assert_api_error(r, 502, "failed before answering")
        assert sum(f.received for f in replicas) == 2  # connect_retries=1: two tries in all
        assert upstream_errors(gateway) == {"before-response": 2.0}
        assert error_rate(gateway) > 0
    finally:
        await gateway.stop()
        for f in replicas:
            await f.stop()


async def test_a_replica_answering_broken_http_is_a_counted_502_never_retried(caplog):
    caplog.set_level(logging.DEBUG)
    replicas = await fakes(garbage_before_headers, garbage_before_headers)
    gateway = await start_gateway([f.url for f in replicas])
    try:
        await wait_ready(gateway, 2)
        async with posted(gateway, "SECRET-MARKER-502") as r:
            await assert_api_error(r, 502, "failed before answering")
        # It answered, if badly: it ran, so no other replica is tried.
        assert sum(f.received for f in replicas) == 1
        assert upstream_errors(gateway) == {"before-response": 1.0}
        assert error_rate(gateway) > 0
        assert tracebacks(caplog) == []
        assert "SECRET-MARKER" not in caplog.text
    finally:
        await gateway.stop()
        for f in replicas:
            await f.stop()


async def sim_process(port: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "unitscale.cli", "--log-level", "warning",
        "sim-replica", "--listen", f"127.0.0.1:{port}",  # real H200 pace: 2,000 tokens ~13 s
    )  # fmt: skip


async def test_a_sim_replica_sigkilled_mid_request_leaves_it_to_the_other_replica():
    ports = [free_port(), free_port()]
    processes = [await sim_process(port) for port in ports]
    gateway = await start_gateway([f"http://127.0.0.1:{port}" for port in ports])
    try:
        await wait_ready(gateway, 2)
        async with aiohttp.ClientSession() as client:
            pending = asyncio.create_task(
                client.post(
                    f"http://127.0.0.1:{gateway.port}/v1/completions",
                    json=completion(max_tokens=2000),  # not streamed: headers come at the end
                )
            )
            await eventually(lambda: gateway.gateway.stats.in_flight == 1, "sent upstream")
            running = 'vllm:num_requests_running{engine="0",model_name="sim-llama"} 1.0'
            victim = None
            async with asyncio.timeout(30):
                while victim is None:
                    for process, port in zip(processes, ports, strict=True):
                        async with client.get(f"http://127.0.0.1:{port}/metrics") as m:
                            if running in await m.text():
                                victim = process
                    await asyncio.sleep(0.02)
            victim.kill()
            await victim.wait()
            async with await asyncio.wait_for(pending, 60) as r:
                assert r.status == 200, await r.text()
        assert upstream_errors(gateway) == {"before-response": 1.0}
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
        await gateway.stop()


# --- a replica that passes /health but never answers: 504; a stalled stream ends ----------


async def test_a_replica_that_never_answers_is_a_counted_504_after_the_upstream_timeout(caplog):
    (replica,) = await fakes(hang_before_headers)
    gateway = await start_gateway([replica.url], upstream_timeout=0.3)
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            async with asyncio.timeout(20):  # without an upstream timeout: held for ever
                async with client.post(
                    f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()
                ) as r:
                    await assert_api_error(r, 504, "no response within 0.3s")
        assert replica.received == 1
        assert upstream_errors(gateway) == {"timeout": 1.0}
        assert error_rate(gateway) > 0
        assert gateway.gateway.stats.in_flight == 0
        assert tracebacks(caplog) == []
    finally:
        await gateway.stop()
        await replica.stop()


async def test_a_stream_that_goes_silent_past_the_upstream_timeout_ends_broken_and_counted():
    (replica,) = await fakes(stall_mid_stream)
    # Long enough that a busy machine never delays the first chunk past it.
    gateway = await start_gateway([replica.url], upstream_timeout=1.0)
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            async with asyncio.timeout(20):
                async with client.post(
                    f"http://127.0.0.1:{gateway.port}/v1/completions",
                    json=completion(stream=True),
                ) as r:
                    assert r.status == 200  # the headers were sent: only the body can end
                    assert await r.content.readline() == b"data: 1\n"
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await r.read()
        assert upstream_errors(gateway) == {"stalled": 1.0}
        assert error_rate(gateway) > 0
        assert gateway.gateway.stats.in_flight == 0
    finally:
        await gateway.stop()
        await replica.stop()


async def test_a_stream_longer_than_the_upstream_timeout_passes_while_chunks_keep_coming():
    (replica,) = await fakes(stream_on_demand)
    timeout = 1.0  # each gap is one round trip: milliseconds, however busy the machine
    gateway = await start_gateway([replica.url], upstream_timeout=timeout)
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            # A bound the tokens below stay within: a stream far past it is cut (overrun).
            body = completion(stream=True, max_tokens=100_000)
            async with client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions", json=body
            ) as r:
                assert r.status == 200
                started, sent = time.monotonic(), 0
                # Token after token, each as soon as the last arrived, for twice the timeout.
                while time.monotonic() - started < 2 * timeout and sent < 100_000:
                    event = f'data: {{"choices": [{{"text": "{sent}"}}]}}\n'.encode()
                    replica.chunks.put_nowait(event + b"\n")
                    assert await r.content.readline() == event
                    assert await r.content.readline() == b"\n"
                    sent += 1
                replica.chunks.put_nowait(None)
                assert await r.read() == b""  # the end, unbroken
        assert upstream_errors(gateway) == {}
    finally:
        await gateway.stop()
        await replica.stop()


# --- bytes: a body over the limit is 413; a buffer full of bytes is 429 -------------------


async def chunked(body: bytes) -> AsyncIterator[bytes]:
    """A body sent without Content-Length, 1 KB at a time."""
    for i in range(0, len(body), 1024):
        yield body[i : i + 1024]


def padded(size: int) -> bytes:
    """A valid completion request of exactly ``size`` bytes."""
    start, end = b'{"model": "sim-llama", "max_tokens": 1, "prompt": "', b'"}'
    return start + b"x" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(lambda body: body, id="a-content-length-over-the-limit"),
        pytest.param(chunked, id="a-chunked-body-that-grows-over-the-limit"),
    ],
)
async def test_a_body_over_the_limit_is_413_and_never_buffered(send):
    gateway = await start_gateway([f"http://127.0.0.1:{free_port()}"], max_request_bytes=4096)
    try:
        async with aiohttp.ClientSession() as client:
            async with asyncio.timeout(20):
                async with client.post(
                    f"http://127.0.0.1:{gateway.port}/v1/completions",
                    data=send(padded(4097)),
                    headers={"Content-Type": "application/json"},
                ) as r:
                    await assert_api_error(r, 413, "larger than 4096 bytes")
        g = gateway.gateway
        assert (g.stats.buffered, g.stats.buffered_bytes, len(g.stats.arrivals)) == (0, 0, 0)
    finally:
        await gateway.stop()


async def test_a_body_at_the_limit_is_served():
    sim = await start_sim()
    gateway = await start_gateway([sim.url], max_request_bytes=4096)
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            async with client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions",
                data=padded(4096),
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == 200, await r.text()
    finally:
        await gateway.stop()
        await sim.stop()


async def test_a_buffer_full_of_bytes_is_429_and_its_bytes_come_back():
    gateway = await start_gateway(
        [f"http://127.0.0.1:{free_port()}"],
        buffer_size=100,
        buffer_bytes=10_000,
        max_request_bytes=8_000,
        buffer_timeout=60,
    )
    g = gateway.gateway
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    headers = {"Content-Type": "application/json"}
    try:
        async with aiohttp.ClientSession() as client:
            first = asyncio.create_task(client.post(url, data=padded(6_000), headers=headers))
            await eventually(lambda: g.stats.buffered == 1, "the first request buffered")
            assert g.stats.buffered_bytes == 6_000
            async with client.post(url, data=padded(5_000), headers=headers) as r:
                await assert_api_error(r, 429, "10000 bytes")  # 11,000 would not fit
                assert "Retry-After" in r.headers
            second = asyncio.create_task(client.post(url, data=padded(4_000), headers=headers))
            await eventually(lambda: g.stats.buffered == 2, "a request that fits buffered")
            assert g.stats.buffered_bytes == 10_000
            for task in (first, second):
                task.cancel()  # the clients leave: their bytes are freed
            await eventually(lambda: g.stats.buffered == 0, "the buffer emptied")
            assert g.stats.buffered_bytes == 0
    finally:
        await gateway.stop()


# --- unknown models at zero replicas: 404 at once when the model is certainly unknown ------


async def _sim_served_then_gone(gateway, sim) -> None:
    await wait_ready(gateway, 1)
    await sim.stop()
    await eventually(lambda: not any(r.ready for r in gateway.gateway.replicas), "not ready")


@pytest.mark.parametrize(
    ("configured", "served_before", "unknown_is_404"),
    [
        pytest.param(("sim-llama",), False, True, id="a-configured-model-makes-others-404"),
        pytest.param((), True, True, id="a-model-served-before-makes-others-404"),
        pytest.param((), False, False, id="with-nothing-known-yet-every-model-waits"),
    ],
)
async def test_at_zero_replicas_a_model_nobody_knows_is_404_and_a_known_one_waits(
    configured, served_before, unknown_is_404
):
    sim = await start_sim()
    upstream = sim.url if served_before else f"http://127.0.0.1:{free_port()}"
    gateway = await start_gateway([upstream], models=configured, buffer_timeout=60)
    g = gateway.gateway
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    try:
        if served_before:
            await _sim_served_then_gone(gateway, sim)
        async with aiohttp.ClientSession() as client:
            unknown = asyncio.create_task(client.post(url, json=completion(model="gpt-5")))
            if unknown_is_404:
                async with await asyncio.wait_for(unknown, 10) as r:
                    await assert_api_error(r, 404, "'gpt-5'")
                # Not buffered and no activity for the scaler: no arrival, nothing waited.
                assert (g.stats.buffered, len(g.stats.arrivals), g.stats.last_arrival) == (
                    0,
                    0,
                    None,
                )
            else:
                await eventually(lambda: g.stats.buffered == 1, "the unknown model waits")
                unknown.cancel()
                await eventually(lambda: g.stats.buffered == 0, "its client left")
            known = asyncio.create_task(client.post(url, json=completion()))
            await eventually(lambda: g.stats.buffered == 1, "a known model waits")
            assert g.stats.last_arrival is not None  # and the scaler hears of it
            known.cancel()
            async with client.get(f"http://127.0.0.1:{gateway.port}/v1/models") as r:
                listed = [m["id"] for m in (await r.json())["data"]]
            assert listed == (["sim-llama"] if unknown_is_404 else [])
    finally:
        await gateway.stop()
        await sim.stop()


@pytest.mark.parametrize(
    ("replicas", "known", "unserved"),
    [
        pytest.param([], {"llama"}, True, id="no-replica-and-a-known-set-without-it-is-404"),
        pytest.param([], {"llama", "m"}, False, id="no-replica-but-known-means-wait"),
        pytest.param([], set(), False, id="no-replica-and-nothing-known-means-wait"),
        pytest.param([(False, {"llama"})], {"llama"}, True, id="a-replica-not-ready-changes-none"),
        pytest.param([(True, {"llama"})], {"m"}, True, id="ready-replicas-decide-over-known"),
        pytest.param([(True, set())], {"llama"}, False, id="a-ready-replica-unlisted-may-serve"),
    ],
)
def test_is_unserved_with_known_models(replicas, known, unserved):
    views = [
        ReplicaView(f"http://r{i}", ready, 0, frozenset(models))
        for i, (ready, models) in enumerate(replicas)
    ]
    assert is_unserved(views, "m", frozenset(known)) is unserved


def test_a_replica_falling_asleep_still_serves_its_models_as_the_router_sees_it():
    """Requests for a model only a replica being put to sleep lists were 404s, never
    counted as arrivals, for as long as its /sleep took (issue 27, hostile pass 27)."""
    pool = ReplicaPool(["http://a", "http://b"], GatewaySettings())
    a, b = pool.replicas
    a.ready = b.ready = True
    a.models, b.models = frozenset({"base", "lora-x"}), frozenset({"base"})
    a.falling_asleep = True
    views = pool.routing_views()
    assert views[0].falling_asleep and not views[0].ready
    assert not is_unserved(views, "lora-x", frozenset({"base", "lora-x"}))
    assert is_unserved(views, "lora-y", frozenset({"base", "lora-x"}))
    assert choose(views, "lora-x") is None  # it waits in the buffer, and wakes it once asleep


class CrashLoop:
    """A replica that dies on every completion (its connection aborted before a byte)
    and fails ``/health`` for ``down`` seconds after each, then is back."""

    def __init__(self, down: float) -> None:
        self.down, self.until = down, 0.0

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if time.monotonic() < self.until else 200)

    async def __call__(self, request: web.Request, fake: Fake) -> web.StreamResponse:
        self.until = time.monotonic() + self.down
        return await close_before_headers(request, fake)


async def test_every_attempt_of_a_request_shares_one_buffer_timeout():
    """Each retry waited a whole buffer timeout of its own: behind a crash-looping replica
    a request was answered after 11 x buffer-timeout (issue 27, hostile pass 27)."""
    loop = CrashLoop(down=0.6)
    crashing = await Fake(loop, loop.health).start()
    gateway = await start_gateway(
        [crashing.url], buffer_timeout=1.0, connect_retries=10, health_interval=0.05
    )
    try:
        await wait_ready(gateway, 1)
        started = time.monotonic()
        async with posted(gateway, "SECRET-MARKER-LOOP") as r:
            await assert_api_error(r, 503, "no replica became ready within 1s")
        waited = time.monotonic() - started
    finally:
        await gateway.stop()
        await crashing.stop()
    # Back after 0.6 s: within the one timeout it is tried at most twice (11 tries before).
    assert 1 <= crashing.received <= 2
    assert waited < 3.0


# --- config reloads are counted on /metrics ----------------------------------------------


async def test_config_reloads_are_counted_by_result(tmp_path):
    from foundation.reload import ConfigSource
    from serving.config import parse_config
    from serving.server import GatewayServer
    from tests.kubelet_volume import KubeletVolume

    volume = KubeletVolume(tmp_path / "config")
    volume.write({"gateway.yaml": "health-interval: 100ms\n"})
    source = ConfigSource(volume.path("gateway.yaml"), poll_interval=0.05)
    config = parse_config(await source.read(), source.origin)
    gateway = GatewayServer(
        config.replicas, config.settings(), "127.0.0.1:0", "127.0.0.1:0",
        config=config, source=source, parse=parse_config,
    )  # fmt: skip
    await gateway.start()
    configs = gateway.configs
    assert configs is not None
    try:
        async with aiohttp.ClientSession() as client:

            async def reloads() -> dict[str, float]:
                async with client.get(f"http://127.0.0.1:{gateway.port}/metrics") as r:
                    text = await r.text()
                return {
                    s.labels["result"]: s.value
                    for family in text_string_to_metric_families(text)
                    if family.name == "unitscale_config_reloads"
                    for s in family.samples
                }

            assert await reloads() == {"success": 0.0, "error": 0.0}
            volume.write({"gateway.yaml": "health-interval: 120ms\n"})
            await eventually(lambda: configs.reloads == 1, "the good update applied")
            volume.write({"gateway.yaml": "health-interval: soon\n"})
            await eventually(lambda: configs.errors == 1, "the bad update refused")
            assert await reloads() == {"success": 1.0, "error": 1.0}
    finally:
        await gateway.stop()


# --- what already held: nothing accepted is lost; a client leaving frees its place -------


async def test_every_request_buffered_at_zero_is_served_once_a_replica_is_ready():
    port = free_port()
    gateway = await start_gateway([f"http://127.0.0.1:{port}"], buffer_timeout=60)
    g = gateway.gateway
    sim = None
    try:
        async with aiohttp.ClientSession() as client:

            async def one(body) -> tuple[int, str]:
                url = f"http://127.0.0.1:{gateway.port}/v1/completions"
                headers = {"Content-Type": "application/json"}
                async with client.post(url, data=body, headers=headers) as r:
                    return r.status, await r.text()

            bodies = [padded(200 + 500 * i) for i in range(6)]
            requests = [asyncio.create_task(one(b)) for b in bodies]
            await eventually(lambda: g.stats.buffered == len(bodies), "all buffered")
            assert g.stats.buffered_bytes == sum(len(b) for b in bodies)
            sim = await start_sim(port)
            results = await asyncio.wait_for(asyncio.gather(*requests), 30)
        assert [status for status, _ in results] == [200] * len(bodies)
        assert (g.stats.buffered, g.stats.buffered_bytes) == (0, 0)
    finally:
        await gateway.stop()
        if sim is not None:
            await sim.stop()


async def test_a_client_leaving_the_buffer_frees_its_place():
    gateway = await start_gateway(
        [f"http://127.0.0.1:{free_port()}"], buffer_size=1, buffer_timeout=60
    )
    g = gateway.gateway
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    try:
        async with aiohttp.ClientSession() as client:
            first = asyncio.create_task(client.post(url, json=completion()))
            await eventually(lambda: g.stats.buffered == 1, "the first request buffered")
            async with client.post(url, json=completion()) as r:
                assert r.status == 429  # the one place is taken
            first.cancel()
            await eventually(lambda: g.stats.buffered == 0, "its place freed")
            second = asyncio.create_task(client.post(url, json=completion()))
            await eventually(lambda: g.stats.buffered == 1, "the next request buffered")
            second.cancel()
    finally:
        await gateway.stop()
