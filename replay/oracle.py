"""The bounds a policy is judged against, and the static fleet sized to the SLO target.

- ``find_clairvoyant`` (the ``oracle`` row): every arrival known in advance, every
  policy's physics. A replica must be started one cold start before the interval that
  needs it and is billed from its start (``policies.Clairvoyant``). Replicas are sized
  per 15 s interval by a greedy over full simulations: start below the work estimate,
  raise the intervals whose requests miss (most misses per replica added first) until
  the SLO target holds, then lower the intervals that missed nothing (those whose
  tightest request had the most slack first) while it still holds, within a bounded
  number of rounds. A constant schedule is a schedule, so the
  smallest static fleet meeting the target is a candidate too: no static fleet is
  cheaper at the same SLO.
- ``find_instant_bound`` (``instant-bound``): the looser, older fit. Replicas per
  interval in proportion to the engine time its arrivals need, one multiplier on that
  work bisected over full simulations, replicas started and stopped instantly. No
  online policy can reach it (no cold start), and one global multiplier over-provisions
  some intervals to meet the others, so it is not a bound either: a reference row.
- ``smallest_static`` (``static-peak``): the fewest fixed replicas meeting the target,
  bisected over full simulations.

Each result says whether it reached the SLO target (``metrics["reached_slo_target"]``);
one that did not is the best it found, not a bound, and the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from replay.policies import Clairvoyant, Scheduled, StaticPeak
from replay.simulate import Result, SimConfig, cold_start_of, simulate
from replay.trace import Trace

GLOBAL_ROUNDS = 4
"""Simulations the clairvoyant spends bisecting one factor on its seed before the greedy."""
REACHED = "reached_slo_target"
"""The metric saying whether a bound (or the sized static fleet) met the SLO target."""


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


@dataclass(frozen=True, slots=True)
class ClairvoyantSchedule:
    """Ready replicas per interval, each started ``lead`` seconds ahead."""

    interval: float
    ready: npt.NDArray[np.int64]
    lead: float

    def policy(self) -> Clairvoyant:
        """The schedule as the replay's ``oracle`` policy."""
        return Clairvoyant(tuple(int(r) for r in self.ready), self.interval, self.lead)


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


def find_instant_bound(
    trace: Trace,
    config: SimConfig,
    slo_target: float = 0.99,
    interval: float = 15.0,
    iterations: int = 7,
) -> tuple[Result, OracleSchedule]:
    """Bisect the work multiplier for the cheapest instant-start schedule meeting the target.

    The multiplier doubles from 1 until the target holds (at most 16), then ``iterations``
    bisection steps. If even 16 misses, that schedule comes back with
    ``reached_slo_target`` false.
    """
    work = engine_work(trace, config, interval)
    # Multipliers that round to the same replicas in every interval run the same fleet: a
    # replay is deterministic, so its result is reused (a light day, one replica
    # wherever work arrives, bisected 8 replays of one schedule).
    runs: dict[bytes, Result] = {}

    def run(multiplier: float) -> tuple[Result, OracleSchedule]:
        schedule = OracleSchedule(interval, work, multiplier)
        key = np.minimum(schedule.replicas(), config.max_replicas).tobytes()
        if key not in runs:
            runs[key] = simulate(trace, Scheduled(schedule.function(config.max_replicas)), config)
        return runs[key], schedule

    low, high = 0.25, 1.0
    best = run(high)
    while not _meets(best[0], slo_target) and high < 16:  # grow until the SLO holds
        low, high = high, high * 2
        best = run(high)
    reached = _meets(best[0], slo_target)
    if reached:
        for _ in range(iterations):
            middle = (low + high) / 2
            tried = run(middle)
            if _meets(tried[0], slo_target):
                high, best = middle, tried
            else:
                low = middle
    best[0].metrics[REACHED] = reached
    return best


def smallest_static(
    trace: Trace, config: SimConfig, slo_target: float = 0.99, hint: int | None = None
) -> tuple[Result, int]:
    """The fewest fixed replicas meeting ``slo_target``, by bisection over full simulations.

    ``hint`` (for example the instant bound's peak) is tried first. If even
    ``config.max_replicas`` misses, that fleet comes back with ``reached_slo_target``
    false.
    """
    top = max(1, config.max_replicas)
    runs: dict[int, Result] = {}

    def meets(n: int) -> bool:
        runs[n] = simulate(trace, StaticPeak(n), config)
        return _meets(runs[n], slo_target)

    failing, meeting = 0, top + 1  # the largest size known to miss, the smallest to meet
    probe = min(max(hint or top, 1), top)
    if meets(probe):
        meeting = probe
    else:
        failing = probe
        if probe < top and meets(top):
            meeting = top
    if meeting > top:
        runs[top] = runs.get(top) or simulate(trace, StaticPeak(top), config)
        runs[top].metrics[REACHED] = False
        return runs[top], top
    while meeting - failing > 1:
        middle = (failing + meeting) // 2
        if meets(middle):
            meeting = middle
        else:
            failing = middle
    runs[meeting].metrics[REACHED] = True
    return runs[meeting], meeting


Candidate = tuple[Result, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]
"""A schedule that met the target: its run, ready replicas, misses and tightest request
per interval."""


def find_clairvoyant(
    trace: Trace,
    config: SimConfig,
    slo_target: float = 0.99,
    interval: float = 15.0,
    rounds: int = 20,
    seed: npt.NDArray[np.int64] | None = None,
    static: tuple[Result, int] | None = None,
) -> tuple[Result, ClairvoyantSchedule]:
    """The cheapest schedule found, within ``rounds`` simulations, that meets the target.

    Args:
        trace: the requests.
        config: the run; its cold start is the lead every replica is started with.
        slo_target: the share of requests that must meet the SLO.
        interval: seconds per sizing interval.
        rounds: simulations the greedy may run.
        seed: replicas per interval to start from (the instant bound's): one factor on
            it is bisected first (``GLOBAL_ROUNDS``). Without one, the work estimate at
            multiplier 1.
        static: the smallest static fleet meeting the target (``smallest_static``),
            a candidate schedule.

    Returns:
        The run (named ``oracle``, ``reached_slo_target`` set) and its schedule. If no
        candidate met the target, the one that came closest.
    """
    search = _Search(trace, config, slo_target, interval, rounds, seed)
    low, low_misses = search.global_fit()
    if low > 0:
        search.raise_misses(low, low_misses)
    search.trim()
    return search.outcome(static)


class _Search:
    """The clairvoyant's search state: the best schedule so far, the closest, the budget."""

    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        slo_target: float,
        interval: float,
        rounds: int,
        seed: npt.NDArray[np.int64] | None,
    ) -> None:
        self.trace, self.config, self.slo_target, self.interval = (
            trace,
            config,
            slo_target,
            interval,
        )
        self.lead = cold_start_of(config) + config.dt
        self.n = int(trace.duration // interval) + 1
        self.index = (trace.arrival // interval).astype(np.int64)
        self.count = np.bincount(self.index, minlength=self.n)
        self.allowed = math.floor((1.0 - slo_target) * len(trace) + 1e-9)
        self.cap = max(1, config.max_replicas)
        if seed is None:
            seed = OracleSchedule(interval, engine_work(trace, config, interval), 1.0).replicas()
        self.start = np.zeros(self.n)
        self.start[: min(self.n, len(seed))] = np.asarray(seed, dtype=np.float64)[: self.n]
        self.best: Candidate | None = None
        self.closest: tuple[Result, npt.NDArray[np.int64]] | None = None
        self.budget = max(1, rounds)

    def scaled(self, factor: float) -> npt.NDArray[np.int64]:
        """The seed times ``factor``, at least 1 where requests arrive, at most the cap."""
        replicas = np.clip(np.ceil(self.start * factor - 1e-9), 1, self.cap)
        return np.where(self.count > 0, replicas, 0).astype(np.int64)

    def run(self, schedule: npt.NDArray[np.int64]) -> tuple[bool, npt.NDArray[np.int64]]:
        """One simulation: whether it met the target, and its misses per interval."""
        self.budget -= 1
        policy = ClairvoyantSchedule(self.interval, schedule, self.lead).policy()
        result = simulate(self.trace, policy, self.config)
        misses = np.bincount(self.index[~result.met], minlength=self.n)
        if self.closest is None or _attainment(result) > _attainment(self.closest[0]):
            self.closest = (result, schedule.copy())
        feasible = int(misses.sum()) <= self.allowed
        if feasible and (self.best is None or _cheaper(result, schedule, self.best)):
            tightest = _tightest(result, self.index, self.n)
            self.best = (result, schedule.copy(), misses, tightest)
            return True, misses
        return False, misses

    def global_fit(self) -> tuple[float, npt.NDArray[np.int64]]:
        """1. One factor on the seed, bisected (a few rounds): a global fit with cold starts.

        Returns the largest factor that missed (0 if none did) and its misses.
        """
        low, high, factor = 0.0, math.inf, 1.0
        low_misses = np.zeros(self.n, dtype=np.int64)
        for _ in range(min(GLOBAL_ROUNDS, self.budget)):
            feasible, misses = self.run(self.scaled(factor))
            if feasible:
                high = factor
            else:
                low, low_misses = factor, misses
            factor = (low + high) / 2 if math.isfinite(high) else factor * 1.5
        return low, low_misses

    def raise_misses(self, low: float, misses: npt.NDArray[np.int64]) -> None:
        """2. From the largest factor that missed, raise the intervals that miss.

        Until the target holds, or the budget ends (the factor that met stays the fallback).
        """
        ready, met = self.scaled(low), False
        while not met and self.budget > 0:
            excess = int(misses.sum()) - self.allowed
            raised = _raise(ready, misses, self.count, excess, self.cap)
            if raised is None:
                break  # every interval that misses is at max_replicas
            ready = raised
            feasible, misses = self.run(ready)
            met = feasible or int(misses.sum()) <= self.allowed

    def trim(self) -> None:
        """3. Trim: lower by one the intervals that missed nothing and that the fleet holds.

        The fullest first; the batch doubles while the target holds and halves when it
        breaks.
        """
        batch, blocked = 0, np.zeros(self.n, dtype=bool)
        while self.best is not None and self.budget > 0:
            base, base_misses = self.best[1], self.best[2]
            held = _holds(base, self.interval, self.lead)
            lowerable = np.flatnonzero((base_misses == 0) & (base > 1) & held & ~blocked)
            if len(lowerable) == 0:
                break
            batch = min(batch or max(1, len(lowerable) // 2), len(lowerable))
            candidate = lowerable[np.argsort(-base[lowerable], kind="stable")][:batch]
            ready = base.copy()
            ready[candidate] -= 1
            accepted, _ = self.run(ready)
            if accepted:
                batch *= 2
            else:
                if batch == 1:
                    blocked[candidate] = True
                batch = max(1, batch // 2)

    def outcome(self, static: tuple[Result, int] | None) -> tuple[Result, ClairvoyantSchedule]:
        """The best schedule (the smallest static fleet if cheaper), or the closest miss."""
        n, best = self.n, self.best
        if static is not None and _meets(static[0], self.slo_target):
            if best is None or _hours(static[0]) < _hours(best[0]):
                fixed = np.full(n, static[1], dtype=np.int64)
                best = (
                    _renamed(static[0], "oracle"),
                    fixed,
                    np.zeros(n, dtype=np.int64),
                    np.zeros(n),
                )
        if best is not None:
            best[0].metrics[REACHED] = True
            return best[0], ClairvoyantSchedule(self.interval, best[1], self.lead)
        assert self.closest is not None
        self.closest[0].metrics[REACHED] = False
        return self.closest[0], ClairvoyantSchedule(self.interval, self.closest[1], self.lead)


def _cheaper(result: Result, ready: npt.NDArray[np.int64], best: Candidate) -> bool:
    """Fewer replica-hours, or as many with fewer replicas planned (a trim the lead hid)."""
    hours, before = _hours(result), _hours(best[0])
    return hours < before or (hours <= before and int(ready.sum()) < int(best[1].sum()))


def _holds(ready: npt.NDArray[np.int64], interval: float, lead: float) -> npt.NDArray[np.bool_]:
    """Per interval, whether the fleet it needs is the fleet held at some moment.

    The fleet at ``t`` is the most any interval within ``[t, t + lead]`` needs; lowering
    an interval that a later one within the lead always outnumbers changes nothing.
    """
    n = len(ready)
    held = np.zeros(n, dtype=bool)
    if n == 0:
        return held
    edges = np.unique(np.r_[np.arange(n + 1) * interval, np.arange(n + 1) * interval - lead])
    edges = edges[(edges >= 0.0) & (edges <= n * interval)]
    t = (edges[:-1] + edges[1:]) / 2  # one moment inside each stretch of equal windows
    first = np.minimum((t // interval).astype(np.int64), n - 1)
    last = np.minimum(((t + lead) // interval).astype(np.int64), n - 1)
    offsets = np.arange(int((last - first).max()) + 1)
    columns = first[:, None] + offsets[None, :]
    valid = columns <= last[:, None]
    values = np.where(valid, ready[np.minimum(columns, n - 1)], -1)
    top = values.max(axis=1, keepdims=True)
    held[columns[valid & (values == top)]] = True
    return held


def _tightest(result: Result, index: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.float64]:
    """Per interval, the largest SLO ratio (TTFT / target or ITL / SLO) of its requests."""
    tightest = np.zeros(n)
    np.maximum.at(tightest, index, result.slo_ratio)
    return tightest


def _raise(
    ready: npt.NDArray[np.int64],
    misses: npt.NDArray[np.int64],
    count: npt.NDArray[np.int64],
    deficit: int,
    cap: int,
) -> npt.NDArray[np.int64] | None:
    """More replicas where requests missed: the most misses per replica added first.

    Each interval that missed may grow by its share of misses (at least one replica, at
    most half again); intervals are taken until their misses cover 1.5 times the
    deficit, since a replica added rarely saves every miss of its interval.
    """
    room = cap - ready
    candidates = np.flatnonzero((misses > 0) & (room > 0))
    if len(candidates) == 0:
        return None
    share = misses[candidates] / np.maximum(count[candidates], 1)
    step = np.maximum(1, np.ceil(ready[candidates] * np.minimum(share, 0.5))).astype(np.int64)
    step = np.minimum(step, room[candidates])
    order = np.argsort(-(misses[candidates] / step), kind="stable")
    covered = np.cumsum(misses[candidates][order])
    take = order[: int(np.searchsorted(covered, 1.5 * deficit)) + 1]
    raised = ready.copy()
    raised[candidates[take]] += step[take]
    return raised


def _meets(result: Result, slo_target: float) -> bool:
    return bool(_attainment(result) >= slo_target)


def _attainment(result: Result) -> float:
    value = float(result.metrics["slo_attainment"])
    return value if math.isfinite(value) else 0.0


def _hours(result: Result) -> float:
    return float(result.metrics["gpu_hours"])


def _renamed(result: Result, name: str) -> Result:
    return Result(
        name,
        dict(result.metrics),
        result.series,
        result.ttft,
        result.e2e,
        result.decisions,
        result.met,
        result.slo_ratio,
        result.miss_cause,
    )
