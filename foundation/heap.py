"""Garbage collection that scans what a pass made, never the whole view a process holds.

A controller's view of a 10,000-card pool is millions of small objects (the watched
Nodes, Pods and Workloads as JSON). CPython's full collection scans every one of them,
a few hundred milliseconds, at whatever moment an allocation crosses its threshold:
mostly inside a pass, where it lands on the check latency of every Workload waiting.
The view needs none of it: JSON is acyclic, so reference counts free it.

``PassHeap.settle()`` runs between passes: it collects (the frozen objects are not
scanned, so this reads only what was made since the last settle) and freezes the
survivors (``gc.freeze``). Automatic collections inside the next pass then scan only
that pass's own objects. An object frozen while alive that later dies in a reference
cycle is not freed until the heap is unfrozen, so every ``full_every`` seconds a settle
unfreezes first and collects everything: one full scan an hour, not one every few
seconds.

Worked example (an in-process pass at 10,000 cards, 5,500 pods, 5,000 Workloads on 2
cores): a pass takes about 60 ms, 230 ms when a full collection lands in it; a settle
takes 3 to 5 ms, and unfreezing after 30 passes found no cyclic garbage among the
frozen objects.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

FULL_EVERY_SECONDS = 3600.0
"""Seconds between settles that unfreeze and scan the whole heap."""


class PassHeap:
    """The collector's schedule for one process's loop (see the module docstring)."""

    def __init__(
        self,
        full_every: float = FULL_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.full_every = full_every
        self._clock = clock
        self._full_at = -math.inf
        self.settles = 0
        self.full = 0
        """Settles that unfroze and scanned the whole heap."""

    def settle(self) -> int:
        """Collect what the last pass left and freeze the survivors; the objects freed."""
        now = self._clock()
        if now - self._full_at >= self.full_every:
            self._full_at = now
            self.full += 1
            gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        self.settles += 1
        return freed
