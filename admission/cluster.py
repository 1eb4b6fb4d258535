"""What one pass of the admission check reads and returns (pure).

The cluster as the API server's JSON (``Cluster``: each object's JSON shape is checked
once, as it is made), the checks pending on it (``Pending``), the inference figures asked
of the scaler (``PoolDemand``), and what a pass returns: a ``Decision`` per pending check
and a ``CheckPlan`` per reclaiming check. Shared by the check's decision
(``admission.decide``) and the capacity manager (``admission.manager``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from admission import incremental, shape
from admission.parameters import Parameters
from admission.pool import PoolPlan
from admission.workload import (
    pods_by_owner,
)
from foundation.objects import RawObject

State = Literal["Pending", "Ready", "Retry", "Rejected"]
Ask = tuple[str, str, int]
"""What a check asks the scaler: (scaler address, pool, horizon seconds)."""


@dataclass(frozen=True)
class PoolDemand:
    """One pool's figures, both known."""

    pool: str
    accelerators_held: float
    """What inference replicas on the pool hold now."""
    accelerators_needed: float
    """The most inference is forecast to need within the horizon."""


@dataclass(frozen=True)
class Pending:
    """One of our checks a workload holds as Pending, with quota reserved."""

    workload: RawObject
    check: str
    parameters: Parameters
    pending_since: float
    """Unix seconds the check entry became Pending (its ``lastTransitionTime``)."""


@dataclass(frozen=True)
class Cluster:
    """Everything the decision reads, as the API server's JSON."""

    nodes: Sequence[RawObject]
    pods: Sequence[RawObject]
    workloads: Sequence[RawObject]
    datasets: Sequence[RawObject]
    dataloads: Sequence[RawObject]
    demand: Mapping[str, PoolDemand] | None
    """Inference demand per pool; None: the scaler could not be asked."""
    demand_error: str = ""
    asked: Mapping[Ask, PoolDemand] | None = None
    """The figures by ask (scaler, pool, horizon), the controller's: when set, each check
    reads its own ask's, never ``demand``. Another check's ask of the same pool (another
    scaler, another horizon) made the pool unknown for both (hostile pass 5, M3)."""
    our_checks: frozenset[str] = frozenset()
    """Every AdmissionCheck of ours (gangs any of them admitted hold their GPUs); the
    pending checks' names when empty."""
    check_parameters: Mapping[str, Parameters] = field(default_factory=dict)
    """Our checks' parameters, where usable: a gang holds GPUs only in its own check's
    pool (one of ours with unusable parameters: in every pool, to be safe)."""
    lora_density: Mapping[str, int] = field(default_factory=dict)
    """Tenants per instance by base model, for checks with ``lora.adaptive`` (the
    controller's ``admission.density``); a model absent takes ``tenantsPerInstance``."""
    datasets_served: bool = True
    """False: the API server serves no Fluid Datasets (Fluid is not installed), so a
    Workload naming one is told that, not that its Dataset does not exist."""
    plans: Mapping[str, CheckPlan] | None = None
    """The capacity manager's plan per check with reclaim enabled (``plan_pools``); None:
    ``decide_all`` and ``reclaim_all`` make them (a caller that also exports them passes
    them in, so they are made once a pass)."""
    pod_index: Mapping[str, list[RawObject]] | None = None
    """``workload.pods_by_owner(pods)``; None: each entry point builds it (a caller making
    one pass of several passes it in, so it is built once a pass)."""
    memo: incremental.Memo | None = field(default=None, compare=False)
    """Pools and fit answers kept from earlier passes (``admission.incremental``); None:
    everything is built afresh."""
    malformed: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """``(subject, why)`` of each object left out for its JSON shape (``admission.shape``)."""
    shaped: bool = field(default=False, compare=False)
    """True: every object passed ``shape.well_formed`` already, where it crossed in (the
    controller's snapshot); False: each is checked here."""

    def __post_init__(self) -> None:
        # The shape boundary: an object of the wrong shape is left out here, once, so no
        # helper meets it (one used to fail the pass, or every check of its pool).
        if self.shaped:
            return
        dropped = list(self.malformed)
        for kind, name in _SHAPED:
            kept, bad = shape.well_formed(kind, getattr(self, name))
            if bad:
                object.__setattr__(self, name, kept)
                dropped.extend(bad)
        object.__setattr__(self, "malformed", tuple(dropped))


_SHAPED = (
    ("node", "nodes"),
    ("pod", "pods"),
    ("workload", "workloads"),
    ("dataset", "datasets"),
    ("dataload", "dataloads"),
)


def indexed(cluster: Cluster) -> Cluster:
    """The cluster with its pod index built (the same cluster when it has one)."""
    if cluster.pod_index is not None:
        return cluster
    return replace(cluster, pod_index=pods_by_owner(cluster.pods))


def pod_index_of(cluster: Cluster) -> Mapping[str, list[RawObject]]:
    return cluster.pod_index if cluster.pod_index is not None else pods_by_owner(cluster.pods)


@dataclass(frozen=True)
class CheckPlan:
    """The capacity manager's plan for the pool of one check with reclaim enabled."""

    check: str
    pool: str
    """The scaler's pool name (``inferenceHeadroom.pool``)."""
    plan: PoolPlan
    entries: Mapping[str, str]
    """Per admitted workload (``namespace/name``), the check of ours holding it Ready: the
    entry a reclaim sets to Retry."""
    failed: str = ""
    """Non-empty: planning raised (this says what); the plan is unknown, reclaims nothing,
    and the check's pending workloads are not decided this pass."""


@dataclass(frozen=True)
class Decision:
    """The new state of one workload's check, and what to create before writing it."""

    namespace: str
    workload: str
    check: str
    state: State
    message: str
    requeue_after_seconds: int | None = None
    pod_set_updates: tuple[RawObject, ...] = ()
    create: tuple[RawObject, ...] = ()
    failed: str = ""
    """Non-empty: deciding raised (this says what): nothing is written, the next pass
    decides again. ``state`` is then ``Pending`` and ``message`` says so."""


def error_text(err: BaseException) -> str:
    """An exception as a failed round's message: its class and a bounded text."""
    return f"{type(err).__name__}: {str(err)[:300]}"


def pool_group(p: Parameters) -> tuple[Any, ...]:
    """Checks with the same pool selector and handshake limit share one inventory."""
    return (tuple(sorted(p.pool_node_selector.items())), p.handshake_timeout_seconds)


def our_checks(cluster: Cluster, pending: Sequence[Pending] = ()) -> dict[str, Parameters | None]:
    """Every check of ours with its parameters (None: unusable now)."""
    checks: dict[str, Parameters | None] = dict.fromkeys(cluster.our_checks)
    checks.update(cluster.check_parameters)
    checks.update((p.check, p.parameters) for p in pending)
    return checks
