"""The capacity manager: each reclaiming check's plan for its pool, and its reclaims (pure).

A check with ``reclaim.enabled`` and an ``inferenceHeadroom`` plans its whole pool once a
pass (``plan_pools``): the cards HAMi's nodes offer and the shares pods hold, the training
admitted through any of our checks on that pool, and the scaler's forecast for the pool
(``admission.pool.plan_pool``). The check's decision admits within the plan's allowance
(``admission.decide``); ``reclaim_all`` asks a ``Retry`` of each workload a plan
reclaims. One pool's plan that raises is an unknown plan for that pool alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from admission import incremental, reclaim
from admission.cluster import (
    CheckPlan,
    Cluster,
    Decision,
    PoolDemand,
    error_text,
    indexed,
    our_checks,
    pod_index_of,
    pool_group,
)
from admission.hami import Inventory, inventory, taking_pods
from admission.parameters import Headroom, Parameters
from admission.pool import InferenceNeed, ManagerPolicy, PoolPlan, plan_pool


def plan_pools(cluster: Cluster, now: float) -> dict[str, CheckPlan]:
    """The capacity manager's plan for each check of ours with reclaim enabled, by check.

    Each plans its whole pool: the cards HAMi's nodes offer and their taken shares, the
    workloads admitted through any of our checks on the same pool (``reclaim``), and the
    scaler's forecast for ``inferenceHeadroom.pool`` (unavailable: an unknown plan, which
    reclaims nothing and says why).
    """
    cluster = indexed(cluster)
    checks = our_checks(cluster)
    inventories: dict[tuple[Any, ...], Inventory] = {}
    plans: dict[str, CheckPlan] = {}
    for name, params in sorted(cluster.check_parameters.items()):
        wanted = params.inference_headroom
        if not params.reclaim.enabled or wanted is None:
            continue
        try:
            plans[name] = _plan_check(cluster, now, name, params, checks, inventories)
        except Exception as err:  # one pool must never stop the pass
            plans[name] = _failed_plan(name, wanted.pool, error_text(err))
    return plans


def _failed_plan(check: str, pool: str, error: str) -> CheckPlan:
    """An unknown plan for a pool whose planning raised: nothing reclaimed, nothing decided."""
    reason = f"pool {pool}: the plan could not be made ({error}): no allowance, nothing reclaimed"
    plan = PoolPlan(False, None, 0.0, 0, 0, (), reason, pool=pool)
    return CheckPlan(check, pool, plan, {}, failed=error)


def _plan_check(
    cluster: Cluster,
    now: float,
    name: str,
    params: Parameters,
    checks: Mapping[str, Parameters | None],
    inventories: dict[tuple[Any, ...], Inventory],
) -> CheckPlan:
    """The plan of one reclaiming check's pool (``plan_pools``)."""
    wanted = params.inference_headroom
    if wanted is None:  # plan_pools asks only for checks with a headroom
        raise ValueError(f"check {name} has no inferenceHeadroom to plan by")
    group = pool_group(params)
    if group not in inventories:
        inventories[group] = plain_pool(cluster, params, now)
    pool = inventories[group]
    mine = [c for c, q in checks.items() if q is not None and pool_group(q) == group]
    here = reclaim.admitted_in_pool(
        cluster.workloads,
        cluster.pods,
        pool,
        mine,
        params.reclaim.max_priority,
        by_owner=pod_index_of(cluster),
        now=now,
    )
    need, missing = _need(cluster, wanted, pool)
    policy = ManagerPolicy(
        reclaim=True,
        min_run_seconds=float(params.reclaim.min_run_seconds),
        headroom_fraction=params.reclaim.headroom_fraction,
        headroom_cards=params.reclaim.headroom_cards,
    )
    training = [a.admitted for a in here]
    plan = plan_pool(
        reclaim.pool_state(pool, wanted.pool, training),
        need,
        training,
        now,
        policy,
        missing,
    )
    entries = {a.admitted.key: a.check for a in here}
    return CheckPlan(name, wanted.pool, plan, entries)


def plain_pool(cluster: Cluster, params: Parameters, now: float) -> Inventory:
    """What the pool of ``params`` offers, every pod taken off (kept in ``cluster.memo``)."""
    selector = dict(params.pool_node_selector) or None
    timeout = params.handshake_timeout_seconds

    def build() -> incremental.Built:
        pool = inventory(
            cluster.nodes, cluster.pods, now=now, handshake_timeout=timeout, node_selector=selector
        )
        return incremental.Built(pool, 0.0, math.inf)

    if cluster.memo is None:
        return build()[0]
    fingerprint = incremental.pool_fingerprint(
        cluster.nodes,
        cluster.pods,
        (),
        lambda w: (),
        selector=selector,
        handshake_timeout=timeout,
        checks=frozenset(),
        now=now,
        keys=cluster.memo.keys,
    )
    keys = cluster.memo.keys

    def extend(kept: incremental.PoolEntry) -> incremental.Built | None:
        """The kept pool with the pods added since taken off too (None: build it)."""
        if fingerprint is None or kept.fingerprint.nodes != fingerprint.nodes:
            return None
        added = incremental.added_pods(kept.fingerprint, fingerprint, cluster.pods, keys)
        pool = None if added is None else taking_pods(kept.pool, added)
        return None if pool is None else incremental.Built(pool, 0.0, math.inf)

    return cluster.memo.pool(("plain", pool_group(params)), fingerprint, now, build, extend).pool


def _need(cluster: Cluster, wanted: Headroom, inv: Inventory) -> tuple[InferenceNeed | None, str]:
    """The scaler's figures for the check's pool, or None and why not (never a zero)."""
    figures, why = scaler_figures(cluster, wanted, inv)
    if figures is None:
        return None, why
    return InferenceNeed(figures.accelerators_held, figures.accelerators_needed), ""


def scaler_figures(
    cluster: Cluster, wanted: Headroom, inv: Inventory
) -> tuple[PoolDemand | None, str]:
    """The scaler's figures for the check's pool where possible, else None and why not.

    The check's own ask's where the controller keyed them so (``Cluster.asked``).
    Inference cannot hold more cards than HAMi registers in the pool (``Inventory.pool``,
    every node, held or not): held 1e6 on 16 cards read as "needs 0 more" and admitted.
    """
    pool = wanted.pool
    if cluster.asked is not None:
        figures = cluster.asked.get((wanted.scaler, pool, wanted.horizon_seconds))
    else:
        figures = None if cluster.demand is None else cluster.demand.get(pool)
    if figures is None:
        return None, cluster.demand_error or f"the scaler knows no pool {pool!r}"
    cards = sum(len(n.devices) for n in inv.pool)
    if figures.accelerators_held > cards + 1e-9:
        return None, (
            f"accelerators_held {figures.accelerators_held:g} is more than the {cards} GPU"
            f"{'s' if cards != 1 else ''} HAMi registers in pool {pool}: not used"
        )
    return figures, ""


def reclaim_all(cluster: Cluster, now: float) -> list[Decision]:
    """A ``Retry`` for each workload a plan reclaims, on the entry of ours holding it Ready.

    A workload two plans reclaim (two reclaiming checks on one pool) gets one decision.
    """
    plans = cluster.plans if cluster.plans is not None else plan_pools(indexed(cluster), now)
    decisions: list[Decision] = []
    seen: set[str] = set()
    for _, planned in sorted(plans.items()):
        for taken in planned.plan.reclaim:
            check = planned.entries.get(taken.key)
            if check is None or taken.key in seen:
                continue
            seen.add(taken.key)
            namespace, _, name = taken.key.partition("/")
            # requeueAfterSeconds 0: Kueue 0.17 keeps an admitted Workload running, quota
            # held, until lastTransitionTime + requeueAfterSeconds; 0 evicts it now. It
            # comes back Pending at once and the check judges it again (Retry, with the
            # check's retryAfterSeconds, while the allowance has no room).
            decisions.append(Decision(namespace, name, check, "Retry", taken.message, 0))
    return decisions
