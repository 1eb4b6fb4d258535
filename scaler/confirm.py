"""Whether a ScaledObject the scaler was told of is one the API server has.

Anyone who reaches the scaler's port can call ``GetMetricSpec`` with a ScaledObjectRef of
their making. A pool's inference demand (``scaler.demand``) holds training back for every
accelerator it claims, and the registry keeps a ScaledObject's metadata for KEDA's calls,
so both take a ScaledObject only as the API server has it: one of its triggers of type
``external`` or ``external-push`` carries exactly the metadata the calls carried (KEDA
sends a trigger's whole ``metadata`` map as ``scalerMetadata``, and unitscale refuses keys
it does not know, so nothing is resolved in between).

>>> llama = {"metadata": {"namespace": "prod", "name": "llama"},
...          "spec": {"triggers": [{"type": "external", "metadata": {"pool": "h200"}}]}}
>>> listed = {"prod/llama": projected(llama)}
>>> standing(listed, ("prod", "llama"), {"pool": "h200"}).name
'CONFIRMED'
>>> standing(listed, ("prod", "llama"), {"pool": "h200", "minReplicas": "100"}).name
'DIFFERS'
>>> standing(listed, ("evil", "x"), {"pool": "h200"}).name
'ABSENT'
>>> standing(None, ("prod", "llama"), {"pool": "h200"}).name
'UNLISTED'

Pure: the listed objects are plain mappings as the API server sent them, or as
``projected`` keeps them; a field of the wrong shape is no matching trigger, never an
exception.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Protocol

from foundation.objects import RawObject
from scaler.metadata import MAX_KEYS, MAX_VALUE_LENGTH

TRIGGER_TYPES = frozenset({"external", "external-push"})
"""KEDA's trigger types that call an external scaler."""
MAX_TRIGGERS = 64
"""External-scaler triggers a ScaledObject may have for the check; one with more has
none that any call matches (an object near etcd's 1.5 MB with 11,000 triggers cost 6 MB
kept whole, and 2.5 ms each call compared)."""

Triggers = tuple[bytes, ...]
"""A ScaledObject's external triggers' metadata maps, each as its ``digest``."""
_TRIGGERS = "unitscale.io/triggers"
"""Where ``projected`` keeps the object's ``Triggers``."""


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
    """The ScaledObjects are not listed yet (the watch starts, cannot list, or its list
    is too old to refuse calls by)."""


class Confirmer(Protocol):
    """Where the API server's ScaledObjects come from (``scaler.scaled_objects``)."""

    @property
    def listed(self) -> Mapping[str, RawObject] | None:
        """Every ScaledObject by ``namespace/name``; None until listed, or when stale."""

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
    if digest(metadata) in triggers_of(found):
        return Standing.CONFIRMED
    return Standing.DIFFERS


def digest(metadata: Mapping[str, str]) -> bytes:
    """A metadata map's fingerprint: equal maps only have equal ones.

    BLAKE2b, 128 bits, of its items sorted. Kept instead of the maps, 10,000 listed
    ScaledObjects take 6 MiB, against 22 MiB (and 80 MiB whole).
    """
    text = json.dumps(sorted(metadata.items()), separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def projected(scaled_object: RawObject) -> RawObject:
    """What the check keeps of a listed ScaledObject: its name and ``Triggers``."""
    meta = scaled_object.get("metadata")
    names = (
        {k: meta[k] for k in ("name", "namespace") if k in meta} if isinstance(meta, dict) else {}
    )
    return {"metadata": names, _TRIGGERS: triggers_of(scaled_object)}


def triggers_of(scaled_object: RawObject) -> Triggers:
    """The metadata maps of the object's external-scaler triggers.

    Any part of the wrong shape (no ``spec`` mapping, ``triggers`` no list, a trigger no
    mapping, a value no string) is no trigger; nor is a map no call could carry (over
    ``MAX_KEYS`` keys or ``MAX_VALUE_LENGTH`` characters a value). Over ``MAX_TRIGGERS``
    of them: none.
    """
    kept = scaled_object.get(_TRIGGERS)
    if isinstance(kept, tuple):
        return kept
    spec = scaled_object.get("spec")
    triggers = spec.get("triggers") if isinstance(spec, dict) else None
    if not isinstance(triggers, list):
        return ()
    maps = [
        trigger["metadata"]
        for trigger in triggers
        if isinstance(trigger, dict)
        and trigger.get("type") in TRIGGER_TYPES
        and isinstance(trigger.get("metadata"), dict)
    ]
    if len(maps) > MAX_TRIGGERS:
        return ()
    return tuple(
        digest(m)
        for m in maps
        if len(m) <= MAX_KEYS
        and all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_VALUE_LENGTH
            for k, v in m.items()
        )
    )
