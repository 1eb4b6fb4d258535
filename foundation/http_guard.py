"""Bounds on what a small HTTP endpoint (``/metrics``, ``/healthz``) holds for a client.

aiohttp's server takes 128 header lines of 8,190 bytes, sets no deadline on a request's
head and no cap on connections, and logs every malformed request at ERROR with a
traceback. Anyone who can reach the exporter's or the scaler's metrics port could hold
~2 MiB a connection for good by trickling an unfinished head (200 connections: the
exporter's RSS 112 -> 506 MiB, all still open after 20 s), or write a traceback into the
log per request (issue 27, hostile pass 6, S6-H3; the gateway's own guard is pass 3's
T-2). ``serve`` listens through a ``ConnectionGuard``:

- at most ``max_connections`` at once; one more is answered 503 and closed;
- a connection that has not sent its first request head whole within ``head_timeout``
  is closed; a head holds at most ``MAX_HEADERS`` lines of ``MAX_FIELD_SIZE`` bytes;
- a malformed request is answered 400 by aiohttp and logged at DEBUG, bounded.

Each refusal is counted in ``ConnectionGuard.refused`` by kind (``too-many-connections``,
``slow-head``, ``malformed-http``), and told to ``on_refused`` where one is given. The
gateway's proxy listens through the same guard with its own bounds and its own 503
(``serving.server.gateway_guard``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

MAX_HEADERS = 32
"""Header lines a request head may have (aiohttp's default: 128): a scraper sends ~5."""
MAX_FIELD_SIZE = 4096
"""Bytes of one header line (aiohttp's default: 8190): a bearer token fits."""
HEAD_TIMEOUT = 10.0
"""Seconds a new connection has to send its first request head whole."""
KEEPALIVE_TIMEOUT = 75.0
"""Seconds an idle keep-alive connection is kept (aiohttp's default)."""
MAX_CONNECTIONS = 256
"""Connections open at once: Prometheus, the kubelet's probes and a few tools use a
handful; with the head's bounds, 256 unfinished heads hold at most ~32 MiB, for seconds."""

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusal(content_type: str, body: bytes) -> bytes:
    """The whole answer a connection past ``max_connections`` gets: a 503, then closed."""
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: %s\r\n"
        b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (content_type.encode(), len(body), body)
    )


TOO_MANY_CONNECTIONS = refusal("text/plain", b"too many connections\n")


class _Malformed(logging.Filter):
    """aiohttp's ERROR with a traceback per malformed request: counted, one DEBUG line."""

    def __init__(self, count: Callable[[], None]) -> None:
        super().__init__()
        self._count = count

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if not isinstance(err, HttpProcessingError):
            return True  # a handler's own failure is logged as aiohttp logs it
        self._count()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("a malformed request was answered 400: %s", str(err)[:200])
        return False


class ConnectionGuard:
    """Caps connections and the time to a first request head, before any handler runs."""

    def __init__(
        self,
        name: str,
        *,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
        on_refused: Callable[[str], None] | None = None,
        answer: bytes = TOO_MANY_CONNECTIONS,
    ) -> None:
        """``name`` names the endpoint's logger (``<name>.http``).

        ``answer`` is what a connection past ``max_connections`` is sent (``refusal``).
        """
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.keepalive_timeout = keepalive_timeout
        self.refused: Counter[str] = Counter()
        """Connections and requests refused, by kind."""
        self._on_refused = on_refused
        self._answer = answer
        self._deadlines: dict[asyncio.BaseProtocol, asyncio.TimerHandle] = {}
        self.logger = logging.getLogger(f"{name}.http")
        for old in [f for f in self.logger.filters if isinstance(f, _Malformed)]:
            self.logger.removeFilter(old)
        self.logger.addFilter(_Malformed(lambda: self._refuse("malformed-http")))

    def _refuse(self, kind: str) -> None:
        self.refused[kind] += 1
        if self._on_refused is not None:
            self._on_refused(kind)

    def protocol_factory(self, server: web.Server) -> Callable[[], asyncio.BaseProtocol]:
        """What the listening socket makes per connection: aiohttp's handler, or a refusal."""

        def connection() -> asyncio.BaseProtocol:
            if len(server.connections) >= self.max_connections:
                self._refuse("too-many-connections")
                return _Refused(self._answer)
            handler = server()
            loop = asyncio.get_running_loop()
            self._deadlines[handler] = loop.call_later(self.head_timeout, self._expire, handler)
            return handler

        return connection

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """A request whose head arrived: its connection's head deadline is off."""
        deadline = self._deadlines.pop(request.protocol, None)
        if deadline is not None:
            deadline.cancel()
        return await handler(request)

    def _expire(self, protocol: asyncio.BaseProtocol) -> None:
        self._deadlines.pop(protocol, None)
        transport = getattr(protocol, "transport", None)
        if transport is None or transport.is_closing():
            return  # closed meanwhile
        self._refuse("slow-head")
        transport.abort()

    def close(self) -> None:
        """Cancel every deadline (the server stops)."""
        for deadline in self._deadlines.values():
            deadline.cancel()
        self._deadlines.clear()


class _Refused(asyncio.Protocol):
    """A connection past ``max_connections``: its answer (a 503), closed."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self._answer)
        transport.close()


class GuardedSite:
    """An aiohttp app served through a ``ConnectionGuard`` on a bound socket.

    ``max_headers`` and ``max_field_size`` bound a request head; ``handler_cancellation``
    cancels a handler whose client left (aiohttp's option).
    """

    def __init__(
        self,
        app: web.Application,
        guard: ConnectionGuard,
        *,
        max_headers: int = MAX_HEADERS,
        max_field_size: int = MAX_FIELD_SIZE,
        handler_cancellation: bool = False,
    ) -> None:
        app.middlewares.append(guard.middleware)
        self.guard = guard
        self.runner = web.AppRunner(
            app,
            access_log=None,
            logger=guard.logger,
            max_headers=max_headers,
            max_field_size=max_field_size,
            keepalive_timeout=guard.keepalive_timeout,
            handler_cancellation=handler_cancellation,
        )
        self._listener: asyncio.Server | None = None

    async def start(self, sock: socket.socket) -> int:
        """Serve on ``sock`` (bound by the caller, so that its errors are the caller's)."""
        await self.runner.setup()
        assert self.runner.server is not None
        self._listener = await asyncio.get_running_loop().create_server(
            self.guard.protocol_factory(self.runner.server), sock=sock
        )
        return int(sock.getsockname()[1])

    async def listen(self, host: str, port: int) -> int:
        """Serve on every address ``host`` resolves to, as asyncio's ``create_server`` binds.

        A name resolving to IPv6 alone, or to both families, and ``[::]`` listening on IPv6
        only: ``bind``'s one socket of the family a colon suggests took none of these as
        the gateway had taken them (hostile pass 44). The port of the first socket.

        Raises:
            OSError: no address could be bound (the caller names its flag).
        """
        await self.runner.setup()
        assert self.runner.server is not None
        self._listener = await asyncio.get_running_loop().create_server(
            self.guard.protocol_factory(self.runner.server), host, port
        )
        return int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, cancel the deadlines, close the connections."""
        if self._listener is not None:
            self._listener.close()
        self.guard.close()
        await self.runner.cleanup()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 for a host with a colon).

    Raises:
        OSError: the address cannot be bound.
        TypeError, UnicodeError: a host the resolver cannot encode (a NUL, a non-IDNA
            name); the socket is closed whatever ``bind`` raised.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


class RefusedCollector(Collector):
    """``<name>_total{reason}``: what a guard refused, read fresh on every scrape."""

    def __init__(self, guard: ConnectionGuard, name: str) -> None:
        self._guard, self._name = guard, name

    def collect(self) -> Iterator[Metric]:
        """One counter family, a sample per reason seen."""
        family = CounterMetricFamily(
            self._name,
            "HTTP connections or requests refused, by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(self._guard.refused.items()):
            family.add_metric([reason], count)
        yield family
