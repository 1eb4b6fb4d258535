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

The compact form (``SeasonalState``, what the decision core carries)
    A full history of weeks does not fit in a decision's state, so ``observe`` folds
    each observation into one ``SlotStats`` per (day kind, slot of the day): a slot is
    ``day_seconds / slots_per_day`` long (15 min by default). When a slot of a day is
    over (the first observation in a later one), its most demand, whether it had any,
    and when in the slot the first came are folded in as running means: a plain mean
    over the first ``1 / smoothing`` days, then exponentially weighted (``smoothing``
    per day), so the pattern follows a change within about a week. A slot no
    observation reached (the scaler down, signals missing) is not folded: missing is
    never an idle day. The state holds ``2 x slots_per_day`` stats (``slots_per_day``
    when not ``weekly``) and one open slot, whatever the history's length.

    ``expected_return`` asks for a *return of traffic*: a slot confidently busy
    (observed on at least ``min_days`` days, busy on at least ``confidence`` of them)
    whose previous slot is not. Traffic that never stopped in the learned pattern (a
    lull at noon) is not a return: being at zero then is an exception the forecast
    does not predict. The expected time is the slot's start plus the mean offset of its
    first demand, less twice its mean deviation (the return comes a little earlier on
    some days); it is waited for until as much after the mean, and a grace more. Local
    time is ``now + utc_offset_seconds`` (a fixed offset: no DST; a change of offset
    shifts the pattern by that much until it is relearnt).
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
    slots_per_day: int = 96
    """The compact state's slots per day (96: 15 min each)."""
    smoothing: float = 0.2
    """The compact state's weight of the newest day, once ``1 / smoothing`` days are seen."""
    utc_offset_seconds: float = 0.0
    """Local time (business hours) is UTC plus this; fixed (no DST)."""

    def __post_init__(self) -> None:
        if not self.day_seconds > 0 or self.lookback_days < 1 or self.min_days < 1:
            raise ValueError(
                "day_seconds must be positive, lookback_days and min_days at least 1:"
                f" {self.day_seconds}, {self.lookback_days}, {self.min_days}"
            )
        if not 0 < self.confidence <= 1:
            raise ValueError(f"confidence must be in (0, 1]: {self.confidence}")
        if not 1 <= self.slots_per_day <= 1440 or not 0 < self.smoothing <= 1:
            raise ValueError(
                "slots_per_day must be 1 to 1440 and smoothing in (0, 1]:"
                f" {self.slots_per_day}, {self.smoothing}"
            )
        if not abs(self.utc_offset_seconds) <= 86_400.0:
            raise ValueError(
                f"utc_offset_seconds must be within a day of UTC: {self.utc_offset_seconds}"
            )


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
    expected_at: float | None = None
    """``expected_return``: when the returning traffic is expected (epoch seconds)."""


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
    offset = policy.utc_offset_seconds
    kind = weekend(now + offset, policy.day_seconds)
    peaks: list[float] = []
    for d in range(1, policy.lookback_days + 1):
        start = now - d * policy.day_seconds
        if start < earliest:
            break
        if policy.weekly and weekend(start + offset, policy.day_seconds) != kind:
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


@dataclass(frozen=True, slots=True)
class SlotStats:
    """What one slot of the day (of one day kind) was like, over the days it was seen."""

    days: int = 0
    """Days with at least one observation in the slot."""
    busy: float = 0.0
    """Running mean of whether the slot had demand (1) or none (0) on those days."""
    peak: float = 0.0
    """Running mean of the slot's most demand (replicas), idle days counting 0."""
    busy_days: int = 0
    onset: float = 0.0
    """Running mean, over busy days, of seconds from the slot's start to its first demand."""
    spread: float = 0.0
    """Running mean, over busy days, of how far the first demand was from ``onset``."""

    def earliest(self) -> float:
        """Seconds into the slot from which its first demand is expected.

        ``onset`` less twice its ``spread``: a return a little early still finds replicas.
        """
        return self.onset - 2 * self.spread


@dataclass(frozen=True, slots=True)
class SeasonalState:
    """The compact seasonal history (module docstring): bounded, whatever its age."""

    slots: tuple[SlotStats, ...] = ()
    """``kinds x slots_per_day`` stats, kind-major; () until the first slot is folded."""
    open_slot: int | None = None
    """Local slot number (from the epoch) being observed now; None before any."""
    open_peak: float = 0.0
    open_onset: float | None = None
    """Seconds into the open slot of its first demand; None while it had none."""


def _width(policy: SeasonalPolicy) -> float:
    return policy.day_seconds / policy.slots_per_day


def _local_slot(t: float, policy: SeasonalPolicy) -> int:
    """The slot number, from the epoch in local time, ``t`` falls in."""
    return math.floor((t + policy.utc_offset_seconds) / _width(policy))


def _stats_index(slot: int, policy: SeasonalPolicy) -> int:
    """Where slot number ``slot``'s stats are kept (its day kind and slot of the day)."""
    day, of_day = divmod(slot, policy.slots_per_day)
    kind = policy.weekly and (day + EPOCH_WEEKDAY) % 7 >= 5
    return int(kind) * policy.slots_per_day + of_day


def _fold(stats: SlotStats, peak: float, onset: float | None, smoothing: float) -> SlotStats:
    """``stats`` with one more day: peak ``peak``, first demand at ``onset`` (None: idle)."""
    days = stats.days + 1
    weight = max(1.0 / days, smoothing)
    busy = 0.0 if onset is None else 1.0
    new = SlotStats(
        days,
        stats.busy + weight * (busy - stats.busy),
        stats.peak + weight * (peak - stats.peak),
        stats.busy_days,
        stats.onset,
        stats.spread,
    )
    if onset is None:
        return new
    busy_days = stats.busy_days + 1
    onset_weight = max(1.0 / busy_days, smoothing)
    # the first busy day sets the onset and deviates from nothing
    deviation = abs(onset - stats.onset) if stats.busy_days else 0.0
    return SlotStats(
        new.days,
        new.busy,
        new.peak,
        busy_days,
        stats.onset + onset_weight * (onset - stats.onset),
        stats.spread + onset_weight * (deviation - stats.spread),
    )


def observe(
    state: SeasonalState, now: float, demand: float | None, policy: SeasonalPolicy
) -> SeasonalState:
    """``state`` with the demand (replicas' worth) observed at ``now``.

    ``demand`` None (not measured) changes nothing: a missing signal is no idle slot.
    An observation older than the open slot is ignored (time runs forward); a layout
    that no longer fits ``policy`` (slots per day, weekly changed) is started afresh.

    Raises:
        ValueError: a negative or non-finite demand, or a non-finite time.
    """
    if demand is None:
        return state
    if not (math.isfinite(demand) and demand >= 0 and math.isfinite(now)):
        raise ValueError(f"demand must be finite and not negative at a finite time: {demand}")
    kinds = 2 if policy.weekly else 1
    size = kinds * policy.slots_per_day
    if state.slots and len(state.slots) != size:
        state = SeasonalState()
    slot = _local_slot(now, policy)
    if state.open_slot is not None and slot < state.open_slot:
        return state
    into = now + policy.utc_offset_seconds - slot * _width(policy)
    onset = into if demand > 0 else None
    if state.open_slot == slot:
        first = state.open_onset if state.open_onset is not None else onset
        return SeasonalState(state.slots, slot, max(state.open_peak, demand), first)
    slots = state.slots or (SlotStats(),) * size
    if state.open_slot is not None:
        index = _stats_index(state.open_slot, policy)
        folded = _fold(slots[index], state.open_peak, state.open_onset, policy.smoothing)
        slots = (*slots[:index], folded, *slots[index + 1 :])
    return SeasonalState(slots, slot, demand, onset)


def _confident(stats: SlotStats, policy: SeasonalPolicy) -> bool:
    return stats.days >= policy.min_days and stats.busy >= policy.confidence


def expected_return(
    state: SeasonalState,
    now: float,
    lead_seconds: float,
    grace_seconds: float,
    policy: SeasonalPolicy,
) -> SeasonalForecast:
    """A confident return of traffic expected within ``[now - grace, now + lead]``.

    The earliest such return (module docstring) is the forecast: ``confident``, its
    slot's mean peak and share of busy days, ``expected_at`` (the early end of when it
    comes: ``SlotStats.earliest``). Without one the forecast
    is not confident; ``peak`` is None when no slot in the window has ``min_days``
    days, 0 when they have and none is a return.

    Raises:
        ValueError: a negative or non-finite lead or grace.
    """
    for value in (lead_seconds, grace_seconds):
        if not 0 <= value < math.inf:
            raise ValueError(f"lead and grace must be finite and not negative: {value}")
    kinds = 2 if policy.weekly else 1
    if len(state.slots) != kinds * policy.slots_per_day:
        return SeasonalForecast(None, 0.0, 0, False, "no forecast: nothing learned yet")
    width = _width(policy)
    # one slot more: an early return may be expected before a later slot starts
    first = _local_slot(now - grace_seconds, policy)
    # The stats repeat every period of slots (a week's when weekly, else a day's): past
    # one period a longer window holds no return the first period has not, and the walk
    # stays a period's slots (672 by default) whatever lead and grace say.
    period = (7 if policy.weekly else 1) * policy.slots_per_day
    last = min(_local_slot(now + lead_seconds + width, policy), first + period + 1)
    known = 0
    for slot in range(first, last + 1):
        stats = state.slots[_stats_index(slot, policy)]
        known = max(known, stats.days)
        before = state.slots[_stats_index(slot - 1, policy)]
        if not _confident(stats, policy) or _confident(before, policy):
            continue
        start = slot * width - policy.utc_offset_seconds
        at, latest = start + stats.earliest(), start + stats.onset + 2 * stats.spread
        if at - lead_seconds <= now <= latest + grace_seconds:
            reason = (
                f"traffic expected at {clock(at, policy)} (confidence {stats.busy:.2f},"
                f" {stats.days} days, {stats.peak:.1f} replicas)"
            )
            return SeasonalForecast(stats.peak, stats.busy, stats.days, True, reason, at)
    if known < policy.min_days:
        reason = f"no forecast: {known} days seen of these slots, {policy.min_days} needed"
        return SeasonalForecast(None, 0.0, known, False, reason)
    return SeasonalForecast(0.0, 0.0, known, False, "no return of traffic expected")


def clock(t: float, policy: SeasonalPolicy) -> str:
    """``t``'s local time of day as HH:MM (of a ``day_seconds`` day)."""
    into = (t + policy.utc_offset_seconds) % policy.day_seconds
    minutes = math.floor(into / policy.day_seconds * 1440)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"
