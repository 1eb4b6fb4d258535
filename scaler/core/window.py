"""Timestamped samples kept for a while: the decision core's time windows."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Recent(Generic[V]):
    """``(time, value)`` samples, oldest first; every method takes ``now`` and returns anew.

    The window's length is not stored: it is a policy knob, which a reload may change
    between two decisions. Oldest first is kept by ``add`` (a sample older than the
    newest goes in its place), so a window's expired samples are always a prefix.
    """

    samples: tuple[tuple[float, V], ...] = ()

    def within(self, now: float, seconds: float, *, closed: bool = True) -> Recent[V]:
        """The samples at most (``closed``) or less than ``seconds`` old at ``now``.

        The expired ones are a prefix (oldest first), so only they are looked at: a
        decision's windows hold hundreds of samples, of which one or two expire.
        """
        samples, first = self.samples, 0
        if closed:
            while first < len(samples) and now - samples[first][0] > seconds:
                first += 1
        else:
            while first < len(samples) and now - samples[first][0] >= seconds:
                first += 1
        return self if first == 0 else Recent(samples[first:])

    def add(self, now: float, value: V) -> Recent[V]:
        """These samples and ``value`` at ``now``, in its place by time (oldest first)."""
        samples = self.samples
        if not samples or samples[-1][0] <= now:
            return Recent((*samples, (now, value)))
        place = bisect_right(samples, now, key=lambda sample: sample[0])
        return Recent((*samples[:place], (now, value), *samples[place:]))

    def age(self, now: float) -> float:
        """How old the oldest sample is at ``now`` (0 with none)."""
        return now - self.samples[0][0] if self.samples else 0.0

    def values(self) -> list[V]:
        """The values, oldest first."""
        return [v for _, v in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[tuple[float, V]]:
        return iter(self.samples)
