"""``foundation.signals`` to and from ``unitscale.v1.Signals``, field by field.

Only values are carried here: a ``None`` (or NaN) is an unset ``optional`` field and
comes back as ``None``; times become Timestamps and Durations (nanoseconds). Anything
else would be arithmetic, and that lives in the exporter and the scaler. The gateway's
rates (arrivals, upstream errors, the SLO's within and outside) are range checked on the
way in: a negative or non-finite one refuses the message, since the scaler reads "no
arrivals" as a reason to scale to zero and steers by the SLO rates' ratio. The engine's
values are checked where every source's are, in the scaler's store
(``foundation.signals.checked``: impossible ones become unmeasured).
"""

from __future__ import annotations

import math

from foundation.signals import (
    MAX_DEPLOYMENT_LENGTH,
    MAX_MODEL_LENGTH,
    MAX_NAMESPACE_LENGTH,
    EngineSignals,
    GatewaySignals,
    Quantiles,
    Snapshot,
    WindowSignals,
)
from foundation.timestamps import from_duration, from_timestamp, to_duration, to_timestamp
from protos.unitscale.v1 import signals_pb2 as pb

# (our field, its proto field) where the names differ, per message.
_ENGINE_FIELDS = (
    ("queue_depth", "queue_depth"),
    ("running", "requests_running"),
    ("kv_usage", "kv_cache_usage"),
    ("cost_per_million_tokens", "cost_per_million_tokens"),
    ("cost_per_million_output_tokens", "cost_per_million_output_tokens"),
)
_WINDOW_FIELDS = (
    ("request_rate", "request_rate"),
    ("prompt_token_rate", "prompt_token_rate"),
    ("generation_token_rate", "generation_token_rate"),
    ("preemption_rate", "preemption_rate"),
    ("queue_depth_mean", "queue_depth_mean"),
    ("running_mean", "requests_running_mean"),
    ("mean_prompt_tokens", "mean_prompt_tokens"),
    ("mean_output_tokens", "mean_output_tokens"),
)
_LATENCY_FIELDS = (
    ("ttft", "ttft_seconds"),
    ("itl", "inter_token_seconds"),
    ("e2e", "e2e_seconds"),
    ("queue_time", "queue_time_seconds"),
)
_QUANTILE_FIELDS = ("p50", "p90", "p95", "p99")


_NAME_LIMITS = (
    ("namespace", MAX_NAMESPACE_LENGTH),
    ("deployment", MAX_DEPLOYMENT_LENGTH),
    ("model", MAX_MODEL_LENGTH),
)


class WireError(ValueError):
    """A message that cannot be attributed to a target and a source, or a value out of range."""


def encode(snapshot: Snapshot) -> pb.Signals:
    """The wire form of a snapshot; unknown values stay unset."""
    namespace, deployment, model = snapshot.target
    message = pb.Signals(
        target=pb.Target(namespace=namespace, deployment=deployment, model=model),
        observed_time=to_timestamp(snapshot.time),
    )
    signals = snapshot.signals
    if isinstance(signals, EngineSignals):
        message.source = pb.SOURCE_EXPORTER
        message.partial = signals.partial
        message.engine.CopyFrom(_encode_engine(signals))
    else:
        message.source = pb.SOURCE_GATEWAY
        message.gateway.CopyFrom(_encode_gateway(signals))
    return message


def decode(message: pb.Signals) -> Snapshot:
    """The snapshot a message carries.

    Raises:
        WireError: the message names no deployment or carries no payload, a target
            name is longer than Kubernetes allows (``_NAME_LIMITS``), or a gateway rate
            is negative or not finite.
    """
    payload = message.WhichOneof("payload")
    if not message.target.deployment or payload is None:
        raise WireError("signals without a target deployment or a payload")
    target = message.target
    for name, limit in _NAME_LIMITS:
        # Each target is kept and logged by name: a megabyte name is no Kubernetes one.
        if len(getattr(target, name)) > limit:
            raise WireError(f"target {name} is over {limit} characters")
    key = (target.namespace, target.deployment, target.model)
    at = from_timestamp(message.observed_time)
    if payload == "engine":
        return Snapshot(key, _decode_engine(message.engine, at, message.partial))
    return Snapshot(key, _decode_gateway(message.gateway, at))


def _encode_engine(signals: EngineSignals) -> pb.EngineSignals:
    if signals.replicas is None or signals.replicas_up is None:
        # The wire's counts have no "unknown" (0 is a count); only the exporter sends
        # engine signals, and it always counts its replicas.
        raise WireError("engine signals without replica counts have no wire form")
    engine = pb.EngineSignals(
        replicas_up=signals.replicas_up,
        replicas_scraped=signals.replicas,
        panic=_encode_window(signals.panic),
        stable=_encode_window(signals.stable),
        price_is_default=signals.price_is_default,
    )
    if signals.replicas_sleeping is not None:
        engine.replicas_sleeping = signals.replicas_sleeping
    for ours, theirs in _ENGINE_FIELDS:
        _set(engine, theirs, getattr(signals, ours))
    return engine


def _decode_engine(engine: pb.EngineSignals, at: float, partial: bool) -> EngineSignals:
    values = {ours: _get(engine, theirs) for ours, theirs in _ENGINE_FIELDS}
    return EngineSignals(
        time=at,
        replicas=engine.replicas_scraped,
        replicas_up=engine.replicas_up,
        panic=_decode_window(engine.panic),
        stable=_decode_window(engine.stable),
        price_is_default=engine.price_is_default,
        partial=partial,
        replicas_sleeping=(
            engine.replicas_sleeping if engine.HasField("replicas_sleeping") else None
        ),
        **values,
    )


def _encode_window(window: WindowSignals) -> pb.WindowSignals:
    out = pb.WindowSignals(window=to_duration(window.seconds))
    for ours, theirs in _WINDOW_FIELDS:
        _set(out, theirs, getattr(window, ours))
    for ours, theirs in _LATENCY_FIELDS:
        quantiles = getattr(out, theirs)
        for name in _QUANTILE_FIELDS:
            _set(quantiles, name, getattr(window.latency(ours), name))
    return out


def _decode_window(window: pb.WindowSignals) -> WindowSignals:
    values: dict[str, object] = {ours: _get(window, theirs) for ours, theirs in _WINDOW_FIELDS}
    for ours, theirs in _LATENCY_FIELDS:
        quantiles = getattr(window, theirs)
        values[ours] = Quantiles(*(_get(quantiles, name) for name in _QUANTILE_FIELDS))
    return WindowSignals(from_duration(window.window), **values)  # type: ignore[arg-type]


def _encode_gateway(signals: GatewaySignals) -> pb.GatewaySignals:
    gateway = pb.GatewaySignals(buffered=signals.buffered, in_flight=signals.in_flight)
    _set(gateway, "arrival_rate", signals.arrival_rate)
    _set(gateway, "upstream_error_rate", signals.upstream_error_rate)
    _set(gateway, "slo_within_rate", signals.slo_within_rate)
    _set(gateway, "slo_outside_rate", signals.slo_outside_rate)
    if signals.last_arrival_time is not None:
        gateway.last_arrival_time.CopyFrom(to_timestamp(signals.last_arrival_time))
    return gateway


def _decode_gateway(gateway: pb.GatewaySignals, at: float) -> GatewaySignals:
    return GatewaySignals(
        time=at,
        arrival_rate=_get_rate(gateway, "arrival_rate"),
        buffered=gateway.buffered,
        in_flight=gateway.in_flight,
        last_arrival_time=(
            from_timestamp(gateway.last_arrival_time)
            if gateway.HasField("last_arrival_time")
            else None
        ),
        upstream_error_rate=_get_rate(gateway, "upstream_error_rate"),
        slo_within_rate=_get_rate(gateway, "slo_within_rate"),
        slo_outside_rate=_get_rate(gateway, "slo_outside_rate"),
    )


def _set(message: object, name: str, value: float | None) -> None:
    if value is not None and not math.isnan(value):
        setattr(message, name, value)


def _get(message: object, name: str) -> float | None:
    if message.HasField(name):  # type: ignore[attr-defined]
        value: float = getattr(message, name)
        return value
    return None


def _get_rate(message: object, name: str) -> float | None:
    """A rate that must be finite and not negative when set.

    Raises:
        WireError: it is set to a negative, infinite or NaN number.
    """
    value = _get(message, name)
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise WireError(f"{name} is {value}: a rate is a finite number, 0 or more")
    return value
