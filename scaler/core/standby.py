"""The warm-tier plan in the served decision: sleepers held beside the running replicas.

A ScaledObject with ``standby: true`` has every decision passed through ``with_standby``:
the replay's ``plan_standby`` (``scaler.core.tiers``) over the same inputs the replay's
``StandbyController`` gives it: the desired replicas sampled every ``STANDBY_INTERVAL``
over ``STANDBY_WINDOW`` (the fleet's need) and the pods its plans wanted, the decision's
last activity, the policy's TTFT SLO, and a confident seasonal return
(``Decision.prewarm_forecast``) as the forecast. The
decision then carries the plan's sleepers (``Decision.sleeping_replicas``), its reason
the plan's, and it stays active while any is held: KEDA is asked for running + sleeping
pods, and the gateway puts the sleepers to sleep (``serving.routing.choose_standby``).

The tiers' figures are the profile's (``foundation.replica_model.warm_tiers``); a start
takes ``forecast_horizon_seconds`` (the policy's "about one cold start"), a cache-warm one
the profile's cached start when the ScaledObject prewarms a Fluid Dataset. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from foundation.replica_model import WarmTiers, warm_tiers
from scaler.core.capacity import profile_for
from scaler.core.model import Decision, Policy
from scaler.core.tiers import StandbyInputs, StandbyPolicy, plan_standby
from scaler.core.window import Recent

STANDBY_INTERVAL = 5.0
"""The need is sampled every 5 s (the exporter's scrape interval)."""
STANDBY_WINDOW = 1800.0
"""The need samples the plan sees: 30 min (the attainment loop's long window)."""
SLEEPING = "sleeping"
"""The decision input holding the plan's sleepers (the scaler's telemetry shows it)."""


@dataclass(frozen=True, slots=True)
class StandbySetup:
    """What a ScaledObject's plan is made with: its tiers' figures and the plan's knobs."""

    tiers: WarmTiers
    policy: StandbyPolicy


@dataclass(frozen=True, slots=True)
class StandbyState:
    """The need and pod samples carried from one decision to the next."""

    need: Recent[float] = field(default_factory=Recent)
    next_sample: float = -math.inf
    pods: Recent[int] = field(default_factory=Recent)
    """The plans' ``wanted_pods`` sampled (``StandbyInputs.recent_pods``)."""
    pods_held: int | None = None
    """Running + sleeping of the last plan (``StandbyInputs.pods_held``)."""


def standby_setup(p: Policy, policy: StandbyPolicy, *, cache: bool) -> StandbySetup:
    """The setup for decisions under ``p``; ``cache``: starts read a warm Fluid cache.

    Raises:
        ValueError: ``p`` has no profile (sleepers are priced by its weights and wake
            times) or names one it does not carry.
    """
    profile = profile_for(p)
    if profile is None:
        raise ValueError(
            "standby needs a profile (the replica model whose weights and wake times price"
            " a sleeper): set the trigger's profile or the scaler config's policy.profile"
        )
    tiers = warm_tiers(profile, p.forecast_horizon_seconds)
    # Wake and load times in the replicas' own time (a simulated replica's --speedup).
    speed = p.profile_speedup
    tiers = replace(
        tiers,
        sleeping_wake_seconds=tiers.sleeping_wake_seconds / speed,
        cache_warm_wake_seconds=tiers.cache_warm_wake_seconds / speed,
    )
    return StandbySetup(tiers, replace(policy, cache=policy.cache and cache))


def with_standby(
    decision: Decision, state: StandbyState, setup: StandbySetup, p: Policy, now: float
) -> tuple[Decision, StandbyState]:
    """``decision`` with the plan's sleepers, and the state for the next one."""
    running = decision.desired_replicas
    need, pods = state.need, state.pods
    next_sample = state.next_sample
    sampled = now >= next_sample
    if sampled:
        need = need.within(now, STANDBY_WINDOW).add(now, float(running))
        pods = pods.within(now, STANDBY_WINDOW)
        next_sample = now + STANDBY_INTERVAL
    forecast = decision.prewarm_forecast
    inputs = StandbyInputs(
        now=now,
        desired_running=running,
        recent_need=tuple(need.values()),
        last_activity=decision.state.last_activity,
        slo_ttft_seconds=p.slo_ttft_seconds,
        forecast_peak=forecast if forecast is not None and math.isfinite(forecast) else None,
        max_pods=p.max_replicas,
        recent_pods=pods.samples,
        pods_held=state.pods_held,
    )
    plan = plan_standby(inputs, setup.tiers, setup.policy)
    sleeping, reason = plan.sleeping, plan.reason
    if sampled:
        pods = pods.add(now, plan.wanted_pods)
    numbers = {f"standby_{key}": value for key, value in plan.inputs.items()}
    made = replace(
        decision,
        active=decision.active or sleeping > 0,
        reason=f"{decision.reason}; standby: {reason}",
        inputs={**decision.inputs, **numbers, SLEEPING: float(sleeping)},
        sleeping_replicas=sleeping,
    )
    return made, StandbyState(need, next_sample, pods, running + sleeping)
