"""Timestamped samples kept for a while: the decision core's time windows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Recent(Generic[V]):
    """``(time, value)`` samples, oldest first; every method takes ``now`` and returns anew.

    The window's length is not stored: it is a policy knob, which a reload may change
    between two decisions.
    """

    samples: tuple[tuple[float, V], ...] = ()

    def within(self, now: float, seconds: float, *, closed: bool = True) -> Recent[V]:
        """The samples at most (``closed``) or less than ``seconds`` old at ``now``."""
        if closed:
            return Recent(tuple((t, v) for t, v in self.samples if now - t <= seconds))
        return Recent(tuple((t, v) for t, v in self.samples if now - t < seconds))

    def add(self, now: float, value: V) -> Recent[V]:
        """These samples and ``value`` at ``now``."""
        return Recent((*self.samples, (now, value)))

    def age(self, now: float) -> float:
        """How old the oldest sample is at ``now`` (0 with none)."""
        return now - self.samples[0][0] if self.samples else 0.0

    def values(self) -> Iterator[V]:
        """The values, oldest first."""
        return (v for _, v in self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[tuple[float, V]]:
        return iter(self.samples)
