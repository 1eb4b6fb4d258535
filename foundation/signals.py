"""The signals one deployment's sources publish: one typed shape from producer to decision.

The exporter derives ``EngineSignals`` from its replicas' ``/metrics``, the gateway
counts ``GatewaySignals``; each travels as a ``Snapshot`` to the scaler (over gRPC,
``foundation.signals_wire`` carries it field by field) and the scaler builds its
``Observation`` from these very fields. The replay hands the same objects over without
the wire. ``None`` is "not measured", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TargetKey = tuple[str, str, str]
"""(namespace, deployment, model); the model is empty when the target names none."""

QUANTILES = (0.5, 0.9, 0.95, 0.99)


def describe_target(key: TargetKey) -> str:
    """``namespace/deployment`` or ``namespace/deployment (model m)`` for messages."""
    namespace, deployment, model = key
    return f"{namespace}/{deployment}" + (f" (model {model})" if model else "")


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Latency quantiles in seconds, from histogram buckets; None where unknown."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None

    def at(self, q: float) -> float | None:
        """The value for quantile ``q`` (one of ``QUANTILES``)."""
        return (self.p50, self.p90, self.p95, self.p99)[QUANTILES.index(q)]


LATENCIES = ("ttft", "itl", "e2e", "queue_time")
"""The latency histograms every window carries, by concept name."""


@dataclass(frozen=True, slots=True)
class WindowSignals:
    """Deployment-wide rates and latency quantiles over one window of ``seconds``."""

    seconds: float
    request_rate: float | None = None
    prompt_token_rate: float | None = None
    generation_token_rate: float | None = None
    preemption_rate: float | None = None
    ttft: Quantiles = field(default_factory=Quantiles)
    itl: Quantiles = field(default_factory=Quantiles)
    e2e: Quantiles = field(default_factory=Quantiles)
    queue_time: Quantiles = field(default_factory=Quantiles)
    queue_depth_mean: float | None = None
    running_mean: float | None = None
    mean_prompt_tokens: float | None = None
    """Prompt tokens per request finished in the window (the request mix); None when
    none finished or the engines do not expose per-request token histograms."""
    mean_output_tokens: float | None = None
    """Output tokens per request finished in the window; None as above."""

    def latency(self, concept: str) -> Quantiles:
        """The quantiles of one of ``LATENCIES``."""
        value: Quantiles = getattr(self, concept)
        return value


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """Everything the exporter publishes for one deployment at one time."""

    time: float
    """When the replicas were scraped (seconds since the epoch)."""
    replicas: int
    """Replicas known, answering or not: each holds accelerators."""
    replicas_up: int
    queue_depth: float | None
    running: float | None
    kv_usage: float | None
    panic: WindowSignals
    stable: WindowSignals
    cost_per_million_tokens: float | None
    cost_per_million_output_tokens: float | None
    price_is_default: bool
    partial: bool
    """Some replicas or metric families were missing."""
    replicas_sleeping: int | None = None
    """Replicas answering that are asleep (vLLM sleep mode, any level): they hold host
    memory, not an accelerator's work. None when some answering replica exposes no sleep
    state (SGLang, vLLM before 0.11): unknown, never "awake"."""


@dataclass(frozen=True, slots=True)
class GatewaySignals:
    """What the gateway counts for one deployment; known at zero replicas too."""

    time: float
    arrival_rate: float | None
    buffered: int
    in_flight: int
    last_arrival_time: float | None = None
    upstream_error_rate: float | None = None
    slo_within_rate: float | None = None
    """Requests per second, over the gateway's window, whose TTFT and mean inter-token
    latency met the SLO (``slo`` block); None when the gateway does not judge them."""
    slo_outside_rate: float | None = None
    """Requests per second, over the same window, that missed either target, failed or
    were dropped: with ``slo_within_rate``, the attainment the scaler steers by."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One source's signals for one target."""

    target: TargetKey
    signals: EngineSignals | GatewaySignals

    @property
    def time(self) -> float:
        """When the signals were measured."""
        return self.signals.time

    @property
    def source(self) -> str:
        """``exporter`` or ``gateway``."""
        return "exporter" if isinstance(self.signals, EngineSignals) else "gateway"
