"""At most ``size`` queries at once, shared fairly among the targets asking.

A semaphore serves queries in the order they queued: a few targets whose queries each
take the whole timeout held every slot in turn, and an honest target's queries waited
behind all of theirs (issue 27, hostile pass 23). Here a freed slot goes to the waiting
target holding the fewest slots, and among those to the one that has used the fewest
slot-seconds; ties go to the one waiting longest. Example, 2 slots: targets S1 and S2
each hold one for 3 s with more queued, honest H queues 18 queries of 5 ms; when S1's
slot frees, H (holding none, used 0 s) takes it ahead of S1 (holding none, used 3 s) and
runs its 18 queries on it in turn, about 90 ms, before S1 gets it back.

A target that stops asking keeps its use for ``grace`` seconds (its next round comes
within it); one new, or back after longer, enters at the least use of those known, not
at zero: entering at zero, every target finishing its round cut ahead of those still
finishing theirs, round after round (a target whose queries cost three times the others'
finished 1 round where its share was 34), and 100 targets on one slot left the last few
without signals for over a minute. Nor below the waiting target served next: at the
least use known, targets whose rounds paused past ``grace`` (an event loop lagging under
load) re-entered ahead of one waiting all along, round after round. Forgotten after
``grace``, a target banks no credit while it asks for nothing.

Use fades: a slot-second used ``memory`` seconds ago counts 1/e of one used now. Kept
for good, one slow query (a Prometheus hiccup, or the event loop stalled while the
target held its slot) made its target wait until every other target asking had used as
much: 100 targets on one slot, one query 0.6 s slower, and that target had no signals
for 63 s, against 4 s for the others. Charged C, a target now waits about
``memory * ln(1 + N * C / memory)`` with N others asking, and one whose every query
takes C at most ``C / (C + that)`` of a slot: with ``memory`` three times C and 100
targets a slot, a wait of 10.6 C and a share under 9%.

The waiting targets are kept in a heap by (holding, used, waiting since): a hand-over
costs the logarithm of their number. A scan of them all on each hand-over cost 225 us a
query at 1,600 targets (6.5 s of the event loop a round), against 5 us for a semaphore.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable


class FairSlots:
    """``slot(key)``: hold one of ``size`` slots, fairly among keys; pure asyncio."""

    def __init__(
        self,
        size: int,
        grace: float = 0.0,
        clock: Callable[[], float] | None = None,
        memory: float = math.inf,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size}")
        if not memory > 0:
            raise ValueError(f"memory must be above 0 seconds, not {memory}")
        self.size = size
        self._grace = grace
        self._clock = clock
        self._memory = memory
        self._epoch: float | None = None
        """Uses are kept scaled by e^((t - epoch) / memory): see ``_weight``."""
        self._busy = 0
        self._held: dict[Hashable, int] = {}
        self._used: dict[Hashable, float] = {}
        """Slot-seconds of each key asking, or stopped within ``grace``."""
        self._idle: dict[Hashable, float] = {}
        """Keys asking for nothing, since when (oldest first): forgotten after ``grace``."""
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self._since: dict[Hashable, int] = {}
        """When each waiting key began to wait (a counter): ties go to the longest."""
        self._heap: list[tuple[int, float, int, int, Hashable]] = []
        """(holding, used, since, version, key) of waiting keys; an entry whose version
        is not its key's latest is stale, skipped when it comes up."""
        self._version: dict[Hashable, int] = {}
        self._count = itertools.count()
        self._uses: list[tuple[float, int, Hashable]] = []
        """(used, tie-break, key): the least use known on top (``_least_use``)."""

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    @contextlib.asynccontextmanager
    async def slot(self, key: Hashable) -> AsyncIterator[None]:
        """Hold a slot for ``key`` while the block runs."""
        await self._acquire(key)
        start = self._now()
        try:
            yield
        finally:
            end = self._now()
            charge = (end - start) * self._weight(end)
            self._set_use(key, self._used.get(key, 0.0) + charge)
            self._release(key)

    def _weight(self, now: float) -> float:
        """What a slot-second used now weighs: e^((now - epoch) / memory).

        Scaling what is charged now up, rather than every use kept down, fades each
        key's past use alike without touching the heaps; once the weight passes e^32
        every use is scaled down and the heaps rebuilt (their order unchanged).
        """
        if self._memory == math.inf:
            return 1.0
        if self._epoch is None:
            self._epoch = now
        exponent = (now - self._epoch) / self._memory
        if exponent > 32.0:
            self._rescale(math.exp(-exponent))
            self._epoch, exponent = now, 0.0
        return math.exp(exponent)

    def _rescale(self, factor: float) -> None:
        self._used = {key: used * factor for key, used in self._used.items()}
        self._uses = [(used, next(self._count), key) for key, used in self._used.items()]
        heapq.heapify(self._uses)
        self._heap.clear()
        for key in self._waiting:
            self._queue(key)

    async def _acquire(self, key: Hashable) -> None:
        self._enter(key)
        if self._busy < self.size and not self._waiting:
            self._take(key)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if key not in self._waiting:
            self._waiting[key] = deque()
            self._since[key] = next(self._count)
            self._queue(key)
        self._waiting[key].append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(key)  # handed a slot as it was cancelled: pass it on
            else:
                self._forget(key, future)
            raise

    def _enter(self, key: Hashable) -> None:
        """A key new, or back after ``grace``, enters at the least use of those known."""
        if key in self._held or key in self._waiting:
            return
        now = self._now()
        while self._idle:
            oldest, since = next(iter(self._idle.items()))
            if now - since <= self._grace:
                break
            del self._idle[oldest], self._used[oldest]
        if self._idle.pop(key, None) is None:
            # Not below the key served next: entering under it, targets whose rounds
            # paused past ``grace`` (an event loop lagging under load) cut ahead of a
            # target waiting all along, round after round, for over a minute.
            self._set_use(key, max(self._least_use(), self._next_use()))

    def _least_use(self) -> float:
        """The least use of the keys known (a heap of uses, stale entries skipped)."""
        while self._uses and self._used.get(self._uses[0][2]) != self._uses[0][0]:
            heapq.heappop(self._uses)
        return self._uses[0][0] if self._uses else 0.0

    def _next_use(self) -> float:
        """The use of the waiting key served next (0 with none waiting)."""
        while self._heap and self._version.get(self._heap[0][4]) != self._heap[0][3]:
            heapq.heappop(self._heap)
        return self._heap[0][1] if self._heap else 0.0

    def _set_use(self, key: Hashable, used: float) -> None:
        self._used[key] = used
        heapq.heappush(self._uses, (used, next(self._count), key))
        if len(self._uses) > 4 * len(self._used) + 64:
            self._uses = [e for e in self._uses if self._used.get(e[2]) == e[0]]
            heapq.heapify(self._uses)

    def _queue(self, key: Hashable) -> None:
        """(Re)place a waiting key in the heap at its present priority.

        Stale entries are dropped once they outnumber the waiting keys three to one, so
        the heap stays within a few entries a waiting key.
        """
        # Never reused: an entry left from an earlier wait must not match a new one.
        version = self._version[key] = next(self._count)
        entry = (self._held.get(key, 0), self._used.get(key, 0.0), self._since[key], version, key)
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 4 * len(self._waiting) + 64:
            self._heap = [e for e in self._heap if self._version.get(e[4]) == e[3]]
            heapq.heapify(self._heap)

    def _take(self, key: Hashable) -> None:
        self._busy += 1
        self._held[key] = self._held.get(key, 0) + 1
        if key in self._waiting:
            self._queue(key)

    def _release(self, key: Hashable) -> None:
        self._busy -= 1
        self._held[key] -= 1
        if self._held[key] == 0:
            del self._held[key]
        if key in self._waiting:
            self._queue(key)  # holding one fewer, having used more
        self._tidy(key)
        self._hand_over()

    def _forget(self, key: Hashable, future: asyncio.Future[None]) -> None:
        queue = self._waiting.get(key)
        if queue is not None:
            with contextlib.suppress(ValueError):  # already handed over and skipped
                queue.remove(future)
            if not queue:
                self._stop_waiting(key)
        self._tidy(key)
        self._hand_over()

    def _stop_waiting(self, key: Hashable) -> None:
        del self._waiting[key], self._since[key], self._version[key]
        if not self._waiting:
            self._heap.clear()  # every entry left is stale

    def _tidy(self, key: Hashable) -> None:
        if key not in self._held and key not in self._waiting:
            self._idle.pop(key, None)  # re-inserted: the dict stays oldest first
            self._idle[key] = self._now()

    def _hand_over(self) -> None:
        while self._busy < self.size and self._waiting:
            *_, version, key = heapq.heappop(self._heap)
            if self._version.get(key) != version:
                continue  # stale: the key's priority changed, or it waits no more
            queue = self._waiting[key]
            future = queue.popleft()
            if queue:
                self._queue(key)  # its entry was popped: back in at the same priority
            else:
                self._stop_waiting(key)
            if future.done():  # its waiter was cancelled and has not forgotten it yet
                continue
            self._take(key)
            future.set_result(None)
