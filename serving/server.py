"""Process shells for ``unitscale gateway`` and ``unitscale sim-replica``."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine

from aiohttp import web

from foundation.discovery import EndpointSliceWatch
from foundation.grpc_server import GrpcServer, service_name
from foundation.http_guard import ConnectionGuard, GuardedSite, refusal
from foundation.kube import KubeAccess
from foundation.net import bind_error, join_listen, split_listen
from foundation.reload import ConfigSource, ConfigStore
from foundation.replica_model import Profile
from protos.unitscale.v1 import signals_pb2, signals_pb2_grpc
from serving.config import GatewayConfig
from serving.gateway import Gateway
from serving.gateway_settings import GatewaySettings
from serving.gateway_signals import GatewaySignalsService
from serving.sim_http import SimReplica

log = logging.getLogger(__name__)

MAX_GRPC_CALLS = 64
"""gRPC calls the gateway serves at once (signal watches, GetSignals, health): the
scaler's replicas and a few tools. One more is refused with ``RESOURCE_EXHAUSTED``."""

MAX_HEADERS = 64
"""Header lines a request head may have (aiohttp's default: 128). An OpenAI client sends
about 15; a service mesh and tracing add about 15 more."""
MAX_FIELD_SIZE = 4096
"""Bytes of one header line (aiohttp's default: 8190): a bearer token or a client
certificate's hash fits. With ``MAX_HEADERS``, a head holds at most 256 KiB unfinished."""
HEAD_TIMEOUT = 10.0
"""Seconds a new connection has to send its first request head whole; past it the
connection is closed, counted (``slow-head``). aiohttp has no deadline on a head: 1 MB of
unfinished headers trickled a byte every 5 s held ~2 MiB of gateway memory for good."""
KEEPALIVE_TIMEOUT = 75.0
"""Seconds an idle keep-alive connection is kept (aiohttp's default)."""
MAX_CONNECTIONS = 4096
"""Client connections open at once; one more is answered 503 and closed, counted
(``too-many-connections``). With ``HEAD_TIMEOUT`` and the head's bounds, connections that
never finish a head hold at most ~2 GiB, and only for seconds."""


_TOO_MANY_CONNECTIONS = refusal(
    "application/json",
    json.dumps(
        {"object": "error", "message": "the gateway has too many connections", "code": 503}
    ).encode(),
)


def gateway_guard(
    on_refused: Callable[[str], None],
    *,
    max_connections: int = MAX_CONNECTIONS,
    head_timeout: float = HEAD_TIMEOUT,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT,
) -> ConnectionGuard:
    """The guard the gateway's proxy listens through (``foundation.http_guard``).

    The gateway's bounds, its refusals counted by ``on_refused`` (``client_error``), and a
    503 in the gateway's error shape.
    """
    return ConnectionGuard(
        "serving.gateway",
        max_connections=max_connections,
        head_timeout=head_timeout,
        keepalive_timeout=keepalive_timeout,
        on_refused=on_refused,
        answer=_TOO_MANY_CONNECTIONS,
    )


class GatewayServer:
    """The gateway's HTTP proxy and its signals gRPC service."""

    def __init__(
        self,
        replicas: list[str],
        settings: GatewaySettings,
        listen: str,
        grpc_listen: str,
        *,
        config: GatewayConfig | None = None,
        source: ConfigSource | None = None,
        parse: Callable[[str, str], GatewayConfig] | None = None,
        kube: KubeAccess | None = None,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.gateway = Gateway(replicas, settings)
        self.guard = guard or gateway_guard(self.gateway.metrics.client_error)
        self._config, self._source, self._kube = config, source, kube
        self.configs: ConfigStore[GatewayConfig] | None = None
        if config is not None and source is not None and parse is not None:
            self.configs = ConfigStore(config, parse)
            self.configs.add_listener(lambda c: self.gateway.reconfigure(c.replicas, c.settings()))
            self.gateway.metrics.count_reloads(self.configs)
        self._tasks: list[asyncio.Task[None]] = []
        self._listen = split_listen(listen)
        self._grpc = GrpcServer(
            [
                (
                    service_name(signals_pb2.DESCRIPTOR, "SignalsService"),
                    signals_pb2_grpc.add_SignalsServiceServicer_to_server,
                    GatewaySignalsService(self.gateway.feed),
                )
            ],
            grpc_listen,
            max_concurrent_rpcs=MAX_GRPC_CALLS,
        )
        self.grpc_port = self._grpc.port
        self._site: GuardedSite | None = None
        self.port = 0

    async def start(self) -> tuple[int, int]:
        """Serve; returns (HTTP port, gRPC port)."""
        # A client that gives up while buffered frees its place (and its upstream request).
        self._site = GuardedSite(
            self.gateway.app(),
            self.guard,
            max_headers=MAX_HEADERS,
            max_field_size=MAX_FIELD_SIZE,
            handler_cancellation=True,
        )
        try:
            self.port = await self._site.listen(*self._listen)
        except OSError as err:
            await self._site.stop()
            raise bind_error("--listen", join_listen(self._listen), err) from err
        await self._grpc.start()
        if self._config is not None and self._config.endpoint_slices is not None:
            watch = EndpointSliceWatch(self._config.namespace, self._config.endpoint_slices)
            self.gateway.pool.endpoint_watch = watch
            self._loop("discovery", watch.run(self._kube or KubeAccess()))
        if self.configs is not None and self._source is not None:
            self._loop("config", self._source.follow(self.configs))
        log.info("gateway on port %d, signals on port %d", self.port, self.grpc_port)
        return self.port, self.grpc_port

    def _loop(self, name: str, work: Coroutine[object, object, None]) -> None:
        """Run ``work`` for as long as the server: one of the loops ``/health`` names.

        The reload and EndpointSlice loops catch whatever they meet; should one end
        anyway, the gateway would follow no config and no Service for good while its
        ``/health`` said ok.
        """
        task = asyncio.create_task(work)
        self._tasks.append(task)
        self.gateway.loops[name] = task

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        # A loop that ended on an exception was named by /health; it does not stop the stop.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._grpc.stop(1.0)
        if self._site is not None:
            await self._site.stop()


class SimReplicaServer:
    """One simulated vLLM replica on HTTP.

    ``stop()`` drains like a Kubernetes pod being deleted: the listening socket closes (new
    connections are refused, so health checks fail and gateways route elsewhere), idle
    keep-alive connections close, requests in flight run to their end for up to ``grace``
    seconds of wall time, then whatever is left is cancelled and the engine stops.
    """

    def __init__(
        self,
        profile: Profile,
        listen: str,
        model: str = "sim-llama",
        speedup: float = 1.0,
        grace: float = 30.0,
        *,
        sleep_mode: bool = True,
    ) -> None:
        self.replica = SimReplica(profile, model, speedup, sleep_mode=sleep_mode)
        self._listen = split_listen(listen)
        self._grace = grace
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> int:
        # aiohttp's own shutdown does the draining: stop listening, close idle connections,
        # wait up to shutdown_timeout for handlers, then run the app's cleanup (the engine
        # task, which must outlive the handlers it serves).
        # A client that leaves has its handler cancelled, so its request is aborted as
        # vLLM aborts it, not run to the end for nobody.
        self._runner = web.AppRunner(
            self.replica.app,
            access_log=None,
            shutdown_timeout=self._grace,
            handler_cancellation=True,
        )
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, *self._listen).start()
        except OSError as err:
            raise bind_error("--listen", join_listen(self._listen), err) from err
        self.port = int(self._runner.addresses[0][1])
        log.info("simulated replica (%s) on port %d", self.replica.engine.profile.name, self.port)
        return self.port

    async def stop(self) -> None:
        """Drain: refuse new connections, let requests in flight finish (``grace``), stop."""
        if self._runner is not None:
            engine = self.replica.engine
            in_flight = engine.running + len(engine.waiting)
            if in_flight:
                log.info("draining %d requests (grace %gs)", in_flight, self._grace)
            await self._runner.cleanup()
