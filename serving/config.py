"""The gateway's configuration: flags alone work; a YAML file (a ConfigMap) says more.

Replicas are the union of ``replicas`` (URLs), ``dns`` (every A record of a headless
Service) and ``endpoint-slices`` (the ready endpoints of a Service, watched through the
API). Keys are kebab-case, durations Go-style; hot-reloaded like the scaler's.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from foundation.configfile import DNS_NAME, KEBAB_CASE, load_mapping, validate
from foundation.discovery import EndpointSlicesConfig
from foundation.durations import Seconds
from serving.gateway_settings import GatewaySettings

_DEFAULTS = GatewaySettings()
"""Where every default below comes from."""


class GatewayConfig(BaseModel):
    """Everything the gateway reads from its ConfigMap."""

    model_config = KEBAB_CASE

    namespace: Annotated[str, Field(pattern=DNS_NAME)] = _DEFAULTS.namespace
    deployment: Annotated[str, Field(pattern=DNS_NAME)] = _DEFAULTS.deployment
    """The target the scaler knows the replicas by (its ScaledObjects' ``deployment``)."""
    replicas: list[str] = Field(default_factory=list)
    """Replica base URLs (``http://host:port``)."""
    dns: str | None = _DEFAULTS.dns
    """``host:port`` of a headless Service: every A record is a replica."""
    endpoint_slices: EndpointSlicesConfig | None = None
    """A Service whose ready endpoints are replicas (``path`` is ignored)."""
    buffer_size: int = Field(_DEFAULTS.buffer_size, ge=0)
    """Requests that may wait for a replica; one more is answered 429."""
    buffer_timeout: Seconds = Field(_DEFAULTS.buffer_timeout, gt=0)
    """How long a request may wait; then 503. Above a local-disk cold start (~40 s)."""
    health_interval: Seconds = Field(_DEFAULTS.health_interval, gt=0)
    rate_window: Seconds = Field(_DEFAULTS.rate_window, gt=0)
    connect_retries: int = Field(_DEFAULTS.connect_retries, ge=0, le=10)

    @field_validator("replicas")
    @classmethod
    def _urls(cls, replicas: list[str]) -> list[str]:
        for url in replicas:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"expected http://host:port, got {url!r}")
        return [url.rstrip("/") for url in replicas]

    def settings(self) -> GatewaySettings:
        """The gateway's runtime settings."""
        return GatewaySettings(
            namespace=self.namespace,
            deployment=self.deployment,
            buffer_size=self.buffer_size,
            buffer_timeout=self.buffer_timeout,
            health_interval=self.health_interval,
            connect_retries=self.connect_retries,
            rate_window=self.rate_window,
            dns=self.dns,
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
