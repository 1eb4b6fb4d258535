"""Listen addresses as the servers take them, and free loopback ports for local runs."""

from __future__ import annotations

import os
import socket

from foundation.errors import ConfigError, quote


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[v6]:PORT``) -> (host, port).

    Raises:
        ConfigError: not HOST:PORT.
    """
    host, _, port = listen.rpartition(":")
    # ASCII digits, 0-65535: isdigit() took '٠', and int() of any length
    if not host or not (port.isascii() and port.isdigit() and len(port) <= 5):
        raise ConfigError(f"expected HOST:PORT, got {quote(listen)}")
    if int(port) > 65535:
        raise ConfigError(f"expected HOST:PORT with a port 0-65535, got {quote(listen)}")
    return host.strip("[]"), int(port)


def free_port() -> int:
    """A loopback port nobody listens on right now (the demo, benchmarks, tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bind_error(flag: str, address: str, err: OSError) -> ConfigError:
    """A bind or lookup failure as one line naming ``flag`` and the ``address`` it gave.

    The error alone said only ``[Errno -2] Name or service not known``. A gaierror (a
    name that does not resolve) has a strerror; ``os.strerror(-2)`` has none.
    """
    why = err.strerror or (os.strerror(err.errno) if err.errno else "cannot bind there")
    return ConfigError(f"{flag} {quote(address)}: {why}")


def join_listen(listen: tuple[str, int]) -> str:
    """``split_listen``'s parts as an address again (an IPv6 host in brackets)."""
    host, port = listen
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
