from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from protos.unitscale.v1 import signals_pb2 as sig
from scaler.config import ScalerConfig
from scaler.server import ScalerServer

T0 = 1_800_000_000.0  # a fixed "now" for tests that control the clock


class FakeClock:
    """A settable wall clock: tests move time, the code under test reads it."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def stamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def engine_signals(
    deployment: str = "llama",
    namespace: str = "team-a",
    *,
    at: float = T0,
    queue: float | None = None,
    running: float | None = None,
    model: str = "",
) -> sig.Signals:
    engine = sig.EngineSignals(replicas_up=1, replicas_scraped=1)
    if queue is not None:
        engine.queue_depth = queue
    if running is not None:
        engine.requests_running = running
    return sig.Signals(
        target=sig.Target(namespace=namespace, deployment=deployment, model=model),
        source=sig.SOURCE_EXPORTER,
        observed_time=stamp(at),
        engine=engine,
    )


def gateway_signals(
    deployment: str = "llama",
    namespace: str = "team-a",
    *,
    at: float = T0,
    buffered: int = 0,
    in_flight: int = 0,
    arrival_rate: float | None = None,
) -> sig.Signals:
    gateway = sig.GatewaySignals(buffered=buffered, in_flight=in_flight)
    if arrival_rate is not None:
        gateway.arrival_rate = arrival_rate
    return sig.Signals(
        target=sig.Target(namespace=namespace, deployment=deployment),
        source=sig.SOURCE_GATEWAY,
        observed_time=stamp(at),
        gateway=gateway,
    )


def ref(
    name: str = "llama",
    namespace: str = "team-a",
    **metadata: str,
) -> keda.ScaledObjectRef:
    # Plumbing tests plan replicas 100% full, so that desired = ceil(in flight / 16).
    meta = {
        "scalerAddress": "unitscale-scaler.keda:9090",
        "deployment": name,
        "targetUtilization": "1",
    }
    meta.update(metadata)
    return keda.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=meta)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def scaler(clock: FakeClock) -> AsyncIterator[ScalerServer]:
    server = ScalerServer(ScalerConfig(max_signal_age=30.0), "127.0.0.1:0", clock=clock)
    await server.start()
    yield server
    await server.stop(grace=0)


@pytest.fixture
async def channel(scaler: ScalerServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{scaler.port}") as chan:
        yield chan


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> keda_grpc.ExternalScalerStub:
    return keda_grpc.ExternalScalerStub(channel)


async def eventually(predicate, what: str = "condition", limit: float = 30.0) -> None:
    """Wait until ``predicate()`` is true; a cap against hangs, not a timing assertion."""
    import asyncio
    import time

    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still false after {limit:.0f}s")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def served_app(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1, a port the kernel picks: its base URL, stopped after."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def streaming_forever(card: dict[str, object]) -> AsyncIterator[str]:
    """A replica listing ``card`` that streams a token every millisecond, forever."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [card]})

    async def tokens_forever(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while True:
            await response.write(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
            await asyncio.sleep(0.001)  # the replica's pace, not the test's synchronisation

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", tokens_forever)
    async with served_app(app) as url:
        yield url


async def send_raw(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to 127.0.0.1:``port`` with ``data`` sent as is (a head, or part of one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    async with asyncio.timeout(30):  # a cap against hangs, not a timing check
        return await reader.read()


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every command's run stopped as it starts (``tests.stand_ins.stop_runs``): the
    names of those started, for tests of what a command refuses before running."""
    import replay.pool.joint
    import replay.run
    import unitscale.commands.exporter
    import unitscale.commands.gateway
    import unitscale.commands.scaler
    import unitscale.demo.run
    import unitscale.tune
    from tests.stand_ins import stop_runs

    return stop_runs(
        monkeypatch,
        {
            "replay": (replay.run, "run_policies"),
            "tiers": (replay.run, "compare_tiers"),
            "joint replay": (replay.pool.joint, "run_all"),
            "tune": (unitscale.tune, "worker_pool"),
            "exporter": (unitscale.commands.exporter, "serve_until_signal"),
            "gateway": (unitscale.commands.gateway, "serve_until_signal"),
            "scaler": (unitscale.commands.scaler, "serve_until_signal"),
            "demo": (unitscale.demo.run, "_plan"),
        },
    )


@pytest.fixture
def no_failure_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick failures weigh nothing in routing (``serving.routing.FAILURE_SECONDS``): for
    tests of what the gateway counts and ejects, whose sick replica, listed first, is then
    given every request until it is ejected (weighed, it is given one)."""
    import serving.gateway_replicas

    monkeypatch.setattr(serving.gateway_replicas, "FAILURE_SECONDS", 0.0)
