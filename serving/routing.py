"""Which replica gets a request, and whether a request may wait for one. Pure.

- Route to the ready replica serving the requested model (a LoRA adapter name counts
  as a model a replica serves) with the fewest outstanding requests; ties go to the
  replica listed first, so routing is deterministic.
- With no such replica, a request may wait in the buffer while it holds fewer than
  ``capacity`` requests; a full buffer answers 429, a wait past the timeout 503.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the router knows of one replica."""

    url: str
    ready: bool
    outstanding: int
    models: frozenset[str]
    """Base model and loaded LoRA adapters (from its /v1/models); empty: not known yet."""


def choose(replicas: Sequence[ReplicaView], model: str | None) -> str | None:
    """The URL to send a request for ``model`` to, or None when no ready replica serves it."""
    best: ReplicaView | None = None
    for replica in replicas:
        if not replica.ready:
            continue
        if model and replica.models and model not in replica.models:
            continue
        if best is None or replica.outstanding < best.outstanding:
            best = replica
    return best.url if best is not None else None


def may_buffer(buffered: int, capacity: int) -> bool:
    """Whether one more request may wait for a replica."""
    return buffered < capacity


def is_unserved(replicas: Sequence[ReplicaView], model: str) -> bool:
    """Whether ``model`` is certainly served by nobody.

    True when some replica is ready, every ready one has listed its models, and none
    lists ``model``: a 404 then beats waiting in the buffer for nothing.
    """
    ready = [r for r in replicas if r.ready]
    listed = bool(ready) and all(r.models for r in ready)
    return listed and all(model not in r.models for r in ready)


def known_models(replicas: Sequence[ReplicaView]) -> Mapping[str, int]:
    """Every model some replica serves, with how many ready replicas serve it."""
    counts: dict[str, int] = {}
    for replica in replicas:
        if replica.ready:
            for model in replica.models:
                counts[model] = counts.get(model, 0) + 1
    return counts
