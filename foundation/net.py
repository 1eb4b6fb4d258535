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


def check_bindable(flag: str, listen: str) -> None:
    """Raise the one line ``bind_error`` gives where ``listen`` cannot be bound, else nothing.

    For servers that bind in a library which logs its own failure first (gRPC's C core
    printed ``E... add_port.cc: Failed to add port`` before the command's one line): the
    host is resolved and each address bound here, as gRPC binds them (``SO_REUSEPORT``),
    then let go. The C library's short numeric forms (``127.1``, ``0``, ``0x7f.1``),
    which gRPC's resolver refuses, are refused here.

    Raises:
        ConfigError: ``listen`` is not HOST:PORT, does not resolve, or an address refuses.
    """
    host, port = split_listen(listen)
    if _numeric_shorthand(host):
        raise ConfigError(
            f"{flag} {quote(listen)}: write the address in full (a dotted quad or IPv6):"
            " gRPC does not read this short form"
        )
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError) as err:
        if isinstance(err, OSError):
            raise bind_error(flag, listen, err) from err
        raise ConfigError(f"{flag} {quote(listen)}: {err}") from err
    for family, kind, proto, _, address in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                probe.bind(address)
            except OSError as err:
                raise bind_error(flag, listen, err) from err


def _numeric_shorthand(host: str) -> bool:
    """A numeric host the C library reads (``127.1``) that is no full IPv4 or IPv6 address."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        return False
    try:
        socket.getaddrinfo(host, 0, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, ValueError):
        return False
    return True
