"""The whole signal path: replicas -> a signal source -> scaler -> KEDA's GetMetrics.

Each test runs over both engine signal sources: our exporter (a gRPC watch) and a real
Prometheus scraping the same replicas (PromQL, ``prometheus-source``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.app import ExporterServer
from exporter.config import ExporterConfig
from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler.config import ScalerConfig
from scaler.server import ScalerServer
from tests.conftest import ref
from tests.fake_engines import FakeReplicaServer, FakeVllm
from tests.prometheus_stack import PROMETHEUS
from tests.test_prometheus_source import prometheus_over, source_config


@dataclass
class Source:
    """Where the scaler gets engine signals from, and how to take that away."""

    config: dict[str, Any]
    """The scaler config's keys for this source."""
    kill: Callable[[], Awaitable[None]]
    """Take the source away at once (SIGKILL for Prometheus); may be called twice."""


async def exporter_source(replicas: list[FakeReplicaServer], directory: Path) -> Source:
    exporter = ExporterServer(
        ExporterConfig.model_validate(
            {
                "interval": "300ms",
                "timeout": "200ms",
                "deployments": [
                    {
                        "namespace": "team-a",
                        "deployment": "llama",
                        "targets": [r.url(0) for r in replicas],
                    }
                ],
            }
        )
    )
    _, grpc_port = await exporter.start()
    config = {"signal-sources": [{"address": f"127.0.0.1:{grpc_port}", "reconnect-min": "100ms"}]}
    stopped = False

    async def kill() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            await exporter.stop(grace=0)

    return Source(config, kill)


async def prometheus_source(replicas: list[FakeReplicaServer], directory: Path) -> Source:
    prometheus = await prometheus_over(directory, replicas)

    async def kill() -> None:
        if prometheus.process.returncode is None:
            prometheus.process.kill()
            await prometheus.process.wait()
        await prometheus.stop()  # closes its client

    return Source({"prometheus-source": source_config(prometheus.url)}, kill)


@pytest.fixture(
    params=[
        pytest.param(exporter_source, id="signals from the exporter"),
        pytest.param(
            prometheus_source,
            id="signals from Prometheus",
            marks=pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed"),
        ),
    ]
)
async def replicas_and_source(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[list[FakeReplicaServer], Source]]:
    replicas = [await FakeReplicaServer(1).start() for _ in range(2)]
    source = await request.param(replicas, tmp_path)
    try:
        yield replicas, source
    finally:
        await source.kill()  # a second stop is a no-op
        for server in replicas:
            await server.stop()


async def decode_steadily(replica: FakeVllm, tokens_per_second: float) -> None:
    """Generation tokens at a steady rate, by the clock, however late the ticks come.

    Once token rates are known they are the load (``decide``), so a test that wants a
    replica count must give both sources the same throughput, not in-flight alone.
    """
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        await asyncio.sleep(0.1)
        now = loop.time()
        output = round(tokens_per_second * (now - last))
        if output > 1:
            replica.finish(1, 1, output, ttft=0.05, itl=0.01, e2e=1.0)
            last = now


@contextlib.asynccontextmanager
async def decoding(
    replicas: list[FakeReplicaServer], tokens_per_second: float
) -> AsyncIterator[None]:
    tasks = [
        asyncio.create_task(decode_steadily(r.replicas[0], tokens_per_second)) for r in replicas
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def desired_when_answered(
    stub: keda_grpc.ExternalScalerStub, request: keda.GetMetricsRequest, expected: int
) -> None:
    """Poll GetMetrics until it answers ``expected``; UNAVAILABLE until the first signal."""
    value = None
    async with asyncio.timeout(30):
        while value != expected:
            try:
                value = (await stub.GetMetrics(request)).metricValues[0].metricValue
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE  # until the first signal
                await asyncio.sleep(0.1)


async def test_keda_sees_the_replicas_load_through_the_source_and_scaler(replicas_and_source):
    replicas, source = replicas_and_source
    replicas[0].replicas[0].set_load(running=20, waiting=12, kv=0.7)
    replicas[1].replicas[0].set_load(running=16, waiting=0, kv=0.5)
    scaler = ScalerServer(ScalerConfig.model_validate(source.config))
    port = await scaler.start()
    # 48 in flight / 16 per replica = 3 until token rates are known; then 2 x 8,100
    # output tokens/s over 6,000 per replica = 2.7: 3 again, whichever comes first.
    try:
        async with (
            decoding(replicas, 8_100),
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            stub = keda_grpc.ExternalScalerStub(channel)
            request = keda.GetMetricsRequest(
                scaledObjectRef=ref(targetConcurrency="16"),
                metricName="s0-unitscale-desired-replicas",
            )
            await desired_when_answered(stub, request, 3)
            assert (await stub.IsActive(ref())).result is True
    finally:
        await scaler.stop(grace=0)


async def test_the_source_gone_is_unavailable_once_its_signals_age(replicas_and_source):
    replicas, source = replicas_and_source
    for server in replicas:
        server.replicas[0].set_load(running=8, waiting=0, kv=0.2)
    config = ScalerConfig.model_validate({**source.config, "max-signal-age": "2s"})
    scaler = ScalerServer(config)
    port = await scaler.start()
    try:  # 16 in flight / 8 per replica = 2; 2 x 5,100 tokens/s / 6,000 = 1.7: 2 too
        async with (
            decoding(replicas, 5_100),
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            stub = keda_grpc.ExternalScalerStub(channel)
            request = keda.GetMetricsRequest(
                scaledObjectRef=ref(targetConcurrency="8"),
                metricName="s0-unitscale-desired-replicas",
            )
            await desired_when_answered(stub, request, 2)  # 16 in flight / 8 per replica
            await source.kill()
            async with asyncio.timeout(30):
                while True:  # the last signals serve until they pass max-signal-age
                    try:
                        await stub.GetMetrics(request)
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.UNAVAILABLE
                        assert "stale" in (err.details() or "")
                        break
                    await asyncio.sleep(0.1)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.IsActive(ref(targetConcurrency="8"))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await scaler.stop(grace=0)
