"""The gateway's configuration: flags alone work; a YAML file (a ConfigMap) says more.

Replicas are the union of ``replicas`` (URLs), ``dns`` (every A record of a headless
Service) and ``endpoint-slices`` (the ready endpoints of a Service, watched through the
API). Keys are kebab-case, durations Go-style (each between a floor and a ceiling), sizes
in bytes or with a Kubernetes suffix (``16Mi``); hot-reloaded like the scaler's. Integer
and ratio keys take numbers only (``strict``): ``buffer-size: false`` (meant as "no
limit") was taken as 0 and answered every request at zero 429; ``true`` or ``"5"`` is
refused, naming the key.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator
from yarl import URL

from foundation.configfile import (
    DNS_NAME,
    KEBAB_CASE,
    host_port,
    load_mapping,
    printable_url,
    validate,
)
from foundation.discovery import EndpointSlicesConfig
from foundation.durations import Seconds
from foundation.errors import quote
from serving.arrivals import MIN_FILE_BYTES, ArrivalSettings
from serving.gateway_settings import GatewaySettings
from serving.routing import MAX_WAKE_FLOOR
from serving.slo import SloTargets

MIN_INTERVAL = 0.1
"""The shortest interval or window a key takes (seconds): a 1 ns ``health-interval`` is
thousands of probes a second per replica, a 1 ns ``rate-window`` a billion requests a
second from one arrival. ``unitscale demo`` compresses time (100 ms windows at 100x)."""
MIN_SLO_SECONDS = 0.001
"""The shortest SLO target (as the ``--slo-*`` flags): 1 ns would judge every request
outside, and push the fleet to its maximum."""
MIN_TIMEOUT = 1.0
"""The shortest ``upstream-timeout`` and ``wake-timeout``: below a second, every answer
would be a 504 blamed on its replica, every wake a failure."""
MAX_WAIT = 3600.0
"""The longest timeout, interval or window a key takes (seconds), as ``slo.window``: a
``rate-window`` of 1000 h published 10 requests a second to the scaler as 0.00017."""
MAX_HEALTH_INTERVAL = 60.0
"""The longest ``health-interval``: a replica marked down by one refused connection is
routed nothing until its next check."""
MAX_IDLE = 86400.0
"""The longest ``sleep-after-idle``: a day."""
MAX_REPLICAS = 1024
"""Static replica URLs: each is checked every ``health-interval`` in a task of its own."""
MAX_MODEL_ID_CHARS = 512
"""The longest model name listed (as a replica's answer is read: ``serving.replica_answers``)."""

_DEFAULTS = GatewaySettings()
"""Where every default below comes from."""
_SLO = _DEFAULTS.slo
_ARRIVALS = _DEFAULTS.arrivals

_SIZE = re.compile(r"([0-9]{1,15})(Ki|Mi|Gi|k|M|G)?")  # ASCII digits only, as Kubernetes
_SIZE_UNITS = {None: 1, "k": 1000, "M": 1000**2, "G": 1000**3}
_SIZE_UNITS |= {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


def parse_size(value: object) -> int:
    """A number of bytes, bare or with a Kubernetes suffix (``k``, ``M``, ``G``, ``Ki``, ...).

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"expected a size such as 16Mi or 1048576, got {quote(value)}")
    return int(match[1]) * _SIZE_UNITS[match[2]]


def replica_url(url: str) -> str:
    """A replica's base URL, ``http[s]://host[:port]`` with no trailing slash.

    Raises:
        ValueError: anything else: no host, a port outside 1-65535, a path, a query, a
            fragment or user info (which every log line would print), a control
            character, a space or any character outside ASCII.
    """
    expected = f"expected http://host:port, got {quote(url)}"
    if not printable_url(url):  # "http://\xa0" was a replica on host " ", failing quietly
        raise ValueError(f"{expected}: a space, a control character or a non-ASCII one")
    try:
        parsed = URL(url)
    except ValueError as err:
        raise ValueError(f"{expected}: {err}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(expected)
    if len(parsed.host) > 253:  # no resolver takes it: every check would fail quietly
        raise ValueError(f"{expected}: a host name of at most 253 characters")
    if parsed.explicit_port == 0:
        raise ValueError(f"{expected}: port 0")
    if parsed.path not in ("", "/") or parsed.query_string or parsed.fragment:
        raise ValueError(f"{expected}: a path, query or fragment would prefix every request")
    if parsed.user is not None or parsed.password is not None:
        raise ValueError(f"{expected}: user info would be logged with the replica")
    return url.rstrip("/")


Size = Annotated[int, BeforeValidator(parse_size)]
"""Bytes, written ``16777216`` or ``16Mi``."""


class SloConfig(BaseModel):
    """The ``slo`` block: what a request must meet to count as within."""

    model_config = KEBAB_CASE

    ttft: Seconds = Field(_SLO.ttft_seconds, ge=MIN_SLO_SECONDS, le=3600)
    """Time to first token, from the gateway's arrival (1 ms to an hour)."""
    itl: Seconds = Field(_SLO.itl_seconds, ge=MIN_SLO_SECONDS, le=60)
    """Mean inter-token latency of one request (1 ms to a minute)."""
    attainment: float = Field(_SLO.attainment, gt=0, le=1, strict=True)
    """The share of requests to keep within both, above 0 and at most 1."""
    window: Seconds = Field(_SLO.window_seconds, ge=MIN_INTERVAL, le=3600)
    """The window the within and outside rates are published over (up to an hour)."""

    def targets(self) -> SloTargets:
        """The targets as the gateway judges by them."""
        return SloTargets(self.ttft, self.itl, self.attainment, self.window)


class ArrivalsConfig(BaseModel):
    """The ``arrivals`` block: the gateway's record of its traffic (``serving.arrivals``)."""

    model_config = KEBAB_CASE

    directory: (
        # Not blank: "   " would be a directory named by spaces, made in the working dir.
        Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*[^\x00\s][^\x00]*$")] | None
    ) = _ARRIVALS.directory
    """Where the files go (created if missing); null: nothing is recorded."""
    max_file_bytes: Size = Field(_ARRIVALS.max_file_bytes, ge=MIN_FILE_BYTES, le=1024**4)
    """Bytes of one file, header included (at least 1 KiB, at most 1 TiB)."""
    max_files: int = Field(_ARRIVALS.max_files, ge=1, le=10_000, strict=True)
    """Files kept, the one being written included; the oldest is deleted past it."""

    def settings(self) -> ArrivalSettings:
        """The recorder's settings."""
        return ArrivalSettings(self.directory, self.max_file_bytes, self.max_files)


class GatewayConfig(BaseModel):
    """Everything the gateway reads from its ConfigMap."""

    model_config = KEBAB_CASE

    # Kubernetes' bounds: each is a label of every metric and the scaler's signals key.
    namespace: Annotated[str, Field(pattern=DNS_NAME, max_length=63)] = _DEFAULTS.namespace
    deployment: Annotated[str, Field(pattern=DNS_NAME, max_length=253)] = _DEFAULTS.deployment
    """The target the scaler knows the replicas by (its ScaledObjects' ``deployment``)."""
    replicas: list[str] = Field(default_factory=list, max_length=MAX_REPLICAS)
    """Replica base URLs (``http://host:port``), at most ``MAX_REPLICAS``; duplicates once."""
    dns: str | None = _DEFAULTS.dns
    """``host:port`` of a headless Service: every A record is a replica."""
    endpoint_slices: EndpointSlicesConfig | None = None
    """A Service whose ready endpoints are replicas, ``http://address:port``: its
    ``path`` is ``/`` (the default here), as a replica URL has none."""
    models: tuple[Annotated[str, Field(max_length=MAX_MODEL_ID_CHARS, pattern=r"\S")], ...] = Field(
        _DEFAULTS.models, max_length=4096
    )
    """Models (and LoRA adapters) served: known at zero replicas, where others get 404."""
    buffer_size: int = Field(_DEFAULTS.buffer_size, ge=0, le=10**6, strict=True)
    """Requests that may wait for a replica; one more is answered 429."""
    buffer_bytes: Size = Field(_DEFAULTS.buffer_bytes, ge=0, le=1024**4)
    """Bytes of bodies that may wait for a replica; a request that would pass it gets 429."""
    buffer_timeout: Seconds = Field(_DEFAULTS.buffer_timeout, ge=MIN_INTERVAL, le=MAX_WAIT)
    """How long a request may wait; then 503. Above a local-disk cold start (~40 s); at
    least 100ms (1 ns answered every request at zero replicas 503 at once)."""
    max_request_bytes: Size = Field(_DEFAULTS.max_request_bytes, gt=0, le=1024**4)
    """The largest request body; a larger one gets 413."""
    body_timeout: Seconds = Field(_DEFAULTS.body_timeout, ge=MIN_INTERVAL, le=MAX_WAIT)
    """How long a client may take to send its whole body; then 408."""
    upstream_timeout: Seconds = Field(_DEFAULTS.upstream_timeout, ge=MIN_TIMEOUT, le=MAX_WAIT)
    """How long a replica may stay silent: to its response headers (then 504), between
    two chunks of its body, or a stream between its tokens (then that response ends
    broken). At least a second."""
    health_interval: Seconds = Field(
        _DEFAULTS.health_interval, ge=MIN_INTERVAL, le=MAX_HEALTH_INTERVAL
    )
    """How often each replica is checked (at least 100ms: each check is three requests)."""
    rate_window: Seconds = Field(_DEFAULTS.rate_window, ge=MIN_INTERVAL, le=MAX_WAIT)
    """The window of the arrival and error rates (at least 100ms: one arrival in a 1 ns
    window would read as a billion a second)."""
    connect_retries: int = Field(_DEFAULTS.connect_retries, ge=0, le=10, strict=True)
    """More tries, each on another replica, after one that refused the connection or
    dropped the request before any byte of an answer."""
    wake_timeout: Seconds = Field(_DEFAULTS.wake_timeout, ge=MIN_TIMEOUT, le=MAX_WAIT)
    """How long a sleeping replica's ``POST /wake_up`` may take; then another is woken.
    At least a second."""
    wake_at_outstanding: int | None = Field(
        _DEFAULTS.wake_at_outstanding, ge=1, le=MAX_WAKE_FLOOR, strict=True
    )
    """Wake a sleeping replica when every ready one has this many requests outstanding
    (at most ``MAX_WAKE_FLOOR``: past it, the threshold's float overflowed)."""
    wake_retry_after: Seconds = Field(_DEFAULTS.wake_retry_after, ge=MIN_INTERVAL, le=MAX_WAIT)
    """How long a replica whose wake or sleep failed is passed over, doubled per failure
    in a row (at most 8x)."""
    standby_scaler: str | None = _DEFAULTS.standby_scaler
    """``host:port`` of the scaler: its standby plan's sleepers are put to sleep."""
    standby_interval: Seconds = Field(_DEFAULTS.standby_interval, ge=MIN_INTERVAL, le=MAX_WAIT)
    """How often the standby plan is asked for."""
    sleep_after_idle: Seconds = Field(_DEFAULTS.sleep_after_idle, ge=0, le=MAX_IDLE)
    """How long a surplus replica must be idle (or awake since a wake) before it sleeps."""
    slo: SloConfig = Field(default_factory=SloConfig)
    """The SLO every request is judged against (``unitscale_gateway_slo_requests_total``)."""
    arrivals: ArrivalsConfig = Field(default_factory=ArrivalsConfig)
    """Recording the traffic for ``unitscale replay`` and ``unitscale tune``; off by default."""

    @field_validator("replicas")
    @classmethod
    def _urls(cls, replicas: list[str]) -> list[str]:
        return list(dict.fromkeys(replica_url(url) for url in replicas))

    @field_validator("endpoint_slices", mode="before")
    @classmethod
    def _slices_at_the_root(cls, value: object) -> object:
        # The exporter's default path is /metrics: taken here, every replica was
        # http://address:port/metrics, checked at /metrics/health (404), never ready,
        # and every request waited out the buffer for a 503.
        if isinstance(value, dict) and "path" not in value:
            return {**value, "path": "/"}
        return value

    @field_validator("endpoint_slices")
    @classmethod
    def _slices_without_a_path(cls, value: EndpointSlicesConfig | None) -> object:
        if value is not None and value.path != "/":
            raise ValueError(
                f"path {quote(value.path)}: a path would prefix every request; a replica is"
                " http://address:port (path: /, the default)"
            )
        return value

    @field_validator("dns", "standby_scaler")
    @classmethod
    def _host_port(cls, address: str | None) -> str | None:
        return None if address is None else host_port(address)

    @model_validator(mode="after")
    def _largest_request_fits_the_buffer(self) -> GatewayConfig:
        if self.buffer_bytes < self.max_request_bytes:
            raise ValueError(
                f"buffer-bytes ({self.buffer_bytes}) is below max-request-bytes "
                f"({self.max_request_bytes}): a request of the largest size could never wait"
            )
        return self

    def settings(self) -> GatewaySettings:
        """The gateway's runtime settings."""
        return GatewaySettings(
            namespace=self.namespace,
            deployment=self.deployment,
            buffer_size=self.buffer_size,
            buffer_bytes=self.buffer_bytes,
            buffer_timeout=self.buffer_timeout,
            max_request_bytes=self.max_request_bytes,
            body_timeout=self.body_timeout,
            upstream_timeout=self.upstream_timeout,
            models=self.models,
            health_interval=self.health_interval,
            connect_retries=self.connect_retries,
            rate_window=self.rate_window,
            dns=self.dns,
            wake_timeout=self.wake_timeout,
            wake_at_outstanding=self.wake_at_outstanding,
            wake_retry_after=self.wake_retry_after,
            standby_scaler=self.standby_scaler,
            standby_interval=self.standby_interval,
            sleep_after_idle=self.sleep_after_idle,
            slo=self.slo.targets(),
            arrivals=self.arrivals.settings(),
        )


def parse_config(
    text: str, origin: str, overrides: dict[str, object] | None = None
) -> GatewayConfig:
    """Validate YAML text, flags in ``overrides`` winning.

    Raises:
        ConfigError: bad YAML or a bad key (named in the message).
    """
    data = load_mapping(text, origin)
    data.update(overrides or {})
    return validate(GatewayConfig, data, origin)
