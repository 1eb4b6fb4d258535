"""A seasonal forecast: what the same time of day, on days of the same kind, needed before.

For predictive prewarm (issue 16, item 2): ``lead_seconds`` ahead of the expected return of
traffic (about one load time: a DataLoad plus a start), the forecast says how many
replicas the window ``[now, now + lead]`` needed on earlier days at the same time of day,
and how sure that is. Days are of two kinds, weekdays and weekend days (day of week from
the epoch's time, 1970-01-01 a Thursday; a shorter ``day_seconds`` replays compressed
days), and only days of ``now``'s kind count, so a Saturday morning does not inherit
Monday's ramp.

- Each earlier day ``d`` (up to ``lookback_days``) of the same kind whose window the
  history covers gives one peak: the most replicas needed in that window.
- Fewer than ``min_days`` such days: no forecast (``peak`` is None), never a zero.
- ``confidence`` is the share of those days that had any traffic in the window;
  ``confident`` when it reaches ``policy.confidence``; ``peak`` is the mean of their
  peaks.

Pure: the history and ``now`` passed in, a forecast with its reason returned.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

EPOCH_WEEKDAY = 3
"""1970-01-01 was a Thursday (Monday = 0)."""


@dataclass(frozen=True, slots=True)
class SeasonalPolicy:
    """The forecast's knobs."""

    day_seconds: float = 86_400.0
    """One day (shorter to replay compressed days)."""
    lookback_days: int = 28
    min_days: int = 2
    """Earlier days of the same kind the history must cover before it forecasts."""
    confidence: float = 0.75
    """Share of those days with traffic in the window for a confident forecast."""
    weekly: bool = True
    """Weekdays and weekend days apart; False: every day alike."""

    def __post_init__(self) -> None:
        if not self.day_seconds > 0 or self.lookback_days < 1 or self.min_days < 1:
            raise ValueError(
                "day_seconds must be positive, lookback_days and min_days at least 1:"
                f" {self.day_seconds}, {self.lookback_days}, {self.min_days}"
            )
        if not 0 < self.confidence <= 1:
            raise ValueError(f"confidence must be in (0, 1]: {self.confidence}")


@dataclass(frozen=True, slots=True)
class SeasonalForecast:
    """Replicas the coming window needed on earlier days, and how sure that is."""

    peak: float | None
    """Mean over the earlier days of the most replicas needed in the window; None: too
    little history to say."""
    confidence: float
    days: int
    """Earlier days of the same kind that covered the window."""
    confident: bool
    reason: str


def weekend(t: float, day_seconds: float) -> bool:
    """Whether ``t`` falls on a Saturday or a Sunday (days of ``day_seconds`` from the epoch)."""
    return (math.floor(t / day_seconds) + EPOCH_WEEKDAY) % 7 >= 5


def seasonal_forecast(
    history: Sequence[tuple[float, float]],
    now: float,
    lead_seconds: float,
    policy: SeasonalPolicy,
) -> SeasonalForecast:
    """The forecast for ``[now, now + lead_seconds]`` from ``(time, replicas needed)`` samples.

    ``history`` is oldest first (as ``Recent`` keeps it); any spacing.

    Raises:
        ValueError: a negative or non-finite lead.
    """
    if not 0 <= lead_seconds < math.inf:
        raise ValueError(f"lead_seconds must be finite and not negative: {lead_seconds}")
    times = [t for t, _ in history]
    earliest = times[0] if times else math.inf
    kind = weekend(now, policy.day_seconds)
    peaks: list[float] = []
    for d in range(1, policy.lookback_days + 1):
        start = now - d * policy.day_seconds
        if start < earliest:
            break
        if policy.weekly and weekend(start, policy.day_seconds) != kind:
            continue
        first, last = bisect_left(times, start), bisect_right(times, start + lead_seconds)
        inside = [v for _, v in history[first:last] if math.isfinite(v)]
        if inside:
            peaks.append(max(inside))
    which = "weekend days" if policy.weekly and kind else "weekdays" if policy.weekly else "days"
    if len(peaks) < policy.min_days:
        reason = (
            f"no forecast: the history covers {len(peaks)} earlier {which},"
            f" {policy.min_days} needed"
        )
        return SeasonalForecast(None, 0.0, len(peaks), False, reason)
    share = sum(1 for p in peaks if p > 0) / len(peaks)
    peak = sum(peaks) / len(peaks)
    confident = share >= policy.confidence
    reason = (
        f"{'confident' if confident else 'unsure'}: {share:.0%} of {len(peaks)} earlier {which}"
        f" had traffic in the next {lead_seconds:.0f}s, needing {peak:.1f} replicas on average"
    )
    return SeasonalForecast(peak, share, len(peaks), confident, reason)
