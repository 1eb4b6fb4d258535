"""An answer anyone may ask for at will, made at most a share of the event loop's time.

Some answers cost in proportion to everything a process keeps, and anyone who can reach
its port may ask for them back to back: the scaler's ``/metrics`` at 10,000 ScaledObjects
took 1.0 s of the event loop a scrape (6.9 MB), its ``GetInferenceDemand`` 0.28 s a call,
the exporter's ``/metrics`` at 3,000 replicas 0.5 s. A few clients asking in a loop left
no time for KEDA's calls, the signal streams or the scrape cycle (issue 27, hostile pass 7).

``LoopShare`` keeps the last answer and makes a new one only once the last is older than
its cost over ``share`` (10%: an answer that took 1 s of CPU is served for 10 s), so
asking cannot take more than that share of the loop, however often. An answer that costs
less than ``free`` seconds of CPU is made afresh each time, as cheap as serving the
request at all: small deployments and tests see every change at once. The cost is the
thread's CPU time (``time.thread_time``), so a loaded machine does not lengthen the wait;
its age is ``time.monotonic``'s, and a clock that goes back makes a new one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

SHARE = 0.1
"""The most of the loop's time asking for the answer may take."""
FREE = 0.005
"""CPU seconds below which an answer is made afresh each time."""


class LoopShare(Generic[T]):
    """``make()``'s answer, made again only once it is older than its cost over ``share``.

    Args:
        make: builds the answer (on the caller's thread: the event loop's).
        clock: the age of an answer (``time.monotonic``).
        cpu: what an answer cost (this thread's CPU seconds; ``time.thread_time``).
    """

    def __init__(
        self,
        make: Callable[[], T],
        *,
        share: float = SHARE,
        free: float = FREE,
        clock: Callable[[], float] | None = None,
        cpu: Callable[[], float] | None = None,
    ) -> None:
        self._make = make
        self._share = share
        self._free = free
        self._clock = clock
        self._cpu = cpu
        self._answer: T | None = None
        self._made = -math.inf
        self._lasts = 0.0
        self.made = 0
        """Answers made (a cached one served is not counted)."""

    def get(self) -> T:
        """The answer: the kept one while it is young enough, else a new one.

        Whatever ``make`` raises goes to the caller, and nothing is kept.
        """
        clock = self._clock or time.monotonic
        cpu = self._cpu or time.thread_time
        if self._answer is not None and 0 <= clock() - self._made < self._lasts:
            return self._answer
        began = cpu()
        answer = self._make()
        cost = cpu() - began
        self.made += 1
        self._answer, self._made = answer, clock()
        self._lasts = cost / self._share if cost >= self._free else 0.0
        return answer
