"""The replayed unitscale policy answers exactly what the gRPC scaler answers KEDA."""

from __future__ import annotations

import grpc
import pytest

from foundation.signals import EngineSignals, Snapshot, WindowSignals
from foundation.signals_wire import encode
from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from replay.policies import KEY, GatewayView, View, unitscale_policy
from scaler.config import ScalerConfig
from scaler.server import ScalerServer
from scaler.sources import receive
from tests.conftest import T0, FakeClock


def signals(at, queue, running, prompt, output, replicas):
    window = WindowSignals(
        60.0, 2.0, prompt, output, 0.0, queue_depth_mean=queue, running_mean=running
    )
    return EngineSignals(
        at, replicas, replicas, queue, running, 0.4, window, window, 1.0, 5.0, False, False
    )


STEPS = [
    (0.0, signals(T0, 0, 4, 20_000, 1_000, 2)),
    (15.0, signals(T0 + 15, 6, 30, 90_000, 9_000, 2)),
    (30.0, signals(T0 + 30, 30, 60, 200_000, 20_000, 4)),
    (45.0, signals(T0 + 45, 0, 10, 40_000, 2_000, 8)),
]


@pytest.mark.parametrize(
    ("target_concurrency", "profile"),
    [
        pytest.param(16, None, id="priors-at-16-in-flight"),
        pytest.param(48, None, id="priors-at-48-in-flight"),
        pytest.param(16, "llama3-8b-h200", id="the-llama3-8b-h200-profile"),
    ],
)
async def test_same_signals_same_answers(target_concurrency, profile):
    clock = FakeClock(T0)
    policy = unitscale_policy(target_concurrency, 64, profile=profile)
    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", clock=clock)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            ref = keda.ScaledObjectRef(name="llm", namespace=KEY[0], scalerMetadata=policy.metadata)
            for offset, engine in STEPS:
                clock.now = T0 + offset
                gateway = GatewayView(
                    arrival_rate=3.0, buffered=0, in_flight=int(engine.running or 0)
                )
                answer = policy.answer(
                    View(T0 + offset, engine, gateway, engine.replicas, engine.replicas)
                )
                # The served path gets both over the wire, as from the exporter and gateway.
                receive(server.store, encode(Snapshot(KEY, engine)))
                receive(
                    server.store,
                    encode(policy.gateway_signals(View(T0 + offset, engine, gateway, 0, 0))),
                )
                request = keda.GetMetricsRequest(
                    scaledObjectRef=ref, metricName="s0-unitscale-desired-replicas"
                )
                served = (await stub.GetMetrics(request)).metricValues[0].metricValueFloat
                active = (await stub.IsActive(ref)).result
                assert (served, active) == (answer.value, answer.active), answer.reason
    finally:
        await server.stop(grace=0)
