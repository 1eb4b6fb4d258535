"""What the gateway tells the scaler: its signals snapshot, now and at every change.

``gateway_signals`` builds the snapshot from the traffic the proxy counts; ``SignalsFeed``
hands it to every watcher (at once when a request is buffered, so ``StreamIsActive`` pushes
KEDA to scale from zero without waiting for a poll); ``GatewaySignalsService`` serves it
over ``unitscale.v1.SignalsService``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
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

log = logging.getLogger(__name__)

WINDOW_BUCKETS = 1000
"""Buckets a window keeps its events in: a count is off by at most a thousandth of the
window (10 ms of the default 10 s), and memory does not grow with the request rate."""
MAX_BUCKETS = 4 * WINDOW_BUCKETS
"""A hard cap on a window's buckets, should a reload widen a window kept at a finer grain."""
MIN_RATE_SECONDS = 1.0
"""The shortest span a rate is taken over (``EventWindow.rate``): a gateway a few
milliseconds old with one arrival is not a thousand requests a second."""
MAX_WATCHERS = 32
"""``WatchSignals`` streams served at once: the scaler's replicas and a few tools. One more
is refused (``RESOURCE_EXHAUSTED``, counted): each costs a message per publish, and every
buffered request publishes."""


class EventWindow:
    """Events counted over a trailing window, on a monotonic clock, in bounded memory.

    Times are ``time.monotonic`` seconds: a step of the wall clock (NTP, a VM resumed)
    neither inflates nor empties a rate. Events close in time share a bucket (at most
    ``seconds / WINDOW_BUCKETS`` apart), so a window holds at most ``MAX_BUCKETS``
    whatever the rate: 5,000 requests a second over an hour is 1,000 buckets, not 18
    million times.
    """

    __slots__ = ("_buckets", "_total", "covered_from")

    def __init__(self, covered_from: float = -math.inf) -> None:
        self._buckets: deque[list[float]] = deque(maxlen=MAX_BUCKETS)
        """``[start, count]`` per bucket, oldest first."""
        self._total = 0
        self.covered_from = covered_from
        """Since when it holds every event: when counting began (the gateway's start), or
        the start of the last window it forgot events before. ``-inf``: always."""

    def add(self, now: float, seconds: float) -> None:
        """One event at ``now``, for a window of ``seconds``."""
        last = self._buckets[-1] if self._buckets else None
        if last is not None and 0 <= now - last[0] < seconds / WINDOW_BUCKETS:
            last[1] += 1
        else:
            if len(self._buckets) == MAX_BUCKETS:
                self._total -= int(self._buckets[0][1])
                self.covered_from = max(self.covered_from, self._buckets[1][0])
            self._buckets.append([now, 1])
        self._total += 1

    def count(self, now: float, seconds: float) -> int:
        """Events in the ``seconds`` up to ``now``.

        Forgets older ones (and any later than ``now``, which a monotonic clock never gives).
        """
        buckets = self._buckets
        while buckets and not 0 <= now - buckets[0][0] <= seconds:
            self._total -= int(buckets.popleft()[1])
            self.covered_from = max(self.covered_from, now - seconds)
        return self._total

    def rate(self, now: float, seconds: float) -> float:
        """Events a second over the ``seconds`` up to ``now``, or the part of them it covers.

        A window it has not held whole (the gateway started, or a reload widened it, less
        than ``seconds`` ago) is divided by the span it held, at least
        ``MIN_RATE_SECONDS``: divided by the whole window, a gateway restarted under 10
        requests a second published 1 a second after a minute of a 10-minute window, and
        the scaler read a tenth of the load.
        """
        span = min(seconds, max(now - self.covered_from, MIN_RATE_SECONDS))
        return self.count(now, seconds) / span

    def __len__(self) -> int:
        return self._total


@dataclass(slots=True)
class TrafficStats:
    """The proxy's traffic, as the signals (and ``/health``) report it."""

    arrivals: EventWindow = field(default_factory=EventWindow)
    """Arrivals (``time.monotonic``) within the rate window."""
    errors: EventWindow = field(default_factory=EventWindow)
    """Upstream failures within the rate window."""
    within: EventWindow = field(default_factory=EventWindow)
    """Requests judged within the SLO as they ended (``serving.slo``), within its window."""
    outside: EventWindow = field(default_factory=EventWindow)
    """Requests judged outside it as they ended, failed or were dropped, within its window."""
    buffered: int = 0
    buffered_bytes: int = 0
    """The bodies of the buffered requests."""
    reading_bytes: int = 0
    """Bytes charged to the bodies being read (``serving.gateway``): at most ``buffer_bytes``."""
    in_flight: int = 0
    last_arrival: float | None = None

    @classmethod
    def starting(cls, now: float) -> TrafficStats:
        """Counts begun at ``now`` (``time.monotonic``): its rate windows cover no time yet."""
        return cls(arrivals=EventWindow(now), errors=EventWindow(now))


def gateway_signals(
    stats: TrafficStats, settings: GatewaySettings, now: float, elapsed: float
) -> Snapshot:
    """The gateway's snapshot at ``now`` (``time.time``, its stamp) for the scaler.

    Rates are counted up to ``elapsed`` (``time.monotonic``, the clock the windows keep),
    forgetting what happened before each window.

    The arrival and upstream-error rates count requests as they arrive or fail over
    ``rate_window`` (over the part of it the gateway has seen, after a start or a reload
    that widened it: ``EventWindow.rate``); the SLO rates (``slo_within_rate``,
    ``slo_outside_rate``) count them as they end and are judged, over the ``slo`` block's
    window (a minute: the scaler steers by them, and ten seconds hold too few requests to
    judge; their ratio is what it steers by, so a short start reads as few judged, held).
    A request still waiting or streaming is in neither yet: it shows in ``buffered`` and
    ``in_flight``.
    """
    window, judged = settings.rate_window, settings.slo.window_seconds
    signals = GatewaySignals(
        time=now,
        arrival_rate=stats.arrivals.rate(elapsed, window),
        buffered=stats.buffered,
        in_flight=stats.in_flight,
        last_arrival_time=stats.last_arrival,
        upstream_error_rate=stats.errors.rate(elapsed, window),
        slo_within_rate=stats.within.count(elapsed, judged) / judged,
        slo_outside_rate=stats.outside.count(elapsed, judged) / judged,
    )
    return Snapshot((settings.namespace, settings.deployment, ""), signals)


class SignalsFeed:
    """The snapshot on demand, and pushed to every watcher's queue."""

    def __init__(self, snapshot: Callable[[float], Snapshot]) -> None:
        self.snapshot = snapshot
        """The signals at a time (``time.time`` seconds)."""
        self._listeners: list[asyncio.Queue[pb.Signals]] = []
        self.on_refused: Callable[[], None] = lambda: None
        """Hears every watcher refused past ``MAX_WATCHERS`` (the gateway counts it)."""

    def subscribe(self) -> asyncio.Queue[pb.Signals] | None:
        """A new watcher's queue; None past ``MAX_WATCHERS`` (refused, counted)."""
        if len(self._listeners) >= MAX_WATCHERS:
            self.on_refused()
            return None
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
        if queue is None:
            log.debug("a WatchSignals stream was refused: %d are served", MAX_WATCHERS)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {MAX_WATCHERS} WatchSignals streams are served at once",
            )
            return
        try:
            yield pb.WatchSignalsResponse(signals=encode(self._feed.snapshot(time.time())))
            while True:
                yield pb.WatchSignalsResponse(signals=await queue.get())
        finally:
            self._feed.unsubscribe(queue)
