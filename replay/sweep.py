"""Policies compared at equal SLO: each one's main knob swept, and its cost at the SLO target.

A policy's default run answers "what does it cost as shipped", but one that misses the
SLO is cheap for the wrong reason, and one that over-provisions may only need a knob
turned. ``sweep_knobs`` gives a few points around each policy's default (its main knobs,
``replay.run.KNOBS``), ``run_sweep`` replays them, and ``cost_at_slo`` reports the
cheapest point reaching the SLO target, or, when none does, the best SLO it reached
("not reached"). The points, as multiples of each default:

- ``unitscale``: the utilization it plans with (trigger metadata: ``profileUtilization``
  with a replica profile, as the replay runs it, else ``targetUtilization``;
  ``unitscale_utilization``) x 0.5, 0.7, 1.2 (at most 1);
- ``kpa``: ``target`` x 1/4, 1/2, 2 at the default delay, and ``scale_down_delay`` 0 s
  and 900 s at the default target (two one-knob sweeps through the default);
- ``production-stack``: ``threshold`` x 0.2, 0.4, 2;
- ``aibrix-kv``: ``target`` x 1/3, 2/3, 2;
- ``static-peak``: ``replicas`` n - 2, n - 1 and ceil(1.25 n) around n, the smallest
  fleet meeting the target (within 1 and ``max_replicas``).

Together with the default run: 4 to 6 points a policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from replay.policies import AibrixKv, Kpa, ProductionStack
from replay.run import KNOBS, ReplayOptions, make_policy
from replay.simulate import Result, SimConfig, simulate
from replay.trace import Trace
from scaler.core.capacity import PRIORS
from scaler.core.model import Policy as CorePolicy

UTILIZATION_FACTORS = (0.5, 0.7, 1.2)
KPA_TARGET_FACTORS = (0.25, 0.5, 2.0)
KPA_DELAYS = (0.0, 900.0)
THRESHOLD_FACTORS = (0.2, 0.4, 2.0)
KV_TARGET_FACTORS = (1 / 3, 2 / 3, 2.0)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Point:
    """One policy run at one setting of its knobs: what it cost and the SLO it met."""

    policy: str
    knobs: Mapping[str, Any]
    """``make_policy`` keywords; empty for the default run."""
    cost_per_million_tokens: float
    gpu_hours: float
    slo_attainment: float
    default: bool = False

    @property
    def label(self) -> str:
        """The knobs as ``key=value, ...`` (trigger metadata flattened), or ``default``."""
        if self.default or not self.knobs:
            return "default"
        return ", ".join(f"{k}={_text(v)}" for k, v in _flat(self.knobs))


def point_of(policy: str, knobs: Mapping[str, Any], result: Result, default: bool = False) -> Point:
    """The point a run of ``policy`` with ``knobs`` made."""
    m = result.metrics
    return Point(
        policy,
        dict(knobs),
        float(m["cost_per_million_tokens"]),
        float(m["gpu_hours"]),
        float(m["slo_attainment"]),
        default,
    )


@dataclass(frozen=True, slots=True)
class CostAtSlo:
    """A policy's cost at the SLO target: its cheapest point reaching it, or its closest."""

    policy: str
    target: float
    reached: bool
    point: Point
    """The cheapest point reaching ``target``; if none did, the one with the best SLO."""
    points: tuple[Point, ...] = field(default=(), repr=False)

    def describe(self) -> str:
        """``0.1234 (target=16)``, or ``not reached (best SLO 0.9612 at target=8)``."""
        if self.reached:
            return f"{self.point.cost_per_million_tokens:.4f} ({self.point.label})"
        return f"not reached (best SLO {self.point.slo_attainment:.4f} at {self.point.label})"


def cost_at_slo(points: Sequence[Point], target: float) -> CostAtSlo:
    """The cheapest of ``points`` (one policy's) whose SLO attainment is at least ``target``.

    Of equally cheap points, the better SLO. If none reaches the target, the point with
    the best SLO (of equals, the cheaper) and ``reached`` false. A point without an SLO
    (NaN: no requests) reaches nothing.

    Raises:
        ValueError: no points, points of more than one policy, or a target outside (0, 1].
    """
    if not points:
        raise ValueError("cost_at_slo: no points")
    if not 0 < target <= 1:
        raise ValueError(f"cost_at_slo: target={target:g} must be above 0 and at most 1")
    policies = sorted({p.policy for p in points})
    if len(policies) > 1:
        raise ValueError(f"cost_at_slo: points of more than one policy: {', '.join(policies)}")
    reaching = [p for p in points if p.slo_attainment >= target]
    if reaching:
        best = min(reaching, key=lambda p: (p.cost_per_million_tokens, -p.slo_attainment))
        return CostAtSlo(policies[0], target, True, best, tuple(points))
    closest = min(
        points,
        key=lambda p: (
            -(p.slo_attainment if math.isfinite(p.slo_attainment) else -1.0),
            p.cost_per_million_tokens,
        ),
    )
    return CostAtSlo(policies[0], target, False, closest, tuple(points))


def frontier(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats on both cost and SLO, cheapest first.

    A point stays if every cheaper (or equally cheap) point met a lower SLO: the cost of
    each level of SLO the policy can reach, what a frontier plot connects.
    """
    finite = [p for p in points if math.isfinite(p.slo_attainment)]
    ordered = sorted(finite, key=lambda p: (p.cost_per_million_tokens, -p.slo_attainment))
    kept: list[Point] = []
    for p in ordered:
        if not kept or p.slo_attainment > kept[-1].slo_attainment:
            kept.append(p)
    return kept


def unitscale_utilization(metadata: Mapping[str, str], defaults: CorePolicy) -> tuple[str, float]:
    """The utilization the unitscale policy plans with: its metadata key and its value.

    With a replica profile (the metadata's ``profile`` or the config's) the scaler plans
    for ``profileUtilization`` of each replica's SLO capacity and ``targetUtilization``
    no longer sizes the fleet; without one, ``targetUtilization``. The value is the
    metadata's, else the config's (``defaults``).
    """
    if (metadata.get("profile") or defaults.profile) not in (None, PRIORS):
        return "profileUtilization", float(
            metadata.get("profileUtilization", defaults.profile_utilization)
        )
    return "targetUtilization", float(
        metadata.get("targetUtilization", defaults.target_utilization)
    )


def sweep_knobs(
    name: str,
    *,
    utilization: tuple[str, float] = ("targetUtilization", CorePolicy().target_utilization),
    static_replicas: int,
    max_replicas: int,
) -> list[dict[str, Any]]:
    """The knob settings to sweep for ``name`` besides its default (module docstring).

    Args:
        name: a policy of ``replay.run.KNOBS``.
        utilization: the unitscale policy's utilization key and default
            (``unitscale_utilization``).
        static_replicas: the smallest static fleet meeting the SLO target.
        max_replicas: the fleet's ceiling.

    Raises:
        ValueError: a name with no knobs (the bounds, or unknown).
    """
    if name not in KNOBS:
        raise ValueError(f"{name} has no knobs to sweep; the policies that do: {', '.join(KNOBS)}")
    if name == "unitscale":
        key, default = utilization
        levels = (min(1.0, round(default * f, 2)) for f in UTILIZATION_FACTORS)
        return [{"metadata": {key: f"{u:g}"}} for u in _distinct(levels)]
    if name == "kpa":
        targets = [{"target": Kpa().target * f} for f in KPA_TARGET_FACTORS]
        delays = [{"scale_down_delay": d} for d in KPA_DELAYS if d != Kpa().scale_down_delay]
        return targets + delays
    if name == "production-stack":
        return [{"threshold": ProductionStack().threshold * f} for f in THRESHOLD_FACTORS]
    if name == "aibrix-kv":
        return [{"target": round(AibrixKv().target * f, 4)} for f in KV_TARGET_FACTORS]
    n = static_replicas
    sizes = (n - 2, n - 1, math.ceil(1.25 * n))
    return [{"replicas": s} for s in _distinct(sizes) if 1 <= s <= max_replicas and s != n]


def run_sweep(
    trace: Trace,
    name: str,
    knob_sets: Sequence[Mapping[str, Any]],
    config: SimConfig,
    options: ReplayOptions,
    initial_replicas: int = 0,
) -> list[Point]:
    """Replay ``name`` at each of ``knob_sets`` in turn (an empty one is the default run)."""
    points = []
    for knobs in knob_sets:
        policy = make_policy(name, config, options, **knobs)
        result = simulate(trace, policy, config, initial_replicas=initial_replicas)
        points.append(point_of(name, knobs, result, default=not knobs))
    return points


def _distinct(values: Iterable[T]) -> list[T]:
    seen: list[T] = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def _flat(knobs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for key, value in knobs.items():
        pairs += _flat(value) if isinstance(value, Mapping) else [(key, value)]
    return pairs


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
