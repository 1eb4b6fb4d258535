"""The scaler process: gRPC server, health, reflection, TLS, signal sources."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from scaler.config import ScalerConfig
from scaler.service import ExternalScalerService, ScaledObjectRegistry
from scaler.signals import SignalStore
from scaler.sources import demo_source, watch_signals
from unitscale.errors import ConfigError

log = logging.getLogger(__name__)

SERVICE_NAME = externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"].full_name


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for serving TLS; ``client_ca`` turns on mutual TLS."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials; with a client CA, clients must present a cert it signed."""
        try:
            cert, key = self.cert.read_bytes(), self.key.read_bytes()
            client_ca = self.client_ca.read_bytes() if self.client_ca else None
        except OSError as err:
            raise ConfigError(f"cannot read TLS file {err.filename}: {err.strerror}") from err
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )


class ScalerServer:
    """A running scaler: ``await start()`` returns the bound port; ``await stop()``."""

    def __init__(
        self,
        config: ScalerConfig,
        listen: str = "127.0.0.1:0",
        tls: TlsFiles | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = SignalStore()
        self.registry = ScaledObjectRegistry(
            self.store, config.max_signal_age, clock, config.policy.policy()
        )
        self._clock = clock
        self._server = grpc.aio.server(
            options=[
                # KEDA keeps one long-lived connection per scaler address; let it idle.
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ]
        )
        externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(
            ExternalScalerService(self.registry), self._server
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        if tls is not None:
            self.port = self._server.add_secure_port(listen, tls.credentials())
        else:
            self.port = self._server.add_insecure_port(listen)
        if self.port == 0:
            raise ConfigError(f"--listen {listen}: cannot bind that address")
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> int:
        """Start serving and the signal sources; returns the bound port."""
        for source in self.config.signal_sources:
            self._tasks.append(asyncio.create_task(watch_signals(source, self.store)))
        if self.config.demo_source is not None:
            self._tasks.append(
                asyncio.create_task(demo_source(self.config.demo_source, self.store, self._clock))
            )
        await self._server.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("scaler serving on port %d", self.port)
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, let open RPCs finish for ``grace`` seconds, then stop."""
        await self._health.enter_graceful_shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._server.stop(self.config.grace_period if grace is None else grace)

    async def wait(self) -> None:
        """Until the server stops."""
        await self._server.wait_for_termination()
