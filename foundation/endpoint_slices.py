"""EndpointSlices to replica ``/metrics`` URLs (pure: raw API objects in, URLs out).

The API's JSON form is the input (``addressType``, ``endpoints[].conditions.ready``,
``ports[].name``), so this module needs no Kubernetes client. A slice or an endpoint of
the wrong shape (``conditions: "ready"``, a port that is no number, an address that is no
IP or DNS name) is skipped alone and named in ``skipped``: one bad object must not fail
the list and hide every good replica with it.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label the EndpointSlice controller puts on every slice of a Service."""

_FQDN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
MAX_SLICE_ENDPOINTS = 1_000
"""The API's limit of endpoints in one slice: a slice past it is no API's."""
MAX_ENDPOINTS_READ = 10_000
"""Endpoints read per change, over every slice (by slice name): each costs microseconds
of the reader's event loop, and 100,000 had held it 0.4 s on every watch event. Far
above what a deployment is scraped or routed to (1,000, 1,024), terminating pods too."""


def is_pod_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether an IP can be a pod's: not unspecified, multicast or broadcast.

    ``0.0.0.0`` connects to the reader's own host (a gateway on its replicas' port
    forwards to itself); the others reach no single pod. An IPv4-mapped IPv6 address is
    judged as the IPv4 it maps (``::ffff:0.0.0.0`` reached the host too).
    """
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    broadcast = isinstance(address, ipaddress.IPv4Address) and address.packed == b"\xff" * 4
    return not (address.is_unspecified or address.is_multicast or broadcast)


def _is_numeric(name: str) -> bool:
    """Whether a resolver reads ``name`` as an IPv4 address (``0x0``, ``127.1``, ``0``)."""
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


class MalformedError(ValueError):
    """A slice or endpoint is not of the API's shape (the message says which field)."""


def is_ready(endpoint: Mapping[str, Any]) -> bool:
    """An endpoint takes traffic: ``conditions.ready`` true, or absent.

    The API says a missing ``ready`` is to be read as ready (old producers do not set
    it); ``terminating`` endpoints carry ``ready: false``.

    Raises:
        MalformedError: ``conditions`` is not an object, or ``ready`` not a boolean.
    """
    conditions = endpoint.get("conditions")
    if conditions is None:
        return True
    if not isinstance(conditions, Mapping):
        raise MalformedError("conditions is not an object")
    ready = conditions.get("ready")
    if ready is not None and not isinstance(ready, bool):
        raise MalformedError("conditions.ready is not a boolean")
    return ready is None or ready


def slice_port(eps: Mapping[str, Any], port: int | str) -> int | None:
    """The port to scrape on this slice's endpoints.

    A number is used as is (the scrape port need not be a Service port); a name is
    looked up among the slice's ports, each slice separately (slices of one Service
    may map a name to different container ports). ``None``: the name is not there.

    Raises:
        MalformedError: ``ports`` is not a list of objects, or the named port's number
            is not an integer in 1-65535.
    """
    if isinstance(port, int):
        return port
    for entry in _list(eps, "ports"):
        if entry.get("name") != port or entry.get("port") is None:
            continue
        number = entry["port"]
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
            raise MalformedError(f"port {str(port)[:63]!r} is not a number in 1-65535")
        return number
    return None


def host_for(address: str, address_type: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets).

    Raises:
        MalformedError: not an address of its type (text that would rewrite the URL).
    """
    try:
        if address_type == "IPv6" or (address_type != "FQDN" and ":" in address):
            v6 = ipaddress.IPv6Address(address)
            if v6.scope_id is not None:  # any text but "%" is a zone: "\n" went into URLs
                raise MalformedError("an IPv6 address with a zone id (a pod's is global)")
            if not is_pod_address(v6):
                raise MalformedError("an address no pod has (unspecified, multicast, broadcast)")
            return f"[{v6.compressed}]"
        if address_type == "FQDN":
            if _FQDN.fullmatch(address) is None or ".." in address or _is_numeric(address):
                raise MalformedError("an FQDN address is not a DNS name")
            return address
        v4 = ipaddress.IPv4Address(address)
        if not is_pod_address(v4):
            raise MalformedError("an address no pod has (unspecified, multicast, broadcast)")
        return str(v4)
    except ipaddress.AddressValueError as err:
        raise MalformedError(f"an address is not {address_type}") from err


def slice_targets(
    slices: Iterable[Mapping[str, Any]],
    port: int | str,
    *,
    scheme: str = "http",
    path: str = "/metrics",
    skipped: list[str] | None = None,
) -> list[str]:
    """Sorted, de-duplicated ``/metrics`` URLs of every ready endpoint of ``slices``.

    Only a slice's first address counts (the API: all addresses of one endpoint are
    fungible). Slices without the named port contribute nothing. A malformed slice or
    endpoint contributes nothing either (a slice of more than ``MAX_SLICE_ENDPOINTS``, an
    address no pod has); why is appended to ``skipped`` (when given). Slices are read by
    name, at most ``MAX_ENDPOINTS_READ`` endpoints in all.
    """
    urls: set[str] = set()
    problems: list[str] = [] if skipped is None else skipped
    left = MAX_ENDPOINTS_READ
    for eps in sorted(slices, key=_name):
        try:
            if not isinstance(eps, Mapping):
                raise MalformedError("a slice is not an object")
            number = slice_port(eps, port)
            if number is None:
                continue
            address_type = str(eps.get("addressType", "IPv4"))
            endpoints = _or_empty(eps.get("endpoints"))
            if not isinstance(endpoints, list):
                raise MalformedError("endpoints is not a list")
            if len(endpoints) > MAX_SLICE_ENDPOINTS:
                raise MalformedError(f"more than the API's {MAX_SLICE_ENDPOINTS:,} endpoints")
        except MalformedError as err:
            problems.append(f"slice {_name(eps)}: {err}")
            continue
        if len(endpoints) > left:  # a smaller slice by a later name may still be read
            problems.append(f"slice {_name(eps)}: past {MAX_ENDPOINTS_READ:,} endpoints, unread")
            continue
        left -= len(endpoints)
        for endpoint in endpoints:
            try:
                url = _endpoint_url(endpoint, address_type, number, scheme, path)
            except MalformedError as err:
                problems.append(f"slice {_name(eps)}: an endpoint skipped: {err}")
                continue
            if url is not None:
                urls.add(url)
    return sorted(urls)


def _endpoint_url(
    endpoint: object, address_type: str, number: int, scheme: str, path: str
) -> str | None:
    if not isinstance(endpoint, Mapping):
        raise MalformedError("an endpoint is not an object")
    addresses = _or_empty(endpoint.get("addresses"))
    if not isinstance(addresses, list):
        raise MalformedError("addresses is not a list")
    if not addresses or not is_ready(endpoint):
        return None
    first = addresses[0]
    if not isinstance(first, str) or len(first) > 253:
        raise MalformedError("an address is not a string of at most 253 characters")
    return f"{scheme}://{host_for(first, address_type)}:{number}{path}"


def _list(eps: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """``eps[key]`` as a list of objects (null is empty)."""
    value = _or_empty(eps.get(key))
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise MalformedError(f"{key} is not a list of objects")
    return value


def _or_empty(value: object) -> object:
    """The API sends null for an empty list; anything else is kept for the shape check."""
    return [] if value is None else value


def _name(eps: object) -> str:
    """A slice's name for a message, cut and quoted."""
    meta = eps.get("metadata") if isinstance(eps, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return repr(str(name)[:63]) if name is not None else "(unnamed)"
