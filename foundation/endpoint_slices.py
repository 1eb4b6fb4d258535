"""EndpointSlices to replica ``/metrics`` URLs (pure: raw API objects in, URLs out).

The API's JSON form is the input (``addressType``, ``endpoints[].conditions.ready``,
``ports[].name``), so this module needs no Kubernetes client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label the EndpointSlice controller puts on every slice of a Service."""


def is_ready(endpoint: Mapping[str, Any]) -> bool:
    """An endpoint takes traffic: ``conditions.ready`` true, or absent.

    The API says a missing ``ready`` is to be read as ready (old producers do not set
    it); ``terminating`` endpoints carry ``ready: false``.
    """
    ready = (endpoint.get("conditions") or {}).get("ready")
    return ready is None or bool(ready)


def slice_port(eps: Mapping[str, Any], port: int | str) -> int | None:
    """The port to scrape on this slice's endpoints.

    A number is used as is (the scrape port need not be a Service port); a name is
    looked up among the slice's ports, each slice separately (slices of one Service
    may map a name to different container ports). ``None``: the name is not there.
    """
    if isinstance(port, int):
        return port
    for entry in eps.get("ports") or []:
        if entry.get("name") == port and entry.get("port") is not None:
            return int(entry["port"])
    return None


def host_for(address: str, address_type: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    if address_type == "IPv6" or (address_type != "FQDN" and ":" in address):
        return f"[{ipaddress.IPv6Address(address).compressed}]"
    return address


def slice_targets(
    slices: Iterable[Mapping[str, Any]],
    port: int | str,
    *,
    scheme: str = "http",
    path: str = "/metrics",
) -> list[str]:
    """Sorted, de-duplicated ``/metrics`` URLs of every ready endpoint of ``slices``.

    Only a slice's first address counts (the API: all addresses of one endpoint are
    fungible). Slices without the named port contribute nothing.
    """
    urls: set[str] = set()
    for eps in slices:
        number = slice_port(eps, port)
        if number is None:
            continue
        address_type = str(eps.get("addressType", "IPv4"))
        for endpoint in eps.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            if not addresses or not is_ready(endpoint):
                continue
            urls.add(f"{scheme}://{host_for(str(addresses[0]), address_type)}:{number}{path}")
    return sorted(urls)
