"""The local demo: a scaler fed by the built-in demo signals, polled the way KEDA does.

It starts a real scaler server on a free loopback port, opens an ``external-push``
stream and, every poll, calls GetMetricSpec, GetMetrics and IsActive exactly as
KEDA's operator does. A small stand-in for KEDA + HPA turns the answers into a
replica count (activation 0 -> 1, ``ceil(value / target)`` beyond a 10% tolerance,
scale to zero after a cooldown). It prints one line per poll.

The full demo (gateway, simulated replicas, exporter, trace replay, report) replaces
the signal generator with real processes; this one shows the scaler's contract.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import grpc

from protos.externalscaler import externalscaler_pb2 as pb
from protos.externalscaler import externalscaler_pb2_grpc as pb_grpc
from scaler.config import DemoSourceConfig, PolicyConfig, ScalerConfig
from scaler.server import ScalerServer
from scaler.sources import demo_concurrency

HPA_TOLERANCE = 0.1


@dataclass(frozen=True, slots=True)
class KedaView:
    """What the stand-in for KEDA + HPA knows between polls."""

    replicas: int = 0
    last_active: float = -math.inf


def keda_step(
    view: KedaView, now: float, value: float, target: float, active: bool, cooldown: float
) -> KedaView:
    """One KEDA + HPA evaluation with the answers the scaler gave.

    Activation scales 0 -> 1; with replicas the HPA applies AverageValue math,
    ``ceil(value / target)`` unless ``value / (target * replicas)`` is within 10% of 1;
    inactivity for ``cooldown`` seconds scales N -> 0.
    """
    replicas, last_active = view.replicas, view.last_active
    if active:
        last_active = now
        if replicas == 0:
            return KedaView(1, last_active)
    elif replicas > 0 and now - last_active >= cooldown:
        return KedaView(0, last_active)
    if replicas > 0 and abs(1 - value / (target * replicas)) > HPA_TOLERANCE:
        replicas = max(1, math.ceil(value / target - 1e-9))
    return KedaView(replicas, last_active)


async def run_demo(duration: float, poll: float = 1.0, cooldown: float | None = None) -> int:
    """Run the demo for ``duration`` seconds (one full load cycle); returns an exit code."""
    cooldown = duration / 10 if cooldown is None else cooldown
    source = DemoSourceConfig(
        namespace="demo", deployments=["llama-chat"], interval=poll / 2, period=duration
    )
    # The demo compresses a day into ``duration``: the policy's clocks shrink with it.
    minute = duration / 30
    policy = PolicyConfig(
        idle_grace=2 * minute,
        scale_down_delay=minute,
        scale_down_window=2 * minute,
        panic_hold=minute,
        forecast_horizon=minute,
        forecast_lookback=2 * minute,
    )
    server = ScalerServer(
        ScalerConfig(demo_source=source, max_signal_age=max(5.0, poll * 5), policy=policy)
    )
    port = await server.start()
    ref = pb.ScaledObjectRef(
        name="llama-chat",
        namespace="demo",
        scalerMetadata={"scalerAddress": f"127.0.0.1:{port}", "deployment": "llama-chat"},
    )
    print(
        f"unitscale demo: scaler on 127.0.0.1:{port}, demo load for {duration:g}s,"
        f" KEDA-style poll every {poll:g}s, cooldown {cooldown:g}s"
    )
    print(f"{'t':>6}  {'in flight':>9}  {'metric':>6}  {'active':>6}  {'replicas':>8}  decision")
    start = time.monotonic()
    pushes: list[float] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            push = asyncio.create_task(_listen_push(stub, ref, start, pushes))
            view = KedaView()
            while (elapsed := time.monotonic() - start) < duration:
                spec = (await stub.GetMetricSpec(ref)).metricSpecs[0]
                request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName=spec.metricName)
                try:
                    value = (await stub.GetMetrics(request)).metricValues[0].metricValueFloat
                    active = (await stub.IsActive(ref)).result
                except grpc.aio.AioRpcError as err:
                    print(f"{elapsed:6.1f}  scaler says {err.code().name}: {err.details()}")
                    await asyncio.sleep(poll)
                    continue
                before = view.replicas
                view = keda_step(view, elapsed, value, spec.targetSizeFloat, active, cooldown)
                scaled = server.registry.get("demo", "llama-chat")
                reason = scaled.decision.reason if scaled and scaled.decision else "-"
                load = demo_concurrency(elapsed, source.period, source.peak_concurrency)
                change = f"{before}->{view.replicas}" if before != view.replicas else str(before)
                print(
                    f"{elapsed:6.1f}  {load:9.1f}  {value:6.0f}  {'yes' if active else 'no':>6}"
                    f"  {change:>8}  {reason}"
                )
                await asyncio.sleep(poll)
            push.cancel()
    finally:
        await server.stop(grace=0)
    print(
        f"done: {len(pushes)} push activation(s) over StreamIsActive"
        + (f" at t={', '.join(f'{t:.1f}s' for t in pushes)}" if pushes else "")
    )
    return 0


async def _listen_push(
    stub: pb_grpc.ExternalScalerStub, ref: pb.ScaledObjectRef, start: float, pushes: list[float]
) -> None:
    try:
        async for response in stub.StreamIsActive(ref):
            if response.result:
                pushes.append(time.monotonic() - start)
                print(f"{pushes[-1]:6.1f}  StreamIsActive pushed true: KEDA would activate now")
    except (grpc.aio.AioRpcError, asyncio.CancelledError):
        return
