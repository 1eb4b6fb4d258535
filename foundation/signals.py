"""The signals one deployment's sources publish: one typed shape from producer to decision.

The exporter derives ``EngineSignals`` from its replicas' ``/metrics``, the gateway
counts ``GatewaySignals``; each travels as a ``Snapshot`` to the scaler (over gRPC,
``foundation.signals_wire`` carries it field by field) and the scaler builds its
``Observation`` from these very fields. The replay hands the same objects over without
the wire. ``None`` is "not measured", never zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

from foundation.errors import quote

TargetKey = tuple[str, str, str]
"""(namespace, deployment, model); the model is empty when the target names none."""

QUANTILES = (0.5, 0.9, 0.95, 0.99)

MAX_REPLICAS = 10_000
"""The most replicas any count from a source may say (a trigger's ``maxReplicas`` bound).

A count above it is no deployment's: ``count(up)`` answering 5e9 is a broken query or a
hostile answer, and read as a fact it pins the deployment at ``maxReplicas`` and
overflows the capacity RPC's uint32 fields, so it is unmeasured instead."""


MAX_REQUESTS = MAX_REPLICAS * 1_000
"""The most requests a count may say (queued, running, buffered, in flight): a thousand
per replica at ``MAX_REPLICAS``. A backlog of 4294967295 (a uint32's -1) or a queue of
1e300 is no deployment's; read as a fact it pins ``maxReplicas``, so it is unmeasured."""
MAX_REQUEST_RATE = 1e6
"""Requests per second any rate may say (arrivals, finished, errors, judged)."""
MAX_TOKEN_RATE = 1e7 * MAX_REPLICAS
"""Tokens per second a deployment may say: 10^7 per replica (``scaler.metadata``'s
``MAX_TOKENS_PER_SECOND``) at ``MAX_REPLICAS``."""
MAX_MEAN_TOKENS = 1e7
"""Tokens per request a mean may say: past any model's context window."""
MAX_LATENCY = 86_400.0
"""Seconds a latency quantile may say: a day, past the largest bucket any engine has."""

_BOUNDS = {
    "queue_depth": MAX_REQUESTS,
    "running": MAX_REQUESTS,
    "queue_depth_mean": MAX_REQUESTS,
    "running_mean": MAX_REQUESTS,
    "buffered": MAX_REQUESTS,
    "in_flight": MAX_REQUESTS,
    "arrival_rate": MAX_REQUEST_RATE,
    "request_rate": MAX_REQUEST_RATE,
    "preemption_rate": MAX_REQUEST_RATE,
    "upstream_error_rate": MAX_REQUEST_RATE,
    "slo_within_rate": MAX_REQUEST_RATE,
    "slo_outside_rate": MAX_REQUEST_RATE,
    "prompt_token_rate": MAX_TOKEN_RATE,
    "generation_token_rate": MAX_TOKEN_RATE,
    "mean_prompt_tokens": MAX_MEAN_TOKENS,
    "mean_output_tokens": MAX_MEAN_TOKENS,
    **dict.fromkeys(("p50", "p90", "p95", "p99"), MAX_LATENCY),
}
"""The plausible domain's upper end of each load field (by its name without the window)."""


MAX_NAMESPACE_LENGTH = 63
"""A namespace: an RFC 1123 label."""
MAX_DEPLOYMENT_LENGTH = 253
"""A Deployment's name: an RFC 1123 subdomain."""
MAX_MODEL_LENGTH = 512
"""A served model's name (``org/model-revision``; Hugging Face ids are under 100)."""


def describe_target(key: TargetKey) -> str:
    """``namespace/deployment`` or ``namespace/deployment (model m)`` for messages.

    A part longer than a Kubernetes name, or not printable (a newline would forge a
    log line), is quoted and cut (``foundation.errors.quote``).
    """
    namespace, deployment, model = (_name(part) for part in key)
    return f"{namespace}/{deployment}" + (f" (model {model})" if model else "")


def _name(part: str) -> str:
    return part if len(part) <= 253 and part.isprintable() else quote(part)


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
    replicas: int | None
    """Replicas known, answering or not: each holds accelerators. None only where a
    source could not count them (Prometheus's count unreadable): never read as 0, which
    says "no load" and would take a busy deployment to zero. The exporter always counts."""
    replicas_up: int | None
    """Replicas that answered; None as ``replicas``."""
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
    buffered: int | None
    """Requests the gateway holds for want of a replica; None only when a source's
    count was impossible (``checked``): the gateway always counts it."""
    in_flight: int | None
    """Requests forwarded and not yet ended; None as ``buffered``."""
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


Impossible = tuple[tuple[str, float], ...]
"""(field, value) of each value a source sent that cannot be a measurement."""


def checked(
    signals: EngineSignals | GatewaySignals,
) -> tuple[EngineSignals | GatewaySignals, Impossible]:
    """The signals with every impossible value unmeasured (None), and what each was.

    Counts, rates, latencies and shares are finite and not negative. A negative queue or
    a NaN rate from a source is not a measurement of no load: read as one it would lower
    the replica count (running -3 summed with a queue of 3 is 0 in flight), so it becomes
    None, as if the series were absent. So does a load figure or latency past its
    plausible domain (``_BOUNDS``: a backlog of 4294967295, a queue of 1e300, a
    10^12-token mean), which pinned ``maxReplicas`` silently; a sleeper count above
    ``MAX_REPLICAS`` or above the replicas answering; and a finished-request rate above
    the window's generation token rate (each request ends with at least one token
    generated in the window, so more requests than tokens is no mix: read as one, 0.012
    tokens a request scaled a loaded
    deployment down). A cost may be +Inf (a price, nothing served).
    Times are not checked here: the store refuses a snapshot whose time is wrong.
    """
    found: list[tuple[str, float]] = []

    def keep(name: str, value: float | None, infinite: bool = False) -> float | None:
        bound = _BOUNDS.get(name.rpartition(".")[2], math.inf)
        if value is None or (0 <= value <= bound and (math.isfinite(value) or infinite)):
            return value  # NaN fails 0 <= value
        found.append((name, value))
        return None

    def count(name: str, value: int | None) -> int | None:
        if value is not None and value > MAX_REPLICAS:
            found.append((name, value))
            return None
        return None if keep(name, value) is None else value

    if isinstance(signals, GatewaySignals):
        return _checked_gateway(signals, keep), tuple(found)
    sleeping = count("replicas_sleeping", signals.replicas_sleeping)
    if sleeping is not None and _impossible_sleepers(sleeping, signals):
        found.append(("replicas_sleeping", sleeping))
        sleeping = None
    result = replace(
        signals,
        queue_depth=keep("queue_depth", signals.queue_depth),
        running=keep("running", signals.running),
        kv_usage=keep("kv_usage", signals.kv_usage),
        cost_per_million_tokens=keep(
            "cost_per_million_tokens", signals.cost_per_million_tokens, infinite=True
        ),
        cost_per_million_output_tokens=keep(
            "cost_per_million_output_tokens", signals.cost_per_million_output_tokens, True
        ),
        replicas_sleeping=sleeping,
        panic=_checked_window("panic", signals.panic, keep, found),
        stable=_checked_window("stable", signals.stable, keep, found),
    )
    return result, tuple(found)


def _checked_gateway(
    signals: GatewaySignals, keep: Callable[[str, float | None], float | None]
) -> GatewaySignals:
    time = signals.last_arrival_time
    buffered, in_flight = keep("buffered", signals.buffered), keep("in_flight", signals.in_flight)
    return replace(
        signals,
        arrival_rate=keep("arrival_rate", signals.arrival_rate),
        buffered=None if buffered is None else signals.buffered,
        in_flight=None if in_flight is None else signals.in_flight,
        upstream_error_rate=keep("upstream_error_rate", signals.upstream_error_rate),
        slo_within_rate=keep("slo_within_rate", signals.slo_within_rate),
        slo_outside_rate=keep("slo_outside_rate", signals.slo_outside_rate),
        last_arrival_time=time if time is None or math.isfinite(time) else None,
    )


def impossible_counts(signals: EngineSignals | GatewaySignals) -> str | None:
    """Why an engine snapshot's replica counts cannot be a deployment's, or None.

    The counts frame every sum in the snapshot (the load is summed over those replicas),
    so one that is impossible (over ``MAX_REPLICAS``, negative, or more replicas up than
    known) is no measurement of anything in it: the snapshot is refused, never read. Read
    as facts, 4294967295 replicas pinned a restarted scaler at ``maxReplicas`` and fed the
    capacity figures; 50 up of 2 known passed silently.
    """
    if not isinstance(signals, EngineSignals):
        return None
    for name, value in (("replicas", signals.replicas), ("replicas_up", signals.replicas_up)):
        if value is not None and not 0 <= value <= MAX_REPLICAS:
            return f"{name} is outside 0-{MAX_REPLICAS}"  # no amount: one log line a change
    known, up = signals.replicas, signals.replicas_up
    if known is not None and up is not None and up > known:
        return "replicas_up is above the replicas known"
    return None


def _impossible_sleepers(sleeping: int, signals: EngineSignals) -> bool:
    """More asleep than answering, or all asleep while requests run: not a count.

    Sleepers are among the replicas answering, and a sleeping engine runs nothing. Read
    as a fact, either takes the load's replicas away (``decide``'s ready = known -
    sleeping) and scales a busy deployment down.
    """
    running, up = signals.running or 0.0, signals.replicas_up
    if up is None:
        return True  # sleepers without the replicas answering to hold them
    return sleeping > up or (sleeping > 0 and sleeping == up and running > 0)


def _checked_window(
    window: str,
    values: WindowSignals,
    keep: Callable[[str, float | None], float | None],
    found: list[tuple[str, float]],
) -> WindowSignals:
    changes: dict[str, object] = {}
    for item in fields(values):
        value = getattr(values, item.name)
        if isinstance(value, Quantiles):
            changes[item.name] = Quantiles(
                *(
                    keep(f"{window}.{item.name}.{q.name}", getattr(value, q.name))
                    for q in fields(value)
                )
            )
        elif item.name != "seconds":
            changes[item.name] = keep(f"{window}.{item.name}", value)
    requests, generated = changes["request_rate"], changes["generation_token_rate"]
    if isinstance(requests, float | int) and isinstance(generated, float | int):
        if requests > generated:  # under one output token a request: no request rate
            found.append((f"{window}.request_rate", requests))
            changes["request_rate"] = None
    return replace(values, **changes)  # type: ignore[arg-type]
