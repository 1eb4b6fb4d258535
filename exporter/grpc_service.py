"""``unitscale.v1.SignalsService``: the exporter's signals for the scaler, over gRPC."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from exporter.runtime import DeploymentState, Exporter
from exporter.signals import DeploymentSignals, WindowSignals
from protos.unitscale.v1 import signals_pb2 as pb
from protos.unitscale.v1 import signals_pb2_grpc as pb_grpc

_QUANTILE_FIELDS = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99"}
_LATENCY_FIELDS = {
    "ttft": "ttft_seconds",
    "itl": "inter_token_seconds",
    "e2e": "e2e_seconds",
    "queue_time": "queue_time_seconds",
}


def to_proto(key: tuple[str, str, str], signals: DeploymentSignals) -> pb.Signals:
    """The wire form of one deployment's signals; unknown values stay unset."""
    namespace, deployment, model = key
    engine = pb.EngineSignals(
        replicas_up=signals.replicas_up,
        replicas_scraped=signals.replicas,
        panic=_window(signals.panic),
        stable=_window(signals.stable),
        price_is_default=signals.price_is_default,
    )
    _set(engine, "queue_depth", signals.queue_depth)
    _set(engine, "requests_running", signals.running)
    _set(engine, "kv_cache_usage", signals.kv_usage)
    _set(engine, "cost_per_million_tokens", signals.cost_per_million_tokens)
    _set(engine, "cost_per_million_output_tokens", signals.cost_per_million_output_tokens)
    stamp = Timestamp()
    stamp.FromNanoseconds(int(signals.time * 1e9))
    return pb.Signals(
        target=pb.Target(namespace=namespace, deployment=deployment, model=model),
        source=pb.SOURCE_EXPORTER,
        observed_time=stamp,
        partial=signals.partial,
        engine=engine,
    )


def _window(window: WindowSignals) -> pb.WindowSignals:
    duration = Duration()
    duration.FromNanoseconds(int(window.seconds * 1e9))
    out = pb.WindowSignals(window=duration)
    _set(out, "request_rate", window.request_rate)
    _set(out, "prompt_token_rate", window.prompt_token_rate)
    _set(out, "generation_token_rate", window.generation_token_rate)
    _set(out, "preemption_rate", window.preemption_rate)
    _set(out, "queue_depth_mean", window.queue_depth_mean)
    _set(out, "requests_running_mean", window.running_mean)
    for concept, field in _LATENCY_FIELDS.items():
        quantiles = getattr(out, field)
        for q, value in window.quantiles.get(concept, {}).items():
            _set(quantiles, _QUANTILE_FIELDS[q], value)
    return out


def _set(message: object, field: str, value: float | None) -> None:
    if value is not None and not math.isnan(value):
        setattr(message, field, value)


def _matches(selector: pb.TargetSelector, target: pb.Target) -> bool:
    return all(
        not want or want == have
        for want, have in (
            (selector.namespace, target.namespace),
            (selector.deployment, target.deployment),
            (selector.model, target.model),
        )
    )


class SignalsService(pb_grpc.SignalsServiceServicer):
    """Latest signals on request, and every new snapshot to watchers."""

    def __init__(self, exporter: Exporter, max_backlog: int = 1024) -> None:
        self._latest: dict[tuple[str, str, str], pb.Signals] = {}
        self._watchers: set[asyncio.Queue[pb.Signals]] = set()
        self._max_backlog = max_backlog
        exporter.add_listener(self._publish)

    def _publish(self, state: DeploymentState) -> None:
        if state.signals is None:
            return
        message = to_proto(state.key, state.signals)
        self._latest[state.key] = message
        for queue in self._watchers:
            if queue.qsize() >= self._max_backlog:
                queue.get_nowait()  # a stalled watcher loses the oldest, never blocks us
            queue.put_nowait(message)

    async def GetSignals(  # noqa: N802 - gRPC method name
        self, request: pb.GetSignalsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSignalsResponse:
        """The latest snapshot of every matching deployment."""
        return pb.GetSignalsResponse(
            signals=[s for s in self._latest.values() if _matches(request.selector, s.target)]
        )

    async def WatchSignals(  # noqa: N802
        self, request: pb.WatchSignalsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchSignalsResponse]:
        """Every matching snapshot now, then each new one as it is derived."""
        queue: asyncio.Queue[pb.Signals] = asyncio.Queue()
        self._watchers.add(queue)
        try:
            for signals in list(self._latest.values()):
                if _matches(request.selector, signals.target):
                    yield pb.WatchSignalsResponse(signals=signals)
            while True:
                signals = await queue.get()
                if _matches(request.selector, signals.target):
                    yield pb.WatchSignalsResponse(signals=signals)
        finally:
            self._watchers.discard(queue)
