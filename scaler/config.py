"""The scaler's own configuration: a YAML file, mounted from a ConfigMap.

Keys are kebab-case, durations Go-style. ``ScalerConfig()`` is the documented
default; ``deploy/scaler-configmap.yaml`` shows every key. A bad file at startup is
fatal (``ConfigError`` names the key); hot reload arrives with the decision core.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from unitscale.durations import Seconds
from unitscale.errors import ConfigError

_FROZEN = ConfigDict(
    frozen=True,
    extra="forbid",
    alias_generator=lambda name: name.replace("_", "-"),
    validate_by_name=True,  # Python callers write max_signal_age=..., YAML max-signal-age
)


class SignalSourceConfig(BaseModel):
    """One process serving ``unitscale.v1.SignalsService`` (exporter or gateway)."""

    model_config = _FROZEN

    address: Annotated[str, Field(min_length=1)]
    """``host:port`` to dial; a headless Service name reaches every pod behind it."""
    reconnect_min: Seconds = Field(0.5, gt=0)
    """First wait after a broken watch; doubles up to ``reconnect-max``."""
    reconnect_max: Seconds = Field(30.0, gt=0)


class DemoSourceConfig(BaseModel):
    """A built-in synthetic signal source, for the demo and benchmarks."""

    model_config = _FROZEN

    namespace: str = "demo"
    deployments: list[str] = Field(default_factory=lambda: ["llama-chat"], min_length=1)
    interval: Seconds = Field(1.0, gt=0)
    """How often each deployment publishes a new snapshot."""
    period: Seconds = Field(60.0, gt=0)
    """Length of one demo load cycle (ramp, burst, idle, return)."""
    peak_concurrency: float = Field(64.0, gt=0)
    """Requests in flight at the top of the burst."""


class ScalerConfig(BaseModel):
    """Everything the scaler reads from its ConfigMap."""

    model_config = _FROZEN

    signal_sources: list[SignalSourceConfig] = Field(default_factory=list)
    """Exporters and gateways to watch. Empty is allowed only with ``demo-source``."""
    max_signal_age: Seconds = Field(30.0, gt=0)
    """Signals older than this make KEDA RPCs answer UNAVAILABLE (KEDA's fallback
    applies) instead of acting on old data. 30 s is two exporter scrapes at the
    default 15 s Prometheus interval."""
    demo_source: DemoSourceConfig | None = None
    """Publish synthetic signals in-process instead of (or beside) real sources."""
    grace_period: Seconds = Field(5.0, ge=0)
    """On SIGTERM, how long open RPCs may finish before the server stops."""


def load_config(path: Path | None) -> ScalerConfig:
    """Read and validate the config file; ``None`` gives the defaults.

    Raises:
        ConfigError: unreadable file, bad YAML, or a bad key (named in the message).
    """
    if path is None:
        return ScalerConfig()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
    return parse_config(text, origin=str(path))


def parse_config(text: str, origin: str = "<config>") -> ScalerConfig:
    """Validate config text (YAML); see ``load_config``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{origin}: not valid YAML: {err}") from err
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return ScalerConfig.model_validate(data)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            key = ".".join(str(part) for part in error["loc"])
            if error["type"] == "extra_forbidden":
                problems.append(f"unknown key {key!r}")
            elif error["type"] == "missing":
                problems.append(f"missing required key {key!r}")
            else:
                message = error["msg"].removeprefix("Value error, ")
                problems.append(f"key {key!r}={error.get('input')!r}: {message}")
        raise ConfigError(f"{origin}: " + "; ".join(problems)) from err
