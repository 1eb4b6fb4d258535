"""The prewarm's Kubernetes side: Fluid watches, DataLoad writes, the decision hook.

``Prewarmer`` hooks the registry: every new decision of a ScaledObject with
``fluidDataset`` is planned at once (``scaler.prewarm.plan``, pure) and its reason
carries the prewarm's state; the decision itself is never held back. A task of its own
does the plan's writes (create a DataLoad, 409 AlreadyExists being success; delete one
of ours under a UID precondition) and re-plans each ``tick`` and on every watch event, so
a DataLoad's progress and a timeout show without waiting for new signals. The watches
(every namespace's Datasets and DataLoads) start with the first ScaledObject that names
a Dataset, so a scaler without prewarm needs no Fluid RBAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from kubernetes_asyncio import client

from foundation.errors import ConfigError
from foundation.kube import (
    DATALOADS,
    DATASETS,
    KubeAccess,
    RawObject,
    Selection,
    create,
    delete,
    watch_objects,
)
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

RETRY_MIN = 1.0
RETRY_MAX = 60.0
"""A refused write is retried after 1 s, doubling to at most a minute."""


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
        self._listed_at: float | None = None
        """When both watches had first listed (what finished before, no plan here saw)."""
        self._wake = asyncio.Event()
        self._watches: list[asyncio.Task[None]] = []
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
        try:
            made = self._plan(scaled, decision, now)
        except Exception:  # a bug here must never cost the scale decision
            log.exception("ScaledObject %s/%s: prewarm planning failed", *scaled.key)
            return decision
        if made is None:
            return decision
        self._wake.set()
        return (
            replace(decision, reason=f"{decision.reason}; {made.note}") if made.note else decision
        )

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
        listed = all(kind in self._sets for kind in ("datasets", "dataloads"))
        return FluidView(
            listed,
            self._sets.get("datasets", {}),
            list(self._sets.get("dataloads", {}).values()),
            "; ".join(self._problems.values()),
            self._listed_at,
        )

    async def run(self) -> None:
        """Re-plan and write until cancelled; starts the watches when first needed."""
        api: client.ApiClient | None = None
        try:
            while True:
                self._replan()
                if self._entries and not self._watches:
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
                self._wake.clear()
        finally:
            for task in self._watches:
                task.cancel()
            for task in self._watches:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._watches.clear()
            if api is not None:
                await api.close()

    async def _client(self) -> client.ApiClient | None:
        try:
            api = await self._access.client()
        except ConfigError as err:
            self._problems["access"] = f"no Kubernetes access: {err}"
            log.error("prewarm: %s", self._problems["access"])
            return None
        self._problems.pop("access", None)
        return api

    def _replan(self) -> None:
        """Plan every prewarm ScaledObject on its latest decision (time moves on)."""
        now = self._clock()
        known = set()
        for scaled in self._registry.objects():
            known.add(scaled.key)
            if scaled.decision is not None:
                self._plan(scaled, scaled.decision, now)
            elif (spec := scaled.metadata.prewarm(scaled.key[0])) is not None:
                # No decision yet (no signals): watch Fluid already, for the first one.
                self._entries.setdefault(scaled.key, _Entry(spec, Track()))
        for gone in [key for key in self._entries if key not in known]:
            del self._entries[gone]

    def _pending(self, entry: _Entry) -> bool:
        made = entry.plan
        return made is not None and (made.create or made.delete) is not None

    async def _write_all(self, api: client.ApiClient) -> None:
        now = self._clock()
        for key, entry in list(self._entries.items()):
            if not self._pending(entry) or now < entry.retry_at:
                continue
            assert entry.plan is not None
            try:
                if entry.plan.create is not None:
                    await self._create(api, key, entry, entry.plan.create)
                elif entry.plan.delete is not None:
                    await self._delete(api, key, entry.plan.delete)
            except (client.ApiException, OSError, TimeoutError) as err:
                entry.write_errors += 1
                entry.retry_at = now + entry.retry_delay
                entry.retry_delay = min(entry.retry_delay * 2, RETRY_MAX)
                log.warning(
                    "ScaledObject %s/%s: prewarm write failed (%s); retrying in %.0f s",
                    *key,
                    _brief(err),
                    entry.retry_at - now,
                )
                continue
            entry.retry_delay = RETRY_MIN
            # Re-plan on what was just written, so one plan's write is done once.
            scaled = self._registry.get(*key)
            if scaled is not None and scaled.decision is not None:
                self._plan(scaled, scaled.decision, self._clock())

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
        # Seen at once, until the watch brings the object itself.
        self._sets.setdefault("dataloads", {})[f"{meta['namespace']}/{meta['name']}"] = made

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

    def _start_watches(self) -> None:
        for kind, resource in (("datasets", DATASETS), ("dataloads", DATALOADS)):
            self._watches.append(
                asyncio.create_task(
                    watch_objects(
                        self._access,
                        Selection(resource),
                        self._on_change(kind),
                        resync=self._resync,
                        on_error=self._on_error(kind),
                    )
                )
            )

    def _on_change(self, kind: str) -> Callable[[dict[str, RawObject]], None]:
        def changed(objects: dict[str, RawObject]) -> None:
            self._sets[kind] = objects
            if self._listed_at is None and self._view().listed:
                self._listed_at = self._clock()
            # Only this watch's problem is over: the other's may still fail.
            self._problems.pop(kind, None)
            self._wake.set()

        return changed

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
            self._wake.set()

        return failed


def _brief(err: BaseException) -> str:
    if isinstance(err, client.ApiException):
        return f"{err.status} {err.reason}: {str(err.body or '')[:300]}"
    return f"{type(err).__name__}: {str(err)[:300]}"
