"""The exporter process: scrape loop, ``/metrics`` over HTTP, signals over gRPC.

Health: ``/healthz`` answers 200 while the scrape loop is alive and has completed a
cycle within ``STALE_CYCLES`` intervals, else 503 with the ``problem``; the gRPC health
service says ``SERVING`` or ``NOT_SERVING`` to match. The loop restarts itself after a
failed cycle (``Exporter.run``); when it is gone for good or stays stuck, failing health
is what tells Kubernetes to restart the pod (a liveness probe on ``/healthz`` or gRPC).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from exporter.collector import WatchersCollector, registry_for
from exporter.config import ExporterConfig, parse_config
from exporter.grpc_service import SignalsService
from exporter.runtime import Exporter
from foundation.grpc_server import GrpcServer, service_name
from foundation.http_guard import ConnectionGuard, GuardedSite, RefusedCollector, bind
from foundation.kube import KubeAccess
from foundation.loop_share import LoopShare
from foundation.net import bind_error, join_listen, split_listen
from foundation.reload import ConfigSource, ConfigStore
from foundation.reload_metrics import ConfigReloadCollector
from protos.unitscale.v1 import signals_pb2, signals_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = service_name(signals_pb2.DESCRIPTOR, "SignalsService")
MAX_GRPC_CALLS = 64
"""gRPC calls the exporter serves at once (signal watches, GetSignals, health): the
scaler's replicas and a few tools. One more is refused with ``RESOURCE_EXHAUSTED``,
never queued without bound."""
HEALTH_CHECK_PERIOD = 1.0
"""Most seconds between health checks that keep the gRPC health status current."""


class ExporterServer:
    """A running exporter; ``start()`` returns the bound HTTP and gRPC ports.

    With a ``source`` the config is hot-reloaded (``parse`` turns its text into a
    config, applying the command line's overrides): interval, timeout, windows and
    deployments apply from the next scrape cycle.
    """

    def __init__(
        self,
        config: ExporterConfig,
        listen: str = "127.0.0.1:0",
        grpc_listen: str = "127.0.0.1:0",
        clock: Callable[[], float] = time.time,
        source: ConfigSource | None = None,
        parse: Callable[[str, str], ExporterConfig] = parse_config,
        kube: KubeAccess | None = None,
        slice_resync: float = 300.0,
    ) -> None:
        self.exporter = Exporter(config, clock, kube, slice_resync)
        self.configs = ConfigStore(config, parse)
        self.configs.add_listener(self.exporter.apply)
        self._source = source
        self._reload_task: asyncio.Task[None] | None = None
        self.registry = registry_for(self.exporter)
        self.registry.register(ConfigReloadCollector(self.configs))
        self.signals = SignalsService(self.exporter)
        self.registry.register(WatchersCollector(self.signals))
        self._listen = split_listen(listen)
        self._grpc = GrpcServer(
            [(SERVICE_NAME, signals_pb2_grpc.add_SignalsServiceServicer_to_server, self.signals)],
            grpc_listen,
            max_concurrent_rpcs=MAX_GRPC_CALLS,
        )
        self.grpc_port = self._grpc.port
        self.http_port = 0
        self.http_guard = ConnectionGuard("exporter")
        self.registry.register(RefusedCollector(self.http_guard, "unitscale_exporter_http_refused"))
        self._site: GuardedSite | None = None
        # At 3,000 replicas a body took 0.5 s of the event loop (5.8 MB), the loop that
        # scrapes and streams signals: made at most a tenth of the time (hostile pass 7).
        self._body = LoopShare(lambda: generate_latest(self.registry))
        self._loop_task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._health_changed = asyncio.Event()

    async def start(self) -> tuple[int, int]:
        """Serve HTTP and gRPC and start scraping; returns (http port, grpc port)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        # Bind first so that port 0 works and the chosen port is known.
        try:
            sock = bind(*self._listen)
        except OSError as err:
            raise bind_error("--listen", join_listen(self._listen), err) from err
        # Through the guard: bounded connections and request heads (S6-H3).
        self._site = GuardedSite(app, self.http_guard)
        self.http_port = await self._site.start(sock)
        await self._grpc.start()
        self._loop_task = asyncio.create_task(self.exporter.run())
        self._loop_task.add_done_callback(self._loop_ended)
        self._health_task = asyncio.create_task(self._follow_health())
        if self._source is not None:
            self._reload_task = asyncio.create_task(self._source.follow(self.configs))
        log.info(
            "exporter serving /metrics on port %d, signals on port %d",
            self.http_port,
            self.grpc_port,
        )
        return self.http_port, self.grpc_port

    async def stop(self, grace: float = 2.0) -> None:
        """Stop scraping, then both servers."""
        await self._grpc.enter_graceful_shutdown()
        for task in (self._health_task, self._reload_task, self._loop_task):
            if task is not None:
                task.cancel()
                # A loop that died earlier was logged when it did (``_loop_ended``).
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.gather(task, return_exceptions=True)
        await self._grpc.stop(grace)
        if self._site is not None:
            await self._site.stop()

    def problem(self) -> str | None:
        """Why the exporter is unhealthy, or None while its loop is alive and cycling."""
        task = self._loop_task
        if task is not None and task.done():
            if task.cancelled():
                return "scrape loop stopped: cancelled"
            return f"scrape loop stopped: {task.exception()!r}"
        return self.exporter.stalled() or self.exporter.parse_problem()

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return  # stop() cancels it
        error = task.exception()
        log.critical("scrape loop stopped: %r; health fails until a restart", error, exc_info=error)
        self._health_changed.set()  # report it at once

    async def _set_health(self, serving: bool) -> None:
        await self._grpc.set_serving(serving)

    async def _follow_health(self) -> None:
        """Keep the gRPC health status in step with ``problem()``."""
        serving = True
        while True:
            problem = self.problem()
            if (problem is None) != serving:
                serving = problem is None
                await self._set_health(serving)
                if problem is not None:
                    log.error("unhealthy: %s", problem)
                else:
                    log.info("healthy again")
            period = min(HEALTH_CHECK_PERIOD, self.exporter.config.interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._health_changed.wait(), period)
            self._health_changed.clear()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._body.get(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        exporter = self.exporter
        problem = self.problem()
        return web.json_response(
            {
                "healthy": problem is None,
                "problem": problem,
                "cycles": exporter.cycles,
                "last_cycle_seconds": exporter.last_cycle_seconds,
                "loop_restarts": exporter.loop_restarts,
                "deployments": len(exporter.deployments),
                "config_reloads": self.configs.reloads,
                "config_errors": self.configs.errors,
            },
            status=200 if problem is None else 503,
        )
