"""Stand-in for ``admission.decide`` (the lead's, not yet in the tree) with its agreed shapes.

``install()`` puts it in ``sys.modules`` only when the real module cannot be imported, so
the controller's tests run now and use the real one once it lands. Its ``decide_all``
refuses to be called: every test that needs decisions passes its own.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from admission.parameters import Parameters

RawObject = dict[str, Any]


@dataclass(frozen=True)
class PoolDemand:
    pool: str
    accelerators_held: float
    accelerators_needed: float


@dataclass(frozen=True)
class Pending:
    workload: RawObject
    check: str
    parameters: Parameters
    pending_since: float


@dataclass(frozen=True)
class Cluster:
    nodes: Sequence[RawObject]
    pods: Sequence[RawObject]
    workloads: Sequence[RawObject]
    datasets: Sequence[RawObject]
    dataloads: Sequence[RawObject]
    demand: Mapping[str, Any] | None
    demand_error: str = ""


@dataclass(frozen=True)
class Decision:
    namespace: str
    workload: str
    check: str
    state: Literal["Pending", "Ready", "Retry", "Rejected"]
    message: str
    requeue_after_seconds: int | None = None
    pod_set_updates: tuple[RawObject, ...] = ()
    create: tuple[RawObject, ...] = ()


def decide_all(pending: Sequence[Pending], cluster: Cluster, now: float) -> list[Decision]:
    raise AssertionError("admission.decide has not landed: pass decide= to the Controller")


def install() -> bool:
    """Use this stand-in unless the real module imports; True when the stand-in is used."""
    try:
        import admission.decide  # noqa: F401
    except ImportError:
        module = types.ModuleType("admission.decide")
        for name in ("PoolDemand", "Pending", "Cluster", "Decision", "decide_all"):
            setattr(module, name, globals()[name])
        sys.modules["admission.decide"] = module
        return True
    return False
