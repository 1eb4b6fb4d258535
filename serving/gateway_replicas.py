"""The replicas the gateway routes to: which are named, which are healthy, which drain.

Replicas are the union of the static URLs (flags, config), the A records of a DNS name
(``foundation.dns``; the last answer is kept while a lookup fails) and the ready endpoints
of a Service's EndpointSlices (``foundation.discovery``). Each is checked on ``/health``
(and, once healthy, asked its ``/v1/models``, again every ``MODELS_EVERY_ROUNDS``: adapters
come and go at runtime) every ``health_interval``, or at once when a reload asks. The
models replicas have listed are remembered, so that at zero replicas the gateway still
knows which models exist.

A replica no longer named but with requests still in flight is draining: it gets no new
request, whatever its health, and is dropped when its last one ends.

A healthy replica is also asked ``GET /is_sleeping`` (vLLM's sleep mode) each round: one
that sleeps gets no request until it is woken (``serving.gateway`` wakes it on demand),
since vLLM queues a sleeper's requests unserved. A 404 means it has no sleep mode (vLLM
without ``VLLM_SERVER_DEV_MODE=1``), asked again only after it was down; an answer that
cannot be read keeps what was known.

Each replica's round is isolated: whatever one replica answers (a list for its models,
JSON nested 100,000 deep, a body of gigabytes: ``serving.replica_answers`` reads every
answer) or whatever is raised while checking it, only that replica's round fails. It is
counted by reason (``on_probe_failure``), logged once as a WARNING naming the replica
when the failure starts or changes, and the replica is checked again next round like any
other; it recovers when it answers well again. A round that fails as a whole (discovery,
the report) is counted too, and the loop goes on.

Nothing slow holds the others: each replica is checked in its own task (a round waits at
most ``health_interval`` for them, and a replica still being checked is skipped, not
waited for), and the DNS lookup runs beside the checks under ``DNS_TIMEOUT`` (a lookup
that hangs keeps the last answer, as one that fails does).

A wake the replica answered ``awake`` holds only once its ``/is_sleeping`` agrees: one
that still says asleep on the first read after the wake, or falls asleep again within
``wake_retry_after`` of it, relapsed (``on_wake_relapse``), and its next wake backs off as
after a failed one. A sleep answered 200 holds only once ``/is_sleeping`` says asleep and
it stays asleep for ``wake_retry_after`` (unless the gateway wakes it): one awake before
relapsed (``on_sleep_relapse``) and is slept again only after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from foundation.discovery import EndpointSliceWatch
from foundation.dns import resolve_addresses
from serving.config import MAX_REPLICAS
from serving.gateway_settings import GatewaySettings
from serving.replica_answers import (
    MAX_ANSWER_BYTES,
    REASONS,
    AnswerError,
    ModelList,
    read_is_sleeping,
    read_model_list,
)
from serving.routing import FAILURE_SECONDS, MAX_FAILURES, Backoff, ReplicaView

# The gateway's logger: its replica lines keep the name operators filter them by.
log = logging.getLogger("serving.gateway")

EJECT_WINDOW = 10
"""A replica's last answers its fast failures are counted over (``serving.gateway``)."""
ANSWERED, REFUSED, FAILED = 0, 1, 2
"""What one answer was, in a replica's windows (``Replica.recent``): an answer, the
client's request refused (a 4xx), or a fast failure of the replica's."""
MAX_SERVED_MODELS = 4096
"""Models the gateway remembers once their replicas are gone (two replicas' worth of
``replica_answers.MAX_MODELS``): bounded, whatever replicas list over time."""

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2)
"""A probe's whole time. Its redirects are never followed (``allow_redirects=False``): a
replica answering ``/v1/models`` with a 302 to another host had that host fetched and its
list taken as the replica's; a redirect is the status it is (not 200: the probe failed)."""
MODELS_EVERY_ROUNDS = 30
"""A healthy replica's /v1/models is asked again every this many rounds (30 s at the
default interval): vLLM loads and unloads LoRA adapters at runtime."""
DNS_TIMEOUT = 2.0
"""Seconds a DNS lookup of the replicas may take; past it the last answer is kept."""
DOWN_REASONS = ("connect", "timeout", "http-status")
"""Why a replica's probe failed when it is down or refusing: logged as "not ready"."""
PROBE_REASONS = (*DOWN_REASONS, *REASONS, "internal")
"""The ``reason`` of a failed probe: down, an answer ``serving.replica_answers`` refused,
or ``internal`` (an exception nobody expected, met checking that replica)."""


class _ModelsRefusedError(Exception):
    """A replica's /v1/models answered a status other than 200."""


@dataclass(frozen=True, slots=True)
class ProbeFailure:
    """Why one replica's round failed."""

    reason: str
    """One of ``PROBE_REASONS``."""
    message: str


async def read_answer(response: aiohttp.ClientResponse, what: str) -> bytes:
    """A replica's answer body, read no further than ``MAX_ANSWER_BYTES``.

    Raises:
        AnswerError: ``too-large`` as soon as it is known to be longer.
    """
    limit = MAX_ANSWER_BYTES
    if response.content_length is not None and response.content_length > limit:
        declared = response.content_length
        raise AnswerError("too-large", f"{what}: Content-Length {declared:,} is over {limit:,}")
    chunks, size = [], 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise AnswerError("too-large", f"{what}: over {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass(slots=True)
class Replica:
    """A replica as the gateway tracks it."""

    url: str
    ready: bool = False
    """Its /health answers 200."""
    outstanding: int = 0
    models: frozenset[str] = frozenset()
    max_model_len: int | None = None
    """The longest context its models take, as its /v1/models lists it (None: unlisted)."""
    draining: bool = False
    """No longer named but with requests in flight: no new ones, dropped when they end."""
    sleeping: bool = False
    """Its /is_sleeping said true (vLLM sleep mode at any level) and no wake since."""
    sleep_mode: bool = True
    """False once its /is_sleeping answered 404: not asked again until it was down."""
    waking: bool = False
    """A wake of it is under way (``serving.gateway``)."""
    wake_started: float = -math.inf
    """``time.monotonic`` when its wake under way began."""
    wake_backoff: Backoff = field(default_factory=Backoff)
    """When it may be woken again after failed wakes (``time.monotonic``)."""
    sleep_backoff: Backoff = field(default_factory=Backoff)
    """When it may be put to sleep again after failed sleeps (``time.monotonic``)."""
    problem: str | None = None
    """The reason its last round failed (``PROBE_REASONS``); None: it answered well."""
    falling_asleep: bool = False
    """A ``POST /sleep`` of it (the standby plan's) is under way: routed nothing."""
    idle_since: float = -math.inf
    """``time.monotonic`` of its last request's end, its turning ready or its wake."""
    sleep_changes: int = 0
    """Sleeps and wakes the gateway made of it: a /is_sleeping read across one is stale."""
    wake_unconfirmed: bool = False
    """It answered a wake ``awake`` and no /is_sleeping read has confirmed it since."""
    failing: set[str] = field(default_factory=set)
    """Kinds of upstream failure logged at WARNING since it last answered a request whole:
    each once, then at DEBUG (``serving.gateway``; the counters carry the rate)."""
    surplus: bool = False
    """Woken under pressure beyond the scaler's running count: routed to only above the
    pressure threshold, until it sleeps again or the plan's running count takes it."""
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=EJECT_WINDOW))
    """Its last answers (``ANSWERED``, ``REFUSED``, ``FAILED``; ``serving.gateway`` ejects
    it at a few failures, or at most answers refused): changed in place, as it never
    changes its routing view."""
    fresh: deque[int] = field(default_factory=lambda: deque(maxlen=EJECT_WINDOW))
    """Its answers since it was last ejected, as ``recent``: its own ejection counts these
    (its peers read ``recent`` whole), so that the failures one ejection was for do not
    eject it again at its next failure once the ejection is over."""
    failed_at: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_FAILURES))
    """``time.monotonic`` of its last quick failures and refusals: those of the last
    ``FAILURE_SECONDS`` weigh in routing (``failed``)."""
    eject_backoff: Backoff = field(default_factory=Backoff)
    """Until when it is ejected: routed to only when no other replica serves the model."""
    wake_probation: float = -math.inf
    """``time.monotonic`` until which a confirmed wake is on probation: asleep again
    before it, the wake relapsed; past it (awake), its wake backoff is reset."""
    sleep_unconfirmed: bool = False
    """It answered a sleep 200 and no /is_sleeping read has confirmed it since."""
    sleep_probation: float = -math.inf
    """``time.monotonic`` until which a confirmed sleep is on probation: awake again before
    it (the gateway did not wake it), the sleep relapsed; past it, its backoff is reset."""
    models_rounds: int = 0
    """Healthy rounds since its /v1/models was last read (asked again every
    ``MODELS_EVERY_ROUNDS``)."""
    view: tuple[ReplicaView, float, float] | None = field(default=None, repr=False, compare=False)
    """Its routing view (``ReplicaPool.routing_views``) and the span of ``time.monotonic``
    it holds for; None once any other field is set."""

    def __setattr__(self, name: str, value: object) -> None:
        # Any change of what its view shows drops the view kept (``routing_views``).
        object.__setattr__(self, name, value)
        if name != "view":
            object.__setattr__(self, "view", None)

    def failed(self, now: float) -> None:
        """A quick failure or refusal at ``now``: it weighs as a request outstanding."""
        self.failed_at.append(now)
        self.view = None

    @property
    def routable(self) -> bool:
        """Whether new requests may go here."""
        return (
            self.ready
            and not self.draining
            and not self.sleeping
            and not self.waking
            and not self.falling_asleep
        )

    @property
    def wakeable(self) -> bool:
        """Healthy, listed and asleep."""
        return self.ready and not self.draining and self.sleeping


def _next_change(replica: Replica, now: float, patience: float) -> float:
    """When its view changes with time alone (after ``now``).

    The first of its backoffs to end, or its wake under way turning overdue.
    """
    ends = (
        replica.wake_backoff.until,
        replica.sleep_backoff.until,
        replica.eject_backoff.until,
        replica.wake_started + patience if replica.waking else -math.inf,
        *(t + FAILURE_SECONDS for t in replica.failed_at),
    )
    return min((end for end in ends if end > now), default=math.inf)


WAKE_PATIENCE = 10.0
"""Seconds a wake under way stands for a replica on its way before another sleeper is
woken beside it: 2.5x a level-1 wake (~4 s, the sleep the gateway puts replicas in), or
twice the median of the last ``RECENT_WAKES`` wakes that succeeded when longer; at most
half of ``wake-timeout``."""
RECENT_WAKES = 8
"""Successful wakes the patience is taken from: their median, so that one slow wake (or
one that hung until just before the timeout) does not set it for good."""


class ReplicaPool:
    """The gateway's replicas, their discovery and their health checks."""

    def __init__(self, replicas: list[str], settings: GatewaySettings) -> None:
        self.settings = settings
        self.replicas = [Replica(url.rstrip("/")) for url in replicas]
        self._static = {r.url for r in self.replicas}
        self._dns_named: set[str] = set()
        """Replicas of the last DNS answer (kept while a lookup fails)."""
        self._dns_for: str | None = None
        """The name ``_dns_named`` answers for: a reload naming another is not answered by it."""
        self._recheck = asyncio.Event()
        """Set to run discovery and health checks now instead of at the next interval."""
        self.endpoint_watch: EndpointSliceWatch | None = None
        """Set by the server when replicas come from a Service's EndpointSlices."""
        self.ready = asyncio.Condition()
        """Notified whenever a replica turns ready, and after a round that finds any routable."""
        self.served: set[str] = set()
        """Every model a replica has listed since the gateway started (kept at zero), at
        most ``MAX_SERVED_MODELS``."""
        self.served_full = False
        """Whether a listed model was not remembered for lack of room: ``served`` no
        longer tells a model no replica serves (at zero, requests are then buffered)."""
        self.on_probe_failure: Callable[[str], None] = lambda reason: None
        """Hears the reason of every replica's failed round (the gateway counts it)."""
        self.on_round_failure: Callable[[], None] = lambda: None
        """Hears every round that failed as a whole (the gateway counts it)."""
        self.on_wake_relapse: Callable[[], None] = lambda: None
        """Hears every wake that did not hold (the gateway counts it)."""
        self.on_sleep_relapse: Callable[[], None] = lambda: None
        """Hears every sleep answered 200 that did not hold (the gateway counts it)."""
        self.recent_wakes: deque[float] = deque(maxlen=RECENT_WAKES)
        """Seconds the last successful wakes took (``wake_patience``)."""
        self.on_routable: Callable[[], None] = lambda: None
        """Called when a replica may have turned routable: buffered requests are handed
        one (``serving.gateway``'s dispatch)."""
        self._checks: dict[str, asyncio.Task[None]] = {}
        """Each replica's check under way, by URL: one at a time per replica."""
        self._dns_failing = False
        self._named_over = False
        """More replicas are named than ``MAX_REPLICAS`` (warned of once until it ends)."""

    def reconfigure(self, replicas: list[str], settings: GatewaySettings) -> None:
        """New static replicas and settings.

        Replicas no longer named start draining now; discovery and health checks run at
        once, so new ones are checked (and take traffic) without waiting for the interval.
        """
        self.settings = settings
        self._static = {url.rstrip("/") for url in replicas}
        self.apply_named(self._named())
        self._recheck.set()

    @property
    def wake_patience(self) -> float:
        """Seconds a wake under way holds other sleepers back (``WAKE_PATIENCE``)."""
        typical = statistics.median(self.recent_wakes) if self.recent_wakes else 0.0
        return min(self.settings.wake_timeout / 2, max(WAKE_PATIENCE, 2 * typical))

    def woke(self, seconds: float) -> None:
        """A wake succeeded in ``seconds``: the patience follows the recent ones."""
        if math.isfinite(seconds) and seconds >= 0:
            self.recent_wakes.append(seconds)
            for replica in self.replicas:  # a waking one's view turns overdue at another time
                if replica.waking:
                    replica.view = None

    def views(self, now: float | None = None) -> list[ReplicaView]:
        """What the router sees of each replica (``now``: ``time.monotonic``)."""
        now = time.monotonic() if now is None else now
        return [self._view(r, now, self.wake_patience) for r in self.replicas]

    def routing_views(self, now: float | None = None) -> list[ReplicaView]:
        """``views``, each replica's kept while nothing of it changed: a request's read.

        Every request reads every replica's view (1,024 at the cap), and building them
        was most of ~4 ms of routing a request there. A view is built again once a field
        of its replica is set (``Replica.__setattr__``) or a backoff of it ends; its
        ``idle_seconds`` is as of when it was built (``choose_standby`` reads ``views``).
        """
        now = time.monotonic() if now is None else now
        patience = self.wake_patience
        out = []
        for r in self.replicas:
            kept = r.view
            if kept is None or not kept[1] <= now < kept[2]:
                kept = (self._view(r, now, patience), now, _next_change(r, now, patience))
                r.view = kept
            out.append(kept[0])
        return out

    @staticmethod
    def _view(r: Replica, now: float, patience: float) -> ReplicaView:
        # A draining or sleeping replica is not ready as far as routing goes, however healthy.
        return ReplicaView(
            r.url,
            r.routable,
            r.outstanding,
            r.models,
            sleeping=r.wakeable,
            waking=r.waking,
            wake_overdue=r.waking and now >= r.wake_started + patience,
            wake_failed=not r.wake_backoff.allows(now),
            wake_failures=r.wake_backoff.failures,
            falling_asleep=r.falling_asleep and r.ready and not r.draining,
            idle_seconds=0.0 if r.outstanding else max(now - r.idle_since, 0.0),
            sleep_mode=r.sleep_mode,
            sleep_failed=not r.sleep_backoff.allows(now),
            surplus=r.surplus,
            failures=sum(t > now - FAILURE_SECONDS for t in r.failed_at),
            ejected=not r.eject_backoff.allows(now),
        )

    def find(self, url: str) -> Replica:
        """The replica the router chose."""
        return next(r for r in self.replicas if r.url == url)

    def mark_down(self, replica: Replica) -> None:
        """A connection failed: stop routing there until /health says otherwise."""
        replica.ready = False

    def _named(self) -> set[str]:
        """Replicas = static URLs + DNS A records (last answer) + ready EndpointSlice endpoints.

        At most ``MAX_REPLICAS``, as the static list: each is checked every interval in a
        task of its own, and every request's routing reads each (a DNS name answering
        5,000 addresses cost 50 ms of event loop a request). Past it the static ones are
        kept, then those tracked already, then the first by name; one WARNING while over.
        """
        named = set(self._static)
        if self.endpoint_watch is not None and self.endpoint_watch.targets is not None:
            named |= {url.rstrip("/") for url in self.endpoint_watch.targets}
        if self.settings.dns is not None and self._dns_for == self.settings.dns:
            # Only the name's own answer: a reload from one Service to another that did
            # not resolve kept routing to the old one's pods for good, as its replicas.
            named |= self._dns_named
        if len(named) <= MAX_REPLICAS:
            self._named_over = False
            return named
        tracked = [r.url for r in self.replicas if r.url in named]
        ordered = [*sorted(self._static), *tracked, *sorted(named)]
        kept = set(list(dict.fromkeys(ordered))[:MAX_REPLICAS])
        if not self._named_over:
            log.warning(
                "%d replicas are named (DNS, EndpointSlices, config); routing to %d of them,"
                " at most %d are tracked",
                len(named), len(kept), MAX_REPLICAS,
            )  # fmt: skip
        self._named_over = True
        return kept

    async def _discover(self) -> None:
        """Resolve the DNS name, if any, and apply the replicas named now.

        A failed DNS lookup (no answer, an error, a name no resolver can encode) keeps the
        replicas it named before: the lookup's failure, never the round's.
        """
        dns = self.settings.dns
        if dns is not None:
            try:
                async with asyncio.timeout(DNS_TIMEOUT):
                    addresses, port = await resolve_addresses(dns)
                self._dns_named = {f"http://{address}:{port}" for address in addresses}
                self._dns_for, self._dns_failing = dns, False
            except (OSError, TimeoutError, ValueError) as err:
                # ValueError: a name the resolver cannot encode (a label empty or over 63
                # characters: UnicodeError), raised by every lookup. It failed every health
                # round as a whole: no round's report, gauges or wake retries, for good.
                problem = str(err)[:200] or f"no answer within {DNS_TIMEOUT:g}s"
                if not self._dns_failing:  # once until it resolves again
                    kept = (
                        "keeping its replicas" if self._dns_for == dns else "no replica from it yet"
                    )
                    log.warning("cannot resolve %s (%s); %s", dns, problem, kept)
                self._dns_failing = True
        self.apply_named(self._named())

    def apply_named(self, named: set[str]) -> None:
        """New replicas are added; one no longer named drains, or goes if it is idle."""
        kept: list[Replica] = []
        for replica in self.replicas:
            if replica.url in named:
                if replica.draining:
                    log.info("replica %s is listed again", replica.url)
                    replica.draining = False
                kept.append(replica)
            elif replica.outstanding:
                if not replica.draining:
                    log.info(
                        "replica %s is no longer listed: draining %d requests",
                        replica.url,
                        replica.outstanding,
                    )
                    replica.draining = True
                kept.append(replica)
        known = {r.url for r in kept}
        self.replicas = kept + [Replica(url) for url in sorted(named - known)]

    def drop_if_drained(self, replica: Replica) -> None:
        """A request on ``replica`` ended: a draining replica with none left goes."""
        if replica.draining and not replica.outstanding:
            log.info("replica %s drained", replica.url)
            self.replicas = [r for r in self.replicas if r is not replica]

    async def check_forever(
        self, session: aiohttp.ClientSession, report: Callable[[int, int], None]
    ) -> None:
        """Discover and check every replica each interval (or at once on a reload).

        ``report`` hears the replicas routable and those asleep after each round. Nothing
        a replica answers and no exception ends the loop: a replica's failure is its own
        round's (``_check``), and a round failing as a whole is counted and tried again.
        """
        failing: str | None = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._recheck.clear()
                began = loop.time()
                try:
                    await self.check_round(session, report)
                    failing = None
                except Exception as err:  # discovery or the report: the next round tries again
                    self.on_round_failure()
                    if type(err).__name__ != failing:  # once per kind, not every second
                        log.warning("a health round failed; trying again", exc_info=True)
                    failing = type(err).__name__
                # Rounds begin an interval apart, however long one took: a replica whose
                # /health hangs held each round its whole interval, and every other
                # replica was checked every other interval (hostile pass 62).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(began + self.settings.health_interval):
                        await self._recheck.wait()
        finally:
            checks = list(self._checks.values())
            for task in checks:
                task.cancel()
            await asyncio.gather(*checks, return_exceptions=True)

    async def check_round(
        self, session: aiohttp.ClientSession, report: Callable[[int, int], None]
    ) -> None:
        """One round: check every replica at once, discover beside them, report, wake.

        Checks start before the DNS lookup (a lookup that hangs delays no static replica);
        replicas it names anew are checked as soon as it answers. The round waits at most
        ``health_interval`` for its checks: a replica slower than that is left to finish
        in its task and is skipped by the next round until it has.
        """
        self._start_checks(session)
        await self._discover()
        started = self._start_checks(session)
        if started:
            await asyncio.wait(started, timeout=self.settings.health_interval)
        routable = sum(r.routable for r in self.replicas)
        asleep = sum(r.wakeable for r in self.replicas)
        report(routable, asleep)
        if routable or asleep:
            # Buffered requests look again: a replica may have been listed again, or
            # one found asleep may be woken for them.
            self.on_routable()
            async with self.ready:
                self.ready.notify_all()

    def _start_checks(self, session: aiohttp.ClientSession) -> list[asyncio.Task[None]]:
        """A check task for each replica not being checked; every check under way."""
        for replica in self.replicas:
            task = self._checks.get(replica.url)
            if task is None or task.done():
                self._checks[replica.url] = asyncio.create_task(self._check(session, replica))
        named = {r.url for r in self.replicas}
        for url in [url for url, task in self._checks.items() if task.done()]:
            if url not in named:
                del self._checks[url]  # bounded by the replicas named
        return [self._checks[r.url] for r in self.replicas]

    async def _check(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        """One replica's round: whatever it answers or raises fails only this round."""
        try:
            await self._round(session, replica)
        except Exception as err:  # a bug met on one replica must not stop the others' checks
            self._note(replica, ProbeFailure("internal", f"{type(err).__name__}: {err}"))
            if replica.ready:
                log.info("replica %s is not ready", replica.url)
            # As a replica found down: not routed, and asked everything afresh next round.
            replica.ready, replica.models = False, frozenset()
            replica.sleep_mode, replica.sleeping = True, False

    async def _round(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        healthy, failure = await self._probe(session, replica)
        if healthy and replica.sleep_mode and not replica.waking and not replica.falling_asleep:
            failure = await self._check_sleep(session, replica) or failure
        self._note(replica, failure)
        if healthy != replica.ready:
            log.info("replica %s is %s", replica.url, "ready" if healthy else "not ready")
            replica.ready = healthy
            if not healthy:
                replica.models = frozenset()
                replica.sleep_mode, replica.sleeping = True, False  # ask again once it is back
            if healthy:
                replica.idle_since = time.monotonic()
                self.on_routable()
                async with self.ready:
                    self.ready.notify_all()

    def _remember(self, replica: Replica) -> None:
        """Add ``replica``'s models to ``served``, never past ``MAX_SERVED_MODELS``.

        Names are kept while their replicas are gone (a model at zero is buffered, not a
        404), so a replica that lists new names each time it comes back would grow the set
        without end; past the bound new names are still routed while a replica lists
        them, only not remembered at zero, and ``served_full`` says so.
        """
        new = replica.models - self.served
        room = MAX_SERVED_MODELS - len(self.served)
        if len(new) > room:
            if room >= 0 and not self.served_full:
                log.warning(
                    "replica %s lists %d models not seen before; remembering %d: at most"
                    " %d models are kept for routing at zero replicas",
                    replica.url, len(new), max(room, 0), MAX_SERVED_MODELS,
                )  # fmt: skip
            self.served_full = True
            new = frozenset(sorted(new)[: max(room, 0)])
        self.served |= new

    async def _probe(
        self, session: aiohttp.ClientSession, replica: Replica
    ) -> tuple[bool, ProbeFailure | None]:
        """Its /health, and its /v1/models (until listed, then every ``MODELS_EVERY_ROUNDS``).

        Healthy, or why not; a failed re-list is healthy with the list kept, and its failure.
        """
        try:
            async with session.get(
                replica.url + "/health", timeout=PROBE_TIMEOUT, allow_redirects=False
            ) as r:
                if r.status != 200:
                    return False, ProbeFailure("http-status", f"/health answered HTTP {r.status}")
            if not replica.models:
                listed = await self._list_models(session, replica)
                replica.models, replica.max_model_len = listed.models, listed.max_model_len
                replica.models_rounds = 0
                self._remember(replica)
            elif replica.models_rounds >= MODELS_EVERY_ROUNDS:
                return True, await self._relist(session, replica)
            else:
                replica.models_rounds += 1
        except _ModelsRefusedError as err:
            return False, ProbeFailure("http-status", str(err))
        except AnswerError as err:
            return False, ProbeFailure(err.reason, str(err))
        except TimeoutError:
            return False, ProbeFailure("timeout", "no answer within 2s")
        except aiohttp.ClientError as err:
            return False, ProbeFailure("connect", f"{type(err).__name__}: {err}")
        return True, None

    async def _list_models(self, session: aiohttp.ClientSession, replica: Replica) -> ModelList:
        """Its /v1/models, read at ``read_model_list``'s boundary.

        Raises:
            _ModelsRefusedError: a status other than 200. AnswerError, TimeoutError,
            aiohttp.ClientError: as the replica's other answers.
        """
        async with session.get(
            replica.url + "/v1/models", timeout=PROBE_TIMEOUT, allow_redirects=False
        ) as r:
            if r.status != 200:
                raise _ModelsRefusedError(f"/v1/models answered HTTP {r.status}")
            return read_model_list(await read_answer(r, "/v1/models"))

    async def _relist(
        self, session: aiohttp.ClientSession, replica: Replica
    ) -> ProbeFailure | None:
        """Its /v1/models again: adapters may have been loaded or unloaded since.

        A bad answer keeps the list it had, and is counted as that round's failure.
        """
        replica.models_rounds = 0
        try:
            listed = await self._list_models(session, replica)
        except _ModelsRefusedError as err:
            return ProbeFailure("http-status", str(err))
        except AnswerError as err:
            return ProbeFailure(err.reason, str(err))
        except TimeoutError:
            return ProbeFailure("timeout", "/v1/models: no answer within 2s")
        except aiohttp.ClientError as err:
            return ProbeFailure("connect", f"/v1/models: {type(err).__name__}: {err}")
        replica.max_model_len = listed.max_model_len
        if listed.models != replica.models:
            log.info("replica %s now lists %d models", replica.url, len(listed.models))
            replica.models = listed.models
            self._remember(replica)
        return None

    def _note(self, replica: Replica, failure: ProbeFailure | None) -> None:
        """Count a failed round; log a WARNING when a replica starts answering badly."""
        if failure is None:
            if replica.problem is not None and replica.problem not in DOWN_REASONS:
                log.info("replica %s answers well again", replica.url)
            replica.problem = None
            return
        self.on_probe_failure(failure.reason)
        if failure.reason != replica.problem and failure.reason not in DOWN_REASONS:
            # Down or refusing is "not ready" (INFO); a bad answer or a bug is worth a look.
            log.warning(
                "replica %s: its round failed (%s: %s); checked again next round",
                replica.url,
                failure.reason,
                failure.message,
            )
        replica.problem = failure.reason

    def _judge_wake(self, replica: Replica, sleeping: bool, now: float) -> None:
        """A /is_sleeping read after a wake: it holds, or it relapsed.

        The first read must say awake; then the wake is on probation for
        ``wake_retry_after``: asleep again within it (the gateway did not sleep it, or the
        read would be stale) is a relapse too. Only a wake that held through its
        probation resets the backoff: a replica that said awake twice and then fell
        asleep was woken every other round, forever.
        """
        if replica.wake_unconfirmed:
            replica.wake_unconfirmed = False
            if sleeping:
                self._wake_relapsed(replica, now, "answered its wake awake but says it is asleep")
            else:
                replica.wake_probation = now + self.settings.wake_retry_after
            return
        if replica.wake_probation == -math.inf:
            return
        if sleeping and not replica.sleeping and now < replica.wake_probation:
            self._wake_relapsed(replica, now, "fell asleep again soon after its wake")
        elif not sleeping and now >= replica.wake_probation:
            replica.wake_backoff, replica.wake_probation = Backoff(), -math.inf

    def _wake_relapsed(self, replica: Replica, now: float, what: str) -> None:
        replica.wake_probation = -math.inf
        replica.wake_backoff = replica.wake_backoff.failed(now, self.settings.wake_retry_after)
        self.on_wake_relapse()
        log.warning(
            "replica %s %s; not woken again for %gs",
            replica.url,
            what,
            replica.wake_backoff.until - now,
        )

    def _judge_sleep(self, replica: Replica, sleeping: bool, now: float) -> None:
        """A /is_sleeping read after a sleep answered 200: it holds, or it relapsed.

        The first read must say asleep; then the sleep is on probation for
        ``wake_retry_after``: awake again within it, while the gateway holds it asleep (it
        did not wake it), is a relapse too. Each relapse is counted and backed off from
        (doubled per relapse in a row); only a sleep that held through its probation, or
        until the gateway woke it, resets the backoff: one that said asleep once and then
        awake was slept every standby round, forever.
        """
        if replica.sleep_unconfirmed:
            replica.sleep_unconfirmed = False
            if sleeping:
                replica.sleep_probation = now + self.settings.wake_retry_after
            else:
                self._sleep_relapsed(replica, now, "answered its sleep but says it is awake")
            return
        if replica.sleep_probation == -math.inf:
            return
        if not sleeping and replica.sleeping and now < replica.sleep_probation:
            self._sleep_relapsed(replica, now, "woke again soon after its sleep")
        elif now >= replica.sleep_probation or not replica.sleeping:
            replica.sleep_backoff, replica.sleep_probation = Backoff(), -math.inf

    def _sleep_relapsed(self, replica: Replica, now: float, what: str) -> None:
        replica.sleep_probation = -math.inf
        retry = self.settings.wake_retry_after
        replica.sleep_backoff = replica.sleep_backoff.failed(now, retry)
        self.on_sleep_relapse()
        log.warning(
            "replica %s %s; not slept again for %gs",
            replica.url,
            what,
            replica.sleep_backoff.until - now,
        )

    async def _check_sleep(
        self, session: aiohttp.ClientSession, replica: Replica
    ) -> ProbeFailure | None:
        """Its /is_sleeping: asleep, awake, no sleep mode (404), or unreadable (kept)."""
        changes = replica.sleep_changes
        try:
            async with session.get(
                replica.url + "/is_sleeping", timeout=PROBE_TIMEOUT, allow_redirects=False
            ) as r:
                if r.status == 404:
                    replica.sleep_mode, sleeping = False, False
                elif r.status != 200:
                    return ProbeFailure("http-status", f"/is_sleeping answered HTTP {r.status}")
                else:
                    sleeping = read_is_sleeping(await read_answer(r, "/is_sleeping"))
        except AnswerError as err:
            return ProbeFailure(err.reason, str(err))
        except TimeoutError:
            return ProbeFailure("timeout", "/is_sleeping: no answer within 2s")
        except aiohttp.ClientError as err:
            return ProbeFailure("connect", f"/is_sleeping: {type(err).__name__}: {err}")
        if changes != replica.sleep_changes or replica.falling_asleep or replica.waking:
            return None  # the gateway slept or woke it meanwhile: what it knows is newer
        now = time.monotonic()
        self._judge_wake(replica, sleeping, now)
        self._judge_sleep(replica, sleeping, now)
        if sleeping != replica.sleeping:
            log.info("replica %s is %s", replica.url, "asleep" if sleeping else "awake")
            replica.sleeping = sleeping
        return None
