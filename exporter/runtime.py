"""The exporter's loop: discover replicas, scrape them all at once, derive, publish.

Each cycle scrapes every replica concurrently with a per-scrape timeout, so one slow
or dead replica never delays the others; the cycle waits at most ``timeout``. Bodies are
parsed in a small pool of worker threads, off the event loop.

A replica's failure stays its own: counted under its reason, logged once per change, its
signals absent and its deployment marked partial. A deployment whose signals cannot be
derived or published is logged and skipped, never the cycle. A cycle that raises all the
same restarts the loop after a backoff (``loop_restarts`` counts them), and
``stalled()`` says when no cycle has completed for ``STALE_CYCLES`` intervals, which the
process turns into failing health.

Replicas come from flags/``targets``, DNS and EndpointSlice watches (their union).
``apply(config)`` swaps in a reloaded config between cycles: deployments that stay keep
their histories, watches follow the ``endpoint-slices`` entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from exporter.config import MAX_TARGETS, MAX_TOTAL_TARGETS, DeploymentConfig, ExporterConfig
from exporter.engines import REJECTIONS
from exporter.parse_pool import ParsePool
from exporter.scrape import REASONS, ScrapeResult, resolve_replicas, scrape
from exporter.signals import ReplicaHistory, derive, history_horizon
from foundation.discovery import EndpointSlicesConfig, EndpointSliceWatch
from foundation.errors import quote
from foundation.kube import KubeAccess
from foundation.signals import EngineSignals

log = logging.getLogger(__name__)

STALE_CYCLES = 3
"""Health fails when no cycle has completed for this many intervals."""
BACKOFF_CAP = 60.0
"""Longest wait before restarting a failed loop; the first wait is one interval."""
MODEL_LABEL_HOLD = 600.0
"""Seconds the ``model`` label stays before it may move to another name (``_label_model``)."""
PARSE_WORKERS = 2
"""Threads that parse bodies, the smallest first (``exporter.parse_pool``)."""


@dataclass(slots=True)
class TargetStatus:
    """What the exporter knows about one replica's ``/metrics``."""

    up: bool = False
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    """Failed scrapes by reason."""
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECTIONS, 0))
    """Concepts rejected by why, summed over scrapes (a scrape may reject several)."""
    last_error: str = ""
    last_reason: str = ""
    """The last failure's reason, "" while scrapes work: a change is logged."""
    last_rejected: dict[str, str] = field(default_factory=dict)
    """The last good scrape's rejected concepts: a change is logged."""
    scrape_seconds: float = 0.0


@dataclass(slots=True)
class DeploymentState:
    """One deployment's replicas, their histories and its latest signals."""

    config: DeploymentConfig
    targets: list[str] = field(default_factory=list)
    histories: dict[str, ReplicaHistory] = field(default_factory=dict)
    status: dict[str, TargetStatus] = field(default_factory=dict)
    served_model: str = ""
    """The model the engines report (``model_name``), for the Prometheus label: see
    ``Exporter._label_model``."""
    model_since: float = -math.inf
    """When ``served_model`` last changed (the exporter's monotonic clock)."""
    engine: str = ""
    signals: EngineSignals | None = None
    failure: str = ""
    """Why its signals could not be derived or published last cycle ("" when they were)."""
    discovery_problem: str = ""
    """Why discovering its replicas failed last cycle ("" when it worked): a change is logged."""
    resolved_dns: str | None = None
    """The ``dns`` name that last resolved: its replica list has answered once."""
    discovered: bool = False
    """Every discovery it is configured with (EndpointSlices, DNS) has answered at least
    once. Until then no signals are published: an empty list is "not listed yet" (a 403,
    an API server away, a lookup timing out), and "0 replicas, no load" read as facts
    scaled the deployment to zero."""
    too_many: int = 0
    """Replicas the last discovery found when over ``MAX_TARGETS`` (0 when within): no
    signals meanwhile, and the last list within it is what is scraped."""

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


def shown(target: str) -> str:
    """A target as a log line shows it: whole when short and printable, else cut, quoted."""
    return target if len(target) <= 200 and target.isprintable() else quote(target, 200)


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
        steady: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.steady = steady or (time.monotonic if clock is time.time else clock)
        """The clock windows are measured on (``_absorb``): monotonic, unless a test's
        fake ``clock`` is both."""
        self.kube = kube or KubeAccess()
        self.slice_resync = slice_resync
        self.deployments = [DeploymentState(d) for d in config.deployments]
        self.cycles = 0
        self.last_cycle_seconds: float | None = None
        self.last_cycle_end: float | None = None
        """``time.monotonic()`` when the last cycle completed."""
        self.loop_restarts = 0
        self._started: float | None = None
        self._failures = 0
        self._parser: ParsePool | None = None
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

    def _parse_pool(self) -> ParsePool:
        if self._parser is None:
            self._parser = ParsePool(PARSE_WORKERS)
        return self._parser

    def close(self) -> None:
        """Stop the parsing threads (a later cycle starts new ones)."""
        if self._parser is not None:
            self._parser.shutdown()
            self._parser = None

    async def cycle(self, session: aiohttp.ClientSession) -> None:
        """Discover, scrape every replica concurrently, derive and publish.

        Raises nothing for a bad replica or a deployment that cannot be derived.
        """
        started = time.perf_counter()
        # One snapshot per cycle: a reload during the awaits applies from the next one.
        config, deployments = self.config, self.deployments
        found = await asyncio.gather(
            *(self._discover(d) for d in deployments), return_exceptions=True
        )
        for state, outcome in zip(deployments, found, strict=True):
            if isinstance(outcome, Exception):
                problem = f"discovery failed: {outcome!r}"[:300]
                if problem != state.discovery_problem:  # once per change
                    log.error("%s/%s: %s; keeping its replicas", *state.key[:2], problem)
                state.discovery_problem = problem
            elif isinstance(outcome, BaseException):
                raise outcome
            elif state.discovery_problem.startswith("discovery failed"):
                log.info("%s/%s: discovery works again", *state.key[:2])
                state.discovery_problem = ""
        limits, parser = config.limits(), self._parse_pool()
        jobs = [
            (state, scrape(session, target, config.timeout, state.config.engine, limits, parser))
            for state in deployments
            for target in state.targets
        ]
        results = await asyncio.gather(*(job for _, job in jobs))
        now, steady = self.clock(), self.steady()
        by_deployment: dict[int, list[ScrapeResult]] = {id(s): [] for s in deployments}
        for (state, _), result in zip(jobs, results, strict=True):
            by_deployment[id(state)].append(result)
        for state in deployments:
            self._publish(config, state, by_deployment[id(state)], now, steady)
            await asyncio.sleep(0)  # let /healthz and gRPC in between deployments
        self.cycles += 1
        self.last_cycle_seconds = time.perf_counter() - started
        self.last_cycle_end = time.monotonic()

    def _publish(
        self,
        config: ExporterConfig,
        state: DeploymentState,
        results: list[ScrapeResult],
        now: float,
        steady: float,
    ) -> None:
        """Absorb one deployment's scrapes and tell the listeners; a failure stays its own."""
        failure = ""
        try:
            self._absorb(config, state, results, now, steady)
        except Exception as err:
            state.signals = None  # no signals rather than wrong ones
            failure = f"deriving signals failed: {err!r}"
            self._deployment_failed(state, failure, err)
        else:
            for listener in self._listeners:
                try:
                    listener(state)
                except Exception as err:
                    failure = f"publishing signals failed: {err!r}"
                    self._deployment_failed(state, failure, err)
        if not failure and state.failure:
            log.info("deployment %s/%s works again", *state.key[:2])
        state.failure = failure

    @staticmethod
    def _deployment_failed(state: DeploymentState, failure: str, err: Exception) -> None:
        if failure != state.failure:  # once per change
            namespace, deployment, _ = state.key
            log.error("deployment %s/%s: %s", namespace, deployment, failure[:300], exc_info=err)

    @property
    def parse_thread_start_failures(self) -> int:
        """Parse threads that could not start (each is tried again with the next body)."""
        return 0 if self._parser is None else self._parser.failed_starts

    def parse_problem(self) -> str | None:
        """Why scraped bodies may wait unparsed (a parse thread not running), or None."""
        return None if self._parser is None else self._parser.problem()

    def stalled(self, now: float | None = None) -> str | None:
        """Why the loop looks stuck (no cycle for ``STALE_CYCLES`` intervals), or None."""
        since = self.last_cycle_end if self.last_cycle_end is not None else self._started
        if since is None:
            return None  # not running
        age = (time.monotonic() if now is None else now) - since
        limit = STALE_CYCLES * self.config.interval
        if age <= limit:
            return None
        return (
            f"no scrape cycle completed for {age:.1f}s"
            f" (more than {STALE_CYCLES} intervals of {self.config.interval:g}s)"
        )

    async def run(self) -> None:
        """Cycle every ``interval`` forever (a late cycle starts the next at once).

        A cycle that raises is logged and the loop restarts with a fresh HTTP session
        after one interval, doubling each time it fails again (at most ``BACKOFF_CAP``);
        histories survive. ``loop_restarts`` counts the restarts.
        """
        self._running = True
        self._started = time.monotonic()
        self._reconcile_watches()
        last = ""
        try:
            while True:
                try:
                    await self._cycle_forever()
                except Exception as err:
                    self._failures += 1
                    self.loop_restarts += 1
                    exponent = min(self._failures - 1, 16)
                    delay = min(self.config.interval * 2**exponent, BACKOFF_CAP)
                    log.error(
                        "scrape loop failed (%d in a row): %s; restarting in %.1fs",
                        self._failures,
                        repr(err)[:300],
                        delay,
                        exc_info=err if repr(err) != last else None,  # a traceback per change
                    )
                    last = repr(err)
                    await asyncio.sleep(delay)
        finally:
            self._running = False
            await self._stop_watches()
            self.close()

    async def _cycle_forever(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None)
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                began = time.monotonic()
                await self.cycle(session)
                if self._failures:
                    log.info("scrape loop works again after %d failures", self._failures)
                    self._failures = 0
                # Read per cycle: a reload may have changed the interval.
                wait = self.config.interval - (time.monotonic() - began)
                await asyncio.sleep(max(0.0, wait))

    async def _discover(self, state: DeploymentState) -> None:
        targets = list(state.config.targets)
        slices = state.config.endpoint_slices
        listed = True
        if slices is not None:
            watch = self.slice_watches.get((state.config.namespace, slices))
            listed = watch is not None and watch.targets is not None
            if watch is not None and watch.targets is not None:
                targets = sorted({*targets, *watch.targets})
        state.discovered = listed and state.config.dns in (None, "", state.resolved_dns)
        if state.config.dns:
            try:
                # Bounded like a scrape: a resolver that hangs must not hold up the cycle.
                async with asyncio.timeout(self.config.timeout):
                    found = await resolve_replicas(state.config.dns)
                self._take(state, sorted({*targets, *found}))
                state.resolved_dns = state.config.dns
                state.discovered = listed and not state.too_many
                if state.discovery_problem:
                    log.info("%s resolves again", state.config.dns)
                    state.discovery_problem = ""
                return
            except OSError as err:  # TimeoutError included
                problem = str(err) or f"no answer within {self.config.timeout:g}s"
                if problem != state.discovery_problem:  # once per change
                    log.warning(
                        "cannot resolve %s (%s); keeping the last replica list",
                        state.config.dns,
                        problem,
                    )
                state.discovery_problem = problem
                targets = sorted({*targets, *state.targets})
        self._take(state, targets)
        state.discovered = state.discovered and not state.too_many

    def _take(self, state: DeploymentState, targets: list[str]) -> None:
        """Scrape ``targets`` from now on, unless there are more than the bound.

        The bound: ``MAX_TARGETS``, or what the other deployments' lists leave of
        ``MAX_TOTAL_TARGETS`` when less. More is no deployment this exporter scrapes:
        every one of them was scraped at once each cycle (30,000 from a Service's
        EndpointSlices ran out of file descriptors; 5,000 starved the deployment beside
        it, whose one replica timed out every cycle; 256 deployments discovering 1,000
        each made 256,000 a cycle). The last list within the bound stays, and no signals
        are published until discovery is within it again (logged once a change).
        """
        others = sum(len(s.targets) for s in self.deployments if s is not state)
        bound = min(MAX_TARGETS, MAX_TOTAL_TARGETS - others)
        if len(targets) > bound:
            if not state.too_many:  # once a change: a count that churns is not one
                log.error(
                    "%s/%s: discovery found %d replicas, more than the %d scraped (%d"
                    " for one deployment, %d for all of them); no signals until it finds"
                    " at most that many",
                    *state.key[:2],
                    len(targets),
                    bound,
                    MAX_TARGETS,
                    MAX_TOTAL_TARGETS,
                )
            state.too_many = len(targets)
            return
        if state.too_many:
            log.info("%s/%s: %d replicas again", *state.key[:2], len(targets))
            state.too_many = 0
        state.targets = targets

    @staticmethod
    def _label_model(state: DeploymentState, models: list[str], now: float) -> None:
        """Keep the ``model`` label while an answering replica reports it.

        The label was the last answering replica's name, each cycle: a replica naming a
        new model each scrape (or two replicas on different ones) gave every family the
        exporter serves a new series each cycle, for good in Prometheus (issue 27,
        hostile pass 7, XS-M3). It now moves only when no answering replica reports it,
        to the name most of them report, once the label has stood ``MODEL_LABEL_HOLD``
        (the first name is taken at once; so is an upgrade of a label that old).
        """
        if not models or state.served_model in models:
            return
        if state.served_model and 0 <= now - state.model_since < MODEL_LABEL_HOLD:
            return
        state.served_model = Counter(models).most_common(1)[0][0]
        state.model_since = now

    def _absorb(
        self,
        config: ExporterConfig,
        state: DeploymentState,
        results: list[ScrapeResult],
        now: float,
        steady: float,
    ) -> None:
        """Fold one deployment's scrapes into its histories and derive its signals.

        ``now`` (the wall clock) dates the signals for the scaler; the histories and
        their windows run on ``steady``, the monotonic clock. On the wall clock a step
        back (NTP correcting a clock a day ahead) kept every scrape until the clock
        caught up, a day of them a replica (20 MB each at vLLM's buckets), with every
        rate unknown meanwhile, and a step an hour ahead published a 720th of each
        rate for a window (issue 27, hostile pass 8, XU-1).
        """
        horizon = history_horizon(config.stable_window, config.interval)
        known = set(state.targets)
        # A replica discovery no longer lists keeps its history for the horizon (at most
        # as many as are listed): listed again (readiness flapping), its rates go on. Its
        # history dropped, each one flapping answered without a window, its load left
        # out: 76,000 of 152,000 tokens a second read, the signal whole (hostile pass 68).
        # Nothing listed at once after replicas were (every pod unready under load, an
        # empty answer) is no fact of 0 replicas until the horizon has passed: read so, a
        # fleet running 640 requests went to zero, and one empty answer dropped every
        # history, the next rates unknown (hostile pass 69).
        recent = [
            t
            for t, h in state.histories.items()
            if t not in known and h.times and steady - h.times[-1] <= horizon
        ]
        vanished = not known and bool(recent)
        kept = known | set(recent[-len(known) :] if known else recent)
        for gone in [t for t in state.histories if t not in kept]:
            del state.histories[gone]
        for gone in [t for t in state.status if t not in known]:
            del state.status[gone]
        latest, answered = [], []
        for result in results:
            status = state.status.setdefault(result.target, TargetStatus())
            status.scrape_seconds = result.seconds
            if result.stats is None:
                assert result.error is not None
                if status.last_reason != result.error:  # once per change of reason
                    log.warning(
                        "scrape %s failed (%s): %s",
                        shown(result.target),
                        result.error,
                        result.detail,
                        exc_info=result.exception,
                    )
                status.up, status.last_error = False, result.detail
                status.last_reason = result.error
                status.errors[result.error] += 1
                continue
            if status.last_reason:
                log.info("scrape %s works again", shown(result.target))
            status.up, status.last_error, status.last_reason = True, "", ""
            rejected = result.stats.rejected
            for why in rejected.values():
                status.rejected[why] += 1
            if rejected != status.last_rejected:
                if rejected:
                    log.warning(
                        "scrape %s: no measurement of %s",
                        shown(result.target),
                        ", ".join(f"{concept} ({why})" for concept, why in rejected.items()),
                    )
                status.last_rejected = dict(rejected)
            state.histories.setdefault(result.target, ReplicaHistory(horizon)).add(
                steady, result.stats
            )
            latest.append(result.stats)
            answered.append(result.target)
            state.engine = result.stats.engine
        self._label_model(state, [stats.model for stats in latest if stats.model], steady)
        if not state.discovered or vanished:
            state.signals = None  # "0 replicas" before any list answered is no fact
            return
        state.signals = derive(
            now,
            len(state.targets),
            latest,
            # Only replicas that answered now: a silent one's last minute is history, not
            # load now (it keeps its history for when it answers again; the signals are
            # partial meanwhile, and the scaler never lowers the count on partial data).
            [state.histories[t] for t in answered],
            config.panic_window,
            config.stable_window,
            state.config.accelerator.accelerator(),
            at=steady,
        )
