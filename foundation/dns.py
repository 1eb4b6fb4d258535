"""Every replica behind a headless Service's name: one DNS resolver for all who need it.

Lookups run in a small executor of their own, one at a time per name. glibc's resolver
blocks a thread for as long as the DNS server does not answer (30 s and more), and a
caller's timeout cancels its await, not that thread: in the event loop's default
executor, which aiohttp's resolver shares, a few hung names starved every scrape of a
healthy hostname. Here a hung name holds one thread, and callers asking for it while
its lookup runs wait on that same lookup.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import socket
from typing import Any

from foundation.endpoint_slices import is_pod_address

MAX_LOOKUPS = 8
"""Lookups of distinct names running at once; more wait their turn."""

_EXECUTOR = concurrent.futures.ThreadPoolExecutor(MAX_LOOKUPS, thread_name_prefix="dns")
_IN_FLIGHT: dict[tuple[str, int], concurrent.futures.Future[Any]] = {}


async def resolve_addresses(host_port: str) -> tuple[list[str], int]:
    """Every IPv4 A record of ``host`` in ``host:port``, sorted and unique, and the port.

    Only addresses a pod can have (``endpoint_slices.is_pod_address``).

    A headless Service answers one A record per ready pod, so this lists the replicas.

    Raises:
        OSError: the name does not resolve, or resolves to no address a pod can have
            (0.0.0.0, multicast: a filtering resolver's answer for a blocked name). Read as
            no replicas it made every caller take the fleet as gone and its load as 0.
        ValueError: ``host_port`` has no numeric port.
    """
    host, _, port = host_port.rpartition(":")
    key = (host, int(port))
    lookup = _IN_FLIGHT.get(key)
    if lookup is None:
        lookup = _EXECUTOR.submit(_getaddrinfo, *key)
        _IN_FLIGHT[key] = lookup
        lookup.add_done_callback(lambda done: _forget(key, done))
    # Shielded: a caller's timeout leaves the lookup running for the others; its
    # outcome is marked seen, as no one may be left to await it.
    waited = asyncio.wrap_future(lookup)
    waited.add_done_callback(_seen)
    infos = await asyncio.shield(waited)
    found = {str(info[4][0]) for info in infos}
    # 0.0.0.0 connects to this host: a gateway on its replicas' port forwards to itself.
    pods = sorted(a for a in found if is_pod_address(ipaddress.IPv4Address(a)))
    if found and not pods:
        shown = ", ".join(sorted(found)[:3])
        raise OSError(f"{host} resolves to no address a pod can have ({shown})")
    return pods, key[1]


def _getaddrinfo(host: str, port: int) -> list[Any]:
    return socket.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)


def _seen(waited: asyncio.Future[Any]) -> None:
    if not waited.cancelled():
        waited.exception()


def _forget(key: tuple[str, int], done: concurrent.futures.Future[Any]) -> None:
    if _IN_FLIGHT.get(key) is done:
        del _IN_FLIGHT[key]
