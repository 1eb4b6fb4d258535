"""The capacity manager's inputs, read from the cluster: a pool's cards, its admitted training.

Pure: HAMi's inventory and the API server's JSON in, ``admission.pool`` values out. The
pass that plans each pool and turns its reclaims into ``Retry`` decisions is
``admission.decide.plan_pools`` / ``reclaim_all``; this module only reads.

**A card's taken share** is the larger of its memory and its cores given out (HAMi's
``used / registered``), 1.0 once every slot of it is taken (nothing more fits there: an
exclusive card), and one slot's worth for a card a container holds without memory or
cores (touched, so not whole and free). A card is ``<node>/<uuid>``.

**An admitted workload's shares** are what its pods (found by owner, as the fit finds a
gang's pods) hold per ``hami.io/vgpu-devices-allocated``, each use the larger of its
memory and cores fractions of the card, summed per card and capped at 1. Only cards the
pool offers count: freeing a card on a cordoned node gives inference nothing.

**What inference holds** (``PoolState.inference_cards``) is what the cards' taken shares
leave over once admitted training's shares are taken off, card by card: on a pool of
training and inference, whatever else holds a card is an inference replica, one still
starting included (the scalers count only serving replicas, so without this a cold start
would read as a shortfall). A gang made Ready but not yet admitted counts there too, which
errs toward reclaiming less, never more.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from admission import annotations as names
from admission.hami import (
    TERMINAL_PHASES,
    DeviceState,
    HamiFormatError,
    Inventory,
    PodPlacement,
    parse_devices_allocated,
)
from admission.pool import Admitted, PoolState
from admission.workload import (
    MAX_CLOCK_SKEW,
    READY,
    check_entries,
    key,
    owned_pods,
    pods_by_owner,
    priority,
    reclaim_guard,
)
from foundation.objects import RawObject
from foundation.timestamps import parse_time

__all__ = [
    "AdmittedHere",
    "admitted_in_pool",
    "card_id",
    "card_share",
    "others_cards",
    "placement_cards",
    "pool_state",
]


def card_id(node: str, uuid: str) -> str:
    """How the capacity manager names a card."""
    return f"{node}/{uuid}"


def card_share(state: DeviceState) -> float:
    """The share of a card taken (0: untouched), as the module docstring defines it."""
    if state.untouched:
        return 0.0
    device = state.device
    if state.free_slots == 0:
        return 1.0
    share = max(
        state.used_memory_mib / device.memory_mib if device.memory_mib > 0 else 0.0,
        state.used_cores / device.cores if device.cores > 0 else 0.0,
    )
    return min(1.0, share) if share > 0 else 1.0 / max(1, device.split_count)


def pool_state(pool: Inventory, name: str = "", training: Iterable[Admitted] = ()) -> PoolState:
    """The cards the pool offers (healthy, not cordoned, handshake fresh) and their shares.

    ``inference_cards`` is what ``training``'s shares leave of them (module docstring).
    """
    taken: dict[str, float] = {}
    cards = 0
    for node in pool.nodes:
        for state in node.devices:
            cards += 1
            share = card_share(state)
            if share > 0:
                taken[card_id(node.name, state.device.uuid)] = share
    return PoolState(
        cards=cards, taken=taken, pool=name, inference_cards=others_cards(taken, training)
    )


def others_cards(taken: Mapping[str, float], training: Iterable[Admitted]) -> float:
    """Cards' worth of ``taken`` that ``training``'s shares do not account for, card by card."""
    left = dict(taken)
    for workload in training:
        for card, share in workload.shares.items():
            if card in left:
                left[card] -= share
    return math.fsum(max(0.0, share) for share in left.values() if share > 1e-6)


def placement_cards(pool: Inventory, placements: Iterable[PodPlacement]) -> float:
    """The cards' worth a gang's placements take (each take: memory or cores, the larger)."""
    total = 0.0
    for placement in placements:
        node = pool.node(placement.node)
        for take in placement.takes():
            state = node.device(take.uuid) if node is not None else None
            if state is None:
                total += 1.0  # a card we cannot size: count it whole, never less
                continue
            total += _fraction(take.memory_mib, take.cores, state)
    return total


@dataclass(frozen=True)
class AdmittedHere:
    """An admitted workload of the pool and the check of ours whose Ready entry it holds."""

    admitted: Admitted
    check: str


def admitted_in_pool(
    workloads: Iterable[RawObject],
    pods: Sequence[RawObject],
    pool: Inventory,
    checks: Collection[str],
    max_priority: int,
    *,
    by_owner: Mapping[str, list[RawObject]] | None = None,
    now: float | None = None,
) -> list[AdmittedHere]:
    """The workloads admitted through ``checks`` that a reclaim may write to, with shares.

    A workload counts when one of ``checks`` holds it Ready and ``reclaim_guard`` allows a
    write (admitted, not evicted, finished or leaving); it is preemptible when its
    ``spec.priority`` is at most ``max_priority`` and its admission time is readable.
    One with no pod placed yet holds no share (it frees nothing, so it is never reclaimed).
    ``by_owner``: the pass's ``workload.pods_by_owner(pods)``, when it has one. ``now``:
    an admission time more than ``MAX_CLOCK_SKEW`` ahead of it, or before the Workload's
    creation, reads as the creation (None: times are not held against a clock).
    """
    by_owner = pods_by_owner(pods) if by_owner is None else by_owner
    found = []
    for w in workloads:
        entries = check_entries(w)
        ours = sorted(c for c in checks if (entries.get(c) or {}).get("state") == READY)
        if not ours or reclaim_guard(w) is not None:
            continue
        shares = _shares(owned_pods(w, by_owner), pool)
        at = _admitted_at(w, now)
        rank = priority(w)
        # Admitted at a time unreadable: how long it ran is unknown, so minRunSeconds
        # cannot be shown to have passed; it is never reclaimed (0 would read as decades).
        preemptible = rank <= max_priority and at is not None
        found.append(AdmittedHere(Admitted(key(w), rank, at or 0.0, preemptible, shares), ours[0]))
    return found


def _admitted_at(w: RawObject, now: float | None) -> float | None:
    """The ``Admitted`` condition's transition; None when unreadable.

    A time more than ``MAX_CLOCK_SKEW`` ahead of ``now``, or more than that before the
    Workload's creation (it was admitted after it; the API server sets it), reads as the
    creation; a creation ahead too is None. Dated a day ahead, a workload was never old
    enough to reclaim, and an older one was taken instead; dated 1970 it read as the
    oldest, and an older one was taken too (hostile pass 4, M2).
    """
    for cond in (w.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Admitted":
            at = parse_time(cond.get("lastTransitionTime"))
            if at is None or now is None:
                return at
            created = parse_time((w.get("metadata") or {}).get("creationTimestamp"))
            if created is not None and created > now + MAX_CLOCK_SKEW:
                created = None  # ahead: unreadable, and no bound for the admission either
            ahead = at > now + MAX_CLOCK_SKEW
            behind = created is not None and at < created - MAX_CLOCK_SKEW
            return created if ahead or behind else at
    return None


def _shares(pods: Iterable[RawObject], pool: Inventory) -> dict[str, float]:
    shares: dict[str, float] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        annotations: Mapping[str, Any] = meta.get("annotations") or {}
        value = annotations.get(names.HAMI_DEVICES_ALLOCATED)
        where = annotations.get(names.HAMI_VGPU_NODE) or (pod.get("spec") or {}).get("nodeName")
        node = pool.node(str(where)) if value and where else None
        if node is None:
            continue
        try:
            uses = parse_devices_allocated(str(value))
        except HamiFormatError:
            continue  # the inventory reports it; its cards count as taken by nobody we know
        for use in uses:
            state = node.device(use.uuid)
            if state is not None:
                card = card_id(node.name, use.uuid)
                part = _fraction(use.memory_mib, use.cores, state)
                shares[card] = min(1.0, shares.get(card, 0.0) + part)
    return shares


def _fraction(memory_mib: int, cores: int, state: DeviceState) -> float:
    device = state.device
    share = max(
        memory_mib / device.memory_mib if device.memory_mib > 0 else 0.0,
        cores / device.cores if device.cores > 0 else 0.0,
    )
    return min(1.0, share) if share > 0 else 1.0 / max(1, device.split_count)
