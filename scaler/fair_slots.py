"""At most ``size`` queries at once, shared fairly among the targets asking.

A semaphore serves queries in the order they queued: a few targets whose queries each
take the whole timeout held every slot in turn, and an honest target's queries waited
behind all of theirs (issue 27, hostile pass 23). Here a freed slot goes to the waiting
target holding the fewest slots, and among those to the one that has used the fewest
slot-seconds this round of its (a target's use is forgotten once it holds and waits for
nothing). Example, 2 slots: targets S1 and S2 each hold one for 3 s with more queued,
honest H queues 18 queries of 5 ms; when S1's slot frees, H (holding none, used 0 s)
takes it ahead of S1 (holding none, used 3 s) and runs its 18 queries on it in turn,
about 90 ms, before S1 gets it back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Hashable


class FairSlots:
    """``slot(key)``: hold one of ``size`` slots, fairly among keys; pure asyncio."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size}")
        self.size = size
        self._busy = 0
        self._held: dict[Hashable, int] = {}
        self._used: dict[Hashable, float] = {}
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}

    @contextlib.asynccontextmanager
    async def slot(self, key: Hashable) -> AsyncIterator[None]:
        """Hold a slot for ``key`` while the block runs."""
        await self._acquire(key)
        start = asyncio.get_running_loop().time()
        try:
            yield
        finally:
            self._used[key] = self._used.get(key, 0.0) + (asyncio.get_running_loop().time() - start)
            self._release(key)

    async def _acquire(self, key: Hashable) -> None:
        if self._busy < self.size and not self._waiting:
            self._take(key)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(key)  # handed a slot as it was cancelled: pass it on
            else:
                self._forget(key, future)
            raise

    def _take(self, key: Hashable) -> None:
        self._busy += 1
        self._held[key] = self._held.get(key, 0) + 1

    def _release(self, key: Hashable) -> None:
        self._busy -= 1
        self._held[key] -= 1
        if self._held[key] == 0:
            del self._held[key]
        self._tidy(key)
        self._hand_over()

    def _forget(self, key: Hashable, future: asyncio.Future[None]) -> None:
        queue = self._waiting.get(key)
        if queue is not None:
            with contextlib.suppress(ValueError):  # already handed over and skipped
                queue.remove(future)
            if not queue:
                del self._waiting[key]
        self._tidy(key)
        self._hand_over()

    def _tidy(self, key: Hashable) -> None:
        if key not in self._held and key not in self._waiting:
            self._used.pop(key, None)

    def _hand_over(self) -> None:
        while self._busy < self.size and self._waiting:
            key = min(self._waiting, key=lambda k: (self._held.get(k, 0), self._used.get(k, 0.0)))
            queue = self._waiting[key]
            future = queue.popleft()
            if not queue:
                del self._waiting[key]
            if future.done():  # its waiter was cancelled and has not forgotten it yet
                continue
            self._take(key)
            future.set_result(None)
