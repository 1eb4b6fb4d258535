"""Which replica gets a request, and whether a request may wait for one. Pure.

- Route to the ready replica serving the requested model (a LoRA adapter name counts
  as a model a replica serves) with the fewest outstanding requests; ties go to the
  replica listed first, so routing is deterministic.
- With no such replica, a request may wait in the buffer while it holds fewer than
  ``capacity`` requests and its body fits in the buffer's bytes; a full buffer answers
  429, a wait past the timeout 503.
- A request for a model certainly served by nobody is answered 404 at once. With ready
  replicas that have listed their models, they decide. With none ready, the known models
  decide (those configured plus every one a replica has listed since the gateway
  started): a model outside them is 404; with nothing known yet, every model may wait.
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


def may_buffer(
    buffered: int, capacity: int, buffered_bytes: int, size: int, byte_capacity: int
) -> bool:
    """Whether one more request, of ``size`` bytes, may wait for a replica.

    Args:
        buffered: requests waiting now.
        capacity: the most requests that may wait.
        buffered_bytes: the bytes of their bodies.
        size: the bytes of this request's body.
        byte_capacity: the most bytes of bodies that may wait.
    """
    return buffered < capacity and buffered_bytes + size <= byte_capacity


def is_unserved(
    replicas: Sequence[ReplicaView], model: str, known: frozenset[str] = frozenset()
) -> bool:
    """Whether ``model`` is certainly served by nobody: a 404 beats waiting for nothing.

    Args:
        replicas: what the router sees.
        model: the model asked for.
        known: the models configured or listed by a replica since the gateway started.

    Returns:
        With some replica ready: True when every ready one has listed its models and
        none lists ``model``. With none ready: True when ``known`` is not empty and
        does not hold ``model``.
    """
    ready = [r for r in replicas if r.ready]
    if ready:
        return all(r.models and model not in r.models for r in ready)
    return bool(known) and model not in known


def known_models(replicas: Sequence[ReplicaView]) -> Mapping[str, int]:
    """Every model some replica serves, with how many ready replicas serve it."""
    counts: dict[str, int] = {}
    for replica in replicas:
        if replica.ready:
            for model in replica.models:
                counts[model] = counts.get(model, 0) + 1
    return counts
