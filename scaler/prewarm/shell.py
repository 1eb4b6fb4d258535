"""The prewarm's Kubernetes side: Fluid watches, DataLoad writes, the decision hook.

``Prewarmer`` hooks the registry: every new decision of a ScaledObject with
``fluidDataset`` is planned at once (``scaler.prewarm.plan``, pure) and its reason
carries the prewarm's state; the decision itself is never held back. A task of its own
does the plan's writes (create a DataLoad, 409 AlreadyExists being success; delete one
of ours under a UID precondition) and re-plans each ``tick`` and on watch events, so
a DataLoad's progress and a timeout show without waiting for new signals; events
coalesce so that the passes take at most ``BUSY_SHARE`` of the loop. The watches
(every namespace's Datasets and DataLoads) start with the first ScaledObject that names
a Dataset, so a scaler without prewarm needs no Fluid RBAC.

Nothing from outside stops it: a watched object whose fields have the wrong shape is
unreadable (left out of the view, counted, one WARNING); one ScaledObject's plan or write
that raises anything fails that ScaledObject alone (counted, logged once a change, its
write backed off); no Kubernetes access is retried at a doubling backoff, logged once a
change; a watch task that ends anyway is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from kubernetes_asyncio import client

from foundation.fluid import FINISHED_PHASES
from foundation.kube import (
    DATALOADS,
    DATASETS,
    KubeAccess,
    Selection,
    create,
    delete,
    watch_objects,
)
from foundation.objects import RawObject
from scaler.core import Decision
from scaler.prewarm.plan import (
    Delete,
    FluidView,
    PrewarmPlan,
    PrewarmSpec,
    Track,
    plan,
)
from scaler.registry import ObjectKey, ScaledObject, ScaledObjectRegistry

log = logging.getLogger(__name__)

BUSY_SHARE = 0.2
"""The share of the event loop's time the passes over every ScaledObject may take: the
next pass waits four times as long as the last took (watch events coalesce meanwhile)."""
RETRY_MIN = 1.0
RETRY_MAX = 60.0
"""A refused write, or no Kubernetes access, is retried after 1 s, doubling to a minute."""

_MAPPINGS = (
    ("spec",),
    ("status",),
    ("spec", "dataset"),
    ("status", "cacheStates"),
    ("status", "waitingFor"),
)
"""Fields of a Dataset or DataLoad the plan reads as mappings (absent or null is fine)."""


def unreadable(obj: RawObject) -> str | None:
    """Why a watched Fluid object cannot be read by the plan, or None when it can.

    The plan (``foundation.fluid``) reads ``spec``, ``status`` and their parts as
    mappings and ``status.conditions`` as a list of them; a DataLoad whose ``spec`` is a
    string would raise in every plan, for every ScaledObject.
    """
    for path in _MAPPINGS:
        value: object = obj
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, dict):
            return f"{'.'.join(path)} is not a mapping"
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if conditions is not None and not (
        isinstance(conditions, list) and all(isinstance(c, dict) for c in conditions)
    ):
        return "status.conditions is not a list of mappings"
    return None


@dataclass(frozen=True, slots=True)
class PrewarmStatus:
    """One ScaledObject's prewarm, as the metrics show it."""

    key: ObjectKey
    plan: PrewarmPlan
    created: int
    write_errors: int


@dataclass(slots=True)
class _Entry:
    spec: PrewarmSpec
    track: Track
    plan: PrewarmPlan | None = None
    created: int = 0
    write_errors: int = 0
    retry_at: float = 0.0
    retry_delay: float = RETRY_MIN


class Prewarmer:
    """Plans and warms the Fluid cache of every ScaledObject that names a Dataset."""

    def __init__(
        self,
        registry: ScaledObjectRegistry,
        access: KubeAccess,
        clock: Callable[[], float] = time.time,
        *,
        tick: float = 1.0,
        resync: float = 300.0,
    ) -> None:
        self._registry = registry
        self._access = access
        self._clock = clock
        self._tick = tick
        self._resync = resync
        self._entries: dict[ObjectKey, _Entry] = {}
        self._sets: dict[str, dict[str, RawObject]] = {}
        self._problems: dict[str, str] = {}
        """Why Fluid's objects cannot be seen, by watch (``datasets``, ``dataloads``), or
        ``access`` (no Kubernetes client)."""
        self._first_done: dict[str, float] = {}
        """UID -> when a watch first brought that DataLoad finished (``FluidView``)."""
        self._before: frozenset[str] | None = None
        """UIDs of the DataLoads when both watches had first listed (how those fared, no
        plan here saw); None before."""
        self._seen: FluidView | None = None
        """The view of the sets, problems and listing above; None when any changed since.
        One a change, not one a plan: a view of every DataLoad for each ScaledObject's
        plan made a pass quadratic (3,000 of each: 6.7 s a pass on the event loop)."""
        self._wake = asyncio.Event()
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._failures: dict[tuple[object, ...], str] = {}
        """What failed last, by (what, ScaledObject or object): logged once a change."""
        self._access_retry_at = 0.0
        self._access_delay = RETRY_MIN
        self.errors: Counter[str] = Counter()
        """Units that failed, by reason: ``plan`` (a ScaledObject's plan raised),
        ``write`` (a DataLoad write failed), ``access`` (no Kubernetes client),
        ``unreadable`` (a watched object of the wrong shape), ``watch`` (a watch task
        ended and was started again)."""
        registry.add_decision_hook(self.on_decision)

    @property
    def listed(self) -> bool:
        """Both watches have listed once: the plans see what Fluid has."""
        return self._view().listed

    def statuses(self) -> list[PrewarmStatus]:
        """Every planned ScaledObject's latest plan and write counts."""
        return [
            PrewarmStatus(key, e.plan, e.created, e.write_errors)
            for key, e in self._entries.items()
            if e.plan is not None
        ]

    def on_decision(self, scaled: ScaledObject, decision: Decision, now: float) -> Decision:
        """Plan on a new decision; its reason gets the prewarm's note. Never blocks."""
        made = self._guarded_plan(scaled, decision, now)
        if made is None:
            return decision
        self._wake.set()
        return (
            replace(decision, reason=f"{decision.reason}; {made.note}") if made.note else decision
        )

    def _guarded_plan(
        self, scaled: ScaledObject, decision: Decision, now: float
    ) -> PrewarmPlan | None:
        """``_plan``, where anything it raises fails this ScaledObject's plan alone.

        A bug or an object the shape check missed must never cost the scale decision,
        nor the other ScaledObjects' plans: counted, logged once a change.
        """
        try:
            made = self._plan(scaled, decision, now)
        except Exception as err:
            self._failed(("plan", *scaled.key), "plan", err)
            return None
        self._recovered(("plan", *scaled.key))
        return made

    def _failed(self, about: tuple[object, ...], reason: str, err: BaseException) -> None:
        """Count one failed unit; a WARNING (with the traceback) when its problem changes."""
        self.errors[reason] += 1
        problem = _brief(err)
        if self._failures.get(about) != problem:
            self._failures[about] = problem
            what = "/".join(str(part) for part in about[1:])
            log.warning("prewarm %s for %s failed: %s", reason, what, problem, exc_info=err)

    def _recovered(self, about: tuple[object, ...]) -> None:
        if self._failures.pop(about, None) is not None:
            log.info("prewarm %s for %s works again", about[0], "/".join(map(str, about[1:])))

    def _plan(self, scaled: ScaledObject, decision: Decision, now: float) -> PrewarmPlan | None:
        spec = scaled.metadata.prewarm(scaled.key[0])
        if spec is None:
            self._entries.pop(scaled.key, None)
            return None
        entry = self._entries.get(scaled.key)
        if entry is None or entry.spec != spec:
            entry = self._entries[scaled.key] = _Entry(spec, Track())
        made = plan(
            scaled.key,
            spec,
            entry.track,
            active=decision.active,
            desired=decision.desired_replicas,
            fluid=self._view(),
            now=now,
            forecast=(decision.prewarm_forecast or 0.0) > 0,
        )
        if entry.plan is None or (entry.plan.state, entry.plan.reason) != (made.state, made.reason):
            log.info("ScaledObject %s/%s: prewarm %s: %s", *scaled.key, made.state, made.reason)
        entry.track, entry.plan = made.track, made
        return made

    def _view(self) -> FluidView:
        """What the watches see, built once a change (a view is indexed on first use)."""
        if self._seen is None:
            listed = all(kind in self._sets for kind in ("datasets", "dataloads"))
            self._seen = FluidView(
                listed,
                dict(self._sets.get("datasets", {})),
                list(self._sets.get("dataloads", {}).values()),
                "; ".join(self._problems.values()),
                dict(self._first_done),
                self._before or frozenset(),
            )
        return self._seen

    async def run(self) -> None:
        """Re-plan and write until cancelled; starts the watches when first needed."""
        api: client.ApiClient | None = None
        try:
            while True:
                began = time.monotonic()
                self._replan()
                cost = time.monotonic() - began
                if self._entries:
                    self._start_watches()
                if any(self._pending(e) for e in self._entries.values()):
                    if api is None:
                        api = await self._client()
                    if api is not None:
                        await self._write_all(api)
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
                # that lands as the event is set, and the task would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._tick):
                        await self._wake.wait()
                # Events coalesce: passes take at most BUSY_SHARE of the loop's time. Each
                # watch event woke a pass over every ScaledObject: a Dataset flipping every
                # 50 ms kept 10,000 of them (0.23 s a pass) replanning without end.
                rest = began + cost / BUSY_SHARE - time.monotonic()
                if rest > 0:
                    await asyncio.sleep(rest)
                self._wake.clear()
        finally:
            for task in self._watches.values():
                task.cancel()
            for task in self._watches.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._watches.clear()
            if api is not None:
                await api.close()

    async def _client(self) -> client.ApiClient | None:
        """A client, or None while there is no access: retried at a doubling backoff.

        A kubeconfig that does not load fails the same way each time; each attempt is
        counted, the problem logged once a change.
        """
        now = self._clock()
        if now < self._access_retry_at:
            return None
        try:
            api = await self._access.client()
        except Exception as err:  # ConfigError, or whatever a client build raises
            self.errors["access"] += 1
            problem = f"no Kubernetes access: {err}"
            if self._problems.get("access") != problem:
                log.error("prewarm: %s; retrying at a backoff up to %.0f s", problem, RETRY_MAX)
            self._problems["access"] = problem
            self._seen = None
            self._access_retry_at = now + self._access_delay
            self._access_delay = min(self._access_delay * 2, RETRY_MAX)
            return None
        if self._problems.pop("access", None) is not None:
            self._seen = None
            log.info("prewarm: Kubernetes access works again")
        self._access_delay = RETRY_MIN
        return api

    def _replan(self) -> None:
        """Plan every prewarm ScaledObject on its latest decision (time moves on)."""
        now = self._clock()
        known = set()
        for scaled in self._registry.objects():
            known.add(scaled.key)
            if scaled.decision is not None:
                self._guarded_plan(scaled, scaled.decision, now)
            elif (spec := scaled.metadata.prewarm(scaled.key[0])) is not None:
                # No decision yet (no signals): watch Fluid already, for the first one.
                self._entries.setdefault(scaled.key, _Entry(spec, Track()))
        for gone in [key for key in self._entries if key not in known]:
            del self._entries[gone]
        # The failures of ScaledObjects no longer known go with them.
        for about in [
            a for a in self._failures if a[0] in ("plan", "write") and a[1:] not in known
        ]:
            del self._failures[about]

    def _pending(self, entry: _Entry) -> bool:
        made = entry.plan
        return made is not None and (made.create or made.delete) is not None

    async def _write_all(self, api: client.ApiClient) -> None:
        now = self._clock()
        written: list[ObjectKey] = []
        for key, entry in list(self._entries.items()):
            if not self._pending(entry) or now < entry.retry_at:
                continue
            assert entry.plan is not None
            try:
                if entry.plan.create is not None:
                    await self._create(api, key, entry, entry.plan.create)
                elif entry.plan.delete is not None:
                    await self._delete(api, key, entry.plan.delete)
            except Exception as err:  # an answer that is no object too: this write only
                entry.write_errors += 1
                self.errors["write"] += 1
                entry.retry_at = now + entry.retry_delay
                entry.retry_delay = min(entry.retry_delay * 2, RETRY_MAX)
                # One WARNING a change of why: a write refused for good (RBAC) was one a
                # retry, a minute apart for as long as it lasted (hostile pass 6, S6-M3).
                problem = _brief(err)
                level = (
                    logging.DEBUG
                    if self._failures.get(("write", *key)) == problem
                    else logging.WARNING
                )
                self._failures[("write", *key)] = problem
                log.log(
                    level,
                    "ScaledObject %s/%s: prewarm write failed (%s); retrying in %.0f s",
                    *key,
                    problem,
                    entry.retry_at - now,
                )
                continue
            self._recovered(("write", *key))
            entry.retry_delay = RETRY_MIN
            written.append(key)
        # Re-plan on what was written, so one plan's write is done once: after the
        # writes, on one view. A re-plan after each rebuilt the view each time (3,000
        # writes: 8.3 s of the event loop, hostile pass 16).
        for key in written:
            scaled = self._registry.get(*key)
            if scaled is not None and scaled.decision is not None:
                self._guarded_plan(scaled, scaled.decision, self._clock())

    async def _create(
        self, api: client.ApiClient, key: ObjectKey, entry: _Entry, body: RawObject
    ) -> None:
        meta = body["metadata"]
        try:
            made = await create(api, DATALOADS, body)
            entry.created += 1
            log.info(
                "ScaledObject %s/%s: created DataLoad %s/%s", *key, meta["namespace"], meta["name"]
            )
        except client.ApiException as err:
            if err.status != 409:
                raise
            made = body  # another scaler's, under the same name: as good as ours
            log.info(
                "ScaledObject %s/%s: DataLoad %s/%s exists already",
                *key,
                meta["namespace"],
                meta["name"],
            )
        # Seen at once, until the watch brings the object itself (ours, when the answer
        # is no readable DataLoad: the watch corrects it).
        seen = made if isinstance(made, dict) and unreadable(made) is None else body
        self._sets.setdefault("dataloads", {})[f"{meta['namespace']}/{meta['name']}"] = seen
        self._seen = None

    async def _delete(self, api: client.ApiClient, key: ObjectKey, target: Delete) -> None:
        try:
            await delete(api, DATALOADS, target.namespace, target.name, uid=target.uid)
        except client.ApiException as err:
            if err.status not in (404, 409):  # gone, or already recreated by another scaler
                raise
        log.info(
            "ScaledObject %s/%s: deleted DataLoad %s/%s to load again",
            *key,
            target.namespace,
            target.name,
        )
        self._sets.setdefault("dataloads", {}).pop(f"{target.namespace}/{target.name}", None)
        self._seen = None

    def _start_watches(self) -> None:
        """Start each watch not running; one that ended anyway is started again."""
        for kind, resource in (("datasets", DATASETS), ("dataloads", DATALOADS)):
            running = self._watches.get(kind)
            if running is not None and not running.done():
                continue
            if running is not None:
                error = None if running.cancelled() else running.exception()
                why = "returned" if error is None else repr(error)
                self.errors["watch"] += 1
                log.error("prewarm: the watch on %s ended (%s); starting it again", kind, why)
            self._watches[kind] = asyncio.create_task(
                watch_objects(
                    self._access,
                    Selection(resource),
                    self._on_change(kind),
                    resync=self._resync,
                    on_error=self._on_error(kind),
                )
            )

    def _readable(self, kind: str, objects: dict[str, RawObject]) -> dict[str, RawObject]:
        """The objects the plan can read; each unreadable one counted and logged once."""
        kept: dict[str, RawObject] = {}
        for name, obj in objects.items():
            problem = unreadable(obj)
            about: tuple[object, ...] = ("unreadable", kind, name)
            if problem is None:
                kept[name] = obj
                self._failures.pop(about, None)
            elif self._failures.get(about) != problem:
                self.errors["unreadable"] += 1
                self._failures[about] = problem
                log.warning("prewarm: %s %s is unreadable (%s); left out", kind, name, problem)
        gone = [a for a in self._failures if a[:2] == ("unreadable", kind) and a[2] not in objects]
        for stale in gone:
            del self._failures[stale]
        return kept

    def _on_change(self, kind: str) -> Callable[[dict[str, RawObject]], None]:
        def changed(objects: dict[str, RawObject]) -> None:
            self._sets[kind] = self._readable(kind, objects)
            if kind == "dataloads":
                self._first_done = self._finished_since(self._sets[kind])
            self._seen = None
            if self._before is None and self._view().listed:
                uids = (
                    (d.get("metadata") or {}).get("uid") for d in self._sets["dataloads"].values()
                )
                self._before = frozenset(u for u in uids if isinstance(u, str) and u)
            # Only this watch's problem is over: the other's may still fail.
            self._problems.pop(kind, None)
            self._seen = None
            self._wake.set()

        return changed

    def _finished_since(self, loads: dict[str, RawObject]) -> dict[str, float]:
        """When each finished load was first seen finished (those gone are let go)."""
        now, known, seen = self._clock(), self._first_done, {}
        for obj in loads.values():
            uid = (obj.get("metadata") or {}).get("uid")
            status = obj.get("status") or {}
            if isinstance(uid, str) and uid and status.get("phase") in FINISHED_PHASES:
                seen[uid] = known.get(uid, now)
        return seen

    def _on_error(self, kind: str) -> Callable[[Exception], None]:
        def failed(err: Exception) -> None:
            resource = f"{kind}.data.fluid.io"
            if isinstance(err, client.ApiException) and err.status == 404:
                problem = f"the API server serves no {resource}: are Fluid's CRDs installed?"
            elif isinstance(err, client.ApiException) and err.status == 403:
                problem = (
                    f"forbidden to watch {resource}: the scaler needs list and watch on it in"
                    " every namespace (the ClusterRole of deploy/components/scaler-prewarm)"
                )
            else:
                problem = f"cannot watch {resource}: {_brief(err)}"
            self._problems[kind] = problem
            self._seen = None
            self._wake.set()

        return failed


def _brief(err: BaseException) -> str:
    if isinstance(err, client.ApiException):
        return f"{err.status} {err.reason}: {str(err.body or '')[:300]}"
    return f"{type(err).__name__}: {str(err)[:300]}"
