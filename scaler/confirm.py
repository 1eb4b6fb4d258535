"""Whether a ScaledObject the scaler was told of is one the API server has.

Anyone who reaches the scaler's port can call ``GetMetricSpec`` with a ScaledObjectRef of
their making. For KEDA's own calls that costs nothing, but a pool's inference demand
(``scaler.demand``) holds training back for every accelerator it claims, so it counts a
ScaledObject only as the API server has it: one of its triggers of type ``external`` or
``external-push`` carries exactly the metadata the calls carried (KEDA sends a trigger's
whole ``metadata`` map as ``scalerMetadata``, and unitscale refuses keys it does not
know, so nothing is resolved in between).

>>> llama = {"metadata": {"namespace": "prod", "name": "llama"},
...          "spec": {"triggers": [{"type": "external", "metadata": {"pool": "h200"}}]}}
>>> listed = {"prod/llama": llama}
>>> standing(listed, ("prod", "llama"), {"pool": "h200"}).name
'CONFIRMED'
>>> standing(listed, ("prod", "llama"), {"pool": "h200", "minReplicas": "100"}).name
'DIFFERS'
>>> standing(listed, ("evil", "x"), {"pool": "h200"}).name
'ABSENT'
>>> standing(None, ("prod", "llama"), {"pool": "h200"}).name
'UNLISTED'

Pure: the listed objects are plain mappings as the API server sent them, checked here
(a field of the wrong shape is no matching trigger, never an exception).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol

from foundation.objects import RawObject

TRIGGER_TYPES = frozenset({"external", "external-push"})
"""KEDA's trigger types that call an external scaler."""


class Standing(enum.Enum):
    """What the API server says of a ScaledObject the scaler was told of."""

    CONFIRMED = "confirmed"
    """It has the ScaledObject, and a trigger with exactly this metadata."""
    DIFFERS = "differs"
    """It has the ScaledObject, with no such trigger: an edit not seen yet by one side,
    or a call that is not KEDA's under an existing name."""
    ABSENT = "absent"
    """It has no ScaledObject of that namespace and name."""
    UNLISTED = "unlisted"
    """The ScaledObjects are not listed yet (the watch starts, or cannot list)."""


class Confirmer(Protocol):
    """Where the API server's ScaledObjects come from (``scaler.scaled_objects``)."""

    @property
    def listed(self) -> Mapping[str, RawObject] | None:
        """Every ScaledObject by ``namespace/name``; None until first listed."""

    @property
    def problem(self) -> str:
        """Why the list is missing or may be old (the watch's last failure); empty if none."""


def standing(
    listed: Mapping[str, RawObject] | None,
    key: tuple[str, str],
    metadata: Mapping[str, str],
) -> Standing:
    """What ``listed`` says of ScaledObject ``key`` whose calls carried ``metadata``.

    ``listed`` is None until listed; ``key`` is (namespace, name).
    """
    if listed is None:
        return Standing.UNLISTED
    found = listed.get(f"{key[0]}/{key[1]}")
    if found is None:
        return Standing.ABSENT
    if any(given == metadata for given in trigger_metadata(found)):
        return Standing.CONFIRMED
    return Standing.DIFFERS


def trigger_metadata(scaled_object: RawObject) -> list[Mapping[object, object]]:
    """The metadata maps of the object's external-scaler triggers.

    Any part of the wrong shape (no ``spec`` mapping, ``triggers`` no list, a trigger
    no mapping) is left out.
    """
    spec = scaled_object.get("spec")
    triggers = spec.get("triggers") if isinstance(spec, dict) else None
    if not isinstance(triggers, list):
        return []
    return [
        trigger["metadata"]
        for trigger in triggers
        if isinstance(trigger, dict)
        and trigger.get("type") in TRIGGER_TYPES
        and isinstance(trigger.get("metadata"), dict)
    ]
