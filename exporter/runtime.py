"""The exporter's loop: discover replicas, scrape them all at once, derive, publish.

Each cycle scrapes every replica concurrently with a per-scrape timeout, so one slow
or dead replica never delays the others; the cycle waits at most ``timeout``.

Replicas come from flags/``targets``, DNS and EndpointSlice watches (their union).
``apply(config)`` swaps in a reloaded config between cycles: deployments that stay keep
their histories, watches follow the ``endpoint-slices`` entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from exporter.config import DeploymentConfig, ExporterConfig
from exporter.scrape import REASONS, ScrapeResult, resolve_replicas, scrape
from exporter.signals import ReplicaHistory, derive, history_horizon
from foundation.discovery import EndpointSlicesConfig, EndpointSliceWatch
from foundation.kube import KubeAccess
from foundation.signals import EngineSignals

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TargetStatus:
    """What the exporter knows about one replica's ``/metrics``."""

    up: bool = False
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    last_error: str = ""
    scrape_seconds: float = 0.0


@dataclass(slots=True)
class DeploymentState:
    """One deployment's replicas, their histories and its latest signals."""

    config: DeploymentConfig
    targets: list[str] = field(default_factory=list)
    histories: dict[str, ReplicaHistory] = field(default_factory=dict)
    status: dict[str, TargetStatus] = field(default_factory=dict)
    served_model: str = ""
    """The model the engine reports (``model_name``), for the Prometheus label."""
    engine: str = ""
    signals: EngineSignals | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """(namespace, deployment, model) as the scaler's ScaledObjects name it.

        The model part is the configured one (usually empty), so that a ScaledObject
        naming only its deployment finds it whatever model the engine reports.
        """
        return (self.config.namespace, self.config.deployment, self.config.model)

    @property
    def model_label(self) -> str:
        """The ``model`` label: configured, else what the engine reports."""
        return self.config.model or self.served_model


SliceKey = tuple[str, EndpointSlicesConfig | None]
"""(namespace, endpoint-slices config): one watch per distinct pair."""


class Exporter:
    """Holds every deployment's state; ``cycle()`` runs one scrape round."""

    def __init__(
        self,
        config: ExporterConfig,
        clock: Callable[[], float] = time.time,
        kube: KubeAccess | None = None,
        slice_resync: float = 300.0,
    ) -> None:
        self.config = config
        self.clock = clock
        self.kube = kube or KubeAccess()
        self.slice_resync = slice_resync
        self.deployments = [DeploymentState(d) for d in config.deployments]
        self.cycles = 0
        self.last_cycle_seconds: float | None = None
        self.slice_watches: dict[SliceKey, EndpointSliceWatch] = {}
        self._watch_tasks: dict[SliceKey, asyncio.Task[None]] = {}
        self._running = False
        self._listeners: list[Callable[[DeploymentState], None]] = []

    def apply(self, config: ExporterConfig) -> None:
        """Use ``config`` from the next cycle on (a hot reload).

        Deployments are matched by (namespace, deployment, model): a match keeps its
        replica histories, so rates continue; a new one starts empty; a removed one
        is dropped with its series.
        """
        old = {state.key: state for state in self.deployments}
        horizon = history_horizon(config.stable_window, config.interval)
        states = []
        for deployment in config.deployments:
            state = DeploymentState(deployment)
            previous = old.get(state.key)
            if previous is not None:
                previous.config = deployment
                for history in previous.histories.values():
                    history.horizon = horizon
                state = previous
            states.append(state)
        self.config = config
        self.deployments = states
        if self._running:
            self._reconcile_watches()

    def _reconcile_watches(self) -> None:
        wanted = {
            (state.config.namespace, state.config.endpoint_slices)
            for state in self.deployments
            if state.config.endpoint_slices is not None
        }
        for key in [k for k in self._watch_tasks if k not in wanted]:
            self._watch_tasks.pop(key).cancel()
            del self.slice_watches[key]
        for key in wanted - self._watch_tasks.keys():
            namespace, slices = key
            assert slices is not None
            watch = EndpointSliceWatch(namespace, slices)
            self.slice_watches[key] = watch
            self._watch_tasks[key] = asyncio.create_task(watch.run(self.kube, self.slice_resync))

    async def _stop_watches(self) -> None:
        tasks = list(self._watch_tasks.values())
        self._watch_tasks.clear()
        self.slice_watches.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def add_listener(self, listener: Callable[[DeploymentState], None]) -> None:
        """Call ``listener`` with each deployment after every cycle."""
        self._listeners.append(listener)

    async def cycle(self, session: aiohttp.ClientSession) -> None:
        """Discover, scrape every replica concurrently, derive and publish."""
        started = time.perf_counter()
        # One snapshot per cycle: a reload during the awaits applies from the next one.
        config, deployments = self.config, self.deployments
        await asyncio.gather(*(self._discover(d) for d in deployments))
        jobs = [
            (state, scrape(session, target, config.timeout, state.config.engine))
            for state in deployments
            for target in state.targets
        ]
        results = await asyncio.gather(*(job for _, job in jobs))
        now = self.clock()
        by_deployment: dict[int, list[ScrapeResult]] = {id(s): [] for s in deployments}
        for (state, _), result in zip(jobs, results, strict=True):
            by_deployment[id(state)].append(result)
        for state in deployments:
            self._absorb(config, state, by_deployment[id(state)], now)
            for listener in self._listeners:
                listener(state)
        self.cycles += 1
        self.last_cycle_seconds = time.perf_counter() - started

    async def run(self) -> None:
        """Cycle every ``interval`` forever (a late cycle starts the next at once)."""
        timeout = aiohttp.ClientTimeout(total=None)
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        self._running = True
        self._reconcile_watches()
        try:
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
                while True:
                    began = time.monotonic()
                    await self.cycle(session)
                    # Read per cycle: a reload may have changed the interval.
                    wait = self.config.interval - (time.monotonic() - began)
                    await asyncio.sleep(max(0.0, wait))
        finally:
            self._running = False
            await self._stop_watches()

    async def _discover(self, state: DeploymentState) -> None:
        targets = list(state.config.targets)
        slices = state.config.endpoint_slices
        if slices is not None:
            watch = self.slice_watches.get((state.config.namespace, slices))
            if watch is not None and watch.targets is not None:
                targets = sorted({*targets, *watch.targets})
        if state.config.dns:
            try:
                state.targets = sorted({*targets, *await resolve_replicas(state.config.dns)})
                return
            except OSError as err:
                log.warning(
                    "cannot resolve %s (%s); keeping the last replica list", state.config.dns, err
                )
                targets = sorted({*targets, *state.targets})
        state.targets = targets

    def _absorb(
        self,
        config: ExporterConfig,
        state: DeploymentState,
        results: list[ScrapeResult],
        now: float,
    ) -> None:
        horizon = history_horizon(config.stable_window, config.interval)
        known = set(state.targets)
        for gone in [t for t in state.histories if t not in known]:
            del state.histories[gone]
        for gone in [t for t in state.status if t not in known]:
            del state.status[gone]
        latest = []
        for result in results:
            status = state.status.setdefault(result.target, TargetStatus())
            status.scrape_seconds = result.seconds
            if result.stats is None:
                assert result.error is not None
                if status.up or status.last_error != result.detail:
                    log.warning("scrape %s failed: %s", result.target, result.detail)
                status.up, status.last_error = False, result.detail
                status.errors[result.error] += 1
                continue
            status.up, status.last_error = True, ""
            state.histories.setdefault(result.target, ReplicaHistory(horizon)).add(
                now, result.stats
            )
            latest.append(result.stats)
            state.engine = result.stats.engine
            if result.stats.model:
                state.served_model = result.stats.model
        state.signals = derive(
            now,
            len(state.targets),
            latest,
            [state.histories[t] for t in state.targets if t in state.histories],
            config.panic_window,
            config.stable_window,
            state.config.accelerator.accelerator(),
        )
