"""Listen addresses as the servers take them, and free loopback ports for local runs."""

from __future__ import annotations

import socket

from foundation.errors import ConfigError


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[v6]:PORT``) -> (host, port).

    Raises:
        ConfigError: not HOST:PORT.
    """
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def bind(listen: tuple[str, int], what: str) -> socket.socket:
    """A TCP socket bound to ``listen`` (port 0 picks one; ``getsockname`` tells which).

    Bound before the server starts, so a port-0 server knows its port and a taken port
    fails at start with the flag or key named (``what``), not later in the event loop.

    Raises:
        ConfigError: the address cannot be bound.
    """
    host, port = listen
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(listen)
    except OSError as err:
        sock.close()
        raise ConfigError(f"{what} {host}:{port}: {err.strerror}") from err
    return sock


def free_port() -> int:
    """A loopback port nobody listens on right now (the demo, benchmarks, tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
