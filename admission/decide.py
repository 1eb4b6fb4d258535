"""The admission check's decision: each Pending workload to Ready, Retry, Rejected or Pending.

Pure: the cluster as plain API objects and ``now`` in, one ``Decision`` per pending check
out, each with its reason. The controller (``admission/controller.py``) reads, calls
``decide_all`` once per pass and writes what it returns.

For one workload, in order (the first that does not pass decides):

1. **Its demand** (``admission.requests.workload_demand``): a podSet that cannot be read is
   ``Rejected``: retrying would read it the same way.
2. **Never fits**: a gang that misses the pool's hardware with nothing else running
   (``fit.fits_ever``) is ``Rejected``: retrying, or waiting for its data, cannot help.
3. **Data** (``admission.fluid.readiness``): no Dataset named passes; a bad name is
   ``Rejected``; a Dataset missing, unbound or still loading keeps the check ``Pending``
   (our DataLoad created if none runs), so the quota stays reserved while the cache
   fills; after ``data.timeoutSeconds``, a failed load or a cache that stays short:
   ``Retry``.
4. **Fits now** (``fit.fit_gang``) on what HAMi's nodes offer, less the gangs admitted
   before it whose pods are not all placed yet, and — when the data must be local or a
   LoRA instance runs somewhere — only on those nodes: else ``Retry`` after
   ``retryAfterSeconds``.
5. **Inference headroom**: after the gang, the whole pool keeps at least the whole GPUs the
   scaler forecasts inference to add within the horizon (needed - held); else ``Retry``.
   The scaler unreachable: ``Retry`` (``whenUnavailable: Hold``) or no check (``Ignore``).
6. **Ready**, with podSetUpdates (HAMi policy and GPU type, the Fluid cache-node
   selector, the LoRA instance), none overriding a key the user set.

Workloads are decided by priority, then age; each Ready reserves its placement, so two
gangs decided in one pass never count the same GPUs, and each DataLoad or LoRA seat
taken is seen by the next.

One workload or pool never stops the pass: an exception while deciding one check (or
planning one pool) fails only that unit's round, as a ``Decision`` with ``failed`` set
(or a ``CheckPlan`` with ``failed`` set, whose pending checks then fail too, since the
allowance they are judged by is unknown). Nothing is written for it; the controller warns
and counts, and the next pass tries again.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from admission import annotations as names
from admission import fluid, incremental, lora, reclaim, shape
from admission.cluster import (
    CheckPlan,
    Cluster,
    Decision,
    Pending,
    State,
    error_text,
    indexed,
    our_checks,
    pod_index_of,
    pool_group,
)
from admission.fit import FitResult, fit_gang, fits_ever, whole_free_gpus
from admission.hami import (
    Inventory,
    NodeGpus,
    allocation_size,
    bound_where_placed,
    holds_cards,
    inventory,
    largest_card_mib,
    taking_pods,
)
from admission.hints import Hints, combine, merge_hints
from admission.manager import plan_pools, scaler_figures
from admission.parameters import Parameters
from admission.pool import within_allowance
from admission.requests import GpuRequest, PodSetDemand, workload_demand
from admission.slots import matched as slots_matched
from admission.workload import (
    MAX_CLOCK_SKEW,
    check_entries,
    condition_status,
    created_at,
    key,
    owned_pods,
    pod_ties,
    priority,
    tied_pods,
    ties_of_pod,
)
from foundation.fluid import FluidIndex
from foundation.objects import RawObject
from foundation.timestamps import parse_time


@dataclass
class _Pass:
    """What earlier decisions of this pass took: GPUs, DataLoads, LoRA seats."""

    cluster: Cluster
    now: float
    inventories: dict[tuple[Any, ...], Inventory] = field(default_factory=dict)
    entries: dict[tuple[Any, ...], incremental.PoolEntry] = field(default_factory=dict)
    """Each pool as the pass began, with the fit answers given on it (kept across passes
    when ``cluster.memo`` is set)."""
    reserved: set[tuple[Any, ...]] = field(default_factory=set)
    """Pools a Ready of this pass took cards from: no longer the pool the pass began with."""
    fluid: FluidIndex = field(default_factory=lambda: FluidIndex((), ()))
    """Fluid's objects, with the DataLoads this pass created."""
    seats: list[lora.LoraAssignment] = field(default_factory=list)
    broken: dict[tuple[Any, ...], str] = field(default_factory=dict)
    """Pools whose inventory raised this pass, and why: read once, failed once."""
    misses: dict[tuple[Any, ...], FitResult] = field(default_factory=dict)
    """Gangs that did not fit now, per pool, nodes and policy: within a pass the
    inventory only shrinks, so the same gang misses again (a backlog of alike
    workloads costs one search, not one each)."""
    plans: Mapping[str, CheckPlan] = field(default_factory=dict)
    granted: dict[tuple[Any, ...], float] = field(default_factory=dict)
    """Cards' worth made Ready earlier in this pass, per pool: the plan predates them."""
    unplaced: dict[tuple[Any, ...], float] = field(default_factory=dict)
    """Cards' worth promised, per pool, to gangs made Ready in earlier passes whose pods
    are not all placed: the plan counts only the shares placed pods hold."""

    def inventory(self, p: Parameters, checks: Mapping[str, Parameters | None]) -> Inventory:
        """The pool of ``p`` less the gangs admitted through its checks not yet placed."""
        group = pool_group(p)
        if group in self.broken:
            raise _PoolError(self.broken[group])
        if group not in self.inventories:
            mine = frozenset(c for c, q in checks.items() if q is None or pool_group(q) == group)
            try:
                entry = _held_pool(self.cluster, p, mine, self.now)
            except Exception as err:
                self.broken[group] = f"the pool's inventory: {error_text(err)}"
                raise _PoolError(self.broken[group]) from err
            self.entries[group] = entry
            self.inventories[group], self.unplaced[group] = entry.pool, entry.promised
        return self.inventories[group]

    def reserve(self, p: Parameters, fit: FitResult) -> None:
        group = pool_group(p)
        self.inventories[group] = self.inventories[group].reserve(fit.placements)
        self.reserved.add(group)

    def fits_ever(self, group: tuple[Any, ...], demand: tuple[PodSetDemand, ...]) -> FitResult:
        """``fit.fits_ever`` on the pool's hardware, once per pool and gang."""
        entry = self.entries[group]
        ever = entry.ever.get(demand)
        if ever is None:
            ever = fits_ever(demand, entry.pool)  # reads the hardware alone
            entry.remember(entry.ever, demand, ever)
        return ever

    def missed(self, attempt: tuple[Any, ...]) -> FitResult | None:
        """A miss of this gang earlier: this pass, or on the pool as the pass began.

        Within a pass the pool only shrinks, so a gang that missed it misses again. One
        kept from an earlier pass says what the pool had as the pass began: taken only
        while no Ready of this pass took cards from it (a search now would say fewer).
        """
        found = self.misses.get(attempt)
        if found is None and attempt[0] not in self.reserved:
            found = self.entries[attempt[0]].misses.get(attempt)
        return found

    def miss(self, attempt: tuple[Any, ...], fit: FitResult) -> None:
        self.misses[attempt] = fit
        group = attempt[0]
        if group not in self.reserved:  # the pool as the pass began: kept with it
            entry = self.entries[group]
            entry.remember(entry.misses, attempt, fit)


class _PoolError(Exception):
    """The pool of a check could not be read this pass (the message says why)."""


def decide_all(pending: Sequence[Pending], cluster: Cluster, now: float) -> list[Decision]:
    """One decision per pending check, by priority (highest first), then age."""
    shaped = [(p, shape.malformed("workload", p.workload)) for p in pending]
    pending = [p for p, why in shaped if why is None]
    cluster = indexed(cluster)
    checks = our_checks(cluster, pending)
    plans = cluster.plans if cluster.plans is not None else plan_pools(cluster, now)
    state = _Pass(cluster, now, fluid=FluidIndex(cluster.datasets, cluster.dataloads), plans=plans)
    order = sorted(pending, key=lambda p: _order(p.workload))
    unshaped = [_failed(p, f"the Workload: {why}") for p, why in shaped if why is not None]
    return [*unshaped, *(_settled(p, state, checks) for p in order)]


def read_pools(cluster: Cluster, now: float) -> None:
    """Read the pool of each of our checks with usable parameters, as a pass deciding would.

    Into ``cluster.memo``: the pools kept are taken back or extended by what changed,
    the others built, so a pass with nothing to decide keeps them current and the next
    Workload is not decided after every change since. One read per pool, by the first
    check's policy (by name); a pool whose inventory raises is left unread (a pass
    deciding fails its checks).
    """
    cluster = indexed(cluster)
    checks = our_checks(cluster)
    state = _Pass(cluster, now)
    for _, params in sorted(checks.items()):
        if params is not None:
            with contextlib.suppress(_PoolError):
                state.inventory(params, checks)


def _settled(p: Pending, state: _Pass, checks: Mapping[str, Parameters | None]) -> Decision:
    """``_decide``, or a failed decision for this check alone when deciding raises.

    What a failed ``_decide`` took before raising stays taken for the rest of the pass
    (a DataLoad it meant to create): later workloads err toward waiting, never toward
    counting the same GPUs twice, since GPUs are reserved only by a Ready.
    """
    planned = state.plans.get(p.check)
    if planned is not None and planned.failed:
        return _failed(p, f"pool {planned.pool}: {planned.failed}")
    try:
        return _decide(p, state, checks)
    except _PoolError as err:
        return _failed(p, str(err))
    except Exception as err:  # one workload must never stop the pass
        return _failed(p, error_text(err))


def _failed(p: Pending, error: str) -> Decision:
    decision = _out(p, "Pending", f"not decided this pass: {error}")
    return replace(decision, failed=error)


def _out(
    p: Pending,
    verdict: State,
    message: str,
    *,
    retry: bool = False,
    updates: tuple[RawObject, ...] = (),
    create: tuple[RawObject, ...] = (),
) -> Decision:
    """The decision for ``p``: Retry waits the check's ``retryAfterSeconds``."""
    meta = p.workload.get("metadata") if isinstance(p.workload, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    requeue = p.parameters.retry_after_seconds if retry else None
    return Decision(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        p.check,
        verdict,
        message,
        requeue,
        updates,
        create,
    )


def waiting_since(p: Pending, now: float) -> float:
    """When the check became Pending, for the data timeout.

    A time more than ``MAX_CLOCK_SKEW`` ahead of ``now`` is unreadable: the Workload's
    creation instead (the API server sets it); a creation ahead too gives 0, so the wait
    times out now rather than never. A date a day ahead kept a data wait from ever
    timing out, with the quota reserved.
    """
    if p.pending_since <= now + MAX_CLOCK_SKEW:
        return p.pending_since
    created = created_at(p.workload)
    return created if created <= now + MAX_CLOCK_SKEW else 0.0


def _decide(p: Pending, state: _Pass, checks: Mapping[str, Parameters | None]) -> Decision:
    w, params = p.workload, p.parameters

    def out(verdict: State, message: str, **extra: Any) -> Decision:
        return _out(p, verdict, message, **extra)

    # 1. The demand.
    try:
        demand = workload_demand(w)
    except (ValueError, TypeError) as err:
        return out("Rejected", f"cannot read the workload's GPU requests: {err}")
    model_problem = lora.base_model_problem(w)
    if model_problem:
        return out("Rejected", model_problem)

    # 2. Never fits the pool: no use waiting for its data first.
    pool = state.inventory(params, checks)
    group = pool_group(params)
    ever = state.fits_ever(group, demand)
    if not ever.fits:
        return out("Rejected", ever.reason)

    # 3. Data.
    data = fluid.readiness(
        w,
        state.fluid,
        threshold_percent=params.data.cached_percentage,
        waiting_since=waiting_since(p, state.now),
        now=state.now,
        timeout_seconds=params.data.timeout_seconds,
        create_dataload=params.data.create_dataload,
        datasets_served=state.cluster.datasets_served,
    )
    create = (data.create,) if data.create is not None else ()
    for made in create:
        state.fluid.add_load(made)
    if data.outcome == "reject":
        return out("Rejected", data.message)
    if data.outcome == "retry":
        return out("Retry", data.message, retry=True, create=create)
    if data.outcome == "wait":
        return out("Pending", data.message, create=create)

    # 4. Fits now, where the data and the LoRA instance are.
    seat = lora.assign_instance(
        w,
        state.cluster.workloads,
        state.cluster.pods,
        tenants_per_instance=_tenant_limit(w, params, state.cluster),
        taken=state.seats,
    )
    where = dict(data.node_selector)
    if seat is not None and seat.node:
        where[names.HOSTNAME] = seat.node
    offered = _on_nodes(pool, state.cluster.nodes, where)
    attempt = (group, tuple(sorted(where.items())), params.gpu_scheduler_policy,
               params.node_scheduler_policy, demand)  # fmt: skip
    fit = state.missed(attempt) or fit_gang(
        demand,
        offered,
        params.gpu_scheduler_policy,
        node_policy=params.node_scheduler_policy or "binpack",
    )
    if not fit.fits:
        state.miss(attempt, fit)
        place = f" on the nodes with {_labels(where)}" if where else ""
        return out("Retry", f"does not fit now{place}: {fit.reason}", retry=True)

    # 5. Inference headroom, and with reclaim enabled the allowance.
    room = _inference_room(p, state, pool, fit)
    if room.hold:
        return out("Retry", room.message, retry=True)

    # 6. Ready, with the hints.
    hints = merge_hints(w, _wanted(demand, params, fit, data.node_selector, seat), check=p.check)
    state.reserve(params, fit)
    state.granted[group] = state.granted.get(group, 0.0) + room.cards
    if seat is not None:
        state.seats.append(seat)
    parts = [fit.reason, room.message]
    if data.dataset:
        parts.append(data.message)
    if seat is not None:
        parts.append(seat.message)
    if hints.message:
        parts.append(f"hints left out: {hints.message}")
    return out("Ready", "; ".join(x for x in parts if x), updates=hints.to_api())


def _tenant_limit(w: RawObject, params: Parameters, cluster: Cluster) -> int:
    """The check's tenantsPerInstance, or with adaptive LoRA the model's density under it."""
    ceiling = params.lora.tenants_per_instance
    model = lora.base_model(w) if params.lora.adaptive else None
    return min(ceiling, cluster.lora_density.get(model, ceiling)) if model else ceiling


@dataclass(frozen=True)
class _Headroom:
    hold: bool
    message: str
    cards: float = 0.0
    """The gang's cards' worth, counted against its pool's allowance (0 while held)."""


def _inference_room(p: Pending, state: _Pass, pool: Inventory, fit: FitResult) -> _Headroom:
    """Step 5: the headroom, then (reclaim enabled) the capacity manager's allowance.

    The headroom is counted over the whole pool: inference may start anywhere in it. The
    allowance is the rule reclaim enforces too, so admitting and reclaiming agree; gangs
    made Ready earlier in the pass count against it (the plan predates them), and so do
    those made Ready before whose pods are not all placed (the plan sees no share yet).
    """
    headroom = _headroom(p.parameters, state.cluster, pool, fit)
    planned = state.plans.get(p.check)
    if headroom.hold:
        return headroom
    # Counted for every check: a reclaiming check on the same pool counts this gang too.
    cards = reclaim.placement_cards(pool, fit.placements)
    if planned is None:
        return _Headroom(False, headroom.message, cards)
    group = pool_group(p.parameters)
    before = state.granted.get(group, 0.0) + state.unplaced.get(group, 0.0)
    plan = replace(planned.plan, training_held=planned.plan.training_held + before)
    fits, why = within_allowance(plan, cards)
    message = "; ".join(x for x in (headroom.message, why) if x)
    return _Headroom(not fits, why if not fits else message, cards)


def _headroom(params: Parameters, cluster: Cluster, pool: Inventory, fit: FitResult) -> _Headroom:
    """Whether admitting ``fit`` leaves inference the whole GPUs it is forecast to add.

    The pool after the gang is made only when a forecast is there to compare it with.
    """
    wanted = params.inference_headroom
    if wanted is None:
        return _Headroom(False, "")
    figures, why = scaler_figures(cluster, wanted, pool)
    if figures is None:
        if wanted.when_unavailable == "Ignore":
            return _Headroom(False, f"inference forecast unavailable ({why}): not checked")
        return _Headroom(True, f"waiting for the inference forecast of pool {wanted.pool} ({why})")
    extra = max(0, math.ceil(figures.accelerators_needed - figures.accelerators_held - 1e-9))
    free = whole_free_gpus(pool.reserve(fit.placements))
    horizon = f"{wanted.horizon_seconds} s"
    if free < extra:
        return _Headroom(
            True,
            f"inference on pool {wanted.pool} is forecast to need {extra} more GPU"
            f"{'s' if extra != 1 else ''} within {horizon} "
            f"({figures.accelerators_needed:g} needed, {figures.accelerators_held:g} held); "
            f"admitting would leave {free} whole GPU{'s' if free != 1 else ''} free",
        )
    return _Headroom(False, f"leaves {free} whole GPUs free for inference (needs {extra} more)")


def _wanted(
    demand: Sequence[PodSetDemand],
    params: Parameters,
    fit: FitResult,
    cache_nodes: Mapping[str, str],
    seat: lora.LoraAssignment | None,
) -> dict[str, Hints]:
    """The hints we would like on each podSet that asks for GPUs (data and LoRA on all)."""
    wanted: dict[str, Hints] = {}
    for pod_set in demand:
        parts = [Hints(node_selector=dict(cache_nodes))]
        if seat is not None:
            parts.append(seat.hints())
        if pod_set.pod.asks_gpus:
            policy: dict[str, str] = {names.HAMI_GPU_POLICY: params.gpu_scheduler_policy}
            if params.node_scheduler_policy:
                policy[names.HAMI_NODE_POLICY] = params.node_scheduler_policy
            types = fit.types_for(pod_set.name)
            if len(types) == 1:
                # The type the gang was fitted on, so HAMi places it where we counted.
                policy[names.HAMI_USE_GPUTYPE] = types[0]
            parts.append(Hints(annotations=policy))
        wanted[pod_set.name] = combine(*parts)
    return wanted


def _held_pool(
    cluster: Cluster, params: Parameters, checks: frozenset[str], now: float
) -> incremental.PoolEntry:
    """``_pool_inventory``, taken back from ``cluster.memo`` while nothing it read changed."""
    selector = dict(params.pool_node_selector) or None
    memo = cluster.memo or incremental.Memo()
    fingerprint = None
    if cluster.memo is not None:
        by_owner = pod_index_of(cluster)
        known = memo.keys

        def owned(w: RawObject) -> list[RawObject]:
            return tied_pods(known.read(w, "ties", functools.partial(pod_ties, w)), by_owner)

        fingerprint = incremental.pool_fingerprint(
            cluster.nodes,
            cluster.pods,
            cluster.workloads,
            owned,
            selector=selector,
            handshake_timeout=params.handshake_timeout_seconds,
            checks=checks,
            now=now,
            keys=memo.keys,
        )
    # The gangs held are refitted by the policy of the check whose workload comes first.
    held = ("held", pool_group(params), params.gpu_scheduler_policy, checks)
    return memo.pool(
        held,
        fingerprint,
        now,
        lambda: _pool_inventory(cluster, params, checks, now),
        lambda kept: _held_after(kept, fingerprint, cluster, params, checks, now),
    )


def _held_after(
    kept: incremental.PoolEntry,
    fingerprint: incremental.Fingerprint | None,
    cluster: Cluster,
    params: Parameters,
    checks: frozenset[str],
    now: float,
) -> incremental.Built | None:
    """The kept pool with the gangs and pods that came since, as a build would give it.

    When the nodes read are the same, and the pods read before are read again unchanged
    (pods were only added): the pods the pool now counts that it did not (new pods of no
    held gang, and those of a gang no longer held) are taken off the kept base
    (``hami.taking_pods``); the gangs whose Workload changed, or that a new pod is tied
    to, are read again. The pool after the last gang held before the first change in
    ``_pool_inventory``'s order is taken back (before the first gang, when the base
    changed), and only the gangs from there on are fitted again: a stream of admissions
    and placements fits a few gangs a pass, not every gang held, and reads no pod twice.
    Else None, and the pool is built.
    """
    if fingerprint is None or kept.base is None or cluster.memo is None:
        return None
    before = kept.fingerprint
    if fingerprint.nodes != before.nodes:
        return None
    new_pods = incremental.added_pods(before, fingerprint, cluster.pods, cluster.memo.keys)
    if new_pods is None:
        return None
    gone, added = incremental.held_changes(before.held, fingerprint.held)
    if any(h.uid in gone and h.has_pods for h in kept.held):
        return None  # its pods' allocations count in the nodes again, and may be gone
    uids = [h.uid for h in kept.held]
    if len(set(uids)) != len(uids) or _uid_repeats(cluster.workloads):
        # Gangs are read again by uid: two sharing one (a broken watch cache) had one
        # fitted twice and the other dropped, and a gang admitted onto its cards (pass 30).
        return None
    by_owner = pod_index_of(cluster)
    held = {h.uid for h in kept.held}
    found, again = _read_again(cluster, new_pods, added, held)
    staying = held - gone - again
    if staying - found.keys():
        return None
    nodes = _node_names(cluster)
    joining = sorted(
        (found[u] for u in again if _holds_readably(found[u], checks, by_owner, now, nodes)),
        key=_order,
    )
    holding = [found[h.uid] for h in kept.held if h.uid in staying] + joining
    card_mib = _largest_card(cluster)
    ignored = frozenset(k for w in holding for k in _pod_keys(w, by_owner, card_mib))
    fresh = {id(pod) for pod in new_pods}
    if any(  # a pod counted before that a gang now holds: a build takes it off no more
        id(pod) not in fresh and not _pod_keys_of(pod) & kept.ignored
        for w in joining
        for pod in owned_pods(w, by_owner)
    ):
        return None
    leaving = [found[h.uid] for h in kept.held if h.uid in again and h.uid in found]
    counted = _newly_counted(new_pods, leaving, by_owner, ignored, kept.ignored)
    base = kept.base
    if counted:
        taken = taking_pods(kept.base, counted, ignored)
        if taken is None:
            return None
        base = taken
    removed = gone | again
    first = min(
        [i for i, h in enumerate(kept.held) if h.uid in removed]
        + [_position(kept.held, _order(w)) for w in joining],
        default=len(kept.held),
    )
    if base is not kept.base:
        first = 0  # every gang held is fitted again on the new base
    while first > 0 and kept.held[first - 1].pool is None:
        first -= 1  # from the checkpoint before it: the gangs since are fitted again
    keep = kept.held[:first]
    refit = [found[h.uid] for h in kept.held[first:] if h.uid in staying]
    placed = {key(found[h.uid]): h.placed for h in kept.held[first:] if h.uid in staying}
    placed.update(
        (a.admitted.key, a.admitted.cards)
        for a in reclaim.admitted_in_pool(
            joining, cluster.pods, base, checks, 0, by_owner=by_owner, now=now
        )
    )
    pool, promised = (keep[-1].pool, keep[-1].promised) if keep else (base, 0.0)
    assert pool is not None  # a checkpoint, or the base
    gangs = sorted([*refit, *joining], key=_order)
    steps = _hold(pool, promised, gangs, placed, cluster, params, checks, now, first=first)
    return _built(base, (*keep, *steps), ignored)


def _uid_repeats(workloads: Sequence[RawObject]) -> bool:
    """Whether two of ``workloads`` share a ``metadata.uid``."""
    seen: set[str] = set()
    for workload in workloads:
        uid = (workload.get("metadata") or {}).get("uid")
        if isinstance(uid, str):
            if uid in seen:
                return True
            seen.add(uid)
    return False


def _read_again(
    cluster: Cluster, new_pods: Sequence[RawObject], added: set[Any], held: set[str]
) -> tuple[dict[str, RawObject], set[str]]:
    """The Workloads held, changed or tied to a new pod, by uid; the uids read anew.

    A Workload is read anew when it changed or a new pod is tied to it.
    """
    known = cluster.memo.keys if cluster.memo is not None else incremental.Keys()
    ties = {tie for pod in new_pods for tie in ties_of_pod(pod)}
    found: dict[str, RawObject] = {}
    again: set[str] = set()
    for w in cluster.workloads:
        uid = (w.get("metadata") or {}).get("uid")
        tied = bool(ties) and any(
            t in ties for t in known.read(w, "ties", functools.partial(pod_ties, w))
        )
        if uid in added or tied:
            again.add(str(uid))
        if uid in added or uid in held or tied:
            found[str(uid)] = w
    return found, again


def _newly_counted(
    new_pods: Sequence[RawObject],
    leaving: Sequence[RawObject],
    by_owner: Mapping[str, list[RawObject]],
    ignored: frozenset[str],
    was_ignored: frozenset[str],
) -> list[RawObject]:
    """The pods a build counts now and the kept base did not.

    A new pod no gang holds, and a pod of a gang held no more (``leaving``).
    """
    fresh = {id(pod) for pod in new_pods}
    counted: dict[int, RawObject] = {}
    for pod in [*new_pods, *(p for w in leaving for p in owned_pods(w, by_owner))]:
        called = _pod_keys_of(pod)
        if not called & ignored and (id(pod) in fresh or called & was_ignored):
            counted[id(pod)] = pod
    return list(counted.values())


def _pod_keys_of(pod: RawObject) -> set[str]:
    """What ``hami.inventory``'s ``ignore_pods`` may name a pod by: its uid, its key."""
    meta = pod.get("metadata") or {}
    return {str(meta.get("uid")), f"{meta.get('namespace', '')}/{meta.get('name', '')}"}


def _position(held: Sequence[incremental.Held], order: tuple[int, float, str]) -> int:
    """Where a gang of this order goes among those held (after every one before it)."""
    return next((i for i, h in enumerate(held) if h.order > order), len(held))


def _built(
    base: Inventory, held: Sequence[incremental.Held], ignored: frozenset[str]
) -> incremental.Built:
    pool, promised = (held[-1].pool, held[-1].promised) if held else (base, 0.0)
    assert pool is not None  # the last step keeps its pool
    valid_until = min((h.deadline for h in held), default=math.inf)
    return incremental.Built(pool, promised, valid_until, base, tuple(held), ignored=ignored)


def _order(w: RawObject) -> tuple[int, float, str]:
    """The order of deciding and of holding back: priority (highest first), then age."""
    return (-priority(w), created_at(w), key(w))


def _hold(
    pool: Inventory,
    promised: float,
    gangs: Sequence[RawObject],
    placed: Mapping[str, float],
    cluster: Cluster,
    params: Parameters,
    checks: frozenset[str],
    now: float,
    *,
    first: int = 0,
) -> list[incremental.Held]:
    """``gangs`` (in order) fitted and held back on ``pool``, each with the pool after it.

    ``first``: the place of the first gang among those held. A step keeps its pool
    where the next one resumes (``incremental.HELD_CHECKPOINT``) and the last step;
    the others let it go (a pass resumes from the checkpoint before its first change).
    """
    by_owner = pod_index_of(cluster)
    steps: list[incremental.Held] = []
    for w in gangs:
        if steps and (first + len(steps)) % incremental.HELD_CHECKPOINT:
            steps[-1] = steps[-1]._replace(pool=None)  # no checkpoint: resumed from before
        where = _granted_selector(w, checks)
        held = fit_gang(
            workload_demand(w), _on_nodes(pool, cluster.nodes, where), params.gpu_scheduler_policy
        )
        if held.fits:
            whole = reclaim.placement_cards(pool, held.placements)
            promised += max(0.0, whole - placed.get(key(w), 0.0))
            kept, pool = pool, pool.reserve(held.placements)
            if steps:  # held with the gang before it, for a later pass: its nodes only
                kept.forget_derived()
        meta = w.get("metadata") or {}
        steps.append(
            incremental.Held(
                _order(w),
                str(meta.get("uid")),
                placed.get(key(w), 0.0),
                bool(owned_pods(w, by_owner)),
                _hold_deadline(w, checks, by_owner, now),
                pool,
                promised,
            )
        )
    return steps


def _pool_inventory(
    cluster: Cluster, params: Parameters, checks: frozenset[str], now: float
) -> incremental.Built:
    """The pool now, with the gangs we admitted whose pods are not all placed held back.

    A gang whose check of ours is Ready, not finished, with fewer GPU pods placed than
    it asks for, holds its whole demand: its placed pods are ignored and the gang is
    fitted as a whole (where its podSetUpdates' nodeSelector puts it), so the GPUs it
    was admitted for are not given away while its pods are being created. Its pods are
    found by what ties them to it (``workload.pods_by_owner``: a Job's pods share the
    Job as owner; a JobSet's, owned by child Jobs, carry the JobSet's uid; Kueue names
    the Workload on the pods it starts); a gang none of whose pods can be matched holds
    for ``HOLD_SECONDS`` after its admission at most, by when its pods' own HAMi
    allocations count instead.

    Also the cards' worth those held gangs take beyond the shares their placed pods
    hold (what the capacity manager's plan counts of them): the allowance counts it; and
    until when this holds (a gang none of whose pods are matched lets go at its deadline).
    """
    selector = dict(params.pool_node_selector) or None
    timeout = params.handshake_timeout_seconds
    by_owner = pod_index_of(cluster)
    nodes = _node_names(cluster)
    holding = [w for w in cluster.workloads if _holds_readably(w, checks, by_owner, now, nodes)]
    card_mib = _largest_card(cluster)
    ignore = frozenset(k for w in holding for k in _pod_keys(w, by_owner, card_mib))
    pool = inventory(
        cluster.nodes,
        cluster.pods,
        now=now,
        handshake_timeout=timeout,
        node_selector=selector,
        ignore_pods=ignore,
    )
    placed = {
        a.admitted.key: a.admitted.cards
        for a in reclaim.admitted_in_pool(
            holding, cluster.pods, pool, checks, 0, by_owner=by_owner, now=now
        )
    }
    holding.sort(key=_order)
    return _built(pool, _hold(pool, 0.0, holding, placed, cluster, params, checks, now), ignore)


def _granted_selector(w: RawObject, checks: frozenset[str]) -> dict[str, str]:
    """The nodeSelector our Ready entry gave the workload (its cache or LoRA nodes)."""
    where: dict[str, str] = {}
    for name in checks:
        entry = check_entries(w).get(name) or {}
        for update in entry.get("podSetUpdates") or ():
            where.update((update.get("nodeSelector") or {}) if isinstance(update, dict) else {})
    return where


HOLD_SECONDS = 300.0
"""How long after admission a gang whose pods cannot be matched to it keeps its GPUs."""


def _node_names(cluster: Cluster) -> frozenset[str]:
    """The Nodes there are: a pod bound to one gone holds nothing its gang counts on."""
    return frozenset(str((n.get("metadata") or {}).get("name")) for n in cluster.nodes)


def _holds_readably(
    w: RawObject,
    checks: frozenset[str],
    by_owner: Mapping[str, list[RawObject]],
    now: float,
    nodes: Collection[str],
) -> bool:
    """``_holds_unplaced``, for a gang whose every field ``_hold`` reads can be read.

    Past the shape boundary (``admission.shape``) a field deeper in a gang can still be
    of the wrong type (a container's ``resources`` a string): that gang holds nothing,
    and every other gang and workload of the pool is decided (it used to fail them all).
    """
    try:
        if not _holds_unplaced(w, checks, by_owner, now, nodes):
            return False
        workload_demand(w)
        _granted_selector(w, checks)
        _order(w)
        _hold_deadline(w, checks, by_owner, now)
        _pod_keys(w, by_owner, lambda: 0)
    except Exception:  # what this gang holds is unknown; never the pool's every check
        return False
    return True


def _holds_unplaced(
    w: RawObject,
    checks: frozenset[str],
    by_owner: Mapping[str, list[RawObject]],
    now: float,
    nodes: Collection[str],
) -> bool:
    entries = check_entries(w)
    ready = [entries[c] for c in checks if entries.get(c, {}).get("state") == "Ready"]
    if not ready:
        return False
    if condition_status(w, "Finished") == "True" or condition_status(w, "Evicted") == "True":
        return False
    try:
        wanted = sum(d.count for d in workload_demand(w) if d.pod.asks_gpus)
    except (ValueError, TypeError):
        return False
    owned = owned_pods(w, by_owner)
    if not owned:
        return now - _ready_since(w, ready, now) < HOLD_SECONDS
    return sum(1 for pod in owned if holds_cards(pod, nodes)) < wanted


def _hold_deadline(
    w: RawObject, checks: frozenset[str], by_owner: Mapping[str, list[RawObject]], now: float
) -> float:
    """When a held gang none of whose pods are matched lets go (never, for one matched)."""
    if owned_pods(w, by_owner):
        return math.inf
    entries = check_entries(w)
    ready = [entries[c] for c in checks if entries.get(c, {}).get("state") == "Ready"]
    return _ready_since(w, ready, now) + HOLD_SECONDS


def _ready_since(w: RawObject, ready: Sequence[Mapping[str, Any]], now: float) -> float:
    """When our Ready entries were set: the latest of their ``lastTransitionTime``.

    Never before the Workload's creation (the API server sets it; nothing was Ready
    before it): a time before it, missing, unreadable or more than ``MAX_CLOCK_SKEW``
    ahead of ``now`` counts from the creation, as in ``waiting_since``. A creation ahead
    too gives 0, so the hold ends now. A Ready dated 9999 held a gang without pods until
    then; one dated 1970, or missing, ended the hold at once and a second gang was
    admitted onto the same cards (hostile pass 4, H1).
    """
    created = created_at(w)
    since = created if created <= now + MAX_CLOCK_SKEW else 0.0
    for entry in ready:
        t = parse_time(entry.get("lastTransitionTime"))
        if t is not None and t <= now + MAX_CLOCK_SKEW:
            since = max(since, t)
    return since


def _pod_keys(
    w: RawObject, by_owner: Mapping[str, list[RawObject]], card_mib: Callable[[], int]
) -> list[str]:
    """The pods a held gang's hold stands for, which the inventory then leaves out.

    Its tied pods the inventory takes nothing off for (finished, not yet allocated) are
    left out as they are. Each one it takes cards off for must fit a pod slot of the
    gang, one slot each, as many as can be and placed pods first
    (``admission.slots.matched``): no more distinct cards than the pod asks (an init
    container's beside its containers'), and on any one card no more MiB and cores than
    all its containers ask together (a percentage of the largest card, ``card_mib()``).
    What is left out is then never more than the gang asks: a pod tied by a label or
    annotation is its tenant's to write (hostile passes 39 and 41: a whole card naming a
    gang of 10% shares), and a slot spent on a failed pod had the gang's placed pod
    counted twice (pass 40).
    """

    def mib_of(c: GpuRequest) -> int:
        return c.memory_mib or c.memory_of(card_mib())

    slots: list[tuple[int, int, int]] = []
    for d in workload_demand(w):
        if not d.pod.asks_gpus:
            continue
        containers, init = d.pod.containers, d.pod.init_containers
        cards = sum(c.gpus for c in containers) + max((c.gpus for c in init), default=0)
        mib = sum(mib_of(c) for c in containers) + max((mib_of(c) for c in init), default=0)
        cores = sum(c.cores for c in containers) + max((c.cores for c in init), default=0)
        slots += [(cards, mib, cores)] * d.count
    keys: list[str] = []
    counted: list[tuple[bool, tuple[int, int, int], int, RawObject]] = []
    for index, pod in enumerate(owned_pods(w, by_owner)):
        size = allocation_size(pod)
        if size == (0, 0, 0):
            keys.append(_pod_key_of(pod))
        elif size is not None:
            counted.append((not bound_where_placed(pod), size, index, pod))
    counted.sort(key=lambda c: (c[0], tuple(-x for x in c[1]), c[2]))
    chosen = slots_matched([size for _, size, _, _ in counted], slots)
    return keys + [_pod_key_of(counted[i][3]) for i in chosen]


def _largest_card(cluster: Cluster) -> Callable[[], int]:
    """The largest card's MiB the Nodes register, read once a pass if a gang needs it."""
    return functools.cache(lambda: largest_card_mib(cluster.nodes))


def _pod_key_of(pod: RawObject) -> str:
    return str((pod.get("metadata") or {}).get("uid") or key(pod))


def _on_nodes(pool: Inventory, nodes: Sequence[RawObject], where: Mapping[str, str]) -> Inventory:
    """The inventory narrowed to nodes carrying every label of ``where``."""
    if not where:
        return pool
    labels = {
        str((n.get("metadata") or {}).get("name")): (n.get("metadata") or {}).get("labels") or {}
        for n in nodes
    }
    labels = {
        name: {**found, names.HOSTNAME: found.get(names.HOSTNAME, name)}
        for name, found in labels.items()
    }

    def keep(node: NodeGpus) -> bool:
        have = labels.get(node.name, {})
        return all(have.get(k) == v for k, v in where.items())

    return Inventory(
        tuple(n for n in pool.nodes if keep(n)),
        tuple(n for n in pool.pool if keep(n)),
        pool.problems,
    )


def _labels(where: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(where.items()))
