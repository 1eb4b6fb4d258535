"""Every replica behind a headless Service's name: one DNS resolver for all who need it."""

from __future__ import annotations

import asyncio
import socket


async def resolve_addresses(host_port: str) -> tuple[list[str], int]:
    """Every IPv4 A record of ``host`` in ``host:port``, sorted and unique, and the port.

    A headless Service answers one A record per ready pod, so this lists the replicas.

    Raises:
        OSError: the name does not resolve.
        ValueError: ``host_port`` has no numeric port.
    """
    host, _, port = host_port.rpartition(":")
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, int(port), family=socket.AF_INET, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos}), int(port)
