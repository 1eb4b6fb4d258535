"""The exporter's configuration: flags alone work; a YAML file (a ConfigMap) says more.

Keys are kebab-case, durations Go-style. Every setting has a default; the price of an
accelerator-hour too, and signals computed with the default price say so
(``price="default"`` on the cost metrics, ``price_is_default`` over gRPC).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator

from exporter.parse import MAX_BYTES, MAX_SERIES, Limits
from exporter.signals import Accelerator
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
from foundation.errors import ConfigError, quote
from foundation.files import MAX_CONFIG_BYTES, read_text
from foundation.replica_model import MAX_PRICE_PER_HOUR
from foundation.signals import MAX_DEPLOYMENT_LENGTH, MAX_MODEL_LENGTH, MAX_NAMESPACE_LENGTH

DEFAULT_PRICE_PER_HOUR = 3.50
"""US$ per accelerator-hour when none is configured: mid-range of 2026 neocloud H100/H200
on-demand prices (about $2.5-4/h; shared/reference/traces-and-calibration.md §5)."""

H200_MEMORY_MIB = 143_771
"""What nvidia-smi reports for an H200 (141 GB), for HAMi memory shares."""


class AcceleratorConfig(BaseModel):
    """What one replica holds, and what an accelerator-hour costs."""

    model_config = KEBAB_CASE

    price_per_hour: float | None = Field(None, ge=0, le=MAX_PRICE_PER_HOUR)
    """US$ per whole accelerator-hour; unset uses the documented default (3.50)."""
    count: float = Field(1.0, gt=0, le=64)
    """Accelerators per replica (``nvidia.com/gpu``)."""
    hami_gpucores: int | None = Field(None, ge=1, le=100)
    """HAMi ``nvidia.com/gpucores``: percent of each card's compute the replica gets."""
    hami_gpumem_mib: int | None = Field(None, ge=1)
    """HAMi ``nvidia.com/gpumem``: MiB of each card's memory the replica gets."""
    card_memory_mib: int = Field(H200_MEMORY_MIB, ge=1)
    """Memory of one card, to turn ``hami-gpumem-mib`` into a share."""

    @model_validator(mode="after")
    def _memory_fits(self) -> AcceleratorConfig:
        if self.hami_gpumem_mib is not None and self.hami_gpumem_mib > self.card_memory_mib:
            raise ValueError(
                f"hami-gpumem-mib ({self.hami_gpumem_mib}) exceeds card-memory-mib"
                f" ({self.card_memory_mib})"
            )
        return self

    def fraction(self) -> float:
        """Accelerators the replica is billed for.

        A HAMi share holds the larger of its compute and memory shares (nobody else
        can use what it holds): gpucores 30 and gpumem 40 GiB of a 141 GB card ->
        max(0.30, 0.285) = 0.30 of each of ``count`` cards.
        """
        shares = []
        if self.hami_gpucores is not None:
            shares.append(self.hami_gpucores / 100)
        if self.hami_gpumem_mib is not None:
            shares.append(self.hami_gpumem_mib / self.card_memory_mib)
        return self.count * (max(shares) if shares else 1.0)

    def accelerator(self) -> Accelerator:
        """The pricing the signal math uses."""
        default = self.price_per_hour is None
        price = DEFAULT_PRICE_PER_HOUR if self.price_per_hour is None else self.price_per_hour
        return Accelerator(price, self.fraction(), price_is_default=default)


MAX_TARGETS = 1000
"""Replicas one deployment may have scraped each cycle, all at once: an LLM fleet behind
one Service is tens to hundreds; every target is a connection and a parse per cycle, and
its history is kept, so what discovery names past this is refused (``runtime._take``),
and so is a config listing more."""


MAX_TOTAL_TARGETS = 4096
"""Targets every deployment of a config lists together, each scraped at once every cycle:
one YAML anchor of 1,000 targets named by 256 deployments (46 KB) had 256,000, the
exporter at 20,000 file descriptors and 1.16 GB, no cycle ending (hostile pass 65)."""


class DeploymentConfig(BaseModel):
    """One scaled workload and where its replicas' ``/metrics`` are."""

    model_config = KEBAB_CASE

    # The wire's bounds (``foundation.signals_wire``): a longer name is refused there, in
    # every message, so it is refused here, once, at start.
    namespace: Annotated[str, Field(pattern=DNS_NAME, max_length=MAX_NAMESPACE_LENGTH)] = "default"
    deployment: Annotated[str, Field(pattern=DNS_NAME, max_length=MAX_DEPLOYMENT_LENGTH)] = (
        "default"
    )
    model: Annotated[str, Field(max_length=MAX_MODEL_LENGTH)] = ""
    """The served model, for the ``model`` label; empty takes it from the engine."""
    engine: Literal["auto", "vllm", "sglang"] = "auto"
    targets: list[str] = Field(default_factory=list, max_length=MAX_TARGETS)
    """Replica URLs (``http://host:port``; ``/metrics`` is added when no path is given);
    at most ``MAX_TARGETS``: more was taken (40,000 in a 1 MiB config), then refused each
    cycle as a deployment too large to scrape."""
    dns: str | None = None
    """``host:port`` of a headless Service: every A record is a replica."""
    endpoint_slices: EndpointSlicesConfig | None = None
    """Watch the Service's EndpointSlices: every ready endpoint is a replica."""
    accelerator: AcceleratorConfig = Field(default_factory=AcceleratorConfig)

    @field_validator("targets")
    @classmethod
    def _urls(cls, targets: list[str]) -> list[str]:
        return [metrics_url(t) for t in targets]

    @field_validator("dns")
    @classmethod
    def _host_port(cls, dns: str | None) -> str | None:
        if dns is None:
            return None
        # The same host check as a target's: a 64-character label passed host_port and
        # failed every discovery cycle, for good, behind a flag that was accepted.
        problem = _host_problem(host_port(dns).rpartition(":")[0])
        if problem is not None:
            raise ValueError(f"{problem}, in {quote(dns)}")
        return dns


MAX_DEPLOYMENTS = 256
"""Deployments one exporter scrapes (the scaler's ``signal-sources`` bound): a 1 MiB
config of 12,000 was taken, each an EndpointSlice watch of its own on the API server."""
MAX_BODY_BYTES_LIMIT = 64 << 20
"""The most ``max-body-bytes`` may say: 64 MiB a target a cycle (vLLM sends ~50 kB);
10^12 was taken, a terabyte read into memory per target."""
MAX_SERIES_LIMIT = 1_000_000
"""The most ``max-series`` may say: a million wanted samples (vLLM has ~120)."""
MAX_STABLE_WINDOW = 3600.0
"""The longest ``stable-window``: an hour (the scaler's ``demand-window`` follows it, and
is an hour at most). Each replica keeps every scrape of the window; 2562047h kept them
for good, each cycle's windows walking them all (3 s of CPU a thousand cycles at 60 s,
10.7 s by the third thousand, growing)."""
MIN_INTERVAL = 0.1
"""The shortest ``interval``, ``panic-window`` and ``stable-window``: the demo's 5 s scrape
compressed 50 times. 1 ns was taken: the scrape loop spun a whole core, every cycle's
scrapes failing (hostile pass 51)."""
MIN_TIMEOUT = 0.01
"""The shortest ``timeout`` (the demo's compressed one is 40 ms): below it no connection
is made, and every scrape fails."""
MAX_INTERVAL = 600.0
"""The longest ``interval``: 10 minutes. 2562047h was taken: one scrape at start, then
none for 292 years, the scaler's signals stale all along."""
MAX_WINDOW_SCRAPES = 720
"""Scrapes a ``stable-window`` may span (an hour at the default 5 s interval): the
scrapes each replica keeps, whatever the interval."""


class ExporterConfig(BaseModel):
    """Everything the exporter reads from its ConfigMap."""

    model_config = KEBAB_CASE

    interval: Seconds = Field(5.0, ge=MIN_INTERVAL, le=MAX_INTERVAL)
    """Time between scrape cycles. 5 s: a 10 s panic window then holds 2-3 scrapes. 10 min
    at most (``MAX_INTERVAL``)."""
    timeout: Seconds = Field(2.0, ge=MIN_TIMEOUT, le=MAX_INTERVAL)
    """Per-scrape limit; a slower replica counts as down for that cycle."""
    panic_window: Seconds = Field(10.0, ge=MIN_INTERVAL, le=MAX_STABLE_WINDOW)
    """Short window for burst detection (Knative's panic window is 6 s of 60 s)."""
    stable_window: Seconds = Field(60.0, ge=MIN_INTERVAL, le=MAX_STABLE_WINDOW)
    """Longer window for steady-state rates, quantiles and cost: at most an hour, and at
    most ``MAX_WINDOW_SCRAPES`` intervals (each replica keeps its scrapes for it)."""
    max_body_bytes: int = Field(MAX_BYTES, ge=1024, le=MAX_BODY_BYTES_LIMIT)
    """Largest ``/metrics`` body read from one target (4 MiB); a larger one is a
    ``too-large`` failure, never parsed. vLLM sends about 50 kB per engine."""
    max_series: int = Field(MAX_SERIES, ge=1, le=MAX_SERIES_LIMIT)
    """Most wanted samples from one target per scrape (10,000); more is a
    ``too-many-series`` failure. One vLLM engine exposes about 120."""
    deployments: list[DeploymentConfig] = Field(default_factory=list, max_length=MAX_DEPLOYMENTS)
    """At most ``MAX_DEPLOYMENTS``: each is a set of scrapes every cycle, and with
    ``endpoint-slices`` a watch of its own on the API server."""

    def limits(self) -> Limits:
        """What one target may send in one scrape."""
        return Limits(self.max_body_bytes, self.max_series)

    @model_validator(mode="after")
    def _consistent(self) -> ExporterConfig:
        if self.timeout >= self.interval:
            raise ValueError(
                f"timeout ({self.timeout}s) must be shorter than interval ({self.interval}s)"
            )
        if self.panic_window > self.stable_window:
            raise ValueError("panic-window must not be longer than stable-window")
        if self.stable_window > MAX_WINDOW_SCRAPES * self.interval:
            raise ValueError(
                f"stable-window ({self.stable_window:g}s) must hold at most"
                f" {MAX_WINDOW_SCRAPES} intervals ({self.interval:g}s each)"
            )
        total = sum(len(d.targets) for d in self.deployments)
        if total > MAX_TOTAL_TARGETS:
            raise ValueError(
                f"the deployments list {total} targets together, more than the"
                f" {MAX_TOTAL_TARGETS} one exporter scrapes at once each cycle"
            )
        keys = [(d.namespace, d.deployment, d.model) for d in self.deployments]
        if len(set(keys)) != len(keys):
            raise ValueError("two deployments share namespace, deployment and model")
        return self


MAX_TARGET_LENGTH = 2048
"""The longest ``--target`` or ``targets`` entry: a URL, not a document (it is logged)."""


def metrics_url(target: str) -> str:
    """``host:port`` or ``http://host:port`` -> ``http://host:port/metrics``.

    The host is an IP literal or a name a resolver can take (printable ASCII, at most 253
    characters, 63 per label): one that no resolver can take would fail every scrape as
    an "internal" error, for good, behind a flag that was accepted.

    Raises:
        ValueError: not an http(s) URL with such a host and a port in 0-65535.
    """
    if len(target) > MAX_TARGET_LENGTH:
        raise ValueError(f"a target of at most {MAX_TARGET_LENGTH} characters, got {quote(target)}")
    if not printable_url(target):
        raise ValueError(
            f"a target of printable ASCII (no spaces, no control characters), got {quote(target)}"
        )
    url = target if "://" in target else f"http://{target}"
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
        parts.port  # noqa: B018 - raises for a port outside 0-65535
    except ValueError:  # an unbalanced IPv6 bracket, a port out of range
        hostname = None
    if hostname is None or parts.scheme not in ("http", "https"):
        raise ValueError(f"expected http://host:port[/path], got {quote(target)}")
    if re.search(r"\](?!:|$)", parts.netloc):  # "[::1]x": every scrape failed later
        raise ValueError(f"expected http://host:port[/path], got {quote(target)}")
    if "@" in parts.netloc:  # not quoted back: the password is the point
        raise ValueError(
            "a target without user info: every series' target label and the logs would carry it"
        )
    problem = _host_problem(hostname)
    if problem is not None:
        raise ValueError(f"{problem}, in {quote(target)}")
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/metrics"


def _host_problem(hostname: str) -> str | None:
    """Why no resolver can take ``hostname``, or None (an IP literal or a DNS name)."""
    try:
        ipaddress.ip_address(hostname)
        return None
    except ValueError:
        pass
    name = hostname.removesuffix(".")
    if not name or len(name) > 253:
        return "a host name of 1-253 characters"
    if any(not 1 <= len(label) <= 63 for label in name.split(".")):
        return "a host name whose labels are 1-63 characters"
    try:
        name.encode("idna")
    except UnicodeError:
        return "a host name IDNA can encode"
    return None


def parse_config(
    text: str,
    origin: str = "<config>",
    overrides: dict[str, object] | None = None,
    extra_deployments: list[dict[str, object]] | None = None,
) -> ExporterConfig:
    """Validate config text (YAML), then flag ``overrides`` and flag-given deployments.

    A hot reload calls this with the same overrides, so flags keep winning.

    Raises:
        ConfigError: bad YAML or a bad key (named in the message).
    """
    data = load_mapping(text, origin)
    data.update(overrides or {})
    if extra_deployments:
        listed = data.get("deployments") or []
        if not isinstance(listed, list):
            raise ConfigError(f"{origin}: key 'deployments': expected a list")
        data["deployments"] = [*listed, *extra_deployments]
    return validate(ExporterConfig, data, origin)


def load_config(
    path: Path | None,
    overrides: dict[str, object] | None = None,
    extra_deployments: list[dict[str, object]] | None = None,
) -> ExporterConfig:
    """Read the YAML file (or nothing), apply flag ``overrides``, validate.

    Raises:
        ConfigError: unreadable file, bad YAML, or a bad key (named in the message).
    """
    if path is None:
        return parse_config("", "flags", overrides, extra_deployments)
    text = read_text(path, MAX_CONFIG_BYTES, "config file")
    return parse_config(text, str(path), overrides, extra_deployments)
