"""The latest signals per target, and the observation the decision core reads from them.

Sources (exporter and gateway watches, the demo source) call ``SignalStore.update``
with typed snapshots (``foundation.signals``); the registry reads ``SignalStore.get``
and is told of every update, so that decisions are made once per new signal, not once
per KEDA call. Pure: no clock (``now`` is passed in), no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from foundation.durations import format_duration
from foundation.errors import NoDataError, StaleSignalError
from foundation.signals import (
    EngineSignals,
    GatewaySignals,
    Snapshot,
    TargetKey,
    describe_target,
)
from scaler.core.model import Observation

__all__ = ["SignalStore", "TargetKey", "TargetSignals", "observe"]


@dataclass(slots=True)
class TargetSignals:
    """The newest snapshot from each source for one target."""

    version: int = 0
    engine: EngineSignals | None = None
    gateway: GatewaySignals | None = None


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

    def update(self, snapshot: Snapshot) -> bool:
        """Keep ``snapshot`` if it is newer than what its source sent before.

        Returns whether it was kept: an older one (a reconnect replayed it) is not.
        """
        key = snapshot.target
        entry = self._targets.get(key)
        if entry is None:
            entry = self._targets[key] = TargetSignals()
        signals = snapshot.signals
        previous = entry.engine if isinstance(signals, EngineSignals) else entry.gateway
        if previous is not None and previous.time > signals.time:
            return False
        if isinstance(signals, EngineSignals):
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
        raise NoDataError(f"no signals yet for {describe_target(key)}")
    # Named as on the wire (unitscale.v1.Source), as KEDA's logs have always shown them.
    sources = (("SOURCE_EXPORTER", signals.engine), ("SOURCE_GATEWAY", signals.gateway))
    engine = signals.engine if _fresh(signals.engine, now, max_age) else None
    gateway = signals.gateway if _fresh(signals.gateway, now, max_age) else None
    if engine is None and gateway is None:
        ages = [
            f"{name} {format_duration(now - snapshot.time)} old"
            for name, snapshot in sources
            if snapshot is not None
        ]
        raise StaleSignalError(
            f"signals for {describe_target(key)} are stale ({', '.join(ages)};"
            f" max {format_duration(max_age)})"
        )
    times = [s.time for s in (engine, gateway) if s is not None]
    observation = Observation(
        now=now,
        signal_time=max(times),
        **(_engine_values(engine) if engine is not None else {}),
        **(_gateway_values(gateway) if gateway is not None else {}),
    )
    return observation, min(times) + max_age


def _fresh(signals: EngineSignals | GatewaySignals | None, now: float, max_age: float) -> bool:
    return signals is not None and now - signals.time <= max_age


def _engine_values(engine: EngineSignals) -> dict[str, Any]:
    stable, panic = engine.stable, engine.panic
    return {
        "prompt_token_rate_panic": panic.prompt_token_rate,
        "generation_token_rate_panic": panic.generation_token_rate,
        "ttft_p95_panic_seconds": panic.ttft.p95,
        "replicas_known": engine.replicas,
        "replicas_sleeping": engine.replicas_sleeping,
        "queue_depth": engine.queue_depth,
        "requests_running": engine.running,
        "requests_running_mean": stable.running_mean,
        "kv_cache_usage": engine.kv_usage,
        "cost_per_million_tokens": engine.cost_per_million_tokens,
        "replicas_up": engine.replicas_up,
        "request_rate": stable.request_rate,
        "prompt_token_rate": stable.prompt_token_rate,
        "generation_token_rate": stable.generation_token_rate,
        "ttft_p95_seconds": stable.ttft.p95,
        "inter_token_p95_seconds": stable.itl.p95,
        "mean_prompt_tokens": stable.mean_prompt_tokens,
        "mean_output_tokens": stable.mean_output_tokens,
    }


def _gateway_values(gateway: GatewaySignals) -> dict[str, Any]:
    return {
        "gateway_arrival_rate": gateway.arrival_rate,
        "gateway_buffered": gateway.buffered,
        "gateway_in_flight": gateway.in_flight,
        "slo_within_rate": gateway.slo_within_rate,
        "slo_outside_rate": gateway.slo_outside_rate,
    }
