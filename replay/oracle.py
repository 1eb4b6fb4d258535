"""The clairvoyant lower bound: the fewest replicas meeting the SLO, interval by interval.

With perfect foresight and no cold start, each interval gets replicas in proportion to
the engine time its arrivals need (prefill of every prompt plus decode of every output
token at the largest batch the inter-token SLO allows). One multiplier on that work is
then searched (bisection over full simulations) for the smallest schedule whose SLO
attainment reaches the target. A policy can be cheaper only by missing the SLO.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from replay.policies import Scheduled
from replay.simulate import Result, SimConfig, simulate
from replay.trace import Trace


@dataclass(frozen=True, slots=True)
class OracleSchedule:
    """Replicas per interval: ``replicas[i]`` holds from ``i * interval`` on."""

    interval: float
    work: np.ndarray
    multiplier: float

    def replicas(self) -> np.ndarray:
        """Replicas per interval at this multiplier (at least 1 where work arrives)."""
        raw = np.ceil(self.work * self.multiplier / self.interval - 1e-9)
        return np.where(self.work > 0, np.maximum(raw, 1), 0).astype(int)

    def function(self, max_replicas: int) -> Callable[[float], int]:
        """The schedule as ``now -> replicas``, clamped to ``max_replicas``."""
        counts = np.minimum(self.replicas(), max_replicas)

        def at(now: float) -> int:
            i = int(now // self.interval)
            # keep the last interval's replicas while the tail drains
            return int(counts[min(i, len(counts) - 1)]) if len(counts) else 0

        return at


def engine_work(trace: Trace, config: SimConfig, interval: float) -> np.ndarray:
    """Replicas' worth of work each interval needs, bursts included.

    Per second, the engine-seconds of work arriving; any window of L seconds inside an
    interval must clear within L plus the TTFT SLO, so the interval needs the largest
    ``work(window) / (L + slo_ttft)`` over windows of 1 to 30 s (times ``interval``,
    so that ``replicas = work / interval`` below).
    """
    p = config.profile
    context = float(np.mean(trace.prompt + trace.output / 2))
    batch = max(1, p.decode_capacity(context, config.slo_itl * 0.8))
    per_token = p.decode_step_seconds(batch, batch * context) / batch
    prefill = p.prefill_marginal_seconds(trace.prompt.astype(np.float64))
    work = prefill + trace.output * per_token
    seconds = math.ceil(trace.duration + 1e-9) + 1
    per_second = np.bincount(trace.arrival.astype(int), weights=work, minlength=seconds)
    need = np.zeros(seconds)
    for length in (1, 2, 4, 8, 15, 30):
        window = np.convolve(per_second, np.ones(length), mode="full")[: seconds + length - 1]
        # the window ending at second s covers [s - length + 1, s]: charge it to all of them
        rate = window / (length + config.slo_ttft)
        for shift in range(length):
            need = np.maximum(need, rate[shift : shift + seconds])
    bins = math.ceil(seconds / interval)
    padded = np.zeros(bins * int(interval))
    padded[:seconds] = need
    result: np.ndarray = padded.reshape(bins, int(interval)).max(axis=1) * interval
    return result


def find_oracle(
    trace: Trace,
    config: SimConfig,
    slo_target: float = 0.99,
    interval: float = 15.0,
    iterations: int = 7,
) -> tuple[Result, OracleSchedule]:
    """Bisect the work multiplier for the cheapest schedule meeting ``slo_target``."""
    work = engine_work(trace, config, interval)
    low, high = 0.25, 1.0
    best: tuple[Result, OracleSchedule] | None = None
    while True:  # grow until the SLO holds
        schedule = OracleSchedule(interval, work, high)
        result = simulate(trace, Scheduled(schedule.function(config.max_replicas)), config)
        if result.metrics["slo_attainment"] >= slo_target or high >= 16:
            best = (result, schedule)
            break
        low, high = high, high * 2
    for _ in range(iterations):
        middle = (low + high) / 2
        schedule = OracleSchedule(interval, work, middle)
        result = simulate(trace, Scheduled(schedule.function(config.max_replicas)), config)
        if result.metrics["slo_attainment"] >= slo_target:
            high, best = middle, (result, schedule)
        else:
            low = middle
    return best
