"""The inference gateway and activator in front of the replicas.

An aiohttp reverse proxy for the OpenAI-compatible API: requests go to the ready
replica serving their model with the fewest outstanding requests (``serving.routing``);
responses, streamed or not, pass through chunk by chunk. With no ready replica a
request waits in a bounded buffer (429 when full, 503 with ``Retry-After`` after the
timeout) and the scaler hears of it at once over ``unitscale.v1.SignalsService``, so
``StreamIsActive`` pushes KEDA to scale from zero without waiting for a poll.

Connection failures are retried on another replica; a request already sent upstream is
never retried (it may have run). A replica that fails mid-stream ends that client's
response; the gateway carries on.

A replica no longer named (config, DNS, EndpointSlices) but with requests still in flight
is draining: it gets no new request, whatever its health, and is dropped when its last one
ends. A reloaded config is acted on at once (discovery and health checks run then, not at
the next interval), so a newly listed ready replica takes traffic within milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import grpc
from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from foundation.discovery import EndpointSliceWatch
from foundation.dns import resolve_addresses
from protos.unitscale.v1 import signals_pb2 as pb
from protos.unitscale.v1 import signals_pb2_grpc as pb_grpc
from serving.routing import ReplicaView, choose, is_unserved, known_models, may_buffer

log = logging.getLogger(__name__)

PROXIED = ("/v1/completions", "/v1/chat/completions")
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


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

    @property
    def routable(self) -> bool:
        """Whether new requests may go here."""
        return self.ready and not self.draining


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Buffering and health-check settings; defaults documented in README."""

    namespace: str = "default"
    deployment: str = "default"
    buffer_size: int = 1000
    buffer_timeout: float = 120.0
    """Seconds a request may wait for a replica: above a cold start from local disk (~40 s)."""
    health_interval: float = 1.0
    connect_retries: int = 2
    signal_interval: float = 1.0
    rate_window: float = 10.0
    """Seconds over which the arrival and upstream-error rates are measured."""
    dns: str | None = None
    """``host:port`` of a headless Service: every A record is a replica (re-resolved each check)."""


@dataclass(slots=True)
class Stats:
    arrivals: deque[float] = field(default_factory=deque)
    errors: deque[float] = field(default_factory=deque)
    buffered: int = 0
    in_flight: int = 0
    last_arrival: float | None = None


class Gateway:
    """State, routing and the HTTP handlers."""

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
        self.stats = Stats()
        self._ready = asyncio.Condition()
        self._listeners: list[asyncio.Queue[pb.Signals]] = []
        self._session: aiohttp.ClientSession | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["namespace", "deployment"]
        self.m_arrivals = Counter(
            "unitscale_gateway_requests",
            "Requests that reached the gateway.",
            labels,
            registry=self.registry,
        )
        self.m_buffered = Gauge(
            "unitscale_gateway_buffered",
            "Requests waiting for a replica.",
            labels,
            registry=self.registry,
        )
        self.m_in_flight = Gauge(
            "unitscale_gateway_in_flight",
            "Requests sent upstream and not finished.",
            labels,
            registry=self.registry,
        )
        self.m_errors = Counter(
            "unitscale_gateway_upstream_errors",
            "Upstream failures by kind.",
            [*labels, "kind"],
            registry=self.registry,
        )
        self.m_rejected = Counter(
            "unitscale_gateway_rejected",
            "Requests answered by the gateway itself.",
            [*labels, "status"],
            registry=self.registry,
        )
        self.m_wait = Histogram(
            "unitscale_gateway_buffer_seconds",
            "Time requests waited for a replica.",
            labels,
            buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300),
            registry=self.registry,
        )
        self.m_ready = Gauge(
            "unitscale_gateway_replicas_ready",
            "Replicas answering /health, draining ones excepted.",
            labels,
            registry=self.registry,
        )
        self.labels = (settings.namespace, settings.deployment)

    # --- lifecycle ----------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        for path in PROXIED:
            app.router.add_post(path, self._proxy)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.cleanup_ctx.append(self._background)
        return app

    async def _background(self, app: web.Application) -> AsyncIterator[None]:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
        )
        tasks = [asyncio.create_task(self._health_loop()), asyncio.create_task(self._signal_loop())]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._session.close()

    # --- health --------------------------------------------------------------------------

    def reconfigure(self, replicas: list[str], settings: GatewaySettings) -> None:
        """A reloaded config: new static replicas and settings (buffered requests stay).

        Replicas it no longer names start draining now; discovery and health checks run at
        once, so new ones are checked (and take traffic) without waiting for the interval.
        """
        self.settings = settings
        self._static = {url.rstrip("/") for url in replicas}
        self._apply_named(self._named())
        self._recheck.set()

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
        self._apply_named(self._named())

    def _apply_named(self, named: set[str]) -> None:
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

    def _drop_if_drained(self, replica: Replica) -> None:
        if replica.draining and not replica.outstanding:
            log.info("replica %s drained", replica.url)
            self.replicas = [r for r in self.replicas if r is not replica]

    async def _health_loop(self) -> None:
        while True:
            self._recheck.clear()
            await self._discover()
            await asyncio.gather(*(self._check(r) for r in self.replicas))
            routable = sum(r.routable for r in self.replicas)
            self.m_ready.labels(*self.labels).set(routable)
            if routable:
                # Buffered requests look again: a replica may have been listed again.
                async with self._ready:
                    self._ready.notify_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.health_interval):
                    await self._recheck.wait()

    async def _check(self, replica: Replica) -> None:
        assert self._session is not None
        try:
            async with self._session.get(
                replica.url + "/health", timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                healthy = r.status == 200
            if healthy and not replica.models:
                async with self._session.get(
                    replica.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=2)
                ) as r:
                    data = await r.json()
                replica.models = frozenset(str(m["id"]) for m in data.get("data", []))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            healthy = False
        if healthy != replica.ready:
            log.info("replica %s is %s", replica.url, "ready" if healthy else "not ready")
            replica.ready = healthy
            if not healthy:
                replica.models = frozenset()
            if healthy:
                async with self._ready:
                    self._ready.notify_all()

    def mark_down(self, replica: Replica) -> None:
        """A connection failed: stop routing there until /health says otherwise."""
        replica.ready = False

    # --- signals ------------------------------------------------------------------------

    def signals(self, now: float) -> pb.Signals:
        """The gateway's snapshot for the scaler."""
        window = self.settings.rate_window
        while self.stats.arrivals and now - self.stats.arrivals[0] > window:
            self.stats.arrivals.popleft()
        while self.stats.errors and now - self.stats.errors[0] > window:
            self.stats.errors.popleft()
        gateway = pb.GatewaySignals(
            arrival_rate=len(self.stats.arrivals) / window,
            buffered=self.stats.buffered,
            in_flight=self.stats.in_flight,
            upstream_error_rate=len(self.stats.errors) / window,
        )
        if self.stats.last_arrival is not None:
            gateway.last_arrival_time.FromNanoseconds(int(self.stats.last_arrival * 1e9))
        stamp = Timestamp()
        stamp.FromNanoseconds(int(now * 1e9))
        return pb.Signals(
            target=pb.Target(
                namespace=self.settings.namespace, deployment=self.settings.deployment
            ),
            source=pb.SOURCE_GATEWAY,
            observed_time=stamp,
            gateway=gateway,
        )

    def subscribe(self) -> asyncio.Queue[pb.Signals]:
        queue: asyncio.Queue[pb.Signals] = asyncio.Queue(maxsize=64)
        self._listeners.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[pb.Signals]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(queue)

    def publish(self) -> None:
        """Send a snapshot to every watcher now (a full watcher drops its oldest)."""
        message = self.signals(time.time())
        for queue in self._listeners:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(message)

    async def _signal_loop(self) -> None:
        while True:
            self.publish()
            await asyncio.sleep(self.settings.signal_interval)

    # --- requests -----------------------------------------------------------------------

    def _views(self) -> list[ReplicaView]:
        # A draining replica is not ready as far as routing goes, however healthy.
        return [ReplicaView(r.url, r.routable, r.outstanding, r.models) for r in self.replicas]

    async def _wait_for_replica(self, model: str | None) -> Replica | None:
        """A ready replica for ``model``, waiting in the buffer if there is none."""
        url = choose(self._views(), model)
        if url is not None:
            return next(r for r in self.replicas if r.url == url)
        if not may_buffer(self.stats.buffered, self.settings.buffer_size):
            raise _reject(429, "the gateway's buffer is full", self.settings.buffer_timeout, self)
        self.stats.buffered += 1
        self.m_buffered.labels(*self.labels).set(self.stats.buffered)
        self.publish()  # the scaler hears at once: StreamIsActive can push true
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.buffer_timeout):
                async with self._ready:
                    while (url := choose(self._views(), model)) is None:
                        await self._ready.wait()
        except TimeoutError:
            raise _reject(
                503, f"no replica became ready within {self.settings.buffer_timeout:g}s", 10, self
            ) from None
        finally:
            self.stats.buffered -= 1
            self.m_buffered.labels(*self.labels).set(self.stats.buffered)
            self.m_wait.labels(*self.labels).observe(time.monotonic() - started)
        return next(r for r in self.replicas if r.url == url)

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _reject(400, "request body is not valid JSON", None, self) from None
        if not isinstance(body, dict):
            raise _reject(400, "request body must be a JSON object", None, self)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise _reject(400, "model must be a string", None, self)
        now = time.time()
        self.stats.arrivals.append(now)
        self.stats.last_arrival = now
        self.m_arrivals.labels(*self.labels).inc()
        if model and is_unserved(self._views(), model):
            raise _reject(404, f"no replica serves model {model!r}", None, self)
        assert self._session is not None
        for attempt in range(self.settings.connect_retries + 1):
            replica = await self._wait_for_replica(model)
            assert replica is not None
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
            replica.outstanding += 1
            self.stats.in_flight += 1
            self.m_in_flight.labels(*self.labels).set(self.stats.in_flight)
            try:
                try:
                    upstream = await self._session.post(
                        replica.url + request.path, data=raw, headers=headers
                    )
                except aiohttp.ClientConnectorError as err:
                    # Nothing was sent: safe to try another replica.
                    log.warning(
                        "cannot connect to %s (%s); attempt %d", replica.url, err, attempt + 1
                    )
                    self.mark_down(replica)
                    self.stats.errors.append(time.time())
                    self.m_errors.labels(*self.labels, "connect").inc()
                    continue
                async with upstream:
                    return await self._relay(request, upstream)
            finally:
                replica.outstanding -= 1
                self._drop_if_drained(replica)
                self.stats.in_flight -= 1
                self.m_in_flight.labels(*self.labels).set(self.stats.in_flight)
        raise _reject(503, "no replica accepted the connection", 5, self)

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
        ) as err:
            # The replica died mid-response: this client's response ends broken; we go on.
            log.warning("upstream %s failed mid-response: %s", upstream.url, err)
            self.stats.errors.append(time.time())
            self.m_errors.labels(*self.labels, "mid-response").inc()
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response

    async def _models(self, request: web.Request) -> web.Response:
        models = sorted(known_models(self._views()))
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": m, "object": "model", "owned_by": "unitscale"} for m in models],
            }
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "replicas": len(self.replicas),
                "ready": sum(r.routable for r in self.replicas),
                "draining": sum(r.draining for r in self.replicas),
                "buffered": self.stats.buffered,
                "in_flight": self.stats.in_flight,
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


_HTTP: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    404: web.HTTPNotFound,
    429: web.HTTPTooManyRequests,
    503: web.HTTPServiceUnavailable,
}


def _reject(
    status: int, message: str, retry_after: float | None, gateway: Gateway
) -> web.HTTPException:
    """An error the gateway answers itself, counted, with ``Retry-After`` when it helps."""
    gateway.m_rejected.labels(*gateway.labels, str(status)).inc()
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
    body = json.dumps({"object": "error", "message": message, "code": status})
    return _HTTP[status](text=body, content_type="application/json", headers=headers)


class GatewaySignalsService(pb_grpc.SignalsServiceServicer):
    """The gateway's signals for the scaler: now, then at every change and second."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    async def GetSignals(  # noqa: N802 - gRPC method name
        self, request: pb.GetSignalsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSignalsResponse:
        return pb.GetSignalsResponse(signals=[self._gateway.signals(time.time())])

    async def WatchSignals(  # noqa: N802
        self, request: pb.WatchSignalsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchSignalsResponse]:
        queue = self._gateway.subscribe()
        try:
            yield pb.WatchSignalsResponse(signals=self._gateway.signals(time.time()))
            while True:
                yield pb.WatchSignalsResponse(signals=await queue.get())
        finally:
            self._gateway.unsubscribe(queue)
