"""What the gateway tells the scaler: its signals snapshot, now and at every change.

``gateway_signals`` builds the snapshot from the traffic the proxy counts; ``SignalsFeed``
hands it to every watcher (at once when a request is buffered, so ``StreamIsActive`` pushes
KEDA to scale from zero without waiting for a poll); ``GatewaySignalsService`` serves it
over ``unitscale.v1.SignalsService``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from foundation.signals import GatewaySignals, Snapshot
from foundation.signals_wire import encode
from protos.unitscale.v1 import signals_pb2 as pb
from protos.unitscale.v1 import signals_pb2_grpc as pb_grpc
from serving.gateway_settings import GatewaySettings


@dataclass(slots=True)
class TrafficStats:
    """The proxy's traffic, as the signals (and ``/health``) report it."""

    arrivals: deque[float] = field(default_factory=deque)
    """Arrival times (``time.time``) within the rate window."""
    errors: deque[float] = field(default_factory=deque)
    """Upstream failure times within the rate window."""
    within: deque[float] = field(default_factory=deque)
    """When requests judged within the SLO ended (``serving.slo``), within the rate window."""
    outside: deque[float] = field(default_factory=deque)
    """When requests judged outside it ended, failed or were dropped, within the window."""
    buffered: int = 0
    buffered_bytes: int = 0
    """The bodies of the buffered requests."""
    in_flight: int = 0
    last_arrival: float | None = None


def gateway_signals(stats: TrafficStats, settings: GatewaySettings, now: float) -> Snapshot:
    """The gateway's snapshot for the scaler; forgets what happened before the window.

    The arrival and upstream-error rates count requests as they arrive or fail over
    ``rate_window``; the SLO rates (``slo_within_rate``, ``slo_outside_rate``) count them
    as they end and are judged, over the ``slo`` block's window (a minute: the scaler
    steers by them, and ten seconds hold too few requests to judge). A request still
    waiting or streaming is in neither yet: it shows in ``buffered`` and ``in_flight``.
    """
    window, judged = settings.rate_window, settings.slo.window_seconds
    for times, seconds in (
        (stats.arrivals, window),
        (stats.errors, window),
        (stats.within, judged),
        (stats.outside, judged),
    ):
        while times and now - times[0] > seconds:
            times.popleft()
    signals = GatewaySignals(
        time=now,
        arrival_rate=len(stats.arrivals) / window,
        buffered=stats.buffered,
        in_flight=stats.in_flight,
        last_arrival_time=stats.last_arrival,
        upstream_error_rate=len(stats.errors) / window,
        slo_within_rate=len(stats.within) / judged,
        slo_outside_rate=len(stats.outside) / judged,
    )
    return Snapshot((settings.namespace, settings.deployment, ""), signals)


class SignalsFeed:
    """The snapshot on demand, and pushed to every watcher's queue."""

    def __init__(self, snapshot: Callable[[float], Snapshot]) -> None:
        self.snapshot = snapshot
        """The signals at a time (``time.time`` seconds)."""
        self._listeners: list[asyncio.Queue[pb.Signals]] = []

    def subscribe(self) -> asyncio.Queue[pb.Signals]:
        queue: asyncio.Queue[pb.Signals] = asyncio.Queue(maxsize=64)
        self._listeners.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[pb.Signals]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(queue)

    def publish(self) -> None:
        """Send a snapshot to every watcher now (a full watcher drops its oldest)."""
        message = encode(self.snapshot(time.time()))
        for queue in self._listeners:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(message)


class GatewaySignalsService(pb_grpc.SignalsServiceServicer):
    """The gateway's signals for the scaler: now, then at every change and second."""

    def __init__(self, feed: SignalsFeed) -> None:
        self._feed = feed

    async def GetSignals(  # noqa: N802 - gRPC method name
        self, request: pb.GetSignalsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSignalsResponse:
        return pb.GetSignalsResponse(signals=[encode(self._feed.snapshot(time.time()))])

    async def WatchSignals(  # noqa: N802
        self, request: pb.WatchSignalsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchSignalsResponse]:
        queue = self._feed.subscribe()
        try:
            yield pb.WatchSignalsResponse(signals=encode(self._feed.snapshot(time.time())))
            while True:
                yield pb.WatchSignalsResponse(signals=await queue.get())
        finally:
            self._feed.unsubscribe(queue)
