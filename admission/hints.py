"""Kueue podSetUpdates from the hints we would like, never against a key already set.

Pure: the Workload's JSON in, the updates to write out, with what was left out and why.

Kueue applies every admission check's podSetUpdates to the pod template when it admits
the job, and fails admission when a key meets a different value on the template or from
another check (``pkg/podset/podset.go`` ``PodSetInfo.Merge``); the same value is fine.
So a key the user set (``template.metadata.labels`` / ``annotations``,
``template.spec.nodeSelector``) or another check set wins: ours is dropped and reported
in ``HintsResult.kept_user``, or silently omitted when it says the same thing. Updates
are immutable while the check stays Ready (Kueue's webhook), so they are computed once,
on the way to Ready.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from foundation.objects import RawObject

MAX_POD_SET_UPDATES: Final = 18
"""Kueue's ``podSetUpdates`` list limit (also the limit on ``spec.podSets``)."""

Field = Literal["labels", "annotations", "nodeSelector"]
FIELDS: Final[tuple[Field, ...]] = ("labels", "annotations", "nodeSelector")

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_QUALIFIED_NAME = re.compile(rf"^({_NAME})$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")


@dataclass(frozen=True)
class Hints:
    """What we would like on one podSet's pods."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)

    def of(self, name: Field) -> Mapping[str, str]:
        """One of the three maps by its Kueue JSON name."""
        if name == "labels":
            return self.labels
        return self.annotations if name == "annotations" else self.node_selector

    def __bool__(self) -> bool:
        return bool(self.labels or self.annotations or self.node_selector)


def combine(*hints: Hints) -> Hints:
    """The union of hints from our own sources (HAMi policy, Fluid cache, LoRA).

    Raises:
        ValueError: two sources want one key with different values; that is a bug in
            the caller, since our sources own disjoint keys.
    """
    maps: dict[Field, dict[str, str]] = {name: {} for name in FIELDS}
    for hint in hints:
        for name in FIELDS:
            for key, value in hint.of(name).items():
                if maps[name].setdefault(key, value) != value:
                    raise ValueError(
                        f"two hints for {name} {key}: {maps[name][key]!r} and {value!r}"
                    )
    return Hints(maps["labels"], maps["annotations"], maps["nodeSelector"])


@dataclass(frozen=True)
class PodSetUpdate:
    """One entry of an admission check's ``podSetUpdates`` (Kueue ``PodSetUpdate``)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)

    def to_api(self) -> RawObject:
        """Kueue's JSON: ``name`` and each non-empty map, keys sorted."""
        out: RawObject = {"name": self.name}
        for key, values in (
            ("labels", self.labels),
            ("annotations", self.annotations),
            ("nodeSelector", self.node_selector),
        ):
            if values:
                out[key] = dict(sorted(values.items()))
        return out


@dataclass(frozen=True)
class Kept:
    """A key someone else set differently: theirs stays, ours is left out."""

    pod_set: str
    field: Field
    key: str
    theirs: str
    ours: str
    owner: str
    """``"the pod template"`` or ``"admission check <name>"``."""

    def describe(self) -> str:
        """One line for the check's message."""
        return (
            f"podSet {self.pod_set}: kept {self.field} {self.key}={self.theirs!r} set by "
            f"{self.owner} (we would set {self.ours!r})"
        )


@dataclass(frozen=True)
class HintsResult:
    """The updates to write, and what was left out."""

    updates: tuple[PodSetUpdate, ...] = ()
    kept_user: tuple[Kept, ...] = ()
    dropped: tuple[str, ...] = ()
    """Hints that could go nowhere: an unknown podSet, an invalid key or value, the limit."""

    def to_api(self) -> tuple[RawObject, ...]:
        """The ``podSetUpdates`` list as Kueue's JSON."""
        return tuple(update.to_api() for update in self.updates)

    @property
    def message(self) -> str:
        """What was left out, for the check's message ("" when nothing was)."""
        return "; ".join([*(k.describe() for k in self.kept_user), *self.dropped])


def workload_annotation(workload: Mapping[str, Any], key: str) -> str | None:
    """A user setting: the Workload's annotation, else the first pod template's.

    Kueue copies no annotations of a Job onto its Workload (only the provisioning
    request's ``provreq.kueue.x-k8s.io/`` ones), so a setting put on a Job reaches us
    only through its pod template, which Kueue copies into ``spec.podSets``.
    """
    own = (workload.get("metadata") or {}).get("annotations") or {}
    if key in own:
        return str(own[key])
    for pod_set in _pod_sets(workload):
        template = (pod_set.get("template") or {}).get("metadata") or {}
        value = (template.get("annotations") or {}).get(key)
        if value is not None:
            return str(value)
    return None


def merge_hints(
    workload: Mapping[str, Any], wanted: Mapping[str, Hints], *, check: str = ""
) -> HintsResult:
    """The podSetUpdates carrying ``wanted`` (podSet name -> hints) that Kueue can apply.

    Args:
        workload: the Workload's JSON.
        wanted: the hints per podSet name.
        check: our AdmissionCheck's name: its current entry is ours to replace, so its
            podSetUpdates are not counted as someone else's.
    """
    pod_sets = _pod_sets(workload)
    known = [str(p.get("name", "")) for p in pod_sets]
    dropped = [
        f"podSet {name!r} is not in spec.podSets ({', '.join(known)}): its hints dropped"
        for name in wanted
        if name not in known and wanted[name]
    ]
    others = _other_checks(workload, check)
    updates: list[PodSetUpdate] = []
    kept: list[Kept] = []
    for pod_set in pod_sets:
        name = str(pod_set.get("name", ""))
        hints = wanted.get(name)
        if not hints:
            continue
        if len(updates) == MAX_POD_SET_UPDATES:
            dropped.append(f"podSet {name}: Kueue takes at most {MAX_POD_SET_UPDATES} updates")
            continue
        fixed = [("the pod template", _template_maps(pod_set))]
        fixed += [(owner, by_name[name]) for owner, by_name in others if name in by_name]
        maps: dict[Field, dict[str, str]] = {}
        for kind in FIELDS:
            maps[kind] = _merge_one(name, kind, hints.of(kind), fixed, kept, dropped)
        if any(maps.values()):
            updates.append(
                PodSetUpdate(name, maps["labels"], maps["annotations"], maps["nodeSelector"])
            )
    return HintsResult(tuple(updates), tuple(kept), tuple(dropped))


def _merge_one(
    pod_set: str,
    kind: Field,
    ours: Mapping[str, str],
    fixed: Sequence[tuple[str, Mapping[Field, Mapping[str, str]]]],
    kept: list[Kept],
    dropped: list[str],
) -> dict[str, str]:
    """Our keys of one map that nobody else holds; the rest reported into the lists."""
    out: dict[str, str] = {}
    for key, value in sorted(ours.items()):
        problem = _invalid(kind, key, value)
        if problem:
            dropped.append(f"podSet {pod_set}: {kind} {key!r}={value!r} dropped: {problem}")
            continue
        holders = [(owner, maps[kind][key]) for owner, maps in fixed if key in maps.get(kind, {})]
        differing = [(owner, theirs) for owner, theirs in holders if theirs != value]
        if differing:
            owner, theirs = differing[0]
            kept.append(Kept(pod_set, kind, key, theirs, value, owner))
        elif not holders:
            out[key] = value
    return out


def _invalid(kind: Field, key: str, value: str) -> str:
    """Why the API server would refuse this key or value ("" when it would not)."""
    prefix, slash, name = key.rpartition("/")
    if not _QUALIFIED_NAME.match(name) or len(name) > 63:
        return "the key is not a qualified name (name part: 63 characters of [-A-Za-z0-9_.])"
    if slash and (not _DNS_SUBDOMAIN.match(prefix) or len(prefix) > 253):
        return "the key's prefix is not a DNS subdomain"
    if kind != "annotations" and (len(value) > 63 or not _LABEL_VALUE.match(value)):
        return "the value is not a label value (at most 63 characters of [-A-Za-z0-9_.])"
    return ""


def _pod_sets(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((workload.get("spec") or {}).get("podSets") or [])


def _template_maps(pod_set: Mapping[str, Any]) -> dict[Field, Mapping[str, str]]:
    template = pod_set.get("template") or {}
    metadata = template.get("metadata") or {}
    return {
        "labels": metadata.get("labels") or {},
        "annotations": metadata.get("annotations") or {},
        "nodeSelector": (template.get("spec") or {}).get("nodeSelector") or {},
    }


def _other_checks(
    workload: Mapping[str, Any], check: str
) -> list[tuple[str, dict[str, dict[Field, Mapping[str, str]]]]]:
    """Other checks' podSetUpdates: owner -> podSet name -> maps."""
    out = []
    for entry in _entries(workload):
        if entry.get("name") == check:
            continue
        by_name: dict[str, dict[Field, Mapping[str, str]]] = {}
        for update in entry.get("podSetUpdates") or []:
            by_name[str(update.get("name", ""))] = {k: update.get(k) or {} for k in FIELDS}
        if by_name:
            out.append((f"admission check {entry.get('name', '?')}", by_name))
    return out


def _entries(workload: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return (workload.get("status") or {}).get("admissionChecks") or []
