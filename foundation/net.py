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


def free_port() -> int:
    """A loopback port nobody listens on right now (the demo, benchmarks, tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
