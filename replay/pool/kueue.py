"""A model of one Kueue ClusterQueue for the joint replay: nominal quota, BestEffortFIFO.

What it keeps of Kueue (docs/replay.md, "The joint replay (one pool)"):

- one ClusterQueue with one resource, GPUs, and a **nominal quota in cards** (a
  fractional ``gpu_milli`` share counts its fraction, as HAMi's ``gpumem``/``gpucores``
  requests would be summed);
- **BestEffortFIFO**: workloads are tried by priority (highest first), then by creation
  (its arrival; a preempted workload keeps its original one, so it goes back near the
  head), then by name; one that cannot be admitted now does not block those behind it;
- **admission checks** as a callback: a workload is admitted only once its quota fits
  and every check says Ready (``check``), and the pool has room for its pods (``place``,
  standing in for kube-scheduler and HAMi after admission).

Simplifications, each said in docs/replay.md: a workload whose check or placement fails
keeps no quota reservation (it is tried again next tick); Kueue's own preemption
(``withinClusterQueue``) and cohorts are not modelled; eviction is the caller's (the
capacity manager's reclaim), after which the workload is pushed back.

Pure: no clock, no I/O; the caller passes ``now`` and the callbacks.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

QUOTA_TOLERANCE = 1e-9
"""Cards; fractional shares summed in floating point must not miss a quota by rounding."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One queued workload: what the queue orders by and the quota counts."""

    key: str
    priority: int
    created: float
    """Seconds; the order within a priority (Kueue's creation timestamp)."""
    cards: float
    """GPUs' worth it requests (fractional shares summed)."""

    @property
    def order(self) -> tuple[int, float, str]:
        """BestEffortFIFO's order: priority first (highest), then creation, then name."""
        return (-self.priority, self.created, self.key)


@dataclass(slots=True)
class ClusterQueue:
    """The queue and its quota; ``admitted`` is the cards' worth admitted workloads hold."""

    nominal_cards: float
    admitted: float = 0.0
    _queue: list[Workload] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.nominal_cards >= 0:
            raise ValueError(f"ClusterQueue: nominal quota {self.nominal_cards!r} cards")

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Workload]:
        """Queued workloads in admission order."""
        return iter(self._queue)

    def push(self, workload: Workload) -> None:
        """Queue ``workload`` (new, or back after an eviction) at its place in the order.

        One requesting more than the nominal quota is queued too and never admitted, as
        Kueue leaves it pending ("exceeds the quota"): the replay counts it as queued.
        """
        bisect.insort(self._queue, workload, key=_order)

    def fits_quota(self, cards: float) -> bool:
        """Whether ``cards`` more stay within the nominal quota."""
        return self.admitted + cards <= self.nominal_cards + QUOTA_TOLERANCE

    def admit(
        self,
        check: Callable[[Workload, float], bool],
        place: Callable[[Workload], bool],
    ) -> list[Workload]:
        """One scheduling pass: admit, in order, every workload that fits now.

        ``check(workload, admitted)`` is the admission checks' verdict given the cards
        admitted so far (this pass's included); ``place`` puts its pods on the pool and
        says whether they fit. Both are asked only for a workload within quota; a workload
        refused by either stays queued. Returns the admitted ones, in admission order.
        """
        admitted: list[Workload] = []
        kept: list[Workload] = []
        for workload in self._queue:
            if (
                self.fits_quota(workload.cards)
                and check(workload, self.admitted)
                and place(workload)
            ):
                self.admitted += workload.cards
                admitted.append(workload)
            else:
                kept.append(workload)
        self._queue = kept
        return admitted

    def finish(self, workload: Workload) -> None:
        """``workload`` left the pool (finished or evicted): its quota is free again."""
        self.admitted = max(0.0, self.admitted - workload.cards)


def _order(workload: Workload) -> tuple[int, float, str]:
    return workload.order


__all__ = ["QUOTA_TOLERANCE", "ClusterQueue", "Workload"]
