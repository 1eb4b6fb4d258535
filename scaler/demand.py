"""Accelerators inference holds and needs per pool, from the scaler's latest decisions.

A ScaledObject that declares ``pool`` and ``acceleratorsPerReplica`` in its trigger
contributes, per pool:

- **held**: the replicas its decision saw (the exporter's count) x accelerators per
  replica;
- **needed**: the most replicas its decision expects: the desired count, or the peak of
  its scale-down window when that is higher (bounded by ``maxReplicas``), plus the
  sleepers its standby plan holds (a sleeping pod keeps its accelerator request), at
  most ``maxReplicas`` pods in all, x accelerators per
  replica. The decision already plans for the short window's demand when it runs
  ahead of the stable one, so a rise is in both; nothing is extrapolated beyond it.

A ScaledObject with no decision (no signals yet, stale ones) or no replica count leaves
its pool's figure unknown (``None``), with the reason, never a smaller sum: a missing
signal must not read as "inference needs nothing here". Pure: plain values in, values
out (``scaler.service`` serves it as ``unitscale.v1.CapacityService``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scaler.core import Decision
from scaler.registry import ScaledObject

MAX_LISTED = 5
"""ScaledObjects an unknown figure's reason names; the rest are counted."""


@dataclass(frozen=True, slots=True)
class Declared:
    """One ScaledObject that declares a pool, and what the registry knows of it."""

    namespace: str
    name: str
    """The ScaledObject's namespace and name."""
    deployment: str
    """The workload it scales (its trigger's ``deployment``)."""
    pool: str
    accelerators_per_replica: float
    max_replicas: int
    forecast_horizon_seconds: float
    """How far ahead its decision plans (its policy's ``forecast-horizon``)."""
    decision: Decision | None
    decided_at: float | None
    """When ``decision`` was made (seconds since the epoch); None without one."""
    unknown: str = ""
    """Why there is no decision (the no-data message); empty with one."""


@dataclass(frozen=True, slots=True)
class DeploymentDemand:
    """One ScaledObject's share of its pool's figures."""

    namespace: str
    name: str
    deployment: str
    replicas_now: int | None
    replicas_needed: int | None
    accelerators_per_replica: float
    reason: str
    """The decision's reason, or why there is none."""
    decided_at: float | None
    forecast_horizon_seconds: float


@dataclass(frozen=True, slots=True)
class InferenceDemand:
    """One pool's figures; a figure is None when some ScaledObject's part is unknown."""

    pool: str
    accelerators_held: float | None
    accelerators_needed: float | None
    unknown: str
    """Which ScaledObjects left a figure unknown, and why; empty when both are known."""
    deployments: tuple[DeploymentDemand, ...]
    decided_at: float | None
    """The oldest decision the figures rest on; None when there is none."""


def declared(scaled: ScaledObject, unconfirmed: str = "") -> Declared | None:
    """What a registry entry contributes, or None when its trigger declares no pool.

    ``unconfirmed`` says why the API server does not (yet) vouch for it
    (``scaler.confirm``): its decision then counts as unknown, with that reason.
    """
    metadata = scaled.metadata
    if metadata.pool is None or metadata.accelerators_per_replica is None:
        return None
    if unconfirmed:
        decision, unknown = None, unconfirmed
    else:
        decision, unknown = scaled.decision, "" if scaled.error is None else str(scaled.error)
    return Declared(
        namespace=scaled.key[0],
        name=scaled.key[1],
        deployment=metadata.deployment,
        pool=metadata.pool,
        accelerators_per_replica=metadata.accelerators_per_replica,
        max_replicas=scaled.policy.max_replicas,
        forecast_horizon_seconds=scaled.policy.forecast_horizon_seconds,
        decision=decision,
        decided_at=scaled.decided_at if decision is not None else None,
        unknown=unknown,
    )


def pool_demand(declared: Iterable[Declared], pool: str = "") -> dict[str, InferenceDemand]:
    """Each pool's figures (only ``pool`` when given), sorted by pool name.

    A pool no ScaledObject declares is absent: the caller tells "unknown pool" apart
    from a pool whose inference needs nothing.
    """
    by_pool: dict[str, list[Declared]] = {}
    for entry in declared:
        if not pool or entry.pool == pool:
            by_pool.setdefault(entry.pool, []).append(entry)
    return {name: _pool(name, by_pool[name]) for name in sorted(by_pool)}


def _pool(pool: str, entries: list[Declared]) -> InferenceDemand:
    parts = tuple(_deployment(e) for e in sorted(entries, key=lambda e: (e.namespace, e.name)))
    unknown = [
        _why_unknown(p) for p in parts if p.replicas_now is None or p.replicas_needed is None
    ]
    times = [p.decided_at for p in parts if p.decided_at is not None]
    return InferenceDemand(
        pool=pool,
        accelerators_held=_total(parts, "replicas_now"),
        accelerators_needed=_total(parts, "replicas_needed"),
        unknown=_cut(unknown),
        deployments=parts,
        decided_at=min(times) if times else None,
    )


def _deployment(entry: Declared) -> DeploymentDemand:
    made = entry.decision
    if made is None:
        now, needed, reason = None, None, entry.unknown or "no decision yet"
    else:
        now, needed, reason = made.current_replicas, _needed(made, entry), made.reason
    return DeploymentDemand(
        namespace=entry.namespace,
        name=entry.name,
        deployment=entry.deployment,
        replicas_now=now,
        replicas_needed=needed,
        accelerators_per_replica=entry.accelerators_per_replica,
        reason=reason,
        decided_at=entry.decided_at,
        forecast_horizon_seconds=entry.forecast_horizon_seconds,
    )


def _needed(made: Decision, entry: Declared) -> int:
    """The desired count, or the window's peak (what a stepped scale-up is heading to).

    Sleepers (``standby``) count too: a sleeping pod keeps its accelerator request. The
    Deployment holds at most ``maxReplicas`` pods, sleepers included.
    """
    peak = max(made.state.need_history.values(), default=0)
    running = max(made.desired_replicas, peak)
    return max(made.desired_replicas, min(running + made.sleeping_replicas, entry.max_replicas))


def _total(parts: tuple[DeploymentDemand, ...], field: str) -> float | None:
    total = 0.0
    for part in parts:
        replicas = getattr(part, field)
        if replicas is None:
            return None
        total += replicas * part.accelerators_per_replica
    return total


def _why_unknown(part: DeploymentDemand) -> str:
    where = f"{part.namespace}/{part.name}"
    if part.replicas_needed is None:
        return f"{where}: {part.reason}"
    return f"{where}: replicas now unknown (no count in its signals)"


def _cut(reasons: list[str]) -> str:
    shown = reasons[:MAX_LISTED]
    if len(reasons) > MAX_LISTED:
        shown.append(f"and {len(reasons) - MAX_LISTED} more")
    return "; ".join(shown)
