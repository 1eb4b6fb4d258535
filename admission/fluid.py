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
``fluid-missing``     wait      Fluid is not installed: the API server serves no
                                Datasets (its CRD is missing), so none can exist
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from admission import annotations as names
from admission.hints import workload_annotation
from admission.workload import MAX_CLOCK_SKEW
from foundation.fluid import (
    DNS_SUBDOMAIN,
    FINISHED_PHASES,
    FLUID_API,
    STATUS_LAG_SECONDS,
    CachedPercentage,
    FluidIndex,
    active_phase,
    bounded_name,
    condition_text,
    dataload_manifest,
    dataset_cache,
    finished_at,
    meta,
    phase,
)
from foundation.objects import RawObject
from foundation.timestamps import format_time

DataState = Literal[
    "not-annotated",
    "bad-annotation",
    "fluid-missing",
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

WORKLOAD_API: Final = "kueue.x-k8s.io/v1beta2"


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
    fluid: FluidIndex,
    *,
    threshold_percent: float,
    waiting_since: float,
    now: float,
    timeout_seconds: float,
    create_dataload: bool,
    datasets_served: bool = True,
) -> DataReadiness:
    """Where the data of ``workload`` stands (see the module docstring for the states).

    Args:
        workload: the Workload.
        fluid: Fluid's Datasets and DataLoads (any namespace; the Workload's own are
            looked up). A caller deciding several Workloads in one pass should add each
            ``create`` it takes (``FluidIndex.add_load``) for the next ones, so two
            Workloads of one Dataset do not start two loads.
        threshold_percent: the cached percentage needed, 0-100 (0: only Bound).
        waiting_since: unix seconds the check has been Pending since.
        now: unix seconds.
        timeout_seconds: a ``wait`` this long or longer becomes ``timed-out``.
        create_dataload: whether we create a DataLoad when none of the Dataset runs.
        datasets_served: False when the API server serves no Fluid Datasets (a 404 on
            the resource, not on one object: Fluid's CRDs are not installed).

    Raises:
        ValueError: ``threshold_percent`` is outside 0-100.
    """
    if not 0 <= threshold_percent <= 100:
        raise ValueError(f"threshold_percent must be within 0-100, got {threshold_percent}")
    name = workload_annotation(workload, names.DATASET)
    if name is None:
        return DataReadiness("not-annotated", "pass", "no Fluid Dataset to wait for")
    if not DNS_SUBDOMAIN.match(name) or len(name) > 253:
        shown = f"{name!r} is not a Dataset name" if name else "names no Dataset"
        return DataReadiness(
            "bad-annotation",
            "reject",
            f"annotation {names.DATASET}: {shown} (the name of a Dataset in the Workload's "
            "namespace)",
        )
    namespace = meta(workload, "namespace")
    found = fluid.dataset(namespace, name)
    ref = f"{namespace}/{name}"
    if found is None and not datasets_served:
        verdict = DataReadiness(
            "fluid-missing",
            "wait",
            f"Fluid is not installed: the API server serves no {FLUID_API} datasets, so "
            f"Dataset {ref} (annotation {names.DATASET}) cannot exist; install Fluid or "
            f"remove the annotation",
        )
        return _timed(replace(verdict, dataset=name), now - waiting_since, timeout_seconds)
    verdict = _assess(workload, found, ref, fluid, threshold_percent, now, create_dataload)
    return _timed(replace(verdict, dataset=name), now - waiting_since, timeout_seconds)


def _timed(verdict: DataReadiness, waited: float, timeout_seconds: float) -> DataReadiness:
    """A ``wait`` of ``timeout_seconds`` or longer becomes ``timed-out`` (a Retry)."""
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
    fluid: FluidIndex,
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
    bound = phase(dataset)
    if bound != "Bound":
        shown = f"is {bound}" if bound else "has no status.phase yet"
        return DataReadiness(
            "not-bound",
            "wait",
            f"Dataset {ref} {shown}, not Bound: its runtime is not ready (kubectl describe "
            f"dataset -n {ref.replace('/', ' ')})",
        )
    cache = dataset_cache(dataset)
    if threshold <= 0 or (cache.value is not None and cache.value >= threshold):
        return _ready(dataset, ref, cache, threshold)
    return _loading(workload, dataset, ref, cache, fluid, threshold, now, create)


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
        selector = {cache_node_label(meta(dataset, "namespace"), dataset): "true"}
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
    fluid: FluidIndex,
    threshold: float,
    now: float,
    create: bool,
) -> DataReadiness:
    """A Bound Dataset below the threshold: what loads it, or what to create."""
    namespace, name = ref.split("/", 1)
    held = f"Dataset {ref} holds {cache.describe()} cached of the {threshold:g}% needed"
    if cache.value is None:
        held = f"Dataset {ref}: {cache.reason} (threshold {threshold:g}%)"
    loads = fluid.loads_of(namespace, name)
    mine = dataload_name(workload)
    active = sorted(
        (d for d in loads if phase(d) not in FINISHED_PHASES),
        key=lambda d: (meta(d, "name") != mine, phase(d) != "Executing", meta(d, "name")),
    )
    base = DataReadiness("loading", "wait", held, cached_percent=cache.value)
    if active:
        load = active[0]
        shown = active_phase(load)
        return replace(
            base,
            message=f"{held}; DataLoad {namespace}/{meta(load, 'name')} is {shown}",
            dataload=meta(load, "name"),
        )
    own = next((d for d in loads if meta(d, "name") == mine), None)
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
    ref = f"{meta(load, 'namespace')}/{meta(load, 'name')}"
    base = replace(base, dataload=meta(load, "name"))
    if phase(load) == "Failed":
        return replace(
            base,
            state="load-failed",
            outcome="retry",
            message=f"{held}; DataLoad {ref} failed ({condition_text(load, 'Failed')}): "
            f"delete it to load again (kubectl describe dataload -n {ref.replace('/', ' ')})",
        )
    done = finished_at(load)
    # A finish more than MAX_CLOCK_SKEW ahead is long past, as the prewarm takes it: a
    # day ahead held the check Pending, quota reserved, until the data timeout.
    ahead = done is not None and done > now + MAX_CLOCK_SKEW
    if done is None or (not ahead and now - done < STATUS_LAG_SECONDS):
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
    when = f"at {format_time(done)}, ahead of our clock" if ahead else f"{now - done:.0f} s ago"
    return replace(
        base,
        state="below-threshold",
        outcome="retry",
        message=f"{held}, though DataLoad {ref} completed {when}: the cache "
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
    last = max(loads, key=lambda d: (finished_at(d) or 0.0, meta(d, "name")))
    ref = f"{namespace}/{meta(last, 'name')}"
    if phase(last) == "Failed":
        return replace(
            base,
            state="load-failed",
            outcome="retry",
            message=f"{held}; DataLoad {ref} failed ({condition_text(last, 'Failed')}) and "
            f"{off}, so none is started again",
            dataload=meta(last, "name"),
        )
    return replace(
        base,
        state="no-dataload",
        message=f"{held}, though DataLoad {ref} completed; {off}: waiting for a new DataLoad",
        dataload=meta(last, "name"),
    )


def dataload_name(workload: Mapping[str, Any]) -> str:
    """Our DataLoad's name for ``workload``: its name, cut to fit, and a hash.

    The hash covers namespace, name and UID, so the name is the same for every
    controller that decides this Workload (a restarted one finds what it created; a
    second one's create fails as AlreadyExists) and differs for a Workload recreated
    under the same name (whose predecessor's DataLoad is being garbage-collected).
    """
    name = meta(workload, "name")
    key = f"{meta(workload, 'namespace')}/{name}/{meta(workload, 'uid')}"
    return bounded_name(name, key, "workload")


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
    namespace, uid = meta(workload, "namespace"), meta(workload, "uid")
    if not uid:
        raise ValueError(
            f"Workload {namespace}/{meta(workload, 'name')} has no metadata.uid: an "
            "ownerReference needs one"
        )
    if meta(dataset, "namespace") != namespace:
        raise ValueError(
            f"Dataset {meta(dataset, 'namespace')}/{meta(dataset, 'name')} is not in the "
            f"Workload's namespace {namespace}"
        )
    return dataload_manifest(
        name=dataload_name(workload),
        namespace=namespace,
        dataset=meta(dataset, "name"),
        paths=("/",),
        owner=(WORKLOAD_API, "Workload", meta(workload, "name"), uid),
        labels={names.MANAGED_BY: names.MANAGER},
        annotations={names.FOR_WORKLOAD: meta(workload, "name")},
    )


def cache_node_label(namespace: str, dataset: Mapping[str, Any]) -> str:
    """The label Fluid puts on the nodes caching ``dataset`` (value ``"true"``).

    ``fluid.io/s-<namespace>-<name>`` while that is under 63 characters, else
    ``fluid.io/s-<dataset UID>`` (Fluid's ``GetNamespacedNameValueWithPrefix``: the
    fallback applies from 63 characters on, not only beyond).

    Raises:
        ValueError: the long form is needed and the Dataset has no UID.
    """
    label = names.fluid_cache_node_label(namespace, meta(dataset, "name"))
    if len(label) < 63:
        return label
    uid = meta(dataset, "uid")
    if not uid:
        raise ValueError(
            f"Dataset {namespace}/{meta(dataset, 'name')}: {label} is 63 characters or more "
            "and the Dataset has no metadata.uid for Fluid's short form"
        )
    return f"{names.FLUID_CACHE_LABEL_PREFIX}{uid}"
