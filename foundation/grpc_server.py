"""One way to run a gRPC server: health, reflection, bind errors named, graceful stop.

The scaler, the exporter and the gateway each serve gRPC; all three get the same
``grpc.health.v1.Health`` (every service ``SERVING`` once started, ``NOT_SERVING`` from
the moment a stop begins), the same server reflection and the same message when the
listen address cannot be bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from foundation.errors import ConfigError, quote
from foundation.net import check_bindable

KEEPALIVE_FOR_LONG_LIVED_CLIENTS = (
    # KEDA (and our own signal watches) hold one connection open for hours; let it idle
    # and accept their pings without calling it abuse.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
)


class GrpcServer:
    """A ``grpc.aio`` server with health and reflection for ``services``.

    Args:
        services: ``(full service name, add_servicer_to_server, servicer)`` per service.
        listen: ``host:port`` (port 0 picks a free one; ``port`` tells which).
        flag: the command-line flag ``listen`` came from, for the bind error.
        credentials: TLS server credentials, or None for plaintext.
        options: channel options for the server.
        max_concurrent_rpcs: calls (streams included) served at once; one more is refused
            at once with ``RESOURCE_EXHAUSTED`` instead of queueing without bound.

    Raises:
        ConfigError: the address cannot be bound.
    """

    def __init__(
        self,
        services: Sequence[tuple[str, Callable[[Any, grpc.aio.Server], None], object]],
        listen: str,
        *,
        flag: str = "--grpc-listen",
        credentials: grpc.ServerCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        max_concurrent_rpcs: int | None = None,
    ) -> None:
        self.server = grpc.aio.server(
            options=list(options), maximum_concurrent_rpcs=max_concurrent_rpcs
        )
        self._names = [name for name, _, _ in services]
        for _, add, servicer in services:
            add(servicer, self.server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        reflection.enable_server_reflection(
            (*self._names, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        check_bindable(flag, listen)  # our one line, before gRPC logs its own
        try:
            if credentials is not None:
                self.port: int = self.server.add_secure_port(listen, credentials)
            else:
                self.port = self.server.add_insecure_port(listen)
        except RuntimeError as err:  # grpcio >= 1.60 raises where it returned 0
            raise ConfigError(f"{flag} {quote(listen)}: cannot bind that address") from err
        if self.port == 0:
            raise ConfigError(f"{flag} {quote(listen)}: cannot bind that address")

    async def start(self) -> int:
        """Serve, and report every service ``SERVING``; returns the bound port."""
        await self.server.start()
        for name in ("", *self._names):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Report every service ``SERVING`` or ``NOT_SERVING`` (the process's own health)."""
        status = health_pb2.HealthCheckResponse
        for name in ("", *self._names):
            await self._health.set(name, status.SERVING if serving else status.NOT_SERVING)

    async def enter_graceful_shutdown(self) -> None:
        """Report ``NOT_SERVING`` for every service (load balancers stop sending)."""
        await self._health.enter_graceful_shutdown()

    async def stop(self, grace: float) -> None:
        """``NOT_SERVING``, then let open calls finish for ``grace`` seconds, then stop."""
        await self.enter_graceful_shutdown()
        await self.server.stop(grace)

    async def wait(self) -> None:
        """Until the server stops."""
        await self.server.wait_for_termination()


def service_name(descriptor: Any, service: str) -> str:
    """The full name of ``service`` in a generated ``_pb2`` module's file ``descriptor``."""
    return str(descriptor.services_by_name[service].full_name)
