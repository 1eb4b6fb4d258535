"""A Kueue Workload (v1beta2) as the check reads it, and the status write it makes.

Reading: our entries in ``status.admissionChecks`` (by check name), the conditions
that say whether a write is safe, ``spec.active``, priority and creation time.

Writing follows Kueue's own admission-check controllers (``pkg/workload`` ``patching``):
server-side apply on ``workloads/status`` with our field manager, a body holding only
what identifies the object and our one entry of the ``admissionChecks`` map-list, so no
other check's entry is touched. The body carries ``uid`` and ``resourceVersion`` as
Kueue's strict apply does: the write lands only on the version we judged, and a Workload
that changed since (evicted in between, say) answers 409 instead of taking a stale state.

The Retry-after-Evicted race (kueue#3543): Kueue evicts and resets checks in separate
writes; a Retry written in between wedges the Workload. ``write_guard`` says no unless
quota is reserved and the Workload is not evicted, finished, deactivated or admitted.

Pure: raw API objects and ``now`` in, values out.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, Protocol

from admission import annotations as names
from foundation.errors import quote
from foundation.objects import RawObject
from foundation.timestamps import format_time, parse_time

API_VERSION: Final = "kueue.x-k8s.io/v1beta2"
MESSAGE_LIMIT: Final = 32768
"""Kueue's maximum ``message`` length of a check state."""
PENDING: Final = "Pending"
MAX_CLOCK_SKEW: Final = 30.0
"""Seconds a time another party wrote (a check's or condition's ``lastTransitionTime``, a
DataLoad's finish) may lie ahead of our clock, as the scaler's ``MAX_CLOCK_SKEW``; one
further ahead is unreadable."""

_GUARDS: Final = (
    # (condition type, status that forbids a write, reason)
    ("Evicted", "True", "evicted"),
    ("Finished", "True", "finished"),
    ("DeactivationTarget", "True", "deactivation-target"),
    ("Admitted", "True", "admitted"),
)


class StatusDecision(Protocol):
    """What a status write reads from an ``admission.decide.Decision``."""

    @property
    def check(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def requeue_after_seconds(self) -> int | None: ...
    @property
    def pod_set_updates(self) -> Sequence[Mapping[str, Any]]: ...


def key(workload: Mapping[str, Any]) -> str:
    """``namespace/name`` of an object."""
    meta = workload.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def check_entries(workload: Mapping[str, Any]) -> dict[str, RawObject]:
    """The Workload's admission-check states by check name."""
    entries = (workload.get("status") or {}).get("admissionChecks") or []
    return {e["name"]: e for e in entries if isinstance(e, dict) and "name" in e}


def condition_status(workload: Mapping[str, Any], kind: str) -> str | None:
    """``True``/``False``/``Unknown`` of condition ``kind``, None when absent."""
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            status = cond.get("status")
            return status if isinstance(status, str) else None
    return None


def priority(workload: Mapping[str, Any]) -> int:
    """``spec.priority`` (Kueue copies the priority class's value there), 0 when unset."""
    value = (workload.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def created_at(workload: Mapping[str, Any]) -> float:
    """``metadata.creationTimestamp`` in unix seconds, 0 when unreadable."""
    return parse_time((workload.get("metadata") or {}).get("creationTimestamp")) or 0.0


def times_before_creation(workload: Mapping[str, Any]) -> str | None:
    """The Ready entries and ``Admitted`` time dated before the Workload's creation, or None.

    Nothing is Ready or admitted before it exists (the API server sets the creation):
    such a time, or a Ready entry's that is missing or unreadable, is read as the
    creation (``decide._ready_since``, ``reclaim._admitted_at``); this names them for the
    controller's one warning each. None when the creation itself cannot be read.
    """
    created = parse_time((workload.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return None
    found = []
    for name, entry in sorted(check_entries(workload).items()):
        at = parse_time(entry.get("lastTransitionTime"))
        if entry.get("state") == READY and (at is None or at < created - MAX_CLOCK_SKEW):
            found.append(f"check {quote(name)} Ready at {quote(entry.get('lastTransitionTime'))}")
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Admitted":
            at = parse_time(cond.get("lastTransitionTime"))
            if at is not None and at < created - MAX_CLOCK_SKEW:
                found.append(f"Admitted at {quote(cond.get('lastTransitionTime'))}")
    if not found:
        return None
    # The first few, then a count: 20,000 entries made one WARNING of 980 KB (pass 5, M2).
    shown = ", ".join(found[:NAMED_TIMES])
    more = f" and {len(found) - NAMED_TIMES:,} more" if len(found) > NAMED_TIMES else ""
    return f"{shown}{more}: before its creation or unreadable, read as its creation"


NAMED_TIMES = 3
"""Times ``times_before_creation`` names; the rest are counted."""


def pods_by_owner(
    pods: Sequence[RawObject], ties: Callable[[RawObject], Sequence[str]] | None = None
) -> dict[str, list[RawObject]]:
    """Pods by what ties them to a Workload: built once a pass, looked up per gang.

    Each pod is filed under the uid of each of its owners (a Job's pods), the uid of the
    JobSet that made its child Job (``jobset.sigs.k8s.io/jobset-uid``: the pod's owner
    is the child Job, the Workload's is the JobSet), and the Workload Kueue names on it
    (``kueue.x-k8s.io/workload``), each within the pod's namespace: an owner is always in
    its dependents' namespace, and a label or annotation in another namespace naming a
    gang's uid is anyone's to write. ``ties``: a pod's ties as ``ties_of_pod`` reads
    them (the controller's, kept per pod object across passes).
    """
    read = ties or ties_of_pod
    index: dict[str, list[RawObject]] = {}
    for pod in pods:
        for tie in read(pod):
            index.setdefault(tie, []).append(pod)
    return index


def ties_of_pod(pod: RawObject) -> list[str]:
    """What a pod is filed under in ``pods_by_owner``, each once."""
    meta = pod.get("metadata") or {}
    namespace = f"{meta.get('namespace', '')}/"
    ties = [
        namespace + str(uid)
        for owner in meta.get("ownerReferences") or ()
        if isinstance(owner, dict) and (uid := owner.get("uid"))
    ]
    labels, annotations = meta.get("labels"), meta.get("annotations")
    jobset = labels.get(names.JOBSET_UID) if isinstance(labels, Mapping) else None
    if isinstance(jobset, str) and jobset:
        ties.append(namespace + jobset)
    named = annotations.get(names.KUEUE_WORKLOAD) if isinstance(annotations, Mapping) else None
    if isinstance(named, str) and named:
        ties.append(f"{_WORKLOAD_KEY}{namespace}{named}")
    return ties if len(ties) < 2 else list(dict.fromkeys(ties))


_WORKLOAD_KEY = "workload:"
"""Prefix of ``pods_by_owner``'s keys naming a Workload (a uid never starts with it)."""


def owned_pods(w: RawObject, by_owner: Mapping[str, list[RawObject]]) -> list[RawObject]:
    """The workload's pods: its owner's (a Job's or a JobSet's), or those naming it."""
    return tied_pods(pod_ties(w), by_owner)


def pod_ties(w: RawObject) -> tuple[str, ...]:
    """What ties pods to the Workload in ``pods_by_owner``: its owners' uids, its key.

    Each within the Workload's namespace, as ``ties_of_pod`` files them.
    """
    meta = w.get("metadata") or {}
    namespace = f"{meta.get('namespace', '')}/"
    ties = [
        namespace + str(uid)
        for owner in meta.get("ownerReferences") or ()
        if isinstance(owner, dict) and (uid := owner.get("uid"))
    ]
    return (*ties, _WORKLOAD_KEY + key(w))


def tied_pods(ties: Sequence[str], by_owner: Mapping[str, list[RawObject]]) -> list[RawObject]:
    """The pods filed under any of ``ties`` (``pod_ties``), each once."""
    found: dict[int, RawObject] = {}
    for tie in ties:
        for pod in by_owner.get(tie, ()):
            found[id(pod)] = pod
    return list(found.values())


def write_guard(workload: Mapping[str, Any]) -> str | None:
    """Why no check state may be written now, or None when one may.

    A write needs ``QuotaReserved=True`` and none of Evicted, Finished,
    DeactivationTarget, Admitted true, and ``spec.active`` not false.
    """
    if condition_status(workload, "QuotaReserved") != "True":
        return "no-quota-reserved"
    if (workload.get("spec") or {}).get("active") is False:
        return "deactivated"
    for kind, status, reason in _GUARDS:
        if condition_status(workload, kind) == status:
            return reason
    return None


def actionable(workload: Mapping[str, Any], our_checks: Collection[str]) -> list[tuple[str, float]]:
    """Our checks the Workload holds as Pending, with when each became Pending.

    Empty when ``write_guard`` forbids a write. Sorted by check name; a transition time
    that cannot be read counts from the Workload's creation.
    """
    if write_guard(workload) is not None:
        return []
    found = []
    for name, entry in sorted(check_entries(workload).items()):
        if name in our_checks and entry.get("state") == PENDING:
            since = parse_time(entry.get("lastTransitionTime"))
            found.append((name, created_at(workload) if since is None else since))
    return found


def apply_body(
    workload: Mapping[str, Any],
    decision: StatusDecision,
    previous_entry: Mapping[str, Any] | None,
    now: float,
) -> RawObject | None:
    """The server-side-apply body writing ``decision`` into our check entry, or None.

    None when nothing may or need be written: the guard forbids it, the Workload lists
    no such check (``previous_entry`` None), the entry is not Pending (Kueue resets a
    Retry; a Ready entry's podSetUpdates are immutable), or the same state, message,
    ``requeueAfterSeconds`` and podSetUpdates are there already. A field the decision
    leaves unset is not compared (Kueue keeps ``requeueAfterSeconds`` across a reset).
    ``lastTransitionTime`` stays unless the state changes.
    """
    if previous_entry is None or previous_entry.get("state") != PENDING:
        return None
    if write_guard(workload) is not None:
        return None
    entry = _entry(decision, previous_entry, now)
    if not _changes(entry, previous_entry):
        return None
    meta = workload.get("metadata") or {}
    identity = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": identity,
        "status": {"admissionChecks": [entry]},
    }


READY: Final = "Ready"


def reclaim_guard(workload: Mapping[str, Any]) -> str | None:
    """Why an admitted Workload's check may not be set to ``Retry`` now, or None.

    Reclaiming writes to a Workload Kueue admitted: it needs ``QuotaReserved=True`` and
    ``Admitted=True``, none of Evicted, Finished, DeactivationTarget true (one Kueue is
    already taking down needs no second push, and kueue#3543's race applies as before),
    and ``spec.active`` not false.
    """
    if condition_status(workload, "QuotaReserved") != "True":
        return "no-quota-reserved"
    if condition_status(workload, "Admitted") != "True":
        return "not-admitted"
    if (workload.get("spec") or {}).get("active") is False:
        return "deactivated"
    for kind, status, reason in _GUARDS[:3]:
        if condition_status(workload, kind) == status:
            return reason
    return None


def reclaim_body(
    workload: Mapping[str, Any],
    decision: StatusDecision,
    previous_entry: Mapping[str, Any] | None,
    now: float,
) -> RawObject | None:
    """The server-side-apply body setting our Ready entry of an admitted Workload to Retry.

    Kueue answers a Retry on an admitted Workload by evicting it (reason
    ``AdmissionCheck``): the Job is suspended, its quota released, every check reset to
    Pending, and it is requeued after ``requeueAfterSeconds``. None unless the decision is
    a Retry, our entry is Ready and ``reclaim_guard`` allows it. Our podSetUpdates leave
    the entry (Kueue drops them on the reset anyway); the preconditions are as in
    ``apply_body``.
    """
    if decision.state != "Retry" or previous_entry is None:
        return None
    if previous_entry.get("state") != READY or reclaim_guard(workload) is not None:
        return None
    meta = workload.get("metadata") or {}
    identity = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": identity,
        "status": {"admissionChecks": [_entry(decision, previous_entry, now)]},
    }


def _entry(decision: StatusDecision, previous: Mapping[str, Any], now: float) -> RawObject:
    since = previous.get("lastTransitionTime")
    if decision.state != previous.get("state") or not isinstance(since, str):
        since = format_time(now)
    entry: RawObject = {
        "name": decision.check,
        "state": decision.state,
        "lastTransitionTime": since,
        "message": _clip(decision.message),
    }
    if decision.requeue_after_seconds is not None:
        entry["requeueAfterSeconds"] = int(decision.requeue_after_seconds)
    if decision.pod_set_updates:
        entry["podSetUpdates"] = [copy.deepcopy(dict(u)) for u in decision.pod_set_updates]
    return entry


def _changes(entry: Mapping[str, Any], previous: Mapping[str, Any]) -> bool:
    # Only what we write is compared: name, state and message always, the rest when set.
    return any(previous.get(field) != value for field, value in entry.items())


def _clip(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    return message[: MESSAGE_LIMIT - 1] + "…"


EVENT_REASON: Final = "AdmissionCheckUpdated"
"""The reason Kueue's own check controllers give their events on a Workload."""


def event_for(
    workload: Mapping[str, Any],
    decision: StatusDecision,
    component: str,
    now: float,
) -> RawObject:
    """A ``core/v1`` Event on the Workload telling of a check state we wrote.

    Kueue overwrites a Rejected or Retry entry's message when it resets the check (on
    eviction or deactivation), so the Event is where our reason stays readable
    (``kubectl describe workload``). Warning for Retry and Rejected, Normal otherwise;
    named as client-go names events (``<object>.<nanoseconds in hex>``).
    """
    meta = workload.get("metadata") or {}
    stamp = format_time(now)
    involved = {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        **{k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
    }
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name', 'workload')}.{int(now * 1e9):x}",
            "namespace": meta.get("namespace", ""),
        },
        "involvedObject": involved,
        "reason": EVENT_REASON,
        "message": _clip(f"{decision.check}: {decision.state}: {decision.message}")[:1024],
        "type": "Warning" if decision.state in ("Retry", "Rejected") else "Normal",
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
