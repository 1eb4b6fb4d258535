"""A ScaledObject trigger's ``metadata`` map, parsed into a typed, validated model.

KEDA forwards the trigger's whole ``metadata`` map as ``ScaledObjectRef.scalerMetadata``
(strings only), including its own keys (``scalerAddress``, ``enableTLS``,
``unsafeSsl``). Unknown keys are refused, so that a typo such as ``maxReplica``
is an error and not a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from foundation.durations import Seconds
from foundation.errors import MetadataError
from scaler.core.model import Policy

# RFC 1123 label: what Kubernetes allows in namespace and Deployment names.
_DNS_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class TriggerMetadata(BaseModel):
    """Every key a unitscale trigger's ``metadata`` may hold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scaler_address: str = Field(alias="scalerAddress", min_length=1)
    """KEDA's: where KEDA dials the scaler (``host:port``). Required by KEDA itself."""
    enable_tls: bool = Field(False, alias="enableTLS")
    """KEDA's: dial the scaler over TLS. Accepted and ignored here."""
    unsafe_ssl: bool = Field(False, alias="unsafeSsl")
    """KEDA's: skip certificate verification. Accepted and ignored here."""

    deployment: Annotated[str, Field(pattern=_DNS_NAME, max_length=253)]
    """The workload whose signals drive this ScaledObject (the exporter's target)."""
    namespace: Annotated[str | None, Field(pattern=_DNS_NAME, max_length=63)] = None
    """The workload's namespace; defaults to the ScaledObject's own."""
    model: str = ""
    """The served model, when the deployment's signals are split by model."""
    min_replicas: int = Field(0, alias="minReplicas", ge=0, le=10_000)
    """Fewest replicas to ask for (0 allows scale to zero)."""
    max_replicas: int = Field(100, alias="maxReplicas", ge=1, le=10_000)
    """Most replicas to ask for."""
    target_concurrency: float | None = Field(None, alias="targetConcurrency", gt=0, le=100_000)
    """Requests in flight (running plus queued) one replica should hold."""
    max_signal_age: Seconds | None = Field(None, alias="maxSignalAge", gt=0)
    """Signals older than this give UNAVAILABLE; defaults to the scaler config's."""
    target_utilization: float | None = Field(None, alias="targetUtilization", gt=0, le=1)
    slo_ttft: Seconds | None = Field(None, alias="sloTtft", gt=0)
    slo_itl: Seconds | None = Field(None, alias="sloItl", gt=0)
    idle_grace: Seconds | None = Field(None, alias="idleGrace", ge=0)
    cost_budget: float | None = Field(None, alias="costBudgetPerMillionTokens", gt=0)
    prefill_tokens_per_second: float | None = Field(None, alias="prefillTokensPerSecond", gt=0)
    decode_tokens_per_second: float | None = Field(None, alias="decodeTokensPerSecond", gt=0)

    @model_validator(mode="after")
    def _min_not_above_max(self) -> TriggerMetadata:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must not exceed maxReplicas"
                f" ({self.max_replicas})"
            )
        return self

    def policy(self, defaults: Policy | None = None) -> Policy:
        """The scaler config's policy with these keys' overrides."""
        base = defaults or Policy()
        overrides: dict[str, float | int | None] = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_concurrency": self.target_concurrency,
            "target_utilization": self.target_utilization,
            "slo_ttft_seconds": self.slo_ttft,
            "slo_itl_seconds": self.slo_itl,
            "idle_grace_seconds": self.idle_grace,
            "cost_budget_per_million_tokens": self.cost_budget,
            "prefill_tokens_per_second": self.prefill_tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
        }
        chosen = {k: v for k, v in overrides.items() if v is not None}
        return replace(base, **chosen)  # type: ignore[arg-type]


ALLOWED_KEYS: tuple[str, ...] = tuple(
    sorted(field.alias or name for name, field in TriggerMetadata.model_fields.items())
)
REQUIRED_KEYS: tuple[str, ...] = tuple(
    sorted(
        field.alias or name
        for name, field in TriggerMetadata.model_fields.items()
        if field.is_required()
    )
)


def parse_metadata(raw: Mapping[str, str]) -> TriggerMetadata:
    """Validate a trigger's metadata map.

    Raises:
        MetadataError: one line per problem, each naming the key and what it allows.
    """
    try:
        return TriggerMetadata.model_validate(dict(raw))
    except ValidationError as err:
        problems = [_describe(error, raw) for error in err.errors()]
        raise MetadataError("invalid scalerMetadata: " + "; ".join(problems)) from err


def _describe(error: object, raw: Mapping[str, str]) -> str:
    assert isinstance(error, dict)
    location = error.get("loc") or ()
    key = str(location[0]) if location else ""
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return f"unknown key {key!r} (allowed keys: {', '.join(ALLOWED_KEYS)})"
    if kind == "missing":
        return f"missing required key {key!r}"
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if key:
        return f"key {key!r}={raw.get(key)!r}: {message}"
    return message
