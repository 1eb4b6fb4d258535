"""The demo's KEDA: the scaler called over gRPC exactly as KEDA's operator calls it.

Every ``pollingInterval`` KEDA calls ``GetMetricSpec``, ``GetMetrics`` and ``IsActive``
(activation 0 -> 1, scale to zero after ``cooldownPeriod``); every HPA sync the HPA
reads the metric through KEDA (``GetMetrics``) and applies its AverageValue arithmetic
and behaviour; an ``external-push`` trigger's ``StreamIsActive`` activates at once.
The arithmetic is the replay's (``replay.keda``), with the plan's clocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from protos.externalscaler import externalscaler_pb2 as pb
from protos.externalscaler import externalscaler_pb2_grpc as pb_grpc
from replay.keda import Answer, LoopState, ScalingSpec, hpa_sync, keda_poll

Report = Callable[[str, int, int, str], None]
"""``(who, before, after, why)`` for every change of the replica count."""


@dataclass
class KedaLoop:
    """KEDA's operator and the HPA for one ScaledObject."""

    stub: pb_grpc.ExternalScalerStub
    ref: pb.ScaledObjectRef
    spec: ScalingSpec
    push: bool
    replicas: Callable[[], int]
    scale: Callable[[int], Awaitable[None]]
    clock: Callable[[], float]
    report: Report
    state: LoopState = field(default_factory=LoopState)

    async def run(self) -> None:
        """Poll and sync forever (cancel to stop)."""
        tasks = [asyncio.create_task(self._timers())]
        if self.push:
            tasks.append(asyncio.create_task(self._listen()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _timers(self) -> None:
        next_poll = next_hpa = self.clock()
        while True:
            now = self.clock()
            if now >= next_poll:
                next_poll += self.spec.polling_interval
                answer = await self._answer(with_activity=True)
                await self._apply("keda", keda_poll, answer, now)
            if now >= next_hpa:
                next_hpa += self.spec.hpa_sync
                answer = await self._answer(with_activity=False)
                await self._apply("hpa", hpa_sync, answer, now)
            await asyncio.sleep(max(0.0, min(next_poll, next_hpa) - self.clock()))

    async def _apply(
        self,
        who: str,
        step: Callable[[int, Answer, LoopState, float, ScalingSpec], tuple[int, LoopState]],
        answer: Answer,
        now: float,
    ) -> None:
        before = self.replicas()
        after, self.state = step(before, answer, self.state, now, self.spec)
        if after != before:
            why = answer.reason or (
                f"metric {answer.value:g}" if answer.value is not None else "no metric"
            )
            self.report(who, before, after, why)
            await self.scale(after)

    async def _answer(self, with_activity: bool) -> Answer:
        """GetMetricSpec + GetMetrics (+ IsActive); UNAVAILABLE gives an empty answer."""
        try:
            spec = (await self.stub.GetMetricSpec(self.ref)).metricSpecs[0]
            request = pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=spec.metricName)
            value = (await self.stub.GetMetrics(request)).metricValues[0].metricValueFloat
            active = (await self.stub.IsActive(self.ref)).result if with_activity else None
        except grpc.aio.AioRpcError as err:
            return Answer(None, 1.0, None, f"{err.code().name}: {err.details()}")
        target = spec.targetSizeFloat or float(spec.targetSize) or 1.0
        return Answer(value, target, active, f"metric {value:g}")

    async def _listen(self) -> None:
        """``StreamIsActive``: each ``true`` activates at once (reconnects on errors)."""
        while True:
            try:
                async for response in self.stub.StreamIsActive(self.ref):
                    if not response.result:
                        continue
                    now = self.clock()
                    self.state = self.state.activated(now)
                    before = self.replicas()
                    if before == 0:
                        after = max(self.spec.min_replicas, 1)
                        self.report("push", before, after, "StreamIsActive: true")
                        await self.scale(after)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(min(1.0, self.spec.polling_interval))
