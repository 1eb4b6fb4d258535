"""The scaler process: gRPC server, health, reflection, TLS, signal sources."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from foundation.errors import ConfigError
from foundation.files import MAX_PEM_BYTES, read_bytes
from foundation.grpc_server import KEEPALIVE_FOR_LONG_LIVED_CLIENTS, GrpcServer, service_name
from foundation.http_guard import ConnectionGuard, GuardedSite, bind
from foundation.kube import KubeAccess
from foundation.net import bind_error
from foundation.reload import ConfigSource, ConfigStore
from protos.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc
from scaler.config import PrometheusSourceConfig, ScalerConfig, SignalSourceConfig, parse_config
from scaler.metadata import MAX_KEY_LENGTH, MAX_KEYS, MAX_NAME_LENGTH, MAX_VALUE_LENGTH
from scaler.prewarm.shell import Prewarmer
from scaler.registry import PUSH_DECISION_GAP, ScaledObjectRegistry
from scaler.scaled_objects import ScaledObjectWatch
from scaler.service import CapacityService, ExternalScalerService
from scaler.signals import TARGET_TTL, SignalStore
from scaler.sources import demo_source, prometheus_source, watch_signals
from scaler.telemetry import metrics_app

log = logging.getLogger(__name__)

PROMETHEUS_RESTART_GAP = 60.0
"""Seconds from one replacement of the Prometheus source to the next
(``ScalerServer._reconcile_prometheus``): long enough for rounds of 1,600 targets on 16
slots (about 18 s) to end and publish whatever the reloads do."""
MAX_CONCURRENT_RPCS = 50_000
"""Calls served at once; more are refused (RESOURCE_EXHAUSTED), never queued without bound.

KEDA holds one StreamIsActive per external-push ScaledObject and polls the rest with
short calls answered from memory, so 10,000 ScaledObjects use about 10,000 slots; a
flood past 50,000 is refused at once instead of growing memory (about 10 KB a call).
Streams have their own bound below it (``scaler.service.MAX_STREAMS``), so short calls
always find slots.
"""

MAX_REQUEST_BYTES = (
    2 * MAX_KEYS * (MAX_KEY_LENGTH + MAX_VALUE_LENGTH) + 4 * MAX_NAME_LENGTH + (16 << 10)
)
"""The largest request read (about 570 KB): a ScaledObjectRef at the metadata's bounds,
twice over for characters beyond ASCII. gRPC's default is 4 MiB, and a ref is parsed and
copied before its keys are counted: 3 MiB refs held the event loop 0.4 s a call (issue 27,
hostile pass 11); a larger request is RESOURCE_EXHAUSTED before it is read."""

SERVICE_NAME = service_name(externalscaler_pb2.DESCRIPTOR, "ExternalScaler")
CAPACITY_SERVICE_NAME = service_name(capacity_pb2.DESCRIPTOR, "CapacityService")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for serving TLS; ``client_ca`` turns on mutual TLS."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials; with a client CA, clients must present a cert it signed.

        Raises:
            ConfigError: a file cannot be read, the certificate and key are not a pair
                (naming both files), or the client CA holds no certificate. gRPC itself
                would only fail to bind, naming neither.
        """
        # Regular files of at most MAX_PEM_BYTES: --tls-cert /dev/zero read until memory ran out.
        cert, key = _pem(self.cert), _pem(self.key)
        client_ca = _pem(self.client_ca) if self.client_ca else None
        self.check()
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )

    def check(self) -> None:
        """Load the files the way a TLS server would, before gRPC binds with them.

        Raises:
            ConfigError: as ``credentials``.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            # A password callback, so that an encrypted key fails instead of prompting.
            context.load_cert_chain(self.cert, self.key, password=_no_password)
        except (ssl.SSLError, ValueError, TypeError) as err:
            if getattr(err, "reason", None) == "KEY_VALUES_MISMATCH":
                problem = "do not match: the key is not the certificate's"
            else:
                problem = (
                    "cannot be loaded (expected a PEM certificate and its unencrypted PEM"
                    f" key): {_reason(err)}"
                )
            raise ConfigError(f"TLS certificate {self.cert} and key {self.key} {problem}") from err
        if self.client_ca is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca)
            except (ssl.SSLError, ValueError) as err:
                raise ConfigError(
                    f"TLS client CA {self.client_ca} holds no usable PEM certificate:"
                    f" {_reason(err)}"
                ) from err


def _pem(path: Path) -> bytes:
    return read_bytes(path, MAX_PEM_BYTES, "TLS file")


def _no_password() -> bytes:
    return b""


def _call_later(delay: float, call: Callable[[], None]) -> bool:
    """``call`` after ``delay`` seconds on the running event loop; whether it will be.

    The registry's trailing decision: signals reach it from the loop's watch tasks; a
    store updated off any loop (a test, a tool) leaves the next snapshot or call to decide.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    loop.call_later(delay, call)
    return True


def _reason(err: Exception) -> str:
    reason = getattr(err, "reason", None)
    return str(reason) if reason else str(err)


class ScalerServer:
    """A running scaler: ``await start()`` returns the bound port; ``await stop()``.

    The config is hot-reloaded from ``source`` (a mounted file or a ConfigMap) when one
    is given: ``max-signal-age`` applies to the next decision, ``signal-sources``
    watches start and stop to match, a changed ``prometheus-source`` restarts its queries.
    ``grace-period`` and ``demo-source`` are read at start only.
    """

    def __init__(
        self,
        config: ScalerConfig,
        listen: str = "127.0.0.1:0",
        tls: TlsFiles | None = None,
        clock: Callable[[], float] = time.time,
        source: ConfigSource | None = None,
        metrics_listen: str | None = None,
        max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS,
        kube: KubeAccess | None = None,
    ) -> None:
        self._metrics_listen = metrics_listen
        self.metrics_port = 0
        self._metrics_site: GuardedSite | None = None
        self.metrics_guard = ConnectionGuard("scaler.metrics")
        """Bounds on ``--metrics-listen``'s connections (what it refused, by kind)."""
        self.configs = ConfigStore(config, parse_config)
        self.configs.add_listener(self._reconfigure)
        self._source = source
        self.store = SignalStore(clock)
        self.registry = ScaledObjectRegistry(
            self.store,
            config.max_signal_age,
            clock,
            config.policy_defaults(),
            push_gap=PUSH_DECISION_GAP,
            later=_call_later,
        )
        self._clock = clock
        # Fluid prewarm for ScaledObjects naming a Dataset (needs the API server).
        self.prewarm = Prewarmer(self.registry, kube, clock) if kube is not None else None
        # Calls and a pool's demand count a ScaledObject only as the API server has it.
        self.scaled_objects = ScaledObjectWatch(kube, self.registry) if kube is not None else None
        self.registry.confirm = self.scaled_objects
        self._grpc = GrpcServer(
            [
                (
                    SERVICE_NAME,
                    externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server,
                    ExternalScalerService(self.registry),
                ),
                (
                    CAPACITY_SERVICE_NAME,
                    capacity_pb2_grpc.add_CapacityServiceServicer_to_server,
                    CapacityService(self.registry, self.scaled_objects),
                ),
            ],
            listen,
            flag="--listen",
            credentials=tls.credentials() if tls is not None else None,
            options=(
                *KEEPALIVE_FOR_LONG_LIVED_CLIENTS,
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ),
            max_concurrent_rpcs=max_concurrent_rpcs,
        )
        self.port = self._grpc.port
        self._tasks: list[asyncio.Task[None]] = []
        self._source_tasks: dict[SignalSourceConfig, asyncio.Task[None]] = {}
        self._prometheus: tuple[PrometheusSourceConfig, asyncio.Task[None]] | None = None
        self._prometheus_replaced = -math.inf
        """The loop's time a reload last replaced the Prometheus source."""
        self._prometheus_started = -math.inf
        """The loop's time the running Prometheus source started."""
        self._prometheus_later: asyncio.TimerHandle | None = None
        """A replacement waiting for ``PROMETHEUS_RESTART_GAP`` to pass."""
        self._started = False
        self._stopped_loops: dict[str, str] = {}
        """Loops that ended while they should run (by name): health fails until a restart."""
        self._health_updates: set[asyncio.Task[None]] = set()

    @property
    def config(self) -> ScalerConfig:
        """The config in force now (one frozen snapshot)."""
        return self.configs.current

    def _reconfigure(self, config: ScalerConfig) -> None:
        """Apply a reloaded config, each part alone: one that fails leaves the others."""
        registry = self.registry
        steps: list[tuple[str, Callable[[], None]]] = [
            ("max-signal-age", lambda: registry.set_default_max_signal_age(config.max_signal_age)),
            ("policy", lambda: registry.set_policy_defaults(config.policy_defaults())),
        ]
        if self._started:
            steps.append(("signal sources", lambda: self._reconcile_sources(config)))
        for part, step in steps:
            try:
                step()
            except Exception as err:  # the config is in force; the next reload tries again
                log.error("applying the reloaded %s failed: %s: %s", part, type(err).__name__, err)

    def _reconcile_sources(self, config: ScalerConfig) -> None:
        """Watch exactly ``config.signal_sources``: start new ones, cancel dropped ones."""
        wanted = set(config.signal_sources)
        for source in [s for s in self._source_tasks if s not in wanted]:
            log.info("no longer watching signals from %s", source.address)
            self._source_tasks.pop(source).cancel()
        for source in config.signal_sources:
            if source not in self._source_tasks:
                task = self._loop(
                    f"signal watch on {source.address}", watch_signals(source, self.store)
                )
                self._source_tasks[source] = task
        self._reconcile_prometheus(config.prometheus_source)

    def _reconcile_prometheus(self, wanted: PrometheusSourceConfig | None) -> None:
        """Query Prometheus as ``wanted`` says: a changed config restarts the rounds.

        A source replaced less than ``PROMETHEUS_RESTART_GAP`` ago runs on until the gap
        has passed, then the newest config replaces it (restarted at every reload, a
        Prometheus slower than the reloads answered none, hostile pass 62; queries left
        to finish beside the new ones piled up, pass 63); one removed within the gap of
        its start goes once the gap has passed, so that a removal undone meanwhile leaves
        it running (removed and added in turn, it restarted at every reload, pass 64).
        """
        if self._prometheus_later is not None:
            self._prometheus_later.cancel()
            self._prometheus_later = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._prometheus is not None:
            running, task = self._prometheus
            if running == wanted:
                return
            since = self._prometheus_replaced if wanted is not None else self._prometheus_started
            left = since + PROMETHEUS_RESTART_GAP - now
            if left > 0:
                self._prometheus_later = loop.call_later(
                    left, lambda: self._reconcile_prometheus(self.config.prometheus_source)
                )
                return
            log.info("no longer querying signals from %s as configured before", running.url)
            task.cancel()
            self._prometheus = None
            if wanted is not None:
                self._prometheus_replaced = now
        if wanted is not None:
            source = prometheus_source(wanted, self.store, self.registry.targets)
            self._prometheus = (wanted, self._loop(f"prometheus-source {wanted.url}", source))
            self._prometheus_started = now

    @property
    def watched_sources(self) -> list[str]:
        """Addresses of the signal sources being watched now."""
        return sorted(source.address for source in self._source_tasks)

    async def start(self) -> int:
        """Start serving, the signal sources and the config reload; returns the port.

        Raises:
            ConfigError: ``--metrics-listen`` cannot be bound (bound first, so that
                nothing else has started: one line, exit 2, no traceback).
        """
        await self._serve_metrics()
        self._started = True
        self._reconcile_sources(self.config)
        if self.config.demo_source is not None:
            demo = demo_source(self.config.demo_source, self.store, self._clock)
            self._tasks.append(self._loop("demo-source", demo))
        if self._source is not None:
            self._tasks.append(self._loop("config reload", self._source.follow(self.configs)))
        self._tasks.append(self._loop("eviction", self._evict_loop()))
        if self.prewarm is not None:
            self._tasks.append(self._loop("prewarm", self.prewarm.run()))
        if self.scaled_objects is not None:
            self._tasks.append(self._loop("scaled-objects", self.scaled_objects.run()))
        await self._grpc.start()
        if self._stopped_loops:  # one ended before the server reported SERVING
            await self._grpc.set_serving(False)
        log.info("scaler serving on port %d", self.port)
        return self.port

    async def _serve_metrics(self) -> None:
        """Serve ``/metrics`` on ``--metrics-listen``, if given, before anything starts."""
        if self._metrics_listen is None:
            return
        host, _, port = self._metrics_listen.rpartition(":")
        try:
            sock = bind(host.strip("[]"), int(port))
        except OSError as err:
            raise bind_error("--metrics-listen", self._metrics_listen, err) from err
        # Through a guard: bounded connections and request heads (S6-H3).
        guard = self.metrics_guard
        app = metrics_app(self.registry, self.configs, self.prewarm, self.store, guard)
        self._metrics_site = GuardedSite(app, guard)
        self.metrics_port = await self._metrics_site.start(sock)

    def _loop(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a loop meant to last until ``stop``; if it ends anyway, health fails."""
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return  # stop() or a reconfiguration cancelled it
        error = task.exception()
        why = f"{error!r}" if error is not None else "returned"
        self._stopped_loops[task.get_name()] = why
        # A scaler whose signals no longer arrive answers from ever older ones, then
        # UNAVAILABLE for good: let the liveness probe restart it.
        log.critical(
            "%s stopped: %s; gRPC health NOT_SERVING until a restart",
            task.get_name(),
            why,
            exc_info=error,
        )
        if self._started:
            update = asyncio.create_task(self._grpc.set_serving(False))
            self._health_updates.add(update)
            update.add_done_callback(self._health_updates.discard)

    def problem(self) -> str | None:
        """Why the scaler is not healthy (a loop that stopped), or None."""
        if not self._stopped_loops:
            return None
        return "; ".join(f"{name} stopped: {why}" for name, why in self._stopped_loops.items())

    async def _evict_loop(self) -> None:
        """Forget what nothing asks about any more (checked each minute).

        ScaledObjects KEDA stopped asking about; targets none scales and no source reports.
        """
        while True:
            await asyncio.sleep(60.0)
            self.registry.evict_idle(self.config.scaled_object_ttl)
            self.store.evict_idle(TARGET_TTL, keep=set(self.registry.targets()))

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, let open RPCs finish for ``grace`` seconds, then stop."""
        await self._grpc.enter_graceful_shutdown()
        if self._prometheus_later is not None:
            self._prometheus_later.cancel()
        tasks = [*self._tasks, *self._source_tasks.values()]
        if self._prometheus is not None:
            tasks.append(self._prometheus[1])
            self._prometheus = None
        self._source_tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            # A loop that died earlier was logged when it did (``_loop_ended``).
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._grpc.stop(self.config.grace_period if grace is None else grace)
        if self._metrics_site is not None:
            await self._metrics_site.stop()

    async def wait(self) -> None:
        """Until the server stops."""
        await self._grpc.wait()
