"""Values the decision core works on. All frozen; time is a number passed in."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Observation:
    """What is known about one target at time ``now``; ``None`` means not measured.

    Engine fields are sums over the deployment's replicas (from the exporter);
    gateway fields come from the gateway in front of them and are known even at
    zero replicas.
    """

    now: float
    """Seconds since the epoch at which the decision is made."""
    signal_time: float
    """When the newest signal used here was measured (seconds since the epoch)."""
    queue_depth: float | None = None
    requests_running: float | None = None
    request_rate: float | None = None
    """Finished requests per second over the stable window."""
    prompt_token_rate: float | None = None
    generation_token_rate: float | None = None
    kv_cache_usage: float | None = None
    ttft_p95_seconds: float | None = None
    inter_token_p95_seconds: float | None = None
    cost_per_million_tokens: float | None = None
    replicas_up: int | None = None
    """Replicas the exporter scraped successfully."""
    gateway_arrival_rate: float | None = None
    gateway_buffered: int | None = None
    gateway_in_flight: int | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """Per-ScaledObject tuning, from trigger metadata over the scaler config."""

    min_replicas: int = 0
    max_replicas: int = 100
    target_concurrency: float = 16.0
    """Requests in flight (running plus queued) one replica should hold."""


@dataclass(frozen=True, slots=True)
class DecisionState:
    """Soft state carried from one decision to the next for one ScaledObject."""

    decisions: int = 0
    """How many decisions were made; a placeholder until the decision core lands."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of ``decide``: replicas, activity, the new state and why."""

    desired_replicas: int
    active: bool
    state: DecisionState
    reason: str
    inputs: dict[str, float] = field(default_factory=dict)
    """The numbers the reason refers to, for logs and metrics."""
