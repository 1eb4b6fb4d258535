"""Is a Workload's Fluid Dataset warm enough to admit it, and which DataLoad to create.

Pure: the Workload, the Datasets and the DataLoads as the API server's JSON (Fluid
v1.0.8, ``data.fluid.io/v1alpha1``), ``now`` passed in; out comes a ``DataReadiness``
with a state, what the check should do with it, and a message for an SRE.

A Workload names its Dataset (same namespace) with the ``unitscale.io/dataset``
annotation. States, and the ``outcome`` the check turns each into:

====================  ========  ===================================================
state                 outcome   meaning
====================  ========  ===================================================
``not-annotated``     pass      no Dataset named: nothing to wait for
``bad-annotation``    reject    the annotation names no Dataset we could find
``dataset-missing``   wait      no such Dataset (yet)
``not-bound``         wait      the Dataset is not Bound (runtime not ready), or is
                                being deleted
``loading``           wait      a DataLoad of the Dataset (anyone's) is under way,
                                or ours is to be created (``create``), or ours just
                                completed and Fluid has not yet re-read the cache
``no-dataload``       wait      nothing loads it and ``createDataLoad`` is off
``cache-unknown``     wait      ours completed; the Dataset reports no usable
                                ``cachedPercentage``
``load-failed``       retry     the DataLoad failed; a ``Once`` load never reruns
``below-threshold``   retry     ours completed long ago, yet the cache is below the
                                threshold: evicted since, or too small for the data
``ready``             pass      Bound, cache at or above the threshold
``timed-out``         retry     a ``wait`` lasted ``timeout_seconds`` or more
====================  ========  ===================================================

``wait`` keeps the check Pending (the quota stays reserved) until the timeout;
``retry`` gives the quota back. A cache that fell below the threshold after our own
load completed is not reloaded by us: our DataLoad's name is taken (a second name would
let each requeue start another load) and a cache too small for the data would evict it
again. The message says what to do (delete the DataLoad, enlarge the cache, or lower
the threshold). A complete DataLoad made by someone else does not stop us creating ours.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from admission import annotations as names
from admission.hints import workload_annotation
from admission.workload import format_time, parse_time

RawObject = dict[str, Any]
"""An API object as the API server's JSON."""

DataState = Literal[
    "not-annotated",
    "bad-annotation",
    "dataset-missing",
    "not-bound",
    "loading",
    "no-dataload",
    "cache-unknown",
    "load-failed",
    "below-threshold",
    "ready",
    "timed-out",
]
Outcome = Literal["pass", "wait", "retry", "reject"]

FLUID_API: Final = "data.fluid.io/v1alpha1"
WORKLOAD_API: Final = "kueue.x-k8s.io/v1beta2"

MAX_DATALOAD_NAME: Final = 46
"""Fluid installs a Helm release ``<name>-loader`` (Helm: at most 53 characters) running
a Job ``<name>-loader-job`` (its name is a label value: 63), so longer names fail there."""
STATUS_LAG_SECONDS: Final = 120.0
"""How long after a DataLoad completes its Dataset's ``cacheStates`` may still show the
old figures: Fluid's runtime controllers re-read the cache on their periodic sync."""
_HASH_LENGTH: Final = 8
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MESSAGE_PART: Final = 200
"""Upstream text quoted into a message is cut here (the check's message is bounded)."""


@dataclass(frozen=True)
class CachedPercentage:
    """A Dataset's ``cachedPercentage``, or why there is none (never a made-up 0)."""

    value: float | None
    reason: str = ""

    def describe(self) -> str:
        """``78.0%``, or the reason there is no figure."""
        return f"{self.value:.1f}%" if self.value is not None else self.reason


def read_cached_percentage(value: object) -> CachedPercentage:
    """Parse ``status.cacheStates.cachedPercentage`` as Fluid writes it (``"78.0%"``)."""
    if value is None:
        return CachedPercentage(None, "no cachedPercentage reported")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return CachedPercentage(None, f"cachedPercentage {value!r} is not a percentage")
    text = str(value).strip().removesuffix("%").strip()
    if not text:
        return CachedPercentage(None, "cachedPercentage is empty (Fluid has no total size yet)")
    try:
        number = float(text)
    except ValueError:
        return CachedPercentage(None, f"cachedPercentage {value!r} is not a percentage")
    if not math.isfinite(number):
        return CachedPercentage(None, f"cachedPercentage {value!r} is not a finite number")
    if number < 0:
        return CachedPercentage(None, f"cachedPercentage {value!r} is negative")
    return CachedPercentage(number)


def parse_cached_percentage(value: object) -> float | None:
    """The percentage as a number; ``None`` when missing or garbled.

    ``read_cached_percentage`` gives the reason with it.
    """
    return read_cached_percentage(value).value


@dataclass(frozen=True)
class DataReadiness:
    """Where a Workload's data stands."""

    state: DataState
    outcome: Outcome
    message: str
    dataset: str = ""
    """The Dataset's name ("" when the Workload names none)."""
    cached_percent: float | None = None
    dataload: str = ""
    """The DataLoad the state refers to (an existing one, or ours to create)."""
    create: RawObject | None = None
    """Our DataLoad to create first, when none of the Dataset is under way."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """When ready: the nodeSelector of Fluid's cache nodes for the Dataset."""

    @property
    def passed(self) -> bool:
        """Nothing more to wait for on the data."""
        return self.outcome == "pass"


def readiness(
    workload: Mapping[str, Any],
    datasets: Sequence[Mapping[str, Any]],
    dataloads: Sequence[Mapping[str, Any]],
    *,
    threshold_percent: float,
    waiting_since: float,
    now: float,
    timeout_seconds: float,
    create_dataload: bool,
) -> DataReadiness:
    """Where the data of ``workload`` stands (see the module docstring for the states).

    Args:
        workload: the Workload.
        datasets: Fluid Datasets (any namespace; the Workload's own is looked up).
        dataloads: Fluid DataLoads (any namespace). A caller deciding several
            Workloads in one pass should add each ``create`` it takes to this list for
            the next ones, so two Workloads of one Dataset do not start two loads.
        threshold_percent: the cached percentage needed, 0-100 (0: only Bound).
        waiting_since: unix seconds the check has been Pending since.
        now: unix seconds.
        timeout_seconds: a ``wait`` this long or longer becomes ``timed-out``.
        create_dataload: whether we create a DataLoad when none of the Dataset runs.

    Raises:
        ValueError: ``threshold_percent`` is outside 0-100.
    """
    if not 0 <= threshold_percent <= 100:
        raise ValueError(f"threshold_percent must be within 0-100, got {threshold_percent}")
    name = workload_annotation(workload, names.DATASET)
    if name is None:
        return DataReadiness("not-annotated", "pass", "no Fluid Dataset to wait for")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        shown = f"{name!r} is not a Dataset name" if name else "names no Dataset"
        return DataReadiness(
            "bad-annotation",
            "reject",
            f"annotation {names.DATASET}: {shown} (the name of a Dataset in the Workload's "
            "namespace)",
        )
    namespace = _meta(workload, "namespace")
    found = next(
        (d for d in datasets if (_meta(d, "namespace"), _meta(d, "name")) == (namespace, name)),
        None,
    )
    ref = f"{namespace}/{name}"
    verdict = _assess(workload, found, ref, dataloads, threshold_percent, now, create_dataload)
    verdict = replace(verdict, dataset=name)
    waited = now - waiting_since
    if verdict.outcome == "wait" and waited >= timeout_seconds:
        message = (
            f"gave up for now after waiting {waited:.0f} s (data.timeoutSeconds "
            f"{timeout_seconds:g}): {verdict.message}"
        )
        return replace(verdict, state="timed-out", outcome="retry", message=message)
    return verdict


def _assess(
    workload: Mapping[str, Any],
    dataset: Mapping[str, Any] | None,
    ref: str,
    dataloads: Sequence[Mapping[str, Any]],
    threshold: float,
    now: float,
    create: bool,
) -> DataReadiness:
    """The state, before the timeout."""
    if dataset is None:
        return DataReadiness(
            "dataset-missing", "wait", f"Dataset {ref} does not exist (annotation {names.DATASET})"
        )
    if (dataset.get("metadata") or {}).get("deletionTimestamp"):
        return DataReadiness("not-bound", "wait", f"Dataset {ref} is being deleted")
    phase = (dataset.get("status") or {}).get("phase") or ""
    if phase != "Bound":
        shown = f"is {phase}" if phase else "has no status.phase yet"
        return DataReadiness(
            "not-bound",
            "wait",
            f"Dataset {ref} {shown}, not Bound: its runtime is not ready (kubectl describe "
            f"dataset -n {ref.replace('/', ' ')})",
        )
    cache = read_cached_percentage(
        ((dataset.get("status") or {}).get("cacheStates") or {}).get("cachedPercentage")
    )
    if threshold <= 0 or (cache.value is not None and cache.value >= threshold):
        return _ready(dataset, ref, cache, threshold)
    return _loading(workload, dataset, ref, cache, dataloads, threshold, now, create)


def _ready(
    dataset: Mapping[str, Any], ref: str, cache: CachedPercentage, threshold: float
) -> DataReadiness:
    if threshold <= 0:
        message = f"Dataset {ref} is Bound (data.cachedPercentage 0: the cache is not waited for)"
    else:
        message = (
            f"Dataset {ref} is Bound with {cache.describe()} cached (threshold {threshold:g}%)"
        )
    try:
        selector = {cache_node_label(_meta(dataset, "namespace"), dataset): "true"}
    except ValueError as err:
        selector = {}
        message += f"; no cache-node hint: {err}"
    return DataReadiness(
        "ready", "pass", message, cached_percent=cache.value, node_selector=selector
    )


def _loading(
    workload: Mapping[str, Any],
    dataset: Mapping[str, Any],
    ref: str,
    cache: CachedPercentage,
    dataloads: Sequence[Mapping[str, Any]],
    threshold: float,
    now: float,
    create: bool,
) -> DataReadiness:
    """A Bound Dataset below the threshold: what loads it, or what to create."""
    namespace, name = ref.split("/", 1)
    held = f"Dataset {ref} holds {cache.describe()} cached of the {threshold:g}% needed"
    if cache.value is None:
        held = f"Dataset {ref}: {cache.reason} (threshold {threshold:g}%)"
    loads = _loads_of(dataloads, namespace, name)
    mine = dataload_name(workload)
    active = sorted(
        (d for d in loads if _phase(d) not in ("Complete", "Failed")),
        key=lambda d: (_meta(d, "name") != mine, _phase(d) != "Executing", _meta(d, "name")),
    )
    base = DataReadiness("loading", "wait", held, cached_percent=cache.value)
    if active:
        load = active[0]
        shown = _active_phase(load)
        return replace(
            base,
            message=f"{held}; DataLoad {namespace}/{_meta(load, 'name')} is {shown}",
            dataload=_meta(load, "name"),
        )
    own = next((d for d in loads if _meta(d, "name") == mine), None)
    if own is None and not create:
        return _without_ours(loads, base, held, namespace)
    if own is None:
        return replace(
            base,
            message=f"{held}: creating DataLoad {namespace}/{mine} to load it",
            dataload=mine,
            create=dataload_for(workload, dataset),
        )
    return _finished(own, base, held, now)


def _finished(load: Mapping[str, Any], base: DataReadiness, held: str, now: float) -> DataReadiness:
    """Our own DataLoad has finished and the cache is still short."""
    ref = f"{_meta(load, 'namespace')}/{_meta(load, 'name')}"
    base = replace(base, dataload=_meta(load, "name"))
    if _phase(load) == "Failed":
        return replace(
            base,
            state="load-failed",
            outcome="retry",
            message=f"{held}; DataLoad {ref} failed ({_condition_text(load, 'Failed')}): "
            f"delete it to load again (kubectl describe dataload -n {ref.replace('/', ' ')})",
        )
    done = _finished_at(load)
    if done is None or now - done < STATUS_LAG_SECONDS:
        return replace(
            base,
            message=f"{held}; DataLoad {ref} completed: waiting for Fluid's cache "
            "figures to catch up",
        )
    if base.cached_percent is None:
        return replace(
            base,
            state="cache-unknown",
            # An absolute time: a message that changed every second would be written on
            # every pass (the controller writes only what changed).
            message=f"{held}; DataLoad {ref} completed at {format_time(done)}",
        )
    return replace(
        base,
        state="below-threshold",
        outcome="retry",
        message=f"{held}, though DataLoad {ref} completed {now - done:.0f} s ago: the cache "
        "was evicted since, or is smaller than the data; delete the DataLoad to load again, "
        "enlarge the runtime's cache, or lower data.cachedPercentage",
    )


def _without_ours(
    loads: Sequence[Mapping[str, Any]], base: DataReadiness, held: str, namespace: str
) -> DataReadiness:
    """We may not create a DataLoad and none runs: report the latest finished one."""
    off = "data.createDataLoad is off"
    if not loads:
        return replace(
            base,
            state="no-dataload",
            message=f"{held}; no DataLoad of it exists and {off}: waiting for one",
        )
    last = max(loads, key=lambda d: (_finished_at(d) or 0.0, _meta(d, "name")))
    ref = f"{namespace}/{_meta(last, 'name')}"
    if _phase(last) == "Failed":
        return replace(
            base,
            state="load-failed",
            outcome="retry",
            message=f"{held}; DataLoad {ref} failed ({_condition_text(last, 'Failed')}) and "
            f"{off}, so none is started again",
            dataload=_meta(last, "name"),
        )
    return replace(
        base,
        state="no-dataload",
        message=f"{held}, though DataLoad {ref} completed; {off}: waiting for a new DataLoad",
        dataload=_meta(last, "name"),
    )


def dataload_name(workload: Mapping[str, Any]) -> str:
    """Our DataLoad's name for ``workload``: its name, cut to fit, and a hash.

    The hash covers namespace, name and UID, so the name is the same for every
    controller that decides this Workload (a restarted one finds what it created; a
    second one's create fails as AlreadyExists) and differs for a Workload recreated
    under the same name (whose predecessor's DataLoad is being garbage-collected).
    """
    name = _meta(workload, "name")
    key = f"{_meta(workload, 'namespace')}/{name}/{_meta(workload, 'uid')}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:_HASH_LENGTH]
    prefix = name[: MAX_DATALOAD_NAME - _HASH_LENGTH - 1].rstrip("-.") or "workload"
    return f"{prefix}-{digest}"


def dataload_for(workload: Mapping[str, Any], dataset: Mapping[str, Any]) -> RawObject:
    """Our DataLoad warming all of ``dataset`` once, owned by ``workload``.

    The owner reference lets garbage collection delete the DataLoad when the Workload
    goes (its Job deleted). ``controller: false``: Kueue does not manage it (Fluid's
    controller does). ``blockOwnerDeletion: false``: Fluid holds a finalizer on the
    DataLoad while it cleans up its loader, and a foreground deletion of the Workload
    must not wait for that (setting true would also need update rights on
    ``workloads/finalizers``). ``loadMetadata`` syncs the file list first, so files
    added to the store since the runtime started are loaded too.

    Raises:
        ValueError: the Workload has no UID (an owner reference needs one), or the
            Dataset is in another namespace (a DataLoad loads its own namespace's).
    """
    namespace, uid = _meta(workload, "namespace"), _meta(workload, "uid")
    if not uid:
        raise ValueError(
            f"Workload {namespace}/{_meta(workload, 'name')} has no metadata.uid: an "
            "ownerReference needs one"
        )
    if _meta(dataset, "namespace") != namespace:
        raise ValueError(
            f"Dataset {_meta(dataset, 'namespace')}/{_meta(dataset, 'name')} is not in the "
            f"Workload's namespace {namespace}"
        )
    owner = {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "name": _meta(workload, "name"),
        "uid": uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }
    return {
        "apiVersion": FLUID_API,
        "kind": "DataLoad",
        "metadata": {
            "name": dataload_name(workload),
            "namespace": namespace,
            "labels": {names.MANAGED_BY: names.MANAGER},
            "annotations": {names.FOR_WORKLOAD: _meta(workload, "name")},
            "ownerReferences": [owner],
        },
        "spec": {
            "dataset": {"name": _meta(dataset, "name"), "namespace": namespace},
            "loadMetadata": True,
            "target": [{"path": "/", "replicas": 1}],
            "policy": "Once",
        },
    }


def cache_node_label(namespace: str, dataset: Mapping[str, Any]) -> str:
    """The label Fluid puts on the nodes caching ``dataset`` (value ``"true"``).

    ``fluid.io/s-<namespace>-<name>`` while that is under 63 characters, else
    ``fluid.io/s-<dataset UID>`` (Fluid's ``GetNamespacedNameValueWithPrefix``: the
    fallback applies from 63 characters on, not only beyond).

    Raises:
        ValueError: the long form is needed and the Dataset has no UID.
    """
    label = names.fluid_cache_node_label(namespace, _meta(dataset, "name"))
    if len(label) < 63:
        return label
    uid = _meta(dataset, "uid")
    if not uid:
        raise ValueError(
            f"Dataset {namespace}/{_meta(dataset, 'name')}: {label} is 63 characters or more "
            "and the Dataset has no metadata.uid for Fluid's short form"
        )
    return f"{names.FLUID_CACHE_LABEL_PREFIX}{uid}"


def _meta(obj: Mapping[str, Any], key: str) -> str:
    return str((obj.get("metadata") or {}).get(key) or "")


def _phase(load: Mapping[str, Any]) -> str:
    return str((load.get("status") or {}).get("phase") or "")


def _loads_of(
    dataloads: Sequence[Mapping[str, Any]], namespace: str, dataset: str
) -> list[Mapping[str, Any]]:
    """The DataLoads of ``namespace/dataset`` that are not being deleted."""
    out = []
    for load in dataloads:
        target = (load.get("spec") or {}).get("dataset") or {}
        in_namespace = _meta(load, "namespace") == namespace
        if (
            in_namespace
            and target.get("name") == dataset
            and (target.get("namespace") or namespace) == namespace
            and not (load.get("metadata") or {}).get("deletionTimestamp")
        ):
            out.append(load)
    return out


def _active_phase(load: Mapping[str, Any]) -> str:
    phase = _phase(load)
    if not phase:
        return "not yet picked up by Fluid (no status.phase)"
    waiting = ((load.get("status") or {}).get("waitingFor") or {}).get("operationComplete")
    return f"{phase} (waiting for the operation it runs after)" if waiting else phase


def _condition(load: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in (load.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def _condition_text(load: Mapping[str, Any], kind: str) -> str:
    condition = _condition(load, kind)
    text = ": ".join(str(p) for p in (condition.get("reason"), condition.get("message")) if p)
    return (text or "no reason given")[:_MESSAGE_PART]


def _finished_at(load: Mapping[str, Any]) -> float | None:
    """When the DataLoad finished: its Complete/Failed condition's transition time."""
    for kind in ("Complete", "Failed"):
        stamp = _condition(load, kind).get("lastTransitionTime")
        if stamp:
            return parse_time(stamp)
    return parse_time((load.get("status") or {}).get("lastSuccessfulTime"))
