"""The whole signal path: replicas -> exporter -> (gRPC watch) -> scaler -> KEDA's GetMetrics."""

from __future__ import annotations

import asyncio

import grpc

from exporter.app import ExporterServer
from exporter.config import ExporterConfig
from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler.config import ScalerConfig
from scaler.server import ScalerServer
from tests.conftest import ref
from tests.fake_engines import FakeReplicaServer


async def test_keda_sees_the_replicas_load_through_exporter_and_scaler():
    replicas = await FakeReplicaServer(2).start()
    replicas.replicas[0].set_load(running=20, waiting=12, kv=0.7)
    replicas.replicas[1].set_load(running=16, waiting=0, kv=0.5)
    exporter = ExporterServer(
        ExporterConfig.model_validate(
            {
                "interval": "300ms",
                "timeout": "200ms",
                "deployments": [
                    {
                        "namespace": "team-a",
                        "deployment": "llama",
                        "targets": [replicas.url(0), replicas.url(1)],
                    }
                ],
            }
        )
    )
    _, grpc_port = await exporter.start()
    scaler = ScalerServer(
        ScalerConfig.model_validate(
            {"signal-sources": [{"address": f"127.0.0.1:{grpc_port}", "reconnect-min": "100ms"}]}
        )
    )
    port = await scaler.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            request = keda.GetMetricsRequest(
                scaledObjectRef=ref(targetConcurrency="16"),
                metricName="s0-unitscale-desired-replicas",
            )
            value = None
            async with asyncio.timeout(15):
                while value != 3:  # 48 in flight / 16 per replica
                    try:
                        value = (await stub.GetMetrics(request)).metricValues[0].metricValue
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.UNAVAILABLE  # until the first signal
                        await asyncio.sleep(0.1)
            assert (await stub.IsActive(ref())).result is True
    finally:
        await scaler.stop(grace=0)
        await exporter.stop(grace=0)
        await replicas.stop()
