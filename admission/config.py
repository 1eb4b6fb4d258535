"""The admission controller's configuration: every key has a default; a YAML file says more.

Keys are kebab-case, durations Go-style (``30s``, ``5m``), as the other roles' files.
Read once at startup (``--config FILE``): a bad file exits with status 2 naming the key.
``--controller-name`` on the command line wins over ``controller-name`` in the file.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from foundation.configfile import KEBAB_CASE, load_mapping, validate
from foundation.durations import Seconds
from foundation.errors import quote
from foundation.files import MAX_CONFIG_BYTES, read_text

DEFAULT_CONTROLLER_NAME = "unitscale.io/capacity"
# A Kueue controllerName (1-253 characters) that is also a field manager (at most 128
# printable characters): a DNS-subdomain-ish prefix and a path, as Kueue's own names.
# As ``unitscale.flags`` checks ``--metrics-listen`` (the layers keep it out of reach
# here): an ASCII name or IPv4 address, or a bracketed IPv6 one. A non-ASCII or NUL host
# passed the port-only check and raised a 33-line TypeError at bind (issue 27, M1).
_LISTEN = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]|[A-Za-z0-9._-]{1,253}):(?P<port>[0-9]{1,5})"
)
_CONTROLLER_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[-A-Za-z0-9_.]+)+")


class LoggingConfig(BaseModel):
    """How the controller logs."""

    model_config = KEBAB_CASE

    level: Literal["debug", "info", "warning", "error"] | None = None
    """None keeps ``--log-level`` (default info)."""
    format: Literal["text", "json"] = "text"
    """``json``: one JSON object a line, for a cluster's log pipeline."""


class AdmissionConfig(BaseModel):
    """Everything the admission controller reads from its config file."""

    model_config = KEBAB_CASE

    controller_name: str = DEFAULT_CONTROLLER_NAME
    """The ``spec.controllerName`` of the AdmissionChecks this controller serves; also
    its field manager for status writes."""
    metrics_listen: str = "0.0.0.0:9094"
    """``host:port`` of ``/metrics`` and ``/healthz``."""
    resync: Seconds = Field(300.0, ge=5, le=86_400)
    """Each watch lists again this often, repairing a missed event; a full reconcile
    runs at least this often too."""
    debounce: Seconds = Field(0.5, ge=0, le=60)
    """The least time between the starts of two passes: a change after a quiet spell is
    reconciled at once, the changes of a burst in the next pass (1,000 Workloads created
    at once cost a few passes, not 1,000)."""
    demand_cache: Seconds = Field(15.0, ge=0, le=3_600)
    """How long one answer of the scaler's inference forecast is reused."""
    demand_timeout: Seconds = Field(2.0, ge=0.1, le=60)
    """Longest wait for the scaler's answer; then ``whenUnavailable`` applies. 100 ms at
    least: 1 ms never heard an answer over a 5 ms round trip, and every headroom check
    read "forecast unavailable" (hostile pass 52)."""
    write_concurrency: int = Field(8, ge=1, le=64)
    """Status writes in flight at once. More clear a backlog sooner and cost a stream's
    tail (``bench/admission.py`` on 2 cores, five runs each: at 32 a backlog of 1,000 is
    decided at 126/s against 102/s, median, and a stream's p99 rises from 1.10 to 1.15 s
    with pods placed, 0.97 to 1.25 s without)."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @field_validator("controller_name")
    @classmethod
    def _controller_name(cls, name: str) -> str:
        return check_controller_name(name)

    @field_validator("write_concurrency", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: object) -> object:
        # pydantic takes true as 1: a boolean is no count (issue 27, hostile pass 5, M5)
        if isinstance(value, bool):
            raise ValueError(f"expected a whole number, got {quote(value)}")
        return value

    @field_validator("metrics_listen")
    @classmethod
    def _listen(cls, listen: str) -> str:
        match = _LISTEN.fullmatch(listen)
        # Port 0 is allowed: the kernel picks one (tests, a second local instance).
        valid = match is not None and int(match["port"]) <= 65535
        if valid and match is not None and match["v6"] is not None:
            try:
                ipaddress.IPv6Address(match["v6"])
            except ValueError:
                valid = False
        if not valid:
            raise ValueError(
                f"expected HOST:PORT (port 0-65535, an ASCII host, IPv6 as [::1]:PORT),"
                f" got {quote(listen)}"
            )
        return listen


def check_controller_name(name: str) -> str:
    """``name`` when it can be both a Kueue controllerName and a field manager.

    Raises:
        ValueError: anything else, the value quoted.
    """
    if len(name) > 128 or not _CONTROLLER_NAME.fullmatch(name):
        raise ValueError(
            f"expected a name such as {DEFAULT_CONTROLLER_NAME} (domain/path, at most "
            f"128 characters), got {quote(name)}"
        )
    return name


def parse_config(
    text: str, origin: str = "<config>", overrides: dict[str, object] | None = None
) -> AdmissionConfig:
    """Validate config text (YAML), then the command line's ``overrides``.

    Raises:
        ConfigError: bad YAML or a bad key (named in the message).
    """
    data = load_mapping(text, origin)
    data.update(overrides or {})
    return validate(AdmissionConfig, data, origin)


def load_config(path: Path | None, overrides: dict[str, object] | None = None) -> AdmissionConfig:
    """Read and validate the config file (``None``: the defaults and the overrides).

    Raises:
        ConfigError: unreadable file, bad YAML, or a bad key (named in the message).
    """
    if path is None:
        return parse_config("", "flags", overrides)
    text = read_text(path, MAX_CONFIG_BYTES, "config file")
    return parse_config(text, str(path), overrides)
