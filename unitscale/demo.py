"""The local demo: a scaler fed by the built-in demo signals, polled the way KEDA does.

It starts a real scaler server on a free loopback port, opens an ``external-push``
stream and, every poll, calls GetMetricSpec, GetMetrics and IsActive exactly as
KEDA's operator does. The replay's model of KEDA + HPA (``scaler.replay.keda``) turns
the answers into a replica count (activation 0 -> 1, the HPA's AverageValue math and
rate limits, scale to zero after a cooldown). It prints one line per poll.

The full demo (gateway, simulated replicas, exporter, trace replay, report) replaces
the signal generator with real processes; this one shows the scaler's contract.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from protos.externalscaler import externalscaler_pb2 as pb
from protos.externalscaler import externalscaler_pb2_grpc as pb_grpc
from scaler.config import DemoSourceConfig, PolicyConfig, ScalerConfig
from scaler.replay.keda import Answer, LoopState, ScalingSpec, hpa_sync, keda_poll
from scaler.server import ScalerServer
from scaler.sources import demo_concurrency


def keda_and_hpa(
    replicas: int, state: LoopState, now: float, answer: Answer, spec: ScalingSpec
) -> tuple[int, LoopState]:
    """One KEDA poll then one HPA sync, with the replay's model of both (``scaler.replay.keda``).

    An activation (0 -> 1) is the whole step: the HPA only acts on running replicas.
    """
    polled, state = keda_poll(replicas, answer, state, now, spec)
    if replicas == 0:
        return polled, state
    return hpa_sync(polled, answer, state, now, spec)


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
            replicas, state = 0, LoopState()
            # The demo's clock is compressed: no HPA scale-down stabilization on top of
            # the scaler's own (compressed) scale-down delay.
            spec = ScalingSpec(cooldown=cooldown, scale_down_stabilization=0.0)
            while (elapsed := time.monotonic() - start) < duration:
                metric = (await stub.GetMetricSpec(ref)).metricSpecs[0]
                request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName=metric.metricName)
                try:
                    value = (await stub.GetMetrics(request)).metricValues[0].metricValueFloat
                    active = (await stub.IsActive(ref)).result
                except grpc.aio.AioRpcError as err:
                    print(f"{elapsed:6.1f}  scaler says {err.code().name}: {err.details()}")
                    await asyncio.sleep(poll)
                    continue
                before = replicas
                answer = Answer(value, metric.targetSizeFloat, active)
                replicas, state = keda_and_hpa(replicas, state, elapsed, answer, spec)
                scaled = server.registry.get("demo", "llama-chat")
                reason = scaled.decision.reason if scaled and scaled.decision else "-"
                load = demo_concurrency(elapsed, source.period, source.peak_concurrency)
                change = f"{before}->{replicas}" if before != replicas else str(before)
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
