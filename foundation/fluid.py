"""Reading Fluid's Datasets and DataLoads (v1.0.8, ``data.fluid.io/v1alpha1``): pure.

Shared by the admission check (is a Workload's data warm?) and the scaler's prewarm
(warm a model's weights before its replicas start). Objects are the API server's JSON;
times are unix seconds. A missing or garbled figure is ``None`` with a reason, never a
made-up 0.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from foundation.errors import quote
from foundation.timestamps import parse_time

FLUID_API: Final = "data.fluid.io/v1alpha1"

MAX_DATALOAD_NAME: Final = 46
"""Fluid installs a Helm release ``<name>-loader`` (Helm: at most 53 characters) running
a Job ``<name>-loader-job`` (its name is a label value: 63), so longer names fail there."""
STATUS_LAG_SECONDS: Final = 120.0
"""How long after a DataLoad completes its Dataset's ``cacheStates`` may still show the
old figures: Fluid's runtime controllers re-read the cache on their periodic sync."""
FINISHED_PHASES: Final = ("Complete", "Failed")
"""A DataLoad in neither is pending or executing (``policy: Once`` never reruns)."""
DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
"""An object name Kubernetes accepts (RFC 1123 subdomain; at most 253 characters)."""
_HASH_LENGTH: Final = 8
_MESSAGE_PART: Final = 200
"""Upstream text quoted into a message is cut here (messages are bounded)."""


@dataclass(frozen=True)
class CachedPercentage:
    """A Dataset's ``cachedPercentage``, or why there is none (never a made-up 0)."""

    value: float | None
    reason: str = ""

    def describe(self) -> str:
        """``78.0%``, or the reason there is no figure."""
        return f"{self.value:.1f}%" if self.value is not None else self.reason


_PERCENTAGE = re.compile(r"[0-9]{1,4}(\.[0-9]{1,9})?", re.ASCII)
"""A percentage as Fluid writes it (``"78.0%"``, Go's ``%.1f``): ASCII digits only
(``float()`` also reads ``1_00``, ``1e308`` and Arabic-Indic digits)."""
MAX_PERCENTAGE: Final = 1000.0
"""Fluid reports a little over 100 % when the cached blocks exceed the UFS size (120.5 %
is kept); more than a thousand percent is no cache Fluid measured."""


def read_cached_percentage(value: object) -> CachedPercentage:
    """Parse ``status.cacheStates.cachedPercentage`` as Fluid writes it (``"78.0%"``).

    Only ASCII decimals from 0 to ``MAX_PERCENTAGE`` are a figure; anything else has
    none, with why.
    """
    if value is None:
        return CachedPercentage(None, "no cachedPercentage reported")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return CachedPercentage(None, f"cachedPercentage {quote(value)} is not a percentage")
    text = str(value).strip().removesuffix("%").strip()
    if not text:
        return CachedPercentage(None, "cachedPercentage is empty (Fluid has no total size yet)")
    try:
        number = float(text)
    except ValueError:
        return CachedPercentage(None, f"cachedPercentage {quote(value)} is not a percentage")
    if not math.isfinite(number):
        return CachedPercentage(None, f"cachedPercentage {quote(value)} is not a finite number")
    if number < 0:
        return CachedPercentage(None, f"cachedPercentage {quote(value)} is negative")
    plain = _PERCENTAGE.fullmatch(text) if isinstance(value, str) else True
    if not plain or number > MAX_PERCENTAGE:
        return CachedPercentage(None, f"cachedPercentage {quote(value)} is not a percentage")
    return CachedPercentage(number)


def parse_cached_percentage(value: object) -> float | None:
    """The percentage as a number; ``None`` when missing or garbled.

    ``read_cached_percentage`` gives the reason with it.
    """
    return read_cached_percentage(value).value


def dataset_cache(dataset: Mapping[str, Any]) -> CachedPercentage:
    """The Dataset's ``status.cacheStates.cachedPercentage``, read."""
    states = (dataset.get("status") or {}).get("cacheStates") or {}
    return read_cached_percentage(states.get("cachedPercentage"))


def bounded_name(prefix: str, key: str, fallback: str) -> str:
    """``<prefix cut to fit>-<hash of key>``: a DataLoad name Fluid can install.

    Everyone who computes it from the same ``key`` gets the same name, so a second
    creator's create answers 409 AlreadyExists instead of starting a second load.
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:_HASH_LENGTH]
    cut = prefix[: MAX_DATALOAD_NAME - _HASH_LENGTH - 1].rstrip("-.") or fallback
    return f"{cut}-{digest}"


def dataload_manifest(
    *,
    name: str,
    namespace: str,
    dataset: str,
    paths: Sequence[str],
    owner: tuple[str, str, str, str],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
) -> dict[str, Any]:
    """A ``policy: Once`` DataLoad of ``paths`` of ``dataset``, one cached copy each.

    ``dataset`` is in ``namespace``; ``owner`` is (apiVersion, kind, name, uid). The one
    manifest of both users (the admission check's data and the scaler's prewarm).
    ``loadMetadata`` syncs the file list first, so files added to the store since the
    runtime started are loaded too. The owner is not the controller and blocks no
    deletion: Fluid's finalizer on the DataLoad must not hold up a foreground deletion of
    its owner (blocking would also need update rights on the owner's finalizers).
    """
    api_version, kind, owner_name, uid = owner
    return {
        "apiVersion": FLUID_API,
        "kind": "DataLoad",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": dict(annotations),
            "ownerReferences": [
                {
                    "apiVersion": api_version,
                    "kind": kind,
                    "name": owner_name,
                    "uid": uid,
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "dataset": {"name": dataset, "namespace": namespace},
            "loadMetadata": True,
            "target": [{"path": path, "replicas": 1} for path in paths],
            "policy": "Once",
        },
    }


def meta(obj: Mapping[str, Any], key: str) -> str:
    """``metadata.<key>`` as text, "" when absent (or ``metadata`` is no mapping)."""
    metadata = obj.get("metadata")
    return str(metadata.get(key) or "") if isinstance(metadata, Mapping) else ""


def phase(load: Mapping[str, Any]) -> str:
    """A DataLoad's ``status.phase`` ("" before Fluid picks it up)."""
    return str((load.get("status") or {}).get("phase") or "")


class FluidIndex:
    """Datasets by (namespace, name) and DataLoads by the Dataset they load.

    Built once a pass over many Workloads or ScaledObjects: looking each one's Dataset
    and loads up in the lists made a pass cost their product (3,000 ScaledObjects and
    DataLoads: 6.7 s a pass on the scaler's event loop).
    """

    def __init__(
        self, datasets: Iterable[Mapping[str, Any]], dataloads: Iterable[Mapping[str, Any]]
    ) -> None:
        self._datasets: dict[tuple[str, str], Mapping[str, Any]] = {}
        for dataset in datasets:
            self._datasets.setdefault((meta(dataset, "namespace"), meta(dataset, "name")), dataset)
        self._loads: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for load in dataloads:
            self.add_load(load)

    def dataset(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The Dataset of this name (the first listed, should two claim it)."""
        return self._datasets.get((namespace, name))

    def loads_of(self, namespace: str, dataset: str) -> Sequence[Mapping[str, Any]]:
        """The DataLoads of ``namespace/dataset`` that are not being deleted."""
        return self._loads.get((namespace, dataset), ())

    def add_load(self, load: Mapping[str, Any]) -> None:
        """A DataLoad created meanwhile (the next Workloads of its Dataset see it)."""
        ref = _loads(load)
        if ref is not None:
            self._loads.setdefault(ref, []).append(load)


def _loads(load: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (namespace, name) of the Dataset a DataLoad loads; None while it is deleted.

    A DataLoad loads a Dataset of its own namespace (Fluid refuses any other).
    """
    spec = load.get("spec")
    target = spec.get("dataset") if isinstance(spec, Mapping) else None
    if not isinstance(target, Mapping):
        return None  # no Dataset named: a load of none (it raised, and failed every pass)
    namespace, name = meta(load, "namespace"), target.get("name")
    if not isinstance(name, str) or (target.get("namespace") or namespace) != namespace:
        return None
    if meta(load, "deletionTimestamp"):
        return None
    return namespace, name


def active_phase(load: Mapping[str, Any]) -> str:
    """An unfinished DataLoad's phase, said for a message."""
    shown = phase(load)
    if not shown:
        return "not yet picked up by Fluid (no status.phase)"
    waiting = ((load.get("status") or {}).get("waitingFor") or {}).get("operationComplete")
    return f"{shown} (waiting for the operation it runs after)" if waiting else shown


def condition(load: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The status condition of type ``kind``, ``{}`` when absent."""
    for found in (load.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return {}


def condition_text(load: Mapping[str, Any], kind: str) -> str:
    """``reason: message`` of a condition, cut for a message."""
    found = condition(load, kind)
    text = ": ".join(str(p) for p in (found.get("reason"), found.get("message")) if p)
    return (text or "no reason given")[:_MESSAGE_PART]


def finished_at(load: Mapping[str, Any]) -> float | None:
    """When the DataLoad finished: its Complete/Failed condition's transition time."""
    for kind in FINISHED_PHASES:
        stamp = condition(load, kind).get("lastTransitionTime")
        if stamp:
            return parse_time(stamp)
    return parse_time((load.get("status") or {}).get("lastSuccessfulTime"))
