"""Adaptive LoRA density: how many tenants each base model's instances take now.

Pure: the pass's pods and HAMi inventory in, with the density the controller holds and
``now``; the new density out, with a reason per model. The controller keeps one number
per base model in memory (``Density``), starting at the check's ``tenantsPerInstance``
(the ceiling), and calls ``step_density`` once a pass: a model moves by at most one
(``admission.lora.tenants_for``) and not again within ``LORA_INTERVAL`` seconds of its
last change, so a new tenant's load shows before the next step. A restarted controller
starts again at the ceiling.

The signals, per base model (its instances are the ``unitscale.io/lora-instance``
labels on running pods whose Workload names it; the most pressed instance counts):

- **memory**: of the cards the instance's pods hold, the memory HAMi has given out
  (``used / registered``, every pod on those cards), the largest fraction;
- **step time**: the largest ``unitscale.io/lora-step-seconds`` annotation on the
  instance's pods (the trainer's recent step time, written by the job), against
  ``lora.stepTimeSloSeconds``; no annotation, or no SLO, is unknown.

An unknown signal only ever holds the density (or lowers it on the other signal);
never a zero.

Lowering the density seats no tenant fewer: an instance that pressed it down still reads
the same until a tenant leaves. So a bad reading lowers it again only while the density
is at least the tenants the model's most crowded instance holds (``seated``: distinct
Jobs among its running pods); below that, the reading is the crowd seated before, and
the density holds (else one full instance would walk it down to 1, a step a minute).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from admission import annotations as names
from admission.hami import TERMINAL_PHASES, HamiFormatError, Inventory, parse_devices_allocated
from admission.lora import InstanceLoad, base_model, model_instance, tenants_for
from foundation.objects import RawObject

LORA_INTERVAL: Final = 60.0
"""Seconds between two changes of one model's density."""
STEP_SECONDS: Final = "unitscale.io/lora-step-seconds"
"""Pod annotation: the tenant's recent step time in seconds (written by the trainer)."""

__all__ = [
    "LORA_INTERVAL",
    "STEP_SECONDS",
    "Density",
    "instance_models",
    "model_loads",
    "model_seated",
    "step_density",
]


@dataclass(frozen=True)
class Density:
    """One base model's tenants per instance now, and when it last changed."""

    tenants: int
    changed_at: float
    reason: str = ""


def model_loads(
    pods: Iterable[RawObject],
    pool: Inventory,
    models: Mapping[str, str],
    slo_seconds: float | None,
) -> dict[str, InstanceLoad]:
    """The load of each base model's most pressed instance, by model.

    ``models`` maps an instance id (``unitscale.io/lora-instance``) to its base model.
    """
    memory: dict[str, float] = {}
    steps: dict[str, float] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        model = models.get(str((meta.get("labels") or {}).get(names.LORA_INSTANCE, "")))
        if model is None:
            continue
        annotations: Mapping[str, Any] = meta.get("annotations") or {}
        fraction = _memory_fraction(annotations, pod, pool)
        if fraction is not None:
            memory[model] = max(memory.get(model, 0.0), fraction)
        step = _step_seconds(annotations.get(STEP_SECONDS))
        if step is not None:
            steps[model] = max(steps.get(model, 0.0), step)
    return {
        model: InstanceLoad(memory.get(model), steps.get(model), slo_seconds)
        for model in sorted(set(models.values()))
    }


def step_density(
    held: Mapping[str, Density],
    loads: Mapping[str, InstanceLoad],
    ceiling: int,
    now: float,
    seated: Mapping[str, int] | None = None,
) -> dict[str, Density]:
    """Each model's density after this pass (models with no load known are kept).

    ``seated``: per model, the tenants its most crowded instance holds (``model_seated``);
    a model absent from it (or ``seated`` None) is lowered on a bad reading as before.
    """
    out = dict(held)
    for model, load in sorted(loads.items()):
        current = held.get(model, Density(ceiling, -math.inf, "starts at tenantsPerInstance"))
        if now - current.changed_at < LORA_INTERVAL and current.tenants <= ceiling:
            out[model] = current
            continue
        tenants, why = tenants_for(current.tenants, load, ceiling)
        crowd = (seated or {}).get(model)
        if tenants < current.tenants <= ceiling and crowd is not None and current.tenants < crowd:
            reading = why.rsplit(":", 1)[0]
            tenants = current.tenants
            why = f"{reading}, from the {crowd} tenants seated before: holding at {tenants}"
        changed = tenants != current.tenants
        out[model] = Density(tenants, now if changed else current.changed_at, why)
    return out


def model_seated(pods: Iterable[RawObject], models: Mapping[str, str]) -> dict[str, int]:
    """Per base model, the most tenants one of its instances holds now.

    A tenant is a Job: the distinct first owners of the instance's running pods (a pod
    without an owner counts as its own tenant).
    """
    owners: dict[str, set[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        instance = str((meta.get("labels") or {}).get(names.LORA_INSTANCE, ""))
        if instance not in models:
            continue
        refs = [r for r in meta.get("ownerReferences") or () if isinstance(r, dict)]
        owner = str(refs[0].get("uid")) if refs and refs[0].get("uid") else f"pod:{meta.get('uid')}"
        owners.setdefault(instance, set()).add(owner)
    seated: dict[str, int] = {}
    for instance, jobs in owners.items():
        model = models[instance]
        seated[model] = max(seated.get(model, 0), len(jobs))
    return seated


def _memory_fraction(
    annotations: Mapping[str, Any], pod: Mapping[str, Any], pool: Inventory
) -> float | None:
    """The largest memory fraction given out on the cards this pod holds; None: unknown."""
    value = annotations.get(names.HAMI_DEVICES_ALLOCATED)
    where = annotations.get(names.HAMI_VGPU_NODE) or (pod.get("spec") or {}).get("nodeName")
    node = pool.node(str(where)) if value and where else None
    if node is None:
        return None
    try:
        uses = parse_devices_allocated(str(value))
    except HamiFormatError:
        return None
    fractions = []
    for use in uses:
        state = node.device(use.uuid)
        if state is not None and state.device.memory_mib > 0:
            fractions.append(min(1.0, state.used_memory_mib / state.device.memory_mib))
    return max(fractions) if fractions else None


MAX_STEP_SECONDS: Final = 86_400.0
"""A step time beyond a day is no trainer's recent step: unknown, never a reading."""
_STEP = re.compile(r"[0-9]{1,6}(\.[0-9]{1,9})?", re.ASCII)
"""Step seconds as a trainer writes them: ASCII decimal, no exponent, sign or ``_``
(``float()`` reads ``1e308``, ``1_0`` and Arabic-Indic digits)."""


def _step_seconds(value: object) -> float | None:
    """The annotation as seconds 0 to ``MAX_STEP_SECONDS``; anything else unknown (None)."""
    text = value.strip() if isinstance(value, str) else ""
    if not _STEP.fullmatch(text):
        return None
    # float() of the stripped text: str.strip() takes '\x1f' as space, float() does not.
    seconds = float(text)
    return seconds if seconds <= MAX_STEP_SECONDS else None


def named_models(workloads: Iterable[RawObject]) -> frozenset[str]:
    """The base models some Workload in the view names (``lora.base_model``).

    A density is kept while its model is named: one a tenant named and then deleted was
    kept for good, so Workloads naming a new model each grew the controller without
    bound (200,000 models: 65 MiB and a sort of them every pass; hostile pass 7). A
    model still named, but with no instance known (one another model's tenant claims
    too), keeps its density: that tenant cannot reset it to the ceiling.
    """
    return frozenset(m for w in workloads if (m := base_model(w)) is not None)


def instance_models(workloads: Sequence[RawObject]) -> dict[str, str]:
    """Instance id -> base model, from the tenants' admission entries and pod templates.

    A label counts for a tenant's model only when it names one of that model's instances
    (``lora.model_instance``); an instance two models claim (a shared slug) is unknown
    and left out, its load held. The label was read raw and the last claim won: a tenant
    of model B labelled with model A's instance took A's step readings (pass 4, M5).
    """
    claims: dict[str, set[str]] = {}
    for w in workloads:
        model = base_model(w)
        if model is None:
            continue
        labels = [
            (update.get("labels") or {}).get(names.LORA_INSTANCE)
            for entry in (w.get("status") or {}).get("admissionChecks") or []
            for update in entry.get("podSetUpdates") or []
        ] + [
            (((pod_set.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(
                names.LORA_INSTANCE
            )
            for pod_set in (w.get("spec") or {}).get("podSets") or []
        ]
        for label in labels:
            instance = model_instance(model, label)
            if instance:
                claims.setdefault(instance, set()).add(model)
    return {instance: next(iter(m)) for instance, m in claims.items() if len(m) == 1}
