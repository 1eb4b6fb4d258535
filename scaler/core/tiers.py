"""What to hold besides the running replicas: sleeping ones, a warm cache, or nothing.

``decide`` says how many replicas run. This plan says what else to hold so that the next
scale-out, or the first request after idle, finds capacity fast (the figures, with their
sources, are ``foundation.replica_model.WarmTiers``):

- **running**: exactly the decision's desired count; the plan adds, it never removes.
- **sleeping** (vLLM sleep level 1: weights in host memory, accelerator freed, wake in
  about a second for 8B, 4 s for 32B): the k-th replica above the running ones sleeps
  when ``p_k``, the share of the recent window in which the fleet needed at least
  ``running + k`` replicas, is at least a sleeper's hour over an accelerator-hour (the
  break-even: a running spare is as fast, but is worth its accelerator only ``p_k`` of the
  time; a sleeper costs its host memory all of the time). At zero replicas the first
  replica of a return counts as needed (``p_1 = 1``) until ``release_after_seconds`` of
  idle, which is what that knob promises; a forecast of ``n`` replicas counts the first
  ``n`` as needed. Besides, at least ``burst_sleepers`` per running replica sleep (one
  running counted at zero), up to ``max_sleeping``: a burst the window never saw finds
  replicas a wake away, which the gateway wakes under pressure before the scaler's next
  decision (``serving.routing.sleepers_to_wake``). And pods are kept: as many sleep as
  keep the pods (running + sleeping) at the most the plan wanted within the hold time, a
  start's accelerator-seconds over a sleeper's cost per second (about 20 minutes for 8B
  from the cache). A replica the plan no longer wants then sleeps rather than stops, and
  a count flapping 5, 6, 5 reloads no sleeper each time: dropped at once, 79 loads of a
  25 s cache-warm start in a business day, 57 kept (tuned unitscale judged on day 3:
  US$ 0.0583 per 1M tokens at 99.15% -> 0.0560 at 99.37%). Pods are kept, never started
  to be kept: no more than the last plan held (``pods_held``), so a step up that takes a
  sleeper loads another only if the plan wants one on its own (at ``max_sleeping`` each
  step up and down loaded one and stopped one: 57 loads -> 48, US$ 0.0553 at 99.42%).
- **cache-warm**: one copy of the weights in the node's Fluid cache makes every start
  that is not a wake a cache-warm one; held while traffic was seen within
  ``release_after_seconds`` (no DataLoad churn across short idles).
- **cold**: everything else.

A tier is not held when it is no faster than the next slower one, or when the slower one
already fits the TTFT SLO. Idle for ``release_after_seconds`` with no forecast of a
return: nothing is held. Pure: time passed in, a plan and its reason returned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from foundation.replica_model import WarmTiers


@dataclass(frozen=True, slots=True)
class StandbyPolicy:
    """The knobs of the standby plan."""

    sleeping: bool = True
    """Whether replicas may sleep (the engine runs with ``--enable-sleep-mode``)."""
    cache: bool = True
    """Whether a Fluid cache of the weights may be held warm."""
    max_sleeping: int = 4
    """At most this many sleepers (each holds its weights in host memory)."""
    burst_sleepers: float = 0.0
    """At least this many sleepers per running replica (up to ``max_sleeping``); 2 holds
    a burst to three times the load a wake away. Each costs its host memory, and a
    start whenever a scale-up takes it (``bench/ablation.py``: without it the Azure code
    trace's unforeseen bursts miss the SLO)."""
    release_after_seconds: float = 3600.0
    """Idle this long (no request at all) and nothing is held any more."""

    @property
    def burst_tier(self) -> bool:
        """Sleepers are held for bursts: some per running replica, and room for one."""
        return self.burst_sleepers > 0 and self.max_sleeping > 0

    def __post_init__(self) -> None:
        if self.max_sleeping < 0:
            raise ValueError(f"max_sleeping must not be negative: {self.max_sleeping}")
        if not 0 <= self.burst_sleepers < math.inf:
            raise ValueError(f"burst_sleepers must be finite and >= 0: {self.burst_sleepers}")
        if not self.release_after_seconds >= 0:
            raise ValueError(
                f"release_after_seconds must not be negative: {self.release_after_seconds}"
            )


@dataclass(frozen=True, slots=True)
class StandbyInputs:
    """What the plan is made from, at ``now``."""

    now: float
    desired_running: int
    """The scaling decision's replicas."""
    recent_need: Sequence[float]
    """Replicas the fleet needed, sampled evenly over a recent window (0 while idle)."""
    last_activity: float
    """When a request was last seen (arrived, buffered or in flight)."""
    slo_ttft_seconds: float
    forecast_peak: float | None = None
    """Replicas a forecast expects before ``release_after_seconds``; None: no forecast."""
    max_pods: int | None = None
    """KEDA's ``maxReplicaCount``: sleepers are pods of the Deployment, so running +
    sleeping is at most this (a sleeper beyond it is never there to wake); None: no cap."""
    recent_pods: Sequence[tuple[float, int]] = ()
    """``(time, StandbyPlan.wanted_pods)`` of the plans before this one, oldest first
    (``kept_seconds`` back are read)."""
    pods_held: int | None = None
    """Running + sleeping as the last plan held them (the pods KEDA was asked for). Pods
    are kept, never started to be kept: a step up takes a sleeper, and the plan loads
    another only if it wants one on its own. None: unknown (the first plan)."""


@dataclass(frozen=True, slots=True)
class StandbyPlan:
    """Replicas per tier, and why."""

    running: int
    sleeping: int
    cache_warm: bool
    reason: str
    inputs: dict[str, float] = field(default_factory=dict)
    wanted_pods: int = 0
    """Running + the sleepers this plan wants on its own, none kept for earlier plans:
    what later plans keep (``StandbyInputs.recent_pods``). Kept pods recorded as held
    would keep themselves for good."""


def plan_standby(inputs: StandbyInputs, tiers: WarmTiers, policy: StandbyPolicy) -> StandbyPlan:
    """The replicas to hold running and sleeping, and whether to keep the cache warm."""
    running = max(0, inputs.desired_running)
    idle_for = max(0.0, inputs.now - inputs.last_activity)
    forecast = 0 if inputs.forecast_peak is None else math.ceil(inputs.forecast_peak - 1e-9)
    numbers = {
        "idle_seconds": idle_for,
        "forecast_replicas": float(forecast),
        "sleeper_break_even": _break_even(tiers),
    }
    if idle_for >= policy.release_after_seconds and forecast <= running:
        reason = (
            f"running {running}; nothing held: idle for {idle_for:.0f}s"
            f" (release after {policy.release_after_seconds:.0f}s) and no return forecast"
        )
        return StandbyPlan(running, 0, False, reason, numbers, running)
    cache, cache_why = _cache(tiers, policy, inputs.slo_ttft_seconds)
    sleeping, wanted, sleep_why = _sleepers(inputs, tiers, policy, running, forecast, cache)
    if inputs.max_pods is not None and sleeping > max(inputs.max_pods - running, 0):
        sleeping = max(inputs.max_pods - running, 0)
        sleep_why += f"; {sleeping} held: maxReplicas {inputs.max_pods} counts sleepers as pods"
    reason = f"running {running}; {sleeping} sleeping ({sleep_why}); {cache_why}"
    return StandbyPlan(running, sleeping, cache, reason, numbers, running + min(wanted, sleeping))


def _break_even(tiers: WarmTiers) -> float:
    """The share of time a spare must be needed for a sleeper to cost less than it saves."""
    if tiers.running_per_hour <= 0:
        return math.inf if tiers.sleeping_per_hour > 0 else 0.0
    return tiers.sleeping_per_hour / tiers.running_per_hour


def _cache(tiers: WarmTiers, policy: StandbyPolicy, slo_ttft: float) -> tuple[bool, str]:
    if not policy.cache:
        return False, "no cache (disabled)"
    if tiers.cache_warm_wake_seconds >= tiers.cold_wake_seconds:
        return False, (
            f"no cache: a cache-warm start ({tiers.cache_warm_wake_seconds:.1f}s) is no faster"
            f" than a cold one ({tiers.cold_wake_seconds:.1f}s)"
        )
    if tiers.cold_wake_seconds <= slo_ttft:
        return False, f"no cache: a cold start ({tiers.cold_wake_seconds:.1f}s) fits the TTFT SLO"
    return True, (
        f"cache warm: starts take {tiers.cache_warm_wake_seconds:.1f}s"
        f" instead of {tiers.cold_wake_seconds:.1f}s"
    )


def _sleepers(
    inputs: StandbyInputs,
    tiers: WarmTiers,
    policy: StandbyPolicy,
    running: int,
    forecast: int,
    cache: bool,
) -> tuple[int, int, str]:
    """How many replicas above ``running`` sleep, and why that many.

    Also how many of them the plan wants on its own (the rest kept for earlier plans).
    """
    if not policy.sleeping or policy.max_sleeping == 0:
        return 0, 0, "sleeping disabled"
    start = tiers.cache_warm_wake_seconds if cache else tiers.cold_wake_seconds
    if tiers.sleeping_wake_seconds >= start:
        return 0, 0, f"a sleeper wakes no faster ({tiers.sleeping_wake_seconds:.1f}s) than a start"
    if start <= inputs.slo_ttft_seconds:
        return 0, 0, f"a start ({start:.1f}s) fits the TTFT SLO"
    break_even = _break_even(tiers)
    needs = [math.ceil(n - 1e-9) for n in inputs.recent_need if math.isfinite(n)]
    count, last_share = 0, 0.0
    for k in range(1, policy.max_sleeping + 1):
        level = running + k
        share = sum(1 for n in needs if n >= level) / len(needs) if needs else 0.0
        if forecast >= level or (running == 0 and k == 1):
            share = 1.0
        if share <= 0 or share < break_even:
            break
        count, last_share = k, share
    burst = min(policy.max_sleeping, math.ceil(policy.burst_sleepers * max(running, 1) - 1e-9))
    hold = kept_seconds(tiers, start)
    held = max((p for t, p in inputs.recent_pods if inputs.now - t <= hold), default=0)
    if inputs.pods_held is not None:
        held = min(held, inputs.pods_held)
    kept = min(policy.max_sleeping, held - running)
    wanted = max(burst, count)
    if kept > wanted:
        return (
            kept,
            wanted,
            (
                f"{held} pods wanted within {hold:.0f}s: a start's accelerator time costs as"
                " much as a sleeper held that long"
            ),
        )
    if burst > count:
        return (
            burst,
            burst,
            (
                f"wake {tiers.sleeping_wake_seconds:.1f}s; {policy.burst_sleepers:g} per running"
                f" replica for a burst"
            ),
        )
    if count == 0:
        return 0, 0, f"no replica above {running} was needed {break_even:.1%} of the window"
    return (
        count,
        count,
        (
            f"wake {tiers.sleeping_wake_seconds:.1f}s; replica {running + count} was needed"
            f" {last_share:.0%} of the window, above the {break_even:.1%} break-even"
        ),
    )


def kept_seconds(tiers: WarmTiers, start_seconds: float) -> float:
    """How long a pod is worth keeping asleep rather than starting again.

    A start's accelerator-seconds over a sleeper's cost per second (``inf`` when a
    sleeper costs nothing).

    Example: 8B, cache-warm starts of 25.3 s at US$ 3.50/h, a sleeper US$ 0.0723/h:
    25.3 * 3.50 / 0.0723 = 1,225 s.
    """
    if tiers.sleeping_per_hour <= 0:
        return math.inf
    return start_seconds * tiers.running_per_hour / tiers.sleeping_per_hour
