"""Headroom steered by attainment: the share of requests the gateway saw within the SLO.

The planner sizes the fleet for its need times ``1 + headroom``; this stage moves the
headroom, the one variable the SLO controls. What it corrects is a fleet slower than the
profile the planner sizes it with (a calibration taken elsewhere, noisy neighbours, a
longer mix): on replicas 25% slower than their profile it holds 99.5-99.7% where the
planner alone falls to 92-97% (``bench/ablation.py``). Bursts are the burst tier's
(sleepers the gateway wakes), not this loop's. Each decision reads the requests the
gateway judged over its window (``Observation.slo_within_rate``, ``slo_outside_rate``)
and keeps those readings over ``lookback_seconds``, the long window:

- **burning** (both windows below the target, with at least ``MIN_JUDGED_RATE``
  requests judged per second): the headroom rises by ``step`` for each allowance of misses the
  gateway's window shows (at most 10), at most to ``headroom_max``, and at most once a
  ``rise_interval_seconds``, so that the replicas a rise bought (a cold start away) show
  before the next one. A short window alone does not rise: the SLO is judged over hours, and one
  unlucky minute of a fleet within it is noise.
- **starting** (replicas the fleet was asked for are still starting, or, with a burst
  tier, the load outran the count asked for within ``decide.SHORTFALL_WINDOWS`` of the
  gateway's windows): no rise; their misses are the cold start's or the burst's, which
  headroom would have cured only by being held all day before it (Azure
  conversation x25: 1.49x the static fleet's cost against 1.61x, at the same 98.7%; the
  business day 99.6% against 99.8%, for 3% less).
- **margin** (the gateway's window's misses at most half the allowance): it falls back
  towards 0, halving every ``fall_half_life_seconds`` (minutes: a fleet that is too
  slow misses again within one, and the rise comes back). The long window need not
  have margin: misses already counted are not bought back with replicas now (Azure
  conversation x25, whose first two minutes miss 1.3% of the hour: 1.86x the static
  fleet's cost holding the headroom until the long window recovered, 1.61x letting it
  fall, at the same 98.7%).
- otherwise, or with too few requests judged, or no judgement at all (no gateway): it
  holds. An unknown attainment is never read as a met one.

Worked numbers, target 0.99 (1% of misses allowed), step 0.1, half-life 300 s: the
long window is at 98.5% and the gateway's shows 60 requests/s within and 3 outside
(4.8% missed: 4.8 allowances); the headroom goes from 0.20 to 0.20 + 0.1 x 4.8 = 0.68.
Later, with the gateway's window at 100%, 150 s after the last move:
0.68 x 0.5 ** (150 / 300) = 0.48.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from scaler.core.window import Recent

MIN_JUDGED_RATE = 1.0 / 3.0
"""Requests judged per second (20 a minute) below which the gateway's attainment moves
nothing: a handful of requests is no evidence either way."""
MAX_ALLOWANCES = 10.0
"""One window's misses count at most this many allowances: a rise stays a step."""


@dataclass(frozen=True, slots=True)
class Steering:
    """The knobs of the attainment loop (``Policy`` carries them)."""

    target: float = 0.99
    step: float = 0.1
    headroom_max: float = 1.0
    fall_half_life_seconds: float = 300.0
    rise_interval_seconds: float = 60.0
    """The least time between two rises: the gateway's window (``slo.window``, 60 s)."""
    lookback_seconds: float = 1800.0
    """The long window the SLO is judged over."""


@dataclass(frozen=True, slots=True)
class Headroom:
    """The controlled variable, when it last moved and rose, and the readings behind it."""

    value: float = 0.0
    since: float = -math.inf
    raised: float = -math.inf
    """When it last rose: the next rise waits a window, for the fleet it bought to show."""
    judged: Recent[tuple[float, float]] = field(default_factory=Recent)
    """The gateway's (within, outside) rates at each decision over the long window."""


@dataclass(frozen=True, slots=True)
class Move:
    """One decision's step: the new headroom, the attainments read, and why."""

    headroom: Headroom
    attainment: float | None
    """The gateway's window's; None when unknown or too few requests were judged."""
    long_run: float | None
    """The long window's."""
    reason: str | None
    """Set when the headroom rose."""


def steer(
    previous: Headroom,
    within_rate: float | None,
    outside_rate: float | None,
    now: float,
    s: Steering,
    starting: bool = False,
) -> Move:
    """The headroom after the gateway's latest judgement.

    ``starting``: replicas the fleet was asked for are still starting; misses then are
    the cold start's, which more headroom would not cure, so the headroom does not rise.
    """
    if within_rate is None or outside_rate is None:
        return Move(previous, None, None, None)
    if within_rate + outside_rate < MIN_JUDGED_RATE:
        return Move(previous, None, None, None)
    judged = previous.judged.within(now, s.lookback_seconds).add(now, (within_rate, outside_rate))
    held = replace(previous, since=now, judged=judged)
    attainment = within_rate / (within_rate + outside_rate)
    readings = judged.values()
    inside = sum([w for w, _ in readings])
    long_run = inside / (inside + sum([o for _, o in readings]))
    allowed = 1.0 - s.target
    allowances = (1.0 - attainment) / allowed
    if attainment < s.target and long_run < s.target:
        if starting or now - previous.raised < s.rise_interval_seconds:
            return Move(held, attainment, long_run, None)
        raised = min(previous.value + s.step * min(allowances, MAX_ALLOWANCES), s.headroom_max)
        why = (
            f"attainment {attainment:.1%} ({long_run:.2%} over {s.lookback_seconds:.0f}s)"
            f" < {s.target:.0%}: headroom {raised:.0%}"
        )
        return Move(replace(held, value=raised, raised=now), attainment, long_run, why)
    if allowances <= 0.5 and previous.value > 0:
        elapsed = now - previous.since if math.isfinite(previous.since) else 0.0
        lowered = previous.value * 0.5 ** (max(elapsed, 0.0) / s.fall_half_life_seconds)
        return Move(
            replace(held, value=lowered if lowered >= 0.005 else 0.0), attainment, long_run, None
        )
    return Move(held, attainment, long_run, None)
