"""Listen addresses as the servers take them."""

from __future__ import annotations

from unitscale.errors import ConfigError


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[v6]:PORT``) -> (host, port).

    Raises:
        ConfigError: not HOST:PORT.
    """
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)
