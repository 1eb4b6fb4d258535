"""LoRA fine-tuning tenants sharing a base-model instance's nodes, N at most per instance.

Pure: Workloads and Pods as the API server's JSON in; an assignment out.

A Workload annotated ``unitscale.io/lora-base-model: <model>`` is a tenant of that base
model. Tenants are grouped into instances of at most ``tenants_per_instance`` (1-8,
default 5); an instance is named ``<model slug>-<n>`` and carried to the pods as the
``unitscale.io/lora-instance`` label (a podSetUpdate). A new tenant joins the fullest
instance of its model that still has a seat (packing tenants onto as few instances as
possible), else starts the next instance (the smallest unused ``n``). When the joined
instance's pods run, a ``kubernetes.io/hostname`` nodeSelector co-locates the tenant.

Who holds a seat: a Workload that is not finished, evicted or deactivated, and carries
our label in a Ready admission-check entry, or (admitted) on its pod template; one
marked for deactivation (``DeactivationTarget``) is leaving and holds none. A Ready
entry counts before Kueue admits, so two tenants decided close together cannot both take
the last seat; Pending entries carry no podSetUpdates (Kueue drops them when it resets
checks on eviction). Instances are cluster-wide: tenants of one base model share nodes
whatever their namespace.

How many tenants an instance should take (``tenants_for``) follows its load: one fewer
when its cards' memory is nearly full or the tenants' steps miss their objective, one
more when both have room, never past the ceiling; a signal unknown never raises it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from admission import annotations as names
from admission.hints import Hints, workload_annotation
from admission.workload import condition_status, key
from foundation.errors import quote

DEFAULT_TENANTS_PER_INSTANCE: Final = 5
MAX_TENANTS_PER_INSTANCE: Final = 8
_SLUG_LENGTH: Final = 50
"""Leaves room in a 63-character label value for ``-<n>``."""
_NOT_SLUG = re.compile(r"[^a-z0-9]+")
MAX_MODEL_CHARS: Final = 253
"""Characters a base model's name may have (a DNS subdomain's length; Hugging Face ids
such as ``meta-llama/Llama-3.1-8B`` are far shorter). It becomes a metric label."""
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*", re.ASCII)
"""A model id's characters: letters, digits and ``. _ / : @ + -`` (no spaces, no
control characters, nothing a label or a log line would have to escape)."""
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", re.ASCII)
"""A Kubernetes label value (63 characters at most), as the instance label must be."""
_MAX_INSTANCE_DIGITS: Final = 9
"""Digits of an instance's number: a billion instances of one model is not real, and
``int()`` of 5,000 digits raises."""

MEMORY_LOWER_AT: Final = 0.90
"""Memory used at or above this fraction of the instance's cards: one tenant fewer (the
next adapter or a longer batch would not fit)."""
MEMORY_RAISE_AT: Final = 0.70
"""Memory used at or below this fraction leaves room for one more tenant's adapter."""
STEP_RAISE_FRACTION: Final = 0.8
"""Steps at or under this fraction of their objective leave room for one more tenant
(a tenant more slows each step; the margin keeps one addition from breaking the SLO)."""


def validate_tenants_per_instance(value: object) -> int:
    """``value`` as the tenant limit.

    Raises:
        ValueError: not an integer from 1 to 8 (a bool is not an integer here).
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
        raise ValueError(
            f"tenants_per_instance must be an integer from 1 to {MAX_TENANTS_PER_INSTANCE}, "
            f"got {value!r}"
        )
    return value


def base_model(workload: Mapping[str, Any]) -> str | None:
    """The base model a Workload fine-tunes; ``None``: not a LoRA tenant.

    Blank, or a name ``base_model_problem`` refuses, is no tenant.
    """
    value = workload_annotation(workload, names.LORA_BASE_MODEL)
    model = value.strip() if value else ""
    return model if model and not _model_problem(model) else None


def base_model_problem(workload: Mapping[str, Any]) -> str:
    """Why the Workload's base-model annotation is no model name (``""``: it is, or none).

    The name becomes a metric label and an instance's slug: at most ``MAX_MODEL_CHARS``
    ASCII letters, digits and ``. _ / : @ + -``.
    """
    value = workload_annotation(workload, names.LORA_BASE_MODEL)
    model = value.strip() if value else ""
    why = _model_problem(model) if model else ""
    return f"annotation {names.LORA_BASE_MODEL} {quote(model)}: {why}" if why else ""


def _model_problem(model: str) -> str:
    if len(model) > MAX_MODEL_CHARS:
        return f"{len(model)} characters, more than the {MAX_MODEL_CHARS} a model name may have"
    if not _MODEL.fullmatch(model):
        return "not a model name (ASCII letters, digits and . _ / : @ + - only)"
    return ""


def instance_slug(model: str) -> str:
    """A label-value-safe stem for a model's instances: ``meta-llama-llama-3-1-8b``."""
    slug = _NOT_SLUG.sub("-", model.lower()).strip("-")[:_SLUG_LENGTH].strip("-")
    return slug or "model"


@dataclass(frozen=True)
class LoraAssignment:
    """The instance a tenant goes to, and where its pods should run."""

    workload: str
    """``namespace/name`` of the tenant."""
    base_model: str
    instance: str
    tenants: int
    """Tenants on the instance, this one included."""
    capacity: int
    new_instance: bool
    node: str | None
    """The node to co-locate with (``None``: no pods of the instance run yet)."""
    message: str

    def hints(self) -> Hints:
        """The label, and the nodeSelector when there is a node to join."""
        selector = {names.HOSTNAME: self.node} if self.node else {}
        return Hints(labels={names.LORA_INSTANCE: self.instance}, node_selector=selector)


@dataclass(frozen=True)
class _Seat:
    workload: str
    base_model: str
    instance: str


def assign_instance(
    workload: Mapping[str, Any],
    workloads: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    *,
    tenants_per_instance: int = DEFAULT_TENANTS_PER_INSTANCE,
    taken: Sequence[LoraAssignment] = (),
) -> LoraAssignment | None:
    """The instance ``workload`` joins; ``None`` when it is not a LoRA tenant.

    Args:
        workload: the Workload to place.
        workloads: all Workloads (seat holders are read from them).
        pods: all Pods (where each instance runs).
        tenants_per_instance: at most this many tenants per instance, 1-8.
        taken: assignments made earlier in the same pass, not yet in ``workloads``.

    Raises:
        ValueError: ``tenants_per_instance`` is not an integer from 1 to 8.
    """
    limit = validate_tenants_per_instance(tenants_per_instance)
    model = base_model(workload)
    if model is None:
        return None
    me = key(workload)
    seats = [s for s in _seats(workloads) if s.workload != me]
    # Counted as _seats will count them once admitted: a pin naming another model's
    # instance holds no seat there, in this pass or the next (pass 49).
    seats += [
        _Seat(a.workload, a.base_model, a.instance)
        for a in taken
        if a.workload != me and model_instance(a.base_model, a.instance)
    ]
    counts = Counter(s.instance for s in seats)
    pinned = _template_instance(workload)
    own = _ready_instance(workload, model)
    if pinned:
        instance, why = pinned, "set on its pod template"
    elif own and counts[own] < limit:
        instance, why = own, ""
    else:
        instance, why = _choose(model, seats, pods, limit), ""
    tenants = counts[instance] + 1
    node, where = _node(instance, pods)
    verb = "keeps" if instance == own else "starts" if counts[instance] == 0 else "joins"
    message = f"{verb} LoRA instance {instance} of {model} ({tenants} of {limit} tenants"
    message += f", {why})" if why else ")"
    if tenants > limit:
        message += f": over the limit of {limit}, as the pod template asks"
    return LoraAssignment(
        me, model, instance, tenants, limit, counts[instance] == 0, node, f"{message}; {where}"
    )


def tenants_per_base_model(workloads: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Seat holders per base model, for the tenants metric (models with none absent)."""
    counts = Counter(s.base_model for s in _seats(workloads))
    return {model: counts[model] for model in sorted(counts)}


def _choose(
    model: str, seats: Sequence[_Seat], pods: Sequence[Mapping[str, Any]], limit: int
) -> str:
    """The fullest instance of ``model`` with a free seat, else the next new one."""
    by_instance: dict[str, set[str]] = {}
    for seat in seats:
        by_instance.setdefault(seat.instance, set()).add(seat.base_model)
    counts = Counter(s.instance for s in seats)
    slug = instance_slug(model)
    joinable = [i for i, models in by_instance.items() if models == {model} and counts[i] < limit]
    if joinable:
        return min(joinable, key=lambda i: (-counts[i], _number(i, slug), i))
    # Ids held by other models (a shared slug) or by pods still running are skipped.
    used = set(by_instance) | {_labels(p).get(names.LORA_INSTANCE, "") for p in _live(pods)}
    n = 1
    while f"{slug}-{n}" in used:
        n += 1
    return f"{slug}-{n}"


def _node(instance: str, pods: Sequence[Mapping[str, Any]]) -> tuple[str | None, str]:
    """The node to pin to, and a sentence on why.

    A nodeSelector names one node (podSetUpdates carry no affinity), so when the
    instance runs on several nodes the tenant goes to the one with most of its pods,
    the first name on a tie.
    """
    nodes = Counter(
        str(p["spec"]["nodeName"])
        for p in _live(pods)
        if _labels(p).get(names.LORA_INSTANCE) == instance and (p.get("spec") or {}).get("nodeName")
    )
    if not nodes:
        return None, "no running pods of it yet: no node pin"
    node, count = min(nodes.items(), key=lambda item: (-item[1], item[0]))
    total = sum(nodes.values())
    if len(nodes) == 1:
        return node, f"pinned to node {node}, where its pods run"
    return node, (
        f"pinned to node {node}, which runs {count} of its {total} pods on {len(nodes)} nodes "
        "(a nodeSelector names one node)"
    )


def _seats(workloads: Iterable[Mapping[str, Any]]) -> list[_Seat]:
    """The seats tenants hold: each on an instance of its own model (``model_instance``).

    A Workload that is no tenant, or a tenant labelled with another model's instance,
    holds none: read raw, one such label made that instance unjoinable and every later
    tenant of its model started a new one (hostile pass 47).
    """
    seats = []
    for wl in workloads:
        model = base_model(wl)
        if model is None or not _holds_seat(wl):
            continue
        instance = _ready_instance(wl, model) or (
            _template_instance(wl, model) if _admitted(wl) else None
        )
        if instance:
            seats.append(_Seat(key(wl), model, instance))
    return seats


def _holds_seat(workload: Mapping[str, Any]) -> bool:
    if (workload.get("spec") or {}).get("active") is False:
        return False
    leaving = ("Finished", "Evicted", "DeactivationTarget")
    return not any(condition_status(workload, kind) == "True" for kind in leaving)


def _admitted(workload: Mapping[str, Any]) -> bool:
    return condition_status(workload, "Admitted") == "True"


def _ready_instance(workload: Mapping[str, Any], model: str) -> str | None:
    """Our label in a Ready admission-check entry's podSetUpdates, as ``model``'s."""
    for entry in (workload.get("status") or {}).get("admissionChecks") or []:
        if entry.get("state") != "Ready":
            continue
        for update in entry.get("podSetUpdates") or []:
            value = model_instance(model, (update.get("labels") or {}).get(names.LORA_INSTANCE))
            if value:
                return value
    return None


def model_instance(model: str, value: object) -> str | None:
    """``value`` as an instance of ``model``: named ``<its slug>-<number>``, as ``_choose`` does.

    Anything else is no instance of it: one tenant's template label naming another
    model's instance is not that instance (hostile pass 4, M5). The number is whole:
    ``meta-llama-llama-3-1-8b-instruct-1`` starts with Llama-3.1-8B's slug, and a base
    model's tenant labelled so held a seat on the Instruct model's instance (pass 49).
    """
    instance = _instance(value)
    slug = instance_slug(model)
    if instance is None or not instance.startswith(f"{slug}-"):
        return None
    return instance if _number(instance, slug) != _NO_NUMBER else None


def _instance(value: object) -> str | None:
    """An instance label as a label value; anything else is no instance."""
    if isinstance(value, str) and value and _LABEL_VALUE.fullmatch(value):
        return value
    return None


def _template_instance(workload: Mapping[str, Any], model: str | None = None) -> str | None:
    """The instance label on a pod template; with ``model``, only one of its instances."""
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        metadata = (pod_set.get("template") or {}).get("metadata") or {}
        label = (metadata.get("labels") or {}).get(names.LORA_INSTANCE)
        value = _instance(label) if model is None else model_instance(model, label)
        if value:
            return value
    return None


def _live(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _number(instance: str, slug: str) -> int:
    tail = instance.removeprefix(f"{slug}-")
    # isdigit() alone is true for "²" and for 5,000 digits, and int() raises on both
    if tail.isascii() and tail.isdigit() and len(tail) <= _MAX_INSTANCE_DIGITS:
        return int(tail)
    return _NO_NUMBER


_NO_NUMBER: Final = 1 << 30
"""``_number`` of an id that is not ``<slug>-<number>``: after every numbered one."""


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """What one base-model instance's tenants observe (None: the signal is unknown)."""

    memory_used: float | None
    """Fraction 0..1 of the instance cards' memory taken (HAMi)."""
    step_seconds: float | None
    """The tenants' observed step time (p95 or mean), seconds."""
    step_slo_seconds: float | None
    """The tenants' step-time objective, seconds."""


def tenants_for(
    current: int, load: InstanceLoad, ceiling: int = MAX_TENANTS_PER_INSTANCE
) -> tuple[int, str]:
    """The tenants an instance should take next, one step from ``current``, and why.

    Lower by one (not below 1) when memory is at ``MEMORY_LOWER_AT`` or more, or steps
    are slower than their objective; raise by one (not above ``ceiling``) when memory is
    at ``MEMORY_RAISE_AT`` or less and steps within ``STEP_RAISE_FRACTION`` of it; else
    hold. A signal unknown only ever holds: the one known and bad still lowers. A
    ``current`` above ``ceiling`` (the ceiling was lowered) comes down to it.

    Raises:
        ValueError: ``current`` below 1, ``ceiling`` not 1-8, a fraction outside 0..1,
            a negative step or an objective not above 0.
    """
    limit = validate_tenants_per_instance(ceiling)
    _check_load(current, load)
    memory, step = _memory_reading(load.memory_used), _step_reading(load)
    bad = [r.text for r in (memory, step) if r.bad]
    if current > limit:
        return limit, f"{current} tenants is above the ceiling of {limit}: {limit}"
    if bad:
        target = max(1, current - 1)
        verb = f"{target} (one fewer)" if target < current else "1 (the fewest)"
        return target, f"{' and '.join(bad)}: {verb}"
    unknown = [r.text for r in (memory, step) if r.unknown]
    if unknown:
        known = [r.text for r in (memory, step) if not r.unknown]
        seen = f" ({' and '.join(known)})" if known else ""
        return current, f"{' and '.join(unknown)}{seen}, so no more: holding at {current}"
    if memory.roomy and step.roomy:
        if current >= limit:
            return current, f"{memory.text} and {step.text}, but at the ceiling of {limit}"
        return current + 1, f"{memory.text} and {step.text}: {current + 1} (one more)"
    return current, f"{memory.text} and {step.text}: holding at {current}"


@dataclass(frozen=True, slots=True)
class _Reading:
    text: str
    bad: bool = False
    roomy: bool = False
    unknown: bool = False


def _memory_reading(used: float | None) -> _Reading:
    if used is None:
        return _Reading("memory use unknown", unknown=True)
    text = f"memory {used:.0%} used"
    if used >= MEMORY_LOWER_AT:
        return _Reading(f"{text} (at or above {MEMORY_LOWER_AT:.0%})", bad=True)
    if used <= MEMORY_RAISE_AT:
        return _Reading(f"{text} (room up to {MEMORY_RAISE_AT:.0%})", roomy=True)
    return _Reading(f"{text} (between {MEMORY_RAISE_AT:.0%} and {MEMORY_LOWER_AT:.0%})")


def _step_reading(load: InstanceLoad) -> _Reading:
    step, slo = load.step_seconds, load.step_slo_seconds
    if step is None or slo is None:
        missing = "step time" if step is None else "step objective"
        return _Reading(f"{missing} unknown", unknown=True)
    text = f"step {step:g} s against a {slo:g} s objective"
    if step > slo:
        return _Reading(f"{text} (over it)", bad=True)
    if step <= STEP_RAISE_FRACTION * slo:
        return _Reading(f"{text} (within {STEP_RAISE_FRACTION:.0%} of it)", roomy=True)
    return _Reading(f"{text} (near it)")


def _check_load(current: int, load: InstanceLoad) -> None:
    if isinstance(current, bool) or not isinstance(current, int) or current < 1:
        raise ValueError(f"current tenants must be an integer >= 1, got {current!r}")
    used = load.memory_used
    if used is not None and not (math.isfinite(used) and 0 <= used <= 1):
        raise ValueError(f"memory_used must be a fraction from 0 to 1, got {used!r}")
    step = load.step_seconds
    if step is not None and not (math.isfinite(step) and step >= 0):
        raise ValueError(f"step_seconds must be a finite number >= 0, got {step!r}")
    slo = load.step_slo_seconds
    if slo is not None and not (math.isfinite(slo) and slo > 0):
        raise ValueError(f"step_slo_seconds must be a finite number > 0, got {slo!r}")
