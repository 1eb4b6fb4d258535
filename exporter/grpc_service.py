"""``unitscale.v1.SignalsService``: the exporter's signals for the scaler, over gRPC."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from exporter.runtime import DeploymentState, Exporter
from foundation.signals import Snapshot
from foundation.signals_wire import encode
from protos.unitscale.v1 import signals_pb2 as pb
from protos.unitscale.v1 import signals_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MAX_WATCHERS = 32
"""``WatchSignals`` streams served at once: the scaler's replicas and a few tools. One more
is refused (``RESOURCE_EXHAUSTED``, counted in ``refused``): each holds a queue of up to
``max_backlog`` messages and every publish walks them all on the event loop, so without a
cap idle streams grew the exporter by about 50 KB each and stalled its loop."""


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
        self.refused = 0
        """``WatchSignals`` streams refused past ``MAX_WATCHERS``."""
        exporter.add_listener(self._publish)

    @property
    def watchers(self) -> int:
        """``WatchSignals`` streams served now."""
        return len(self._watchers)

    def _publish(self, state: DeploymentState) -> None:
        if state.signals is None:
            return
        message = encode(Snapshot(state.key, state.signals))
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
        if len(self._watchers) >= MAX_WATCHERS:
            self.refused += 1
            log.debug("a WatchSignals stream was refused: %d are served", MAX_WATCHERS)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {MAX_WATCHERS} WatchSignals streams are served at once",
            )
            return
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
