"""The replicas the gateway routes to: which are named, which are healthy, which drain.

Replicas are the union of the static URLs (flags, config), the A records of a DNS name
(``foundation.dns``; the last answer is kept while a lookup fails) and the ready endpoints
of a Service's EndpointSlices (``foundation.discovery``). Each is checked on ``/health``
(and, once healthy, asked its ``/v1/models``) every ``health_interval``, or at once when a
reload asks. The models replicas have listed are remembered, so that at zero replicas the
gateway still knows which models exist.

A replica no longer named but with requests still in flight is draining: it gets no new
request, whatever its health, and is dropped when its last one ends.

A healthy replica is also asked ``GET /is_sleeping`` (vLLM's sleep mode) each round: one
that sleeps gets no request until it is woken (``serving.gateway`` wakes it on demand),
since vLLM queues a sleeper's requests unserved. A 404 means it has no sleep mode (vLLM
without ``VLLM_SERVER_DEV_MODE=1``), asked again only after it was down; an answer that
cannot be read keeps what was known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from foundation.discovery import EndpointSliceWatch
from foundation.dns import resolve_addresses
from serving.gateway_settings import GatewaySettings
from serving.routing import ReplicaView

# The gateway's logger: its replica lines keep the name operators filter them by.
log = logging.getLogger("serving.gateway")


@dataclass(slots=True)
class Replica:
    """A replica as the gateway tracks it."""

    url: str
    ready: bool = False
    """Its /health answers 200."""
    outstanding: int = 0
    models: frozenset[str] = frozenset()
    draining: bool = False
    """No longer named but with requests in flight: no new ones, dropped when they end."""
    sleeping: bool = False
    """Its /is_sleeping said true (vLLM sleep mode at any level) and no wake since."""
    sleep_mode: bool = True
    """False once its /is_sleeping answered 404: not asked again until it was down."""
    waking: bool = False
    """A wake of it is under way (``serving.gateway``)."""
    wake_failed_at: float | None = None
    """``time.monotonic`` of its last failed wake."""
    falling_asleep: bool = False
    """A ``POST /sleep`` of it (the standby plan's) is under way: routed nothing."""
    idle_since: float = -math.inf
    """``time.monotonic`` of its last request's end, its turning ready or its wake."""
    sleep_changes: int = 0
    """Sleeps and wakes the gateway made of it: a /is_sleeping read across one is stale."""

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


class ReplicaPool:
    """The gateway's replicas, their discovery and their health checks."""

    def __init__(self, replicas: list[str], settings: GatewaySettings) -> None:
        self.settings = settings
        self.replicas = [Replica(url.rstrip("/")) for url in replicas]
        self._static = {r.url for r in self.replicas}
        self._dns_named: set[str] = set()
        """Replicas of the last DNS answer (kept while a lookup fails)."""
        self._recheck = asyncio.Event()
        """Set to run discovery and health checks now instead of at the next interval."""
        self.endpoint_watch: EndpointSliceWatch | None = None
        """Set by the server when replicas come from a Service's EndpointSlices."""
        self.ready = asyncio.Condition()
        """Notified whenever a replica turns ready, and after a round that finds any routable."""
        self.served: set[str] = set()
        """Every model a replica has listed since the gateway started (kept at zero)."""

    def reconfigure(self, replicas: list[str], settings: GatewaySettings) -> None:
        """New static replicas and settings.

        Replicas no longer named start draining now; discovery and health checks run at
        once, so new ones are checked (and take traffic) without waiting for the interval.
        """
        self.settings = settings
        self._static = {url.rstrip("/") for url in replicas}
        self.apply_named(self._named())
        self._recheck.set()

    def views(self, now: float | None = None) -> list[ReplicaView]:
        """What the router sees of each replica (``now``: ``time.monotonic``)."""
        # A draining or sleeping replica is not ready as far as routing goes, however healthy.
        now = time.monotonic() if now is None else now
        retry = self.settings.wake_retry_after
        return [
            ReplicaView(
                r.url,
                r.routable,
                r.outstanding,
                r.models,
                sleeping=r.wakeable,
                waking=r.waking,
                wake_failed=r.wake_failed_at is not None and now - r.wake_failed_at < retry,
                idle_seconds=0.0 if r.outstanding else max(now - r.idle_since, 0.0),
                sleep_mode=r.sleep_mode,
            )
            for r in self.replicas
        ]

    def find(self, url: str) -> Replica:
        """The replica the router chose."""
        return next(r for r in self.replicas if r.url == url)

    def mark_down(self, replica: Replica) -> None:
        """A connection failed: stop routing there until /health says otherwise."""
        replica.ready = False

    def _named(self) -> set[str]:
        """Replicas = static URLs + DNS A records (last answer) + ready EndpointSlice endpoints."""
        named = set(self._static)
        if self.endpoint_watch is not None and self.endpoint_watch.targets is not None:
            named |= {url.rstrip("/") for url in self.endpoint_watch.targets}
        if self.settings.dns is not None:
            named |= self._dns_named
        return named

    async def _discover(self) -> None:
        """Resolve the DNS name, if any, and apply the replicas named now.

        A failed DNS lookup keeps the replicas it named before.
        """
        if self.settings.dns is not None:
            try:
                addresses, port = await resolve_addresses(self.settings.dns)
                self._dns_named = {f"http://{address}:{port}" for address in addresses}
            except OSError as err:
                log.warning("cannot resolve %s (%s); keeping its replicas", self.settings.dns, err)
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

        ``report`` hears the replicas routable and those asleep after each round.
        """
        while True:
            self._recheck.clear()
            await self._discover()
            await asyncio.gather(*(self._check(session, r) for r in self.replicas))
            routable = sum(r.routable for r in self.replicas)
            asleep = sum(r.wakeable for r in self.replicas)
            report(routable, asleep)
            if routable or asleep:
                # Buffered requests look again: a replica may have been listed again, or
                # one found asleep may be woken for them.
                async with self.ready:
                    self.ready.notify_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.health_interval):
                    await self._recheck.wait()

    async def _check(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        try:
            async with session.get(
                replica.url + "/health", timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                healthy = r.status == 200
            if healthy and not replica.models:
                async with session.get(
                    replica.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=2)
                ) as r:
                    data = await r.json()
                replica.models = frozenset(str(m["id"]) for m in data.get("data", []))
                self.served |= replica.models
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            healthy = False
        if healthy and replica.sleep_mode and not replica.waking and not replica.falling_asleep:
            await self._check_sleep(session, replica)
        if healthy != replica.ready:
            log.info("replica %s is %s", replica.url, "ready" if healthy else "not ready")
            replica.ready = healthy
            if not healthy:
                replica.models = frozenset()
                replica.sleep_mode, replica.sleeping = True, False  # ask again once it is back
            if healthy:
                replica.idle_since = time.monotonic()
                async with self.ready:
                    self.ready.notify_all()

    async def _check_sleep(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        """Its /is_sleeping: asleep, awake, no sleep mode (404), or unreadable (kept)."""
        changes = replica.sleep_changes
        try:
            async with session.get(
                replica.url + "/is_sleeping", timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                if r.status == 404:
                    replica.sleep_mode, sleeping = False, False
                else:
                    r.raise_for_status()
                    answer = (await r.json()).get("is_sleeping")
                    if not isinstance(answer, bool):
                        raise ValueError(f"is_sleeping is {answer!r}")
                    sleeping = answer
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as err:
            log.debug("cannot read %s/is_sleeping (%s); keeping what was known", replica.url, err)
            return
        if changes != replica.sleep_changes or replica.falling_asleep or replica.waking:
            return  # the gateway slept or woke it meanwhile: what it knows is newer
        if sleeping != replica.sleeping:
            log.info("replica %s is %s", replica.url, "asleep" if sleeping else "awake")
            replica.sleeping = sleeping
