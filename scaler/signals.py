"""The latest signals per target, and the observation the decision core reads from them.

Sources (exporter and gateway watches, Prometheus, the demo source) call
``SignalStore.update`` with typed snapshots (``foundation.signals``); the registry reads
``SignalStore.get`` and is told of every update, so that decisions are made once per new
signal, not once per KEDA call.

The store is where every source's signals enter the scaler, so it is the one place that
checks them: a snapshot dated in the future (beyond ``MAX_CLOCK_SKEW``) or at no finite
time is refused, and impossible values (a negative queue, a NaN rate) are kept as
unmeasured; both are counted and logged once per target and source until they stop.
No I/O; the clock is injected (``clock()`` is only compared with snapshot times).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from foundation.durations import format_duration
from foundation.errors import NoDataError, StaleSignalError
from foundation.signals import (
    EngineSignals,
    GatewaySignals,
    Snapshot,
    TargetKey,
    checked,
    describe_target,
    impossible_counts,
)
from scaler.core.model import Observation

__all__ = [
    "MAX_CLOCK_SKEW",
    "MAX_TARGETS",
    "TARGET_TTL",
    "SignalStore",
    "TargetKey",
    "TargetSignals",
    "observe",
]

log = logging.getLogger(__name__)

MAX_CLOCK_SKEW = 30.0
"""Seconds a source's clock may run ahead of the scaler's.

The store keeps each source's newest snapshot and drops older ones, so one dated a day
ahead would make every real one look older for a day while it still counted as fresh:
the target's signals frozen at that round's values. NTP keeps clocks within a second;
30 s leaves room for a slow one, and bounds how long a bad snapshot can hold.
"""


MAX_TARGETS = 20_000
"""Targets the store keeps (two per ScaledObject at the registry's bound, with room).

A watched source can name any number of targets; each is kept with its problems. Past
the bound a new target's snapshots are refused (counted ``full``, logged once a filling)
until ``evict_idle`` frees room: targets kept stay, so a flood of new names cannot
push out the ones in use; and a new target a ScaledObject scales takes the place of the
stalest one none scales, so a flood cannot keep it out either."""

NEW_TARGETS = "new targets"
"""What a problem with a snapshot refused for a target not stored is remembered under."""

TARGET_TTL = 600.0
"""Seconds a target no ScaledObject scales is kept after its last snapshot: long past any
signal's use (``max-signal-age`` is 30 s by default), short enough that names a source
sent once do not pile up."""


@dataclass(slots=True)
class TargetSignals:
    """The newest snapshot from each source for one target."""

    version: int = 0
    engine: EngineSignals | None = None
    gateway: GatewaySignals | None = None
    updated_at: float = 0.0
    """When a snapshot was last kept (the store's clock)."""


def shows_load(signals: TargetSignals | None) -> bool:
    """Whether the newest snapshots show any request arriving, waiting, running or served.

    What can turn a deployment at zero active at once (a forecast turns it at KEDA's
    poll). A value not measured shows nothing here: this only says when to decide
    early, never what. Example: the gateway buffering 1 at zero replicas shows load;
    engines reporting 0 everywhere and a gateway with no arrivals do not.
    """
    if signals is None:
        return False
    found: list[float | None] = []
    if signals.gateway is not None:
        gateway = signals.gateway
        found += [gateway.buffered, gateway.in_flight, gateway.arrival_rate]
    if signals.engine is not None:
        engine = signals.engine
        found += [engine.queue_depth, engine.running]
        for window in (engine.panic, engine.stable):
            found += [window.request_rate, window.prompt_token_rate, window.running_mean]
            found.append(window.generation_token_rate)
    return any(value is not None and value > 0 for value in found)


class SignalStore:
    """Latest signals per target; notifies listeners after each accepted update.

    Args:
        clock: seconds since the epoch now (the scaler's clock; the replay's simulated one).
    """

    def __init__(
        self, clock: Callable[[], float] = time.time, max_targets: int = MAX_TARGETS
    ) -> None:
        self._clock = clock
        self._max_targets = max_targets
        self._full_logged = False
        self._targets: dict[TargetKey, TargetSignals] = {}
        self._listeners: list[Callable[[TargetKey], None]] = []
        self._bound: Callable[[TargetKey], bool] = lambda key: False
        self._problems: dict[tuple[object, str], str] = {}
        self.refused: Counter[tuple[str, str]] = Counter()
        """Snapshots refused, by (source, reason): ``future``, ``time-not-finite``,
        ``replicas`` (counts no deployment has: ``impossible_counts``), ``full`` (a new
        target past ``max_targets``) here;
        what a source could not even decode it counts with ``count_refused``."""
        self.unmeasured: Counter[tuple[str, str]] = Counter()
        """Impossible values taken as unmeasured, by (source, field)."""
        self.evicted = 0
        """Targets no ScaledObject scales dropped, while the store was full, for one a
        ScaledObject scales."""
        self.errors: Counter[tuple[str, str]] = Counter()
        """A source's units of work that failed (a target's query round, a message), by
        (source, reason): see ``count_error``."""

    def set_bound(self, bound: Callable[[TargetKey], bool]) -> None:
        """Tell the store which targets some ScaledObject scales (the registry knows).

        Such a target is admitted when the store is full, in place of the stalest other.
        """
        self._bound = bound

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

        Returns whether it was kept: an older one (a reconnect replayed it) is not, nor
        one dated beyond ``MAX_CLOCK_SKEW`` ahead or at no finite time, nor one whose
        replica counts are impossible. Impossible values
        in a kept one are unmeasured (``foundation.signals.checked``).
        """
        key, source = snapshot.target, snapshot.source
        signals, impossible = checked(snapshot.signals)
        entry = self._targets.get(key)
        refusal = self._refusal(signals)
        if refusal is not None:
            self.refused[(source, refusal[0])] += 1
            problem = f"{source} snapshot refused: {refusal[1]}"
            if entry is not None:
                self.report((key, source), problem)
            else:
                # A target never stored is never forgotten: its problem is remembered per
                # source, not per name (a name each snapshot grew this by 600 B and a
                # WARNING a name, for good: issue 27, hostile pass 6, S6-H4).
                self.report((NEW_TARGETS, source), problem, f" ({describe_target(key)})")
            return False
        if entry is None:
            if not self._has_room(source, key):
                return False
            entry = self._targets[key] = TargetSignals()
        for name, _ in impossible:
            self.unmeasured[(source, name.rpartition(".")[2])] += 1
        names = ", ".join(name for name, _ in impossible)
        values = ", ".join(f"{name} {value!r}" for name, value in impossible)
        problem = names and f"{source} sent impossible values, taken as unmeasured: {names}"
        self.report((key, source), problem, detail=values and f" (this time {values})")
        previous = entry.engine if isinstance(signals, EngineSignals) else entry.gateway
        if previous is not None and previous.time > signals.time:
            return False
        if isinstance(signals, EngineSignals):
            entry.engine = signals
        else:
            entry.gateway = signals
        entry.version += 1
        entry.updated_at = self._clock()
        for listener in self._listeners:
            listener(key)
        return True

    def _has_room(self, source: str, key: TargetKey) -> bool:
        """Whether a new target fits; past ``max_targets`` it is refused, counted.

        One a ScaledObject scales is let in all the same, in place of the target no
        ScaledObject scales that was updated longest ago: a source naming 20,000 junk
        targets every round kept a new deployment's signals out for good (KEDA's
        fallback), as ``evict_idle`` never frees targets refreshed each round.
        """
        if len(self._targets) < self._max_targets:
            self._full_logged = False
            return True
        if self._bound(key):
            unbound = (k for k in self._targets if not self._bound(k))
            stalest = min(unbound, key=lambda k: self._targets[k].updated_at, default=None)
            if stalest is not None:
                self._forget([stalest])
                self.evicted += 1
                return True
        self.refused[(source, "full")] += 1
        if not self._full_logged:
            self._full_logged = True
            log.error(
                "refusing signals for new targets: %d kept already, the most kept"
                " (a target no ScaledObject scales is forgotten %s after its last snapshot;"
                " one a ScaledObject scales takes the place of the stalest such)",
                len(self._targets),
                format_duration(TARGET_TTL),
            )
        return False

    def evict_idle(self, ttl: float, keep: Collection[TargetKey] = ()) -> int:
        """Forget targets without a snapshot for ``ttl`` seconds, except those in ``keep``.

        Returns how many were forgotten; their logged problems go with them.
        """
        for about in [a for a in self._problems if a[0] == NEW_TARGETS]:
            del self._problems[about]  # logged again, once, if it goes on
        cutoff = self._clock() - ttl
        gone = [
            key
            for key, entry in self._targets.items()
            if entry.updated_at < cutoff and key not in keep
        ]
        self._forget(gone)
        if gone:
            log.info(
                "forgot the signals of %d targets (none for %s)", len(gone), format_duration(ttl)
            )
        return len(gone)

    def _forget(self, keys: Collection[TargetKey]) -> None:
        """Drop ``keys`` and the problems logged about them."""
        for key in keys:
            del self._targets[key]
        forgotten = set(keys)
        for about in [a for a in self._problems if a[0] in forgotten]:
            del self._problems[about]

    def _refusal(self, signals: EngineSignals | GatewaySignals) -> tuple[str, str] | None:
        """(reason, message) when a snapshot must not be stored: its time or its counts."""
        at = signals.time
        counts = impossible_counts(signals)
        if counts is not None:
            return "replicas", f"its replica counts are impossible ({counts})"
        if not math.isfinite(at):
            return "time-not-finite", f"its time is {at!r}"
        if at - self._clock() > MAX_CLOCK_SKEW:
            # No amount in the message: it changes every round, the problem does not.
            return "future", (
                f"dated more than {format_duration(MAX_CLOCK_SKEW)} ahead of this clock"
            )
        return None

    def count_error(self, source: str, reason: str) -> None:
        """Count one failed unit of a source's work (the source logs it, once a change)."""
        self.errors[(source, reason)] += 1

    def count_refused(self, source: str, reason: str) -> None:
        """Count one message a source refused before it could become a snapshot."""
        self.refused[(source, reason)] += 1

    def report(self, about: tuple[object, str], problem: str, detail: str = "") -> bool:
        """Log ``problem`` about ``(target, source)`` once, until it changes or clears.

        ``detail`` (this time's values) is logged with it but is no change by itself.
        An empty ``problem`` clears it (logged once as usable again). Returns whether
        anything was logged. A source failing every second is one line, not thousands.
        """
        before = self._problems.get(about, "")
        if problem == before:
            return False
        target, source = about
        where = describe_target(target) if isinstance(target, tuple) else str(target)
        if problem:
            self._problems[about] = problem
            log.warning("signals for %s: %s%s", where, problem, detail)
        else:
            del self._problems[about]
            log.info("signals for %s from %s are usable again", where, source)
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
        "replicas_uncounted": engine.replicas is None or engine.replicas_up is None,
        "replicas_sleeping": engine.replicas_sleeping,
        "engine_partial": engine.partial,
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
