"""KEDA's and the HPA's arithmetic, as pure functions of time and the scaler's answers.

- KEDA polling (``pollingInterval``, default 30 s): active with 0 replicas -> 1 (or
  ``minReplicaCount``); inactive for ``cooldownPeriod`` (300 s) -> 0. A scaler error
  changes nothing (no fallback configured). ``external-push`` activates at once.
- HPA sync (15 s) while replicas >= 1, AverageValue: ``ceil(value / target)`` unless
  ``value / (target * replicas)`` is within the 10% tolerance of 1; scale-up limited to
  max(+4 pods, +100%) per 15 s; scale-down to the highest recommendation of the last
  300 s (stabilization), then at most -100% per 15 s.
Sources: kubernetes pkg/controller/podautoscaler (replica_calculator.go, defaults.go);
kedacore/keda pkg/scaling/executor/scale_scaledobjects.go (see keda-external-scaler.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScalingSpec:
    """A ScaledObject's scaling settings and the HPA behaviour it gets."""

    min_replicas: int = 0
    max_replicas: int = 100
    polling_interval: float = 30.0
    cooldown: float = 300.0
    hpa_sync: float = 15.0
    tolerance: float = 0.1
    scale_down_stabilization: float = 300.0
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_down_percent: float = 100.0


@dataclass(frozen=True, slots=True)
class Answer:
    """What the scaler answered: the metric and target (HPA), activity (KEDA).

    ``value`` or ``active`` None means the call failed (UNAVAILABLE): KEDA and the HPA
    keep the current replicas.
    """

    value: float | None
    target: float
    active: bool | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LoopState:
    """What KEDA and the HPA remember between evaluations."""

    last_active: float = -math.inf
    recommendations: tuple[tuple[float, int], ...] = ()


def keda_poll(
    replicas: int, answer: Answer, state: LoopState, now: float, spec: ScalingSpec
) -> tuple[int, LoopState]:
    """One KEDA operator poll: 0 -> 1 on activity, N -> 0 after the cooldown."""
    if replicas < spec.min_replicas:
        return spec.min_replicas, state  # KEDA keeps minReplicaCount whatever the scaler says
    if answer.active is None:
        return replicas, state  # a scaler error never scales to zero
    if answer.active:
        state = LoopState(now, state.recommendations)
        if replicas == 0:
            return max(spec.min_replicas, 1), state
        return replicas, state
    if replicas > 0 and spec.min_replicas == 0 and now - state.last_active >= spec.cooldown:
        return 0, LoopState(state.last_active, ())
    return replicas, state


def hpa_sync(
    replicas: int, answer: Answer, state: LoopState, now: float, spec: ScalingSpec
) -> tuple[int, LoopState]:
    """One HPA evaluation of an AverageValue external metric."""
    if replicas == 0 or answer.value is None:
        return replicas, state
    value = max(0.0, answer.value)  # KEDA clamps negatives (v2.20.2)
    ratio = value / (answer.target * replicas)
    wanted = (
        replicas if abs(1.0 - ratio) <= spec.tolerance else math.ceil(value / answer.target - 1e-9)
    )
    wanted = min(max(wanted, max(spec.min_replicas, 1)), spec.max_replicas)
    window = tuple(
        (t, r) for t, r in state.recommendations if now - t < spec.scale_down_stabilization
    )
    window += ((now, wanted),)
    stabilized = wanted if wanted > replicas else min(replicas, max(r for _, r in window))
    up_limit = max(
        replicas + spec.scale_up_pods, math.ceil(replicas * (1 + spec.scale_up_percent / 100))
    )
    down_limit = math.floor(replicas * (1 - spec.scale_down_percent / 100))
    desired = min(
        max(stabilized, down_limit, max(spec.min_replicas, 1)), up_limit, spec.max_replicas
    )
    return desired, LoopState(state.last_active, window)
