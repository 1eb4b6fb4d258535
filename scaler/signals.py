"""The latest signals per target, and their conversion into core observations.

Sources (exporter and gateway watches, the demo source) call ``SignalStore.update``;
the gRPC service reads ``SignalStore.get`` and is told of every update so that
decisions are made once per new signal, not once per KEDA call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from foundation.durations import format_duration
from foundation.errors import NoDataError, StaleSignalError
from protos.unitscale.v1 import signals_pb2 as pb
from scaler.core.model import Observation

log = logging.getLogger(__name__)

TargetKey = tuple[str, str, str]
"""(namespace, deployment, model)."""


def target_key(target: pb.Target) -> TargetKey:
    """The store's key for a target."""
    return (target.namespace, target.deployment, target.model)


def describe_key(key: TargetKey) -> str:
    """``namespace/deployment`` or ``namespace/deployment (model m)`` for messages."""
    namespace, deployment, model = key
    return f"{namespace}/{deployment}" + (f" (model {model})" if model else "")


def timestamp_seconds(stamp: object) -> float:
    """Seconds since the epoch of a ``google.protobuf.Timestamp``."""
    return stamp.seconds + stamp.nanos * 1e-9  # type: ignore[attr-defined,no-any-return]


@dataclass(slots=True)
class TargetSignals:
    """The newest snapshot from each source for one target."""

    version: int = 0
    engine: pb.Signals | None = None
    gateway: pb.Signals | None = None


class SignalStore:
    """Latest signals per target; notifies listeners after each accepted update."""

    def __init__(self) -> None:
        self._targets: dict[TargetKey, TargetSignals] = {}
        self._listeners: list[Callable[[TargetKey], None]] = []

    def add_listener(self, listener: Callable[[TargetKey], None]) -> None:
        """Call ``listener(key)`` after every accepted update of ``key``."""
        self._listeners.append(listener)

    def get(self, key: TargetKey) -> TargetSignals | None:
        """The target's signals, or None if no source has reported it yet."""
        return self._targets.get(key)

    def keys(self) -> list[TargetKey]:
        """Every target seen so far."""
        return list(self._targets)

    def update(self, signals: pb.Signals) -> bool:
        """Keep ``signals`` if it is newer than what its source sent before.

        Returns whether it was kept. Snapshots without a target, source or payload
        are refused with a warning: they cannot be attributed.
        """
        payload = signals.WhichOneof("payload")
        if not signals.target.deployment or payload is None:
            log.warning("ignoring signals without target or payload: %s", signals)
            return False
        key = target_key(signals.target)
        entry = self._targets.get(key)
        if entry is None:
            entry = self._targets[key] = TargetSignals()
        previous = entry.engine if payload == "engine" else entry.gateway
        if previous is not None and timestamp_seconds(previous.observed_time) > timestamp_seconds(
            signals.observed_time
        ):
            return False  # out of order (a reconnect replayed an older snapshot)
        if payload == "engine":
            entry.engine = signals
        else:
            entry.gateway = signals
        entry.version += 1
        for listener in self._listeners:
            listener(key)
        return True


def observe(
    key: TargetKey, signals: TargetSignals | None, now: float, max_age: float
) -> tuple[Observation, float]:
    """Build the observation for ``key`` at ``now`` from signals at most ``max_age`` old.

    Returns the observation and the time until which it stays valid (when its
    oldest input would pass ``max_age``).

    Raises:
        NoDataError: no source has reported the target.
        StaleSignalError: every source's newest snapshot is older than ``max_age``.
    """
    if signals is None or (signals.engine is None and signals.gateway is None):
        raise NoDataError(f"no signals yet for {describe_key(key)}")
    fresh: list[tuple[float, pb.Signals]] = []
    ages: list[str] = []
    for snapshot in (signals.engine, signals.gateway):
        if snapshot is None:
            continue
        at = timestamp_seconds(snapshot.observed_time)
        if now - at <= max_age:
            fresh.append((at, snapshot))
        else:
            ages.append(f"{pb.Source.Name(snapshot.source)} {format_duration(now - at)} old")
    if not fresh:
        raise StaleSignalError(
            f"signals for {describe_key(key)} are stale ({', '.join(ages)};"
            f" max {format_duration(max_age)})"
        )
    values: dict[str, float | int | None] = {}
    for _, snapshot in fresh:
        if snapshot.HasField("engine"):
            values.update(_engine_values(snapshot.engine))
        else:
            values.update(_gateway_values(snapshot.gateway))
    oldest = min(at for at, _ in fresh)
    newest = max(at for at, _ in fresh)
    observation = Observation(now=now, signal_time=newest, **values)  # type: ignore[arg-type]
    return observation, oldest + max_age


def _optional(message: object, name: str) -> float | None:
    return getattr(message, name) if message.HasField(name) else None  # type: ignore[attr-defined]


def _engine_values(engine: pb.EngineSignals) -> dict[str, float | int | None]:
    stable, panic = engine.stable, engine.panic
    return {
        "prompt_token_rate_panic": _optional(panic, "prompt_token_rate"),
        "generation_token_rate_panic": _optional(panic, "generation_token_rate"),
        "ttft_p95_panic_seconds": _optional(panic.ttft_seconds, "p95"),
        "replicas_known": engine.replicas_scraped,
        "queue_depth": _optional(engine, "queue_depth"),
        "requests_running": _optional(engine, "requests_running"),
        "kv_cache_usage": _optional(engine, "kv_cache_usage"),
        "cost_per_million_tokens": _optional(engine, "cost_per_million_tokens"),
        "replicas_up": engine.replicas_up,
        "request_rate": _optional(stable, "request_rate"),
        "prompt_token_rate": _optional(stable, "prompt_token_rate"),
        "generation_token_rate": _optional(stable, "generation_token_rate"),
        "ttft_p95_seconds": _optional(stable.ttft_seconds, "p95"),
        "inter_token_p95_seconds": _optional(stable.inter_token_seconds, "p95"),
    }


def _gateway_values(gateway: pb.GatewaySignals) -> dict[str, float | int | None]:
    return {
        "gateway_arrival_rate": _optional(gateway, "arrival_rate"),
        "gateway_buffered": gateway.buffered,
        "gateway_in_flight": gateway.in_flight,
    }
