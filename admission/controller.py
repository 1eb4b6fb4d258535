"""The admission-check controller: watches, an in-memory view, and one reconcile loop.

Seven list-then-watch loops (``foundation.kube.watch_objects``) keep the view: our
AdmissionChecks and their CapacityCheckParameters, Workloads in every namespace, Nodes,
live Pods, and Fluid's Datasets and DataLoads. A resource the server does not serve (Fluid
not installed) is an empty set marked ``absent``, never a crash, and is picked up once its
CRD appears.

Every change marks the view dirty; the loop waits ``debounce`` after the first change,
then runs one pass over the view, so a burst of 1,000 Workload events costs a few
passes. Each watch event names the object it changed (``on_event``): a pass reads again
(shape, HAMi annotations, pending checks) only what changed since the last. A pass also
runs every ``resync`` seconds. No pass runs before every watch has listed once: deciding
on an empty Pod list would hand out GPUs that pods hold.

A pass: keep each of our AdmissionChecks Active (or Active=False, BadParametersRef, with
the problem); gather the Pending checks Kueue lets us write (``workload.actionable``),
call ``admission.decide.decide_all`` once for all of them, create what the decisions ask
for (DataLoads; AlreadyExists is fine), and write each check state that changed with
server-side apply (``workload.apply_body``: uid and resourceVersion as preconditions, so
a Workload changed since our view answers 409 and the next pass judges it again).

One object never stops a pass: an object of the wrong JSON shape (``admission.shape``)
is left out of the view, and a node or pod whose HAMi annotation cannot be read offers
no GPUs, each warned of once and counted (``unreadable_objects``); a
workload whose decision, a pool whose plan, or a decision whose write raises fails that
unit's round alone (one WARNING, ``unit_failures{unit}``), and the next pass tries again.

A pass builds the pod index once and keeps each pool's inventory and the fit answers
given on it for the next (``admission.incremental.Memo``): a pool none of whose nodes,
pods or held gangs changed is taken back as it was, and a gang that did not fit it is not
searched again. Every ``incremental.RESYNC_SECONDS`` a pass's view is also planned and
decided from scratch, in a thread beside the loop (a pass from scratch costs several kept
ones, and every Workload arriving meanwhile would wait for it); each kind of answer the
kept state gave otherwise is counted (``resync_differences{kind}``) and warned of once,
and the kept state starts again. Between passes the heap is settled
(``foundation.heap``): the collections inside a pass scan what it made, not the view.

What we write comes back through the watch later; until it does, the object our write
returned stands in for the watched one (the higher resourceVersion wins), so the next
pass neither writes the same state twice nor judges a stale copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from admission import density, hami, incremental, lora, shape
from admission import parameters as params
from admission.cluster import Ask, CheckPlan, Cluster, Decision, Pending, PoolDemand
from admission.config import AdmissionConfig
from admission.decide import decide_all, read_pools, waiting_since
from admission.demand import DemandResult, fetch_demand, merge_demand
from admission.manager import plain_pool, plan_pools, reclaim_all
from admission.metrics import AdmissionMetrics
from admission.pool import Reclaim
from admission.workload import (
    MAX_CLOCK_SKEW,
    actionable,
    apply_body,
    check_entries,
    created_at,
    event_for,
    key,
    pods_by_owner,
    reclaim_body,
    ties_of_pod,
    times_before_creation,
)
from foundation.daemon import in_daemon_thread
from foundation.errors import ConfigError
from foundation.heap import PassHeap
from foundation.kube import (
    DATALOADS,
    DATASETS,
    NODES,
    PODS,
    KubeAccess,
    Resource,
    Selection,
    apply,
    create,
    watch_objects,
)
from foundation.objects import RawObject
from foundation.timestamps import format_time

log = logging.getLogger(__name__)

ADMISSION_CHECKS = Resource("kueue.x-k8s.io", "v1beta2", "admissionchecks", namespaced=False)
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads")
PARAMETERS = Resource(params.API_GROUP, params.VERSION, params.PLURAL, namespaced=False)
EVENTS = Resource("", "v1", "events")

WATCHES: Mapping[str, Selection] = {
    "admissionchecks": Selection(ADMISSION_CHECKS),
    "parameters": Selection(PARAMETERS),
    "workloads": Selection(WORKLOADS),
    "nodes": Selection(NODES),
    # Finished pods hold nothing (HAMi frees their cards): not worth a copy in memory.
    "pods": Selection(PODS, field_selector="status.phase!=Succeeded,status.phase!=Failed"),
    "datasets": Selection(DATASETS),
    "dataloads": Selection(DATALOADS),
}
RETRY_MIN = 1.0
RETRY_MAX = 30.0
"""Seconds before a pass whose writes failed runs again (doubling)."""
CREATABLE: Mapping[tuple[str, str], Resource] = {("data.fluid.io/v1alpha1", "DataLoad"): DATALOADS}
"""What a decision may ask us to create, by (apiVersion, kind)."""
_SHAPED: Mapping[str, str] = {
    "admissionchecks": "admissioncheck",
    "nodes": "node",
    "pods": "pod",
    "workloads": "workload",
    "datasets": "dataset",
    "dataloads": "dataload",
}
"""The watched sets whose objects pass ``admission.shape``, by the kind it checks."""
_REVISION = re.compile(r"[0-9]{1,19}")


Decide = Callable[[Sequence[Pending], Cluster, float], Sequence[Decision]]
FetchDemand = Callable[..., Awaitable[DemandResult]]


FRESH_SECONDS = 30.0
"""How long a write's answer stands in for the watch's older copy of the object."""


@dataclass
class Watched:
    """One watch's latest set and how it stands."""

    objects: dict[str, RawObject] = field(default_factory=dict)
    synced: bool = False
    """Listed at least once (or found not served)."""
    absent: bool = False
    """The server does not serve the resource (its CRD is not installed)."""
    error: str = ""
    changed: set[str] | None = None
    """Keys a watch event changed since the view last read them; None: every key (a list)."""


@dataclass
class _Shaped:
    """One watch's objects past the shape boundary, kept from view to view."""

    good: dict[str, RawObject] = field(default_factory=dict)
    bad: dict[str, tuple[RawObject, tuple[str, str, str]]] = field(default_factory=dict)
    """Each object left out, by key, with ``(kind, subject, why)``."""
    overlaid: set[str] = field(default_factory=set)
    """Keys our fresher write stood in for in the last view."""


@dataclass(frozen=True)
class Snapshot:
    """The view at the start of a pass; a pass reads nothing else."""

    checks: dict[str, RawObject]
    parameters: dict[str, RawObject]
    workloads: dict[str, RawObject]
    nodes: list[RawObject]
    pods: list[RawObject]
    datasets: list[RawObject]
    dataloads: list[RawObject]
    malformed: tuple[tuple[str, str, str], ...] = ()
    """``(kind, subject, why)`` of each object left out for its shape (``admission.shape``)."""
    ours: frozenset[str] = frozenset()
    """Our AdmissionChecks by name, also one left out for its shape: the gangs admitted
    through it still hold their GPUs."""
    by_key: Mapping[str, Mapping[str, RawObject]] = field(default_factory=dict)
    """The objects past the shape boundary by watch and key (``nodes``, ``pods``, ...)."""
    changed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """By watch, the keys whose object may differ from the view the last pass that ended
    read; a watch not named: any."""


class _Once:
    """Log a recurring problem when it changes, not on every pass.

    At most ``MAX_TOPICS`` are remembered, the least recently warned of forgotten first
    (it warns again if it recurs): a topic per object whose write failed was kept until
    it cleared, and objects deleted meanwhile never clear (hostile pass 4, L4).
    """

    MAX_TOPICS = 10_000

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def warn(self, topic: str, message: str, *args: object) -> None:
        text = message % args if args else message
        level = logging.WARNING if self._last.pop(topic, None) != text else logging.DEBUG
        self._last[topic] = text  # last in the order: the most recently warned of
        if len(self._last) > self.MAX_TOPICS:
            del self._last[next(iter(self._last))]
        log.log(level, "%s", text)

    def clear(self, topic: str) -> None:
        self._last.pop(topic, None)


class Controller:
    """Watches, the view, and the reconcile loop; ``run()`` until cancelled."""

    def __init__(
        self,
        access: KubeAccess,
        config: AdmissionConfig,
        metrics: AdmissionMetrics | None = None,
        *,
        clock: Callable[[], float] = time.time,
        decide: Decide = decide_all,
        demand: FetchDemand = fetch_demand,
        heap: PassHeap | None = None,
    ) -> None:
        self.access = access
        self.config = config
        self.name = config.controller_name
        self.metrics = metrics or AdmissionMetrics()
        self._clock = clock
        self._decide = decide
        self._fetch_demand = demand
        self._heap = heap
        """Collects between passes (``foundation.heap``); None: CPython's own schedule."""
        self.watched = {name: Watched() for name in WATCHES}
        self._fresh: dict[tuple[str, str], tuple[RawObject, float]] = {}
        """Our writes' answers, newer than the watch's copy, with when each landed."""
        self._shaped: dict[str, _Shaped] = {}
        self._unpassed: dict[str, frozenset[str] | None] = {}
        """By watch, the keys changed since the view of the last pass that ended (None or
        absent: any). A scrape's view (``observe``) leaves them to the pass, and a pass
        that fails gives its keys back: a key taken by either was never read again."""
        """Each watch's objects past the shape boundary, as of the last view."""
        self._dirty = asyncio.Event()
        self._synced = asyncio.Event()
        self._demand_cache: dict[tuple[str, str, int], tuple[float, DemandResult]] = {}
        self._once = _Once()
        self.passes = 0
        self.last_pass_end: float | None = None
        self.started = time.monotonic()
        self._loop: asyncio.Task[None] | None = None
        self._unwritten = False
        """A write of the last pass failed for a reason other than a conflict."""
        self._density: dict[str, density.Density] = {}
        """Adaptive LoRA: tenants per instance by base model, from the first pass."""
        self._usable: Mapping[str, params.Parameters] = {}
        """Our checks with good parameters, as the last pass found them."""
        self._read_versions: dict[tuple[str, str], tuple[str, str]] = {}
        """Each node's and pod's resourceVersion last checked, and its problem (or "")."""
        self._memo = incremental.Memo()
        """Pools and fit answers kept from pass to pass (``admission.incremental``)."""
        self._pod_ties: dict[int, tuple[RawObject, list[str]]] = {}
        """Each pod's ties (``workload.ties_of_pod``) last pass, by the object's id."""
        self._actionable_seen: dict[str, tuple[str, frozenset[str], list[tuple[str, float]]]] = {}
        """Each Workload's version last read, our checks then, and its pending checks."""
        self._pending: dict[str, tuple[RawObject, list[tuple[str, float]]]] = {}
        """The Workloads with checks we may write, by key, as of the last view."""
        self._pending_ours: frozenset[str] | None = None
        """Our usable checks when ``_pending`` was read."""
        self._resynced: float | None = None
        """The clock's seconds at the last pass that also decided from scratch."""
        self.resync: asyncio.Task[None] | None = None
        """The last resync (``_resync_beside``), running or done."""
        self.metrics.refresh = self.observe

    # --- the view --------------------------------------------------------------------

    def _changed(self, name: str, objects: dict[str, RawObject]) -> None:
        """A watch's whole set (a list): every key is read again."""
        watched = self.watched[name]
        watched.objects, watched.synced, watched.absent, watched.error = objects, True, False, ""
        watched.changed = None
        self._mark()

    def _heard(self, name: str, object_key: str, obj: RawObject | None) -> None:
        """One watch event: the object under ``object_key`` changed (None: deleted)."""
        watched = self.watched[name]
        if obj is None:
            watched.objects.pop(object_key, None)
        else:
            watched.objects[object_key] = obj
        if watched.changed is not None:
            watched.changed.add(object_key)
        self._mark()

    def _failed(self, name: str, err: Exception) -> None:
        watched = self.watched[name]
        if isinstance(err, client.ApiException) and err.status == 404:
            if not watched.absent:
                log.info("%s is not served (CRD not installed): taken as empty", WATCHES[name])
            watched.objects, watched.synced, watched.absent = {}, True, True
            watched.changed = None
            watched.error = f"{WATCHES[name].kind} is not served by the API server"
            self._mark()
        else:
            watched.error = f"{type(err).__name__}: {str(err)[:200]}"

    def _mark(self) -> None:
        self._dirty.set()
        if not self._synced.is_set() and all(w.synced for w in self.watched.values()):
            log.info("every watch has listed: reconciling")
            self._synced.set()

    def notify(self) -> None:
        """Ask for a pass soon (tests, and anything that knows the view changed)."""
        self._dirty.set()

    def snapshot(self, *, take: bool = False) -> Snapshot:
        """The view now, our own fresher writes standing in for the watched copies.

        Each watch's objects pass the shape boundary once a version (``admission.shape``):
        only the keys its events changed are read again (re-reading every object every
        pass was a third of the controller's CPU on a 10,000-card pool), and the view
        says which keys may differ from the view of the last pass that ended
        (``Snapshot.changed``). A pass ``take``s them (``_give_back`` should it fail);
        any other view leaves them for the next pass.
        """
        sets = {name: self._merged(name) for name in ("admissionchecks", "parameters")}
        by_key: dict[str, dict[str, RawObject]] = {}
        changed: dict[str, frozenset[str]] = {}
        malformed: list[tuple[str, str, str]] = []
        for name, kind in _SHAPED.items():
            view, bad, keys = self._shape_view(name, kind)
            by_key[name] = view
            malformed.extend(bad)
            since = self._since(name, keys, self._unpassed.get(name))
            self._unpassed[name] = frozenset() if take else since
            if since is not None:
                changed[name] = since
        return Snapshot(
            checks=by_key["admissionchecks"],
            parameters=sets["parameters"],
            workloads=by_key["workloads"],
            nodes=list(by_key["nodes"].values()),
            pods=list(by_key["pods"].values()),
            datasets=list(by_key["datasets"].values()),
            dataloads=list(by_key["dataloads"].values()),
            malformed=tuple(malformed),
            ours=frozenset(
                name
                for name, check in sets["admissionchecks"].items()
                if _controller_of(check) == self.name
            ),
            by_key=by_key,
            changed=changed,
        )

    def _shape_view(
        self, name: str, kind: str
    ) -> tuple[dict[str, RawObject], list[tuple[str, str, str]], frozenset[str] | None]:
        """One watch's view: its objects past the shape boundary, ours standing in.

        Also what was left out, and the keys that may differ from the last view (None:
        any, the first view).
        """
        watched = self.watched[name]
        kept = self._shaped.get(name)
        keys: set[str] | None
        last_overlaid = kept.overlaid if kept is not None else set()
        if kept is None or watched.changed is None:  # a list: the very objects read before stand
            before, kept = kept, _Shaped()
            keys = _relisted(before, kept, kind, watched.objects)
            self._shaped[name] = kept
        else:
            keys = set(watched.changed)
            for object_key in keys:
                _shape_into(kept, kind, object_key, watched.objects.get(object_key))
        watched.changed = set()
        view = dict(kept.good)
        bad = {object_key: entry for object_key, (_, entry) in kept.bad.items()}
        overlaid = self._standing(name)
        for object_key, ours in overlaid.items():
            why = shape.malformed(kind, ours)
            if why is None:
                bad.pop(object_key, None)
                view[object_key] = ours
            else:
                view.pop(object_key, None)
                bad[object_key] = (kind, shape.subject(kind, ours), why)
        kept.overlaid = set(overlaid)
        if keys is None:
            return view, list(bad.values()), None
        # Where ours stood in last view or does now, the object differs from the watched.
        return view, list(bad.values()), frozenset({*keys, *last_overlaid, *overlaid})

    def _give_back(self, view: Snapshot) -> None:
        """A pass that took ``view``'s changed keys did not end: the next pass reads them."""
        for name in _SHAPED:
            keys = view.changed.get(name)
            self._unpassed[name] = self._since(name, keys, self._unpassed.get(name))

    def _since(
        self, name: str, keys: frozenset[str] | None, before: frozenset[str] | None
    ) -> frozenset[str] | None:
        """``before`` and ``keys`` together (None: any); any once they outnumber the objects.

        Keys of objects created and deleted while passes kept failing grew without bound
        (hostile pass 44); past the objects' count, reading every key is no dearer.
        """
        if keys is None or before is None:
            return None
        since = before | keys
        return None if len(since) > max(64, len(self.watched[name].objects)) else since

    def _merged(self, name: str) -> dict[str, RawObject]:
        """A watch's set, our fresher writes standing in."""
        return {**self.watched[name].objects, **self._standing(name)}

    def _standing(self, name: str) -> dict[str, RawObject]:
        """Our writes' answers of one watch that stand in for its copies, by key.

        Ours stands while its resourceVersion is higher and for at most ``FRESH_SECONDS``;
        once the watch caught up, or the object is gone, it is let go.
        """
        objects = self.watched[name].objects
        now = self._clock()
        standing: dict[str, RawObject] = {}
        for (kind, object_key), (ours, landed) in list(self._fresh.items()):
            if kind != name:
                continue
            watched = objects.get(object_key)
            # At most FRESH_SECONDS: an answer claiming resourceVersion 9999999999999999999
            # stayed newer than every real revision and froze the Workload's view for
            # good (hostile pass 13); the watch brings a real write within seconds.
            if (
                watched is not None
                and _version(ours) > _version(watched)
                and now - landed < FRESH_SECONDS
            ):
                standing[object_key] = ours
            else:
                del self._fresh[(kind, object_key)]
        return standing

    # --- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Watch and reconcile until cancelled.

        Raises:
            ConfigError: no usable kubeconfig or service account.
        """
        api = await self.access.client()
        watches = [asyncio.create_task(self._watch(name), name=f"watch {name}") for name in WATCHES]
        try:
            async with api:
                self._loop = asyncio.current_task()
                await self._reconcile_forever(api)
        finally:
            for task in watches:
                task.cancel()
            if self.resync is not None:
                self.resync.cancel()
            await asyncio.gather(*watches, return_exceptions=True)

    async def _watch(self, name: str) -> None:
        await watch_objects(
            self.access,
            WATCHES[name],
            functools.partial(self._changed, name),
            resync=self.config.resync,
            on_error=functools.partial(self._failed, name),
            on_event=functools.partial(self._heard, name),
        )

    async def _reconcile_forever(self, api: client.ApiClient) -> None:
        await self._synced.wait()
        retry = RETRY_MIN
        started = -math.inf
        while True:
            # A pass whose writes failed (API server restarting, 429, 5xx) is retried
            # sooner than the resync, doubling up to RETRY_MAX; nothing else would ask.
            wait = retry if self._unwritten else self.config.resync
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that
            # lands as the event is set (gh-86296), and the controller would not stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._dirty.wait()
            # Passes start at most once a debounce: a change after a quiet spell is
            # decided at once, and the rest of a burst is gathered into the next pass.
            gap = self.config.debounce - (time.monotonic() - started)
            if gap > 0:
                await asyncio.sleep(gap)
            self._dirty.clear()
            started = time.monotonic()
            failed_before = self._unwritten
            self._unwritten = False
            try:
                await self.reconcile(api)
            except Exception as err:  # one bad pass must not end the controller
                self._once.warn("pass", "reconcile pass failed: %r", err)
                log.debug("reconcile pass failed", exc_info=True)
                self._unwritten = True
            else:
                self._once.clear("pass")
            if self._heap is not None:
                self._heap.settle()
            retry = min(retry * 2, RETRY_MAX) if failed_before and self._unwritten else RETRY_MIN
            self.passes += 1
            self.last_pass_end = time.monotonic()
            self.metrics.passes.inc()
            self.metrics.pass_seconds.observe(self.last_pass_end - started)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy while the loop runs and passes keep coming (at least every resync)."""
        now = time.monotonic()
        problem = None
        if self._loop is not None and self._loop.done():
            problem = "reconcile loop stopped"
        elif self.last_pass_end is not None:
            if now - self.last_pass_end > 2 * self.config.resync + 60:
                problem = f"no reconcile pass for {now - self.last_pass_end:.0f}s"
        elif now - self.started > 2 * self.config.resync + 60:
            # A watch that never lists (403, a wrong URL) means no pass at all: a liveness
            # probe must see that, not a controller that merely has nothing to do.
            waiting = sorted(n for n, w in self.watched.items() if not w.synced)
            problem = (
                f"no reconcile pass in {now - self.started:.0f}s: waiting for the first list"
                f" of {', '.join(waiting) or 'nothing'}"
            )
        details = {
            "problem": problem,
            "synced": self._synced.is_set(),
            "passes": self.passes,
            "absent": sorted(str(WATCHES[n].kind) for n, w in self.watched.items() if w.absent),
            "watch_errors": {
                n: w.error for n, w in self.watched.items() if w.error and not w.absent
            },
        }
        return problem is None, details

    # --- one pass --------------------------------------------------------------------

    async def reconcile(self, api: client.ApiClient) -> None:
        """One pass over the view: checks Active, every actionable Workload, reclaims."""
        now = self._clock()
        view = self.snapshot(take=True)
        try:
            await self._reconcile(api, view, now)
        except BaseException:
            self._give_back(view)
            raise

    async def _reconcile(self, api: client.ApiClient, view: Snapshot, now: float) -> None:
        self._check_objects(view)
        ours = await self._sync_checks(api, view, now)
        found = self._pending_checks(view, frozenset(ours))
        if len(self._actionable_seen) > 2 * len(view.workloads) + 64:  # deleted ones go
            seen = self._actionable_seen
            self._actionable_seen = {k: seen[k] for k in view.workloads if k in seen}
        self._usable = ours
        reclaiming = [q for q in ours.values() if q.reclaim.enabled and q.inference_headroom]
        if not found and not reclaiming:
            self.metrics.set_plans({})
            if ours:  # the pools kept current: the next Workload waits for no catching up
                self._memo.begin()
                read_pools(dataclasses.replace(self._cluster(view, ours), memo=self._memo), now)
            return
        pending = [
            Pending(workload=w, check=check, parameters=ours[check], pending_since=since)
            for w, check, since in found
        ]
        asked, demand_error = await self._demand([*(p.parameters for p in pending), *reclaiming])
        cluster = dataclasses.replace(
            self._cluster(view, ours),
            demand_error=demand_error,
            asked=asked if asked is not None else {},
            lora_density=self._density_or_last(view, ours, now),
        )
        plans, decided = self._decide_pass(pending, cluster, now)
        for name, planned in sorted(plans.items()):
            self._settled("pool", f"check {name} pool {planned.pool}", planned.failed)
        cluster = dataclasses.replace(cluster, plans=plans)
        self.metrics.set_plans({name: (p.pool, p.plan) for name, p in plans.items()})
        decisions = []
        for decision in decided:
            subject = f"workload {decision.namespace}/{decision.workload} check {decision.check}"
            if not self._settled("workload", subject, decision.failed):
                decisions.append(decision)
        reclaims = reclaim_all(cluster, now)
        since = {(key(p.workload), p.check): _waiting_from(p, now) for p in pending}
        taken = _reclaims_by_key(plans)
        gate = asyncio.Semaphore(self.config.write_concurrency)

        async def write(decision: Decision, reclaim: tuple[str, Reclaim] | None) -> None:
            subject = f"write {decision.namespace}/{decision.workload} check {decision.check}"
            async with gate:
                try:
                    await self._write(api, decision, view, since, now, reclaim=reclaim)
                except Exception as err:  # one write must never stop the others
                    self._settled("write", subject, f"{type(err).__name__}: {str(err)[:300]}")
                    self._unwritten = True
                else:
                    self._settled("write", subject, "")

        await asyncio.gather(
            *(write(d, None) for d in decisions),
            *(write(d, taken.get(f"{d.namespace}/{d.workload}")) for d in reclaims),
        )

    def _cluster(self, view: Snapshot, ours: Mapping[str, params.Parameters]) -> Cluster:
        """The pass's view as ``decide`` reads it, before the scaler's figures are asked."""
        return Cluster(
            nodes=view.nodes,
            pods=view.pods,
            workloads=list(view.workloads.values()),
            datasets=view.datasets,
            dataloads=view.dataloads,
            datasets_served=not self.watched["datasets"].absent,
            demand=None,  # each check reads its own ask's figures
            asked={},
            # Gangs admitted through any of our checks hold their GPUs, also those of a
            # check whose parameters are bad right now.
            our_checks=view.ours,
            check_parameters=ours,
            pod_index=self._pod_index(view.pods),  # once a pass, for every pool
            shaped=True,  # the snapshot's boundary checked every object
        )

    def _pod_index(self, pods: Sequence[RawObject]) -> dict[str, list[RawObject]]:
        """``pods_by_owner``, a pod's ties read again only when its object is new.

        A watch replaces a pod that changed, never edits it (as ``snapshot``'s verdicts);
        reading every pod's ties every pass cost a sixth of a pass on a stream.
        """
        known, kept = self._pod_ties, {}

        def ties(pod: RawObject) -> list[str]:
            seen = known.get(id(pod))
            if seen is None or seen[0] is not pod:
                seen = (pod, ties_of_pod(pod))
            kept[id(pod)] = seen
            return seen[1]

        index = pods_by_owner(pods, ties)
        self._pod_ties = kept
        return index

    def _decide_pass(
        self, pending: Sequence[Pending], cluster: Cluster, now: float
    ) -> tuple[dict[str, CheckPlan], Sequence[Decision]]:
        """The plans (made once: admission's step 5 and reclaim read the same) and decisions.

        On the pools and fit answers kept from earlier passes; every ``RESYNC_SECONDS``
        the same view from scratch too, beside the loop (``_resync_beside``).
        """
        memo = self._memo
        memo.begin()
        built, reused, extended = memo.built, memo.reused, memo.extended
        kept = dataclasses.replace(cluster, memo=memo)
        plans = plan_pools(kept, now)
        decided = (
            self._decide(pending, dataclasses.replace(kept, plans=plans), now) if pending else ()
        )
        self.metrics.pools.labels("built").inc(memo.built - built)
        self.metrics.pools.labels("reused").inc(memo.reused - reused)
        self.metrics.pools.labels("extended").inc(memo.extended - extended)
        if self._resync_due(now):
            kept_answers: dict[str, Mapping[Any, object]] = {
                "decision": _by_subject(decided),
                "plan": dict(plans),
                "inventory": incremental.pool_states(memo),
            }
            self.resync = asyncio.create_task(
                self._resync_beside(kept_answers, pending, cluster, now), name="resync"
            )
        return plans, decided

    def _resync_due(self, now: float) -> bool:
        """Whether this pass's view is also decided from scratch; if so, counted from now.

        ``RESYNC_SECONDS`` after the last, one at a time; a clock that went back resyncs
        at once. The first pass only starts the count.
        """
        if self.resync is not None and not self.resync.done():
            return False
        if self._resynced is None:
            self._resynced = now
            return False
        if 0 <= now - self._resynced < incremental.RESYNC_SECONDS:
            return False
        self._resynced = now
        return True

    async def _resync_beside(
        self,
        kept: Mapping[str, Mapping[Any, object]],
        pending: Sequence[Pending],
        cluster: Cluster,
        now: float,
    ) -> None:
        """Plan and decide a pass's view from scratch in a thread; compare with ``kept``.

        The pass wrote the kept answers. Each kind the pass from scratch answers
        otherwise is counted and warned of once, and the kept state starts again (the
        next pass builds every pool). The view is the pass's: a watch replaces objects,
        never edits them, and the thread reads nothing else the loop changes.
        """

        def from_scratch() -> dict[str, Mapping[Any, object]]:
            fresh = incremental.Memo()
            scratch = dataclasses.replace(cluster, memo=fresh)
            plans = plan_pools(scratch, now)
            decided = (
                self._decide(pending, dataclasses.replace(scratch, plans=plans), now)
                if pending
                else ()
            )
            return {
                "decision": _by_subject(decided),
                "plan": dict(plans),
                "inventory": incremental.pool_states(fresh),
            }

        try:
            # A daemon thread: a resync under way holds up no exit (the pod's grace period).
            fresh = await in_daemon_thread(from_scratch, "resync")
        except Exception as err:  # the safety net failing must not stop the loop
            self._settled("resync", "the resync", f"{type(err).__name__}: {str(err)[:300]}")
            return
        self._settled("resync", "the resync", "")
        found = incremental.differences({kind: (kept[kind], fresh[kind]) for kind in kept})
        for kind, count in sorted(found.items()):
            self.metrics.resync_differences.labels(kind).inc(count)
            self._once.warn(
                f"resync {kind}",
                "resync: the kept state's %s answers differ from a pass from scratch "
                "(unitscale_admission_resync_differences_total counts them); the kept "
                "state starts again",
                kind,
            )
        if found:
            self._memo = incremental.Memo()

    def _pending_checks(
        self, view: Snapshot, ours: frozenset[str]
    ) -> list[tuple[RawObject, str, float]]:
        """Each Workload's checks of ours it holds Pending: ``(workload, check, since)``.

        Read again only for the Workloads the view changed (every one when our checks
        did): a pass costs the changes, not a read of every Workload.
        """
        keys: Iterable[str] | None = view.changed.get("workloads")
        if keys is None or ours != self._pending_ours:
            self._pending, self._pending_ours = {}, ours
            keys = view.workloads.keys()
        for object_key in keys:
            self._pending.pop(object_key, None)
            w = view.workloads.get(object_key)
            if w is None:
                continue
            found = self._actionable(object_key, w, ours)
            if found:
                self._pending[object_key] = (w, found)
        return [(w, check, since) for w, found in self._pending.values() for check, since in found]

    def _actionable(
        self, object_key: str, w: RawObject, ours: frozenset[str]
    ) -> list[tuple[str, float]]:
        """``workload.actionable``, read once per Workload version and set of our checks."""
        version = str((w.get("metadata") or {}).get("resourceVersion") or "")
        known = self._actionable_seen.get(object_key)
        if version and known is not None and known[0] == version and known[1] == ours:
            return known[2]
        found = actionable(w, ours)
        if version:
            self._actionable_seen[object_key] = (version, ours, found)
        return found

    def _settled(self, unit: str, subject: str, failed: str) -> bool:
        """Warn of and count a unit's failed round (``failed`` non-empty); whether it failed.

        One WARNING while the same failure lasts (DEBUG after), again once it changes or
        comes back after a good round; the counter counts every failed round.
        """
        topic = f"unit {subject}"
        if not failed:
            self._once.clear(topic)
            return False
        self._once.warn(topic, "%s: failed this pass, the others went on: %s", subject, failed)
        self.metrics.unit_failures.labels(unit).inc()
        return True

    def _check_objects(self, view: Snapshot) -> None:
        """Warn once of, and count, each object the pass reads with a problem.

        A node or pod whose HAMi annotation cannot be read; a Workload whose Ready or
        Admitted time is before its creation (read as its creation).

        Only versions not seen before are read, so a pass costs a lookup per object; a
        warning comes when an object's problem appears or changes, not with each new
        version (HAMi rewrites a node's handshake every few seconds). The inventory
        leaves such a node (or the node of such a pod) out on its own.
        """
        checked = self._read_versions
        malformed: set[tuple[str, str]] = set()
        for kind, subject, why in view.malformed:  # left out whole: warned of as it changes
            before = checked.get((kind, subject))
            checked[kind, subject] = ("", why)
            malformed.add((kind, subject))
            if before is None or before[1] != why:
                log.warning("%s: left out, of the wrong shape: %s", subject, why)
                self.metrics.unreadable.labels(kind).inc()
        # Only the objects the view changed are read again (a watch replaces a changed
        # object, never edits it): a pass costs the changes, not a read of every object.
        total = 0
        listed = {"node": view.nodes, "pod": view.pods, "workload": list(view.workloads.values())}
        for kind, name in (("node", "nodes"), ("pod", "pods"), ("workload", "workloads")):
            total += len(listed[kind])
            objects, keys = view.by_key.get(name), view.changed.get(name)
            todo: Iterable[RawObject] = listed[kind]
            if objects is not None and keys is not None:
                todo = [obj for k in keys if (obj := objects.get(k)) is not None]
            for obj in todo:
                ident = _ident(kind, obj)
                version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                before = checked.get(ident)
                if before is not None and before[0] == version:
                    continue
                found = _unreadable(kind, obj)
                problem = found[2] if found is not None else ""
                checked[ident] = (version, problem)
                if found is not None and (before is None or before[1] != problem):
                    log.warning(*found)
                    self.metrics.unreadable.labels(kind).inc()
        if len(checked) > 2 * (total + len(malformed)) + 1024:  # objects gone
            here = {_ident(kind, obj) for kind, objects in listed.items() for obj in objects}
            self._read_versions = {k: v for k, v in checked.items() if k in malformed or k in here}

    def _density_or_last(
        self, view: Snapshot, ours: Mapping[str, params.Parameters], now: float
    ) -> dict[str, int]:
        """``_step_density``, or the last densities when the step raises (a failed round)."""
        try:
            tenants = self._step_density(view, ours, now)
        except Exception as err:  # the density must not stop admission
            self._settled("density", "LoRA density", f"{type(err).__name__}: {str(err)[:300]}")
            return {model: held.tenants for model, held in self._density.items()}
        self._settled("density", "LoRA density", "")
        return tenants

    def _step_density(
        self, view: Snapshot, ours: Mapping[str, params.Parameters], now: float
    ) -> dict[str, int]:
        """Move each base model's adaptive density one step (``admission.density``).

        One density per model, cluster-wide as the instances are: the first check with
        ``lora.adaptive`` (by name) gives the ceiling, the SLO and the pool whose HAMi
        view reads the memory.
        """
        adaptive = [(n, q) for n, q in sorted(ours.items()) if q.lora.adaptive]
        if not adaptive:
            self._density = {}
            self.metrics.set_lora_density({})
            return {}
        _, first = adaptive[0]
        pool = plain_pool(self._nodes_and_pods(view), first, now)
        models = density.instance_models(list(view.workloads.values()))
        loads = density.model_loads(view.pods, pool, models, first.lora.step_time_slo_seconds)
        before = self._density
        seated = density.model_seated(view.pods, models)
        ceiling = first.lora.tenants_per_instance
        named = density.named_models(view.workloads.values())
        stepped = density.step_density(before, loads, ceiling, now, seated)
        # Only models a Workload still names: one named once was kept for good (pass 7).
        self._density = {model: held for model, held in stepped.items() if model in named}
        for model, now_held in sorted(self._density.items()):
            if model not in before or before[model].tenants != now_held.tenants:
                log.info(
                    "LoRA %s: %d tenants per instance: %s", model, now_held.tenants, now_held.reason
                )
        tenants = {model: held.tenants for model, held in self._density.items()}
        self.metrics.set_lora_density(tenants)
        return tenants

    async def _sync_checks(
        self, api: client.ApiClient, view: Snapshot, now: float
    ) -> dict[str, params.Parameters]:
        """Keep our checks' Active condition; the parameters of the usable ones."""
        usable: dict[str, params.Parameters] = {}
        active: dict[str, bool] = {}
        for name, check in sorted(view.checks.items()):
            if name not in view.ours:
                continue
            problem = None
            try:
                usable[name] = params.check_parameters(check, view.parameters)
            except ConfigError as err:
                problem = str(err)
                if self.watched["parameters"].absent:
                    problem += f" (the {PARAMETERS} CRD is not installed)"
            except Exception as err:  # one check's parameters must not stop the others
                problem = f"its parameters could not be read: {type(err).__name__}: {err}"[:1000]
                self._settled("check", f"check {name}", problem)
            active[name] = problem is None
            condition = params.active_condition(check, problem, format_time(now))
            if condition is None:
                continue
            if problem is not None:
                log.warning("AdmissionCheck %s is not active: %s", name, problem)
            else:
                log.info("AdmissionCheck %s is active", name)
            body = params.active_body(check, condition)
            await self._apply(api, ADMISSION_CHECKS, "admissionchecks", name, body)
        self.metrics.set_active(active)
        return usable

    async def _write(
        self,
        api: client.ApiClient,
        decision: Decision,
        view: Snapshot,
        since: Mapping[tuple[str, str], float],
        now: float,
        *,
        reclaim: tuple[str, Reclaim] | None = None,
    ) -> None:
        """Write one decision; ``reclaim`` (pool, what the plan said) for a reclaim's Retry."""
        object_key = f"{decision.namespace}/{decision.workload}"
        workload = view.workloads.get(object_key)
        if workload is None:
            return
        for obj in decision.create:
            await self._create(api, obj)
        previous = check_entries(workload).get(decision.check)
        if reclaim is not None:
            body = reclaim_body(workload, decision, previous, now)
        else:
            body = apply_body(workload, decision, previous, now)
        if body is None:
            return
        if not await self._apply(api, WORKLOADS, "workloads", object_key, body):
            return
        before = (previous or {}).get("state")
        if before != decision.state:
            log.info(
                "workload %s check %s: %s -> %s: %s",
                object_key,
                decision.check,
                before,
                decision.state,
                decision.message[:300],
            )
            if decision.state in ("Retry", "Rejected"):
                # Kueue's reset overwrites these messages: the Event keeps ours. A Ready
                # keeps its message on the entry, and an Event each would double the
                # writes of a burst.
                await self._event(api, event_for(workload, decision, self.name, now))
        if reclaim is not None:
            pool, taken = reclaim
            self.metrics.reclaimed(pool, taken.accelerator_hours_lost)
            self.metrics.decided(decision.check, decision.state, None)
            return
        waited = now - since.get((object_key, decision.check), now)
        self.metrics.decided(decision.check, decision.state, waited)

    async def _apply(
        self, api: client.ApiClient, resource: Resource, name: str, object_key: str, body: RawObject
    ) -> bool:
        """Server-side apply a status; whether it landed."""
        topic = f"apply {resource} {object_key}"
        try:
            answer = await apply(api, resource, body, field_manager=self.name, subresource="status")
        except client.ApiException as err:
            if err.status == 409:
                # Changed since our view (or not there any more): the watch brings the
                # new version, and a pass judges that one.
                log.debug("%s: conflict, judged again next pass", topic)
                self.metrics.writes.labels("conflict").inc()
            elif err.status != 404:  # 404: deleted meanwhile, nothing to write to
                self._once.warn(topic, "%s failed: %s %s", topic, err.status, err.reason)
                self.metrics.writes.labels("error").inc()
                self._unwritten = True
            return False
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            # ValueError: a 2xx answer that is no object (not JSON, too large): a non-JSON
            # answer to one check's Active write failed every pass whole (hostile pass 12).
            self._once.warn(topic, "%s failed: %s", topic, err)
            self.metrics.writes.labels("error").inc()
            self._unwritten = True
            return False
        self._once.clear(topic)
        if _same_object(answer, body):  # else the watch brings the object itself
            self._fresh[(name, object_key)] = (answer, self._clock())
        self.metrics.writes.labels("applied").inc()
        return True

    async def _event(self, api: client.ApiClient, event: RawObject) -> None:
        """Tell of a state change on the Workload; an event lost is only logged."""
        try:
            await create(api, EVENTS, event)
        except (client.ApiException, aiohttp.ClientError, TimeoutError, ValueError) as err:
            self._once.warn(
                "event", "an event on %s was not recorded: %s", event["involvedObject"]["name"], err
            )

    async def _create(self, api: client.ApiClient, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        what = f"{obj.get('kind')} {meta.get('namespace')}/{meta.get('name')}"
        resource = CREATABLE.get((str(obj.get("apiVersion")), str(obj.get("kind"))))
        if resource is None:
            self._once.warn(what, "not creating %s: not a kind the check creates", what)
            return
        try:
            await create(api, resource, dict(obj))
        except client.ApiException as err:
            if err.status == 409:
                return  # created already (by us, an earlier pass)
            self._once.warn(what, "creating %s failed: %s %s", what, err.status, err.reason)
            self.metrics.writes.labels("error").inc()  # retried with the pass's backoff
            self._unwritten = True
            return
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            self._once.warn(what, "creating %s failed: %s", what, err)
            self.metrics.writes.labels("error").inc()
            self._unwritten = True
            return
        log.info("created %s", what)
        self.metrics.writes.labels("applied").inc()

    # --- inference demand ------------------------------------------------------------

    async def _demand(
        self, parameters: Iterable[params.Parameters]
    ) -> tuple[Mapping[Ask, PoolDemand] | None, str]:
        """What inference needs of the pools the pending checks guard, by ask, cached briefly.

        None with the errors when no ask was answered.
        """
        asked = {
            (h.scaler, h.pool, h.horizon_seconds)
            for p in parameters
            if (h := p.inference_headroom) is not None
        }
        # An answer no check asks for any more goes once it expires: one entry was kept for
        # good per edit of a check's scaler, pool or horizon.
        now = time.monotonic()
        self._demand_cache = {
            k: v for k, v in self._demand_cache.items() if k in asked or v[0] > now
        }
        if not asked:
            return {}, ""
        ordered = sorted(asked)
        results = await asyncio.gather(*(self._ask(*one) for one in ordered))
        known, errors = merge_demand(list(zip(ordered, results, strict=True)))
        if not known and errors:
            return None, "; ".join(errors)
        return known, "; ".join(errors)

    async def _ask(self, scaler: str, pool: str, horizon: int) -> DemandResult:
        now = time.monotonic()
        cached = self._demand_cache.get((scaler, pool, horizon))
        if cached is not None and cached[0] > now:
            return cached[1]
        result = await self._fetch_demand(
            scaler, pool, float(horizon), timeout=self.config.demand_timeout
        )
        # A failure is asked again sooner: the scaler may be back in seconds.
        keep = (
            self.config.demand_cache
            if result.demand is not None
            else min(5.0, self.config.demand_cache)
        )
        self._demand_cache[(scaler, pool, horizon)] = (now + keep, result)
        if result.demand is None:
            self._once.warn(
                f"demand {scaler}", "inference demand from %s: %s", scaler, result.error
            )
        else:
            self._once.clear(f"demand {scaler}")
        return result

    # --- metrics of the view ---------------------------------------------------------

    def _nodes_and_pods(self, view: Snapshot) -> Cluster:
        """The view's nodes and pods, to read a pool from (kept from pass to pass)."""
        return Cluster(view.nodes, view.pods, (), (), (), None, memo=self._memo, shaped=True)

    def observe(self) -> None:
        """Set the view's gauges: each pool's GPUs, LoRA tenants.

        Run when ``/metrics`` is scraped, not every pass: the inventory costs as much as
        a tenth of a busy controller's CPU, and only a scrape reads it.
        """
        view, now = self.snapshot(), self._clock()
        pools: dict[str, tuple[int, int]] = {}
        cluster = self._nodes_and_pods(view)
        for pool, parameters in pool_labels(self._usable).items():
            seen = plain_pool(cluster, parameters, now)
            total = sum(len(node.devices) for node in seen.pool)
            free = sum(1 for node in seen.nodes for card in node.devices if card.untouched)
            pools[pool] = (total, free)
        self.metrics.set_inventory(pools)
        self.metrics.set_lora_tenants(lora.tenants_per_base_model(view.workloads.values()))


def _unreadable(kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """What a pass warns of for one object: ``(format, subject, problem)``, or None.

    A node's or pod's unreadable HAMi annotation, or a Workload's times before its
    creation (read as its creation: hostile pass 4, H1 and M2).
    """
    if kind == "workload":
        problem = times_before_creation(obj)
        return None if problem is None else ("%s: %s", f"workload {key(obj)}", problem)
    found = hami.unreadable(kind, obj)
    return None if found is None else ("%s: left out, its GPUs are not offered: %s", *found)


def _waiting_from(p: Pending, now: float) -> float:
    """When a check began to wait, for the decision histogram.

    ``waiting_since``, never before the Workload's creation (a Pending dated year 1 read
    as 6e10 s: hostile pass 4, L3).
    """
    start = waiting_since(p, now)
    created = created_at(p.workload)
    return max(start, created) if created <= now + MAX_CLOCK_SKEW else start


def pool_labels(checks: Mapping[str, params.Parameters]) -> dict[str, params.Parameters]:
    """The pools our checks guard, by the name the metrics give them, each read once.

    A pool's name is its ``inferenceHeadroom.pool`` (the scaler's, as the plan gauges
    name it), else its poolNodeSelector as ``key=value,...`` (``*``: every node HAMi
    registered; an ``=`` or ``*`` is never in a scaler's pool name). Checks naming one
    pool share its series, read with the first one's parameters by check name; one name
    over two selectors gives each its own, ``name/key=value,...``.
    """
    found: dict[str, dict[tuple[tuple[str, str], ...], params.Parameters]] = {}
    for _, parameters in sorted(checks.items()):
        selector = tuple(sorted(parameters.pool_node_selector.items()))
        headroom = parameters.inference_headroom
        name = headroom.pool if headroom is not None and headroom.pool else ""
        name = name or _selector_text(selector)
        found.setdefault(name, {}).setdefault(selector, parameters)
    labels: dict[str, params.Parameters] = {}
    for name, pools in found.items():
        for selector, parameters in pools.items():
            labels[name if len(pools) == 1 else f"{name}/{_selector_text(selector)}"] = parameters
    return labels


def _selector_text(selector: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector) or "*"


def _reclaims_by_key(plans: Mapping[str, CheckPlan]) -> dict[str, tuple[str, Reclaim]]:
    """Each reclaimed workload's pool and reclaim, the first plan naming it winning."""
    found: dict[str, tuple[str, Reclaim]] = {}
    for _, planned in sorted(plans.items()):
        for taken in planned.plan.reclaim:
            found.setdefault(taken.key, (planned.pool, taken))
    return found


def _controller_of(check: object) -> object:
    """An AdmissionCheck's ``spec.controllerName``, None where it cannot be read."""
    spec = check.get("spec") if isinstance(check, Mapping) else None
    return spec.get("controllerName") if isinstance(spec, Mapping) else None


def _ident(kind: str, obj: RawObject) -> tuple[str, str]:
    """What ``_check_objects`` keeps an object's last version under."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return (kind, f"{meta.get('namespace')}/{meta.get('name')}/{meta.get('uid')}")


def _relisted(
    before: _Shaped | None, kept: _Shaped, kind: str, objects: Mapping[str, RawObject]
) -> set[str] | None:
    """A watch's whole set into ``kept``; the keys changed since ``before`` (None: no before).

    An object that is the very one read before keeps its verdict (a watch replaces a
    changed object, never edits it; a list of 6,000 Workloads was read whole every
    time the watch relisted).
    """
    changed: set[str] = set()
    for object_key, obj in objects.items():
        if before is not None:
            if before.good.get(object_key) is obj:
                kept.good[object_key] = obj
                continue
            left_out = before.bad.get(object_key)
            if left_out is not None and left_out[0] is obj:
                kept.bad[object_key] = left_out
                continue
        changed.add(object_key)
        _shape_into(kept, kind, object_key, obj)
    if before is None:
        return None
    return changed | {k for k in (*before.good, *before.bad) if k not in objects}


def _shape_into(kept: _Shaped, kind: str, object_key: str, obj: RawObject | None) -> None:
    """One watched object (None: gone) into ``kept``, past the shape boundary.

    A changed object that stays well shaped keeps its place (a watch keeps its objects
    in the order they first came, a changed one in its place: ``incremental.added_pods``).
    """
    if obj is None:
        kept.good.pop(object_key, None)
        kept.bad.pop(object_key, None)
        return
    why = shape.malformed(kind, obj)
    if why is None:
        kept.bad.pop(object_key, None)
        kept.good[object_key] = obj
    else:
        kept.good.pop(object_key, None)
        kept.bad[object_key] = (obj, (kind, shape.subject(kind, obj), why))


def _by_subject(decisions: Iterable[Decision]) -> dict[tuple[str, str, str], Decision]:
    return {(d.namespace, d.workload, d.check): d for d in decisions}


def _same_object(answer: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether a write's answer is the object written (same name and namespace)."""
    ours, theirs = body.get("metadata") or {}, answer.get("metadata") or {}
    return all(ours.get(k) == theirs.get(k) for k in ("name", "namespace"))


def _version(obj: object) -> int:
    """An object's resourceVersion as a number (etcd's revision), -1 when not one."""
    if not isinstance(obj, Mapping):
        return -1
    meta = obj.get("metadata")
    text = meta.get("resourceVersion", "") if isinstance(meta, Mapping) else ""
    # ASCII digits, at most int64's 19 (etcd's revision): isdigit() is true for '²' and
    # for 5,000 digits, on which int() raised and failed every pass (issue 27, H5).
    return int(text) if _REVISION.fullmatch(text if isinstance(text, str) else "") else -1
