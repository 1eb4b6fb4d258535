"""KEDA's ``externalscaler.ExternalScaler`` service over the decision core.

The one place where errors become gRPC status codes:

=====================  ==================  ========================================
error                  status              why
=====================  ==================  ========================================
MetadataError          INVALID_ARGUMENT    the ScaledObject's trigger is misconfigured
unknown metric name    NOT_FOUND           KEDA asked for a metric we never specified
NoDataError            UNAVAILABLE         lets KEDA's fallback act; never a fake 0
=====================  ==================  ========================================

The answers come from ``scaler.registry`` (grpc-free, shared with the replay).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import AsyncIterator

import grpc

from foundation.errors import MetadataError, NoDataError, quote
from protos.externalscaler import externalscaler_pb2 as pb
from protos.externalscaler import externalscaler_pb2_grpc as pb_grpc
from scaler.core import Decision
from scaler.metadata import describe_object
from scaler.registry import (
    METRIC_NAME,
    TARGET_VALUE,
    ScaledObject,
    ScaledObjectRegistry,
    metric_value,
)

log = logging.getLogger(__name__)

# KEDA names the HPA metric "s<trigger index>-<name>" and strips that prefix before
# GetMetrics; accept it anyway, for older KEDA versions and hand-made calls.
_KEDA_INDEX_PREFIX = re.compile(r"^s\d+-")

_METRIC_SPEC = pb.GetMetricSpecResponse(
    metricSpecs=[
        pb.MetricSpec(
            metricName=METRIC_NAME, targetSize=int(TARGET_VALUE), targetSizeFloat=TARGET_VALUE
        )
    ]
)
_ACTIVE = pb.IsActiveResponse(result=True)
_INACTIVE = pb.IsActiveResponse(result=False)


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    """The five RPCs KEDA calls, answered from the registry."""

    def __init__(self, registry: ScaledObjectRegistry) -> None:
        self._registry = registry

    async def IsActive(  # noqa: N802 - name fixed by KEDA
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        """Whether the ScaledObject should have replicas (KEDA's 0 <-> 1)."""
        decision = await self._decision(request, context)
        return _ACTIVE if decision.active else _INACTIVE

    async def StreamIsActive(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """Push ``true`` on every inactive-to-active transition, and nothing else.

        Each ``true`` activates at once and resets KEDA's cooldown, so repeating it
        would delay scale-to-zero; ``false`` is ignored by KEDA >= 2.18. The stream
        opens as "inactive", so a target already active gets one ``true`` first.
        """
        scaled = await self._resolve(request, context)
        event = asyncio.Event()
        self._registry.add_activation_listener(scaled, event.set)
        try:
            try:
                if self._registry.current(scaled).active:
                    event.set()
            except NoDataError:
                pass  # no data is not activity; wait for signals
            while True:
                await event.wait()
                event.clear()
                yield _ACTIVE
        finally:
            self._registry.remove_activation_listener(scaled, event.set)

    async def GetMetricSpec(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        """The one metric and its target; validates the metadata on the way."""
        await self._resolve(request, context)
        return _METRIC_SPEC

    async def GetMetrics(  # noqa: N802
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        """The desired replica count as the metric value (both int and float fields)."""
        name = request.metricName
        if _KEDA_INDEX_PREFIX.sub("", name, count=1) != METRIC_NAME:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown metric {quote(name)}: this scaler serves {METRIC_NAME!r}"
                f" (optionally with KEDA's 'sN-' prefix)",
            )
        decision = await self._decision(request.scaledObjectRef, context)
        value = metric_value(decision)
        return pb.GetMetricsResponse(
            metricValues=[
                # int field for KEDA < 2.17: ceil keeps the HPA's result the same
                pb.MetricValue(
                    metricName=name, metricValue=math.ceil(value), metricValueFloat=value
                )
            ]
        )

    async def StreamMetricSpec(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        """The spec at once, then nothing: our target never changes (KEDA >= 2.21)."""
        await self._resolve(request, context)
        yield _METRIC_SPEC
        await asyncio.Event().wait()  # hold the stream open until KEDA closes it

    async def _resolve(
        self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> ScaledObject:
        try:
            return self._registry.resolve(ref.name, ref.namespace, ref.scalerMetadata)
        except MetadataError as err:
            where = describe_object(ref.namespace, ref.name)  # a huge name is cut
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ScaledObject {where}: {err}")
            raise  # unreachable: abort raises

    async def _decision(
        self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> Decision:
        scaled = await self._resolve(ref, context)
        try:
            return self._registry.current(scaled)
        except NoDataError as err:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"ScaledObject {ref.namespace}/{ref.name}: {err}"
            )
            raise  # unreachable: abort raises
