"""Sliding windows over scrapes, and the signals derived from them.

Everything here is pure: scrapes and ``now`` come in, numbers come out. Counters and
histogram buckets become *increases inside the window* (Prometheus ``increase``
semantics: a restart, seen as every core counter set back to at most half, counts the new
value as the increase; a column falling alone adds nothing; a replica whose core counters
fell twice in its history is two engines behind one address, its increases unknown),
never lifetime totals. A signal
that cannot be computed (one scrape in the window, a family the engine does not expose)
is None.

The request mix (mean prompt and output tokens per request) is the increase of the
per-request token histograms' ``_sum`` over that of their ``_count``: requests finished
in the window, each counted once when it finished (the token counters count a prompt at
prefill, a request at its end, so their ratio is off while the load changes).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from exporter.engines import COUNTERS, HISTOGRAMS, LENGTHS, EngineStats
from foundation.signals import QUANTILES, EngineSignals, Quantiles, WindowSignals

Vector = npt.NDArray[np.float64]


# A replica's flat vector: counters, each LENGTHS histogram's count and sum, then buckets.
_SCALARS = len(COUNTERS) + 2 * len(LENGTHS)
_CORE = [COUNTERS.index(c) for c in ("prompt_tokens", "generation_tokens", "requests")]
LOAD = frozenset({"running", "waiting", "prompt_tokens", "generation_tokens", "requests"})
"""The concepts that measure a replica's load: one missing on a replica that answers
makes the deployment's signal ``partial`` (a latency histogram or ``preemptions`` that
an engine lacks does not: SGLang has no ``e2e`` histogram, every scrape)."""
"""The counters that fall together when an engine restarts."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each counter and histogram sits in a replica's flat vector."""

    bounds: tuple[tuple[str, tuple[float, ...]], ...]

    @staticmethod
    def of(stats: EngineStats) -> Layout:
        """The layout of a scrape's counters and histograms."""
        return Layout(
            tuple((c, stats.histograms[c].bounds) for c in HISTOGRAMS if c in stats.histograms)
        )

    def vector(self, stats: EngineStats) -> Vector:
        """Counters, token histograms' count and sum (NaN when missing), then buckets."""
        values = [stats.counters.get(c, math.nan) for c in COUNTERS]
        for concept in LENGTHS:
            found = stats.histograms.get(concept)
            values.extend((found.count, found.total) if found else (math.nan, math.nan))
        for concept, _ in self.bounds:
            values.extend(stats.histograms[concept].counts)
        return np.array(values, dtype=np.float64)


def history_horizon(stable_window: float, interval: float) -> float:
    """How long a replica's scrapes are kept: the stable window plus two intervals.

    A window needs the newest scrape at or before its start as its base, and scrapes
    land up to one interval late, so 60 s windows scraped every 5 s keep 70 s.
    """
    return stable_window + 2 * interval


@dataclass(slots=True)
class ReplicaHistory:
    """A replica's recent scrapes, oldest first, kept for ``horizon`` seconds."""

    horizon: float
    layout: Layout | None = None
    times: list[float] = field(default_factory=list)
    vectors: list[Vector] = field(default_factory=list)
    gauges: list[dict[str, float]] = field(default_factory=list)
    falls: list[float] = field(default_factory=list)
    """When its core counters fell (a restart, or one of them back), among the scrapes kept."""

    def add(self, now: float, stats: EngineStats) -> None:
        """Record a scrape taken at ``now``; a new bucket layout keeps the counters."""
        layout = Layout.of(stats)
        if layout != self.layout:  # buckets changed (an upgrade): their deltas are nonsense
            self._relayout(layout)
        vector = layout.vector(stats)
        if self.vectors and _fell(self.vectors[-1], vector):
            self.falls.append(now)
        self.times.append(now)
        self.vectors.append(vector)
        self.gauges.append(stats.gauges)
        cutoff = now - self.horizon
        drop = 0
        while drop < len(self.times) - 2 and self.times[drop + 1] < cutoff:
            drop += 1  # keep one scrape before the horizon as the base of the window
        if drop:
            del self.times[:drop], self.vectors[:drop], self.gauges[:drop]
            self.falls = [t for t in self.falls if t > self.times[0]]

    def _relayout(self, layout: Layout) -> None:
        """Keep the scrapes' counters under a new bucket layout; their buckets are unknown.

        The scrapes were dropped whole, counters too, so the replica had no window until
        two scrapes under the new layout, and the deployment's rates were the other
        replicas' alone (not partial, nothing missing): a replica whose buckets moved
        every scrape hid its load for good, and the scaler took the rest for the whole
        (issue 27, hostile pass 7, XS-H2). The counters go on; a window over the change
        has no buckets (NaN: ``ReplicaWindow.buckets`` says None), as an engine that
        lacks the histogram.
        """
        self.layout = layout
        unknown = np.full(sum(len(bounds) for _, bounds in layout.bounds), math.nan)
        self.vectors = [np.concatenate((v[:_SCALARS], unknown)) for v in self.vectors]

    def window(self, now: float, seconds: float) -> ReplicaWindow | None:
        """Increases and gauge means over the last ``seconds``, or None with < 2 scrapes."""
        start = now - seconds
        first = 0
        while first < len(self.times) - 1 and self.times[first + 1] <= start:
            first += 1  # the newest scrape at or before the window start is its base
        if len(self.times) - first < 2:
            return None
        times = self.times[first:]
        matrix = np.vstack(self.vectors[first:])
        steps = np.diff(matrix, axis=0)
        restarted = _restarted(matrix[:-1], matrix[1:])
        if restarted.any():
            steps[restarted] = matrix[1:][restarted]  # the counts since the restart
        np.maximum(steps, 0.0, out=steps, where=~np.isnan(steps))
        increase = steps.sum(axis=0)
        if len(self.falls) > 1:
            # Counters that fell twice in a history of a minute: no engine restarts so
            # fast (it loads its model each time), and an honest counter falls only then;
            # but one address answering for two engines in turn (a Service, not a pod)
            # falls each time it lands on the one that counted less. Each fall read as a
            # restart (or each rise after one that was not) made 20 requests/s 3,888, the
            # fleet at its maximum (hostile pass 62). Its counts are unknown while two
            # falls are in its history.
            increase[:] = math.nan
        assert self.layout is not None
        gauges = self.gauges[first + 1 :]
        means = {
            name: float(np.mean([g[name] for g in gauges]))
            for name in ("running", "waiting", "kv_usage")
            if all(name in g for g in gauges)
        }
        return ReplicaWindow(times[-1] - times[0], increase, self.layout, means)


def _restarted(
    before: npt.NDArray[np.float64], after: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]:
    """Per step (row), whether the engine restarted between the two scrapes.

    A restart sets the counters back to 0: every core counter (requests, tokens) that had
    counted anything comes back at most half of it (``_reset``). Neither a _created that
    moves (one that moved each scrape made every step a restart: 2e8 requests/s for 1/s)
    nor a counter or bucket a few counts back (100,045 requests/s for 10, the fleet at its
    maximum: hostile passes 30 and 31) is one; a column that falls without a restart adds
    nothing. With no core count yet (an engine without them), the other columns tell it.
    """
    restarted = _reset(before[:, _CORE], after[:, _CORE])
    blank = ~np.any(before[:, _CORE] > 0, axis=1)
    restarted[blank] = _reset(before[blank], after[blank])
    return restarted


FALL_SLACK = 3.0
"""Counts a core counter may come back without falling (``_fell``): scrapes that are not
atomic, as ``_reset`` allows them (hostile passes 30 and 31)."""


def _fell(before: Vector, after: Vector) -> bool:
    """Whether the engine restarted between two scrapes, or a core counter fell."""
    with np.errstate(invalid="ignore"):
        down = bool(np.any(after[_CORE] < before[_CORE] - FALL_SLACK))
    return down or bool(_restarted(before[None, :], after[None, :])[0])


def _reset(before: Vector, after: Vector) -> npt.NDArray[np.bool_]:
    """Per step, whether the columns were set back to 0.

    Every one that had counted anything is now at most half of it (counts since a
    restart are few against a lifetime), and some had. A column one count back, or
    three, is no reset: read as one, every lifetime total was the step's increase
    (hostile passes 30 and 31).
    """
    with np.errstate(invalid="ignore"):
        counted = before > 0
        down = after <= before / 2
    result: npt.NDArray[np.bool_] = np.any(counted, axis=1) & np.all(down | ~counted, axis=1)
    return result


@dataclass(frozen=True, slots=True)
class ReplicaWindow:
    """One replica's increases over ``duration`` seconds."""

    duration: float
    increase: Vector
    layout: Layout
    gauge_means: dict[str, float]

    def rate(self, counter: str) -> float | None:
        """Per-second increase of a counter, or None if the engine lacks it."""
        value = self.increase[COUNTERS.index(counter)]
        return None if math.isnan(value) or self.duration <= 0 else float(value / self.duration)

    def finished(self, concept: str) -> tuple[float, float] | None:
        """Requests finished and their tokens (a ``LENGTHS`` histogram), or None if unknown."""
        at = len(COUNTERS) + 2 * LENGTHS.index(concept)
        count, total = self.increase[at], self.increase[at + 1]
        return None if math.isnan(count) or math.isnan(total) else (float(count), float(total))

    def counted(self, concept: str) -> tuple[float, float] | None:
        """Requests and their tokens by the counters (a ``LENGTHS`` concept), or None.

        For an engine without the per-request histograms (SGLang without
        ``--collect-tokens-histogram``): its counters count a prompt at prefill and a
        request at its end, so the ratio is off while the load changes, but each replica
        has its own, and the deployment's is floored by the replicas' (``_mean_tokens``):
        pooled alone, one replica claiming 10,000 one-token requests a second set the mix
        of ten, and a loaded deployment asked for one replica (hostile pass 63).
        """
        tokens = "prompt_tokens" if concept == "prompt_length" else "generation_tokens"
        count = self.increase[COUNTERS.index("requests")]
        total = self.increase[COUNTERS.index(tokens)]
        return None if math.isnan(count) or math.isnan(total) else (float(count), float(total))

    def buckets(self, histogram: str) -> tuple[tuple[float, ...], Vector] | None:
        """Bucket bounds and cumulative count increases of a histogram."""
        offset = _SCALARS
        for concept, bounds in self.layout.bounds:
            if concept == histogram:
                counts = self.increase[offset : offset + len(bounds)]
                # NaN: the window spans a change of layout (``ReplicaHistory._relayout``)
                return None if np.isnan(counts).any() else (bounds, counts)
            offset += len(bounds)
        return None


def bucket_quantile(q: float, bounds: Sequence[float], cumulative: Vector) -> float | None:
    """Prometheus ``histogram_quantile`` over cumulative bucket counts.

    Linear interpolation inside the bucket holding rank ``q * total``; the first
    bucket starts at 0; a rank in the +Inf bucket answers the largest finite bound.
    None when the buckets hold no observation. Example: bounds (0.1, 0.5, +Inf),
    counts (2, 6, 6), q 0.5: rank 3 lies in (0.1, 0.5] holding 4 -> 0.1 + 0.4 * 1/4 = 0.2.
    """
    return bucket_quantiles((q,), bounds, cumulative)[0]


def bucket_quantiles(
    qs: Sequence[float], bounds: Sequence[float], cumulative: Vector
) -> tuple[float | None, ...]:
    """``bucket_quantile`` for each of ``qs``, the counts made monotone once."""
    # Scrapes are not atomic: keep the counts monotone.
    counts: list[float] = np.maximum.accumulate(cumulative).tolist()
    total = float(counts[-1]) if counts else 0.0
    if total <= 0 or not math.isfinite(total):
        return (None,) * len(qs)
    return tuple(_interpolated(q * total, bounds, counts) for q in qs)


def _interpolated(rank: float, bounds: Sequence[float], counts: list[float]) -> float | None:
    index = min(bisect.bisect_left(counts, rank), len(bounds) - 1)
    if math.isinf(bounds[index]):
        finite = [b for b in bounds if math.isfinite(b)]
        return finite[-1] if finite else None
    upper = bounds[index]
    if index == 0:
        lower, below = (0.0 if upper > 0 else upper), 0.0
    else:
        lower, below = bounds[index - 1], counts[index - 1]
    inside = counts[index] - below
    if inside <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / inside


@dataclass(frozen=True, slots=True)
class Accelerator:
    """What one replica costs: price per accelerator-hour times the share it holds."""

    price_per_hour: float
    fraction: float
    price_is_default: bool = False


def derive(
    now: float,
    replicas: int,
    latest: Sequence[EngineStats],
    histories: Sequence[ReplicaHistory],
    panic_seconds: float,
    stable_seconds: float,
    accelerator: Accelerator,
    at: float | None = None,
) -> EngineSignals:
    """Deployment signals from the replicas scraped now (``latest``) and their histories.

    ``now`` dates the signals; ``at`` is the same instant on the histories' clock (the
    exporter's monotonic one; None: ``now``).

    ``replicas`` counts every known replica, up or not: each holds accelerators and
    costs money. With no replica at all, load and rates are 0 (facts, not guesses);
    with replicas but none answering, they are None; a gauge or rate some answering
    replica lacks is None too, never the others' sum. Replicas asleep are counted among
    those answering when every one of them exposes its sleep state, else unknown (None).
    """
    up = len(latest)
    none_known = replicas == 0
    at = now if at is None else at
    running_now = [s.gauges.get("running") for s in latest]
    panic, _ = _window(at, panic_seconds, histories, none_known, running_now)
    stable, estimated = _window(at, stable_seconds, histories, none_known, running_now)
    queue = _gauge_sum(latest, "waiting", none_known)
    running = _gauge_sum(latest, "running", none_known)
    kv_values = [s.gauges["kv_usage"] for s in latest if "kv_usage" in s.gauges]
    kv = float(np.mean(kv_values)) if kv_values else None
    spend = accelerator.price_per_hour * accelerator.fraction * replicas  # $ per hour
    cost_total = _cost(spend, _sum(stable.prompt_token_rate, stable.generation_token_rate))
    cost_output = _cost(spend, stable.generation_token_rate)
    # A token rate unknown (or estimated) while replicas answer is some replica's part
    # unknown (a counter NaN, or fallen twice in the window): the deployment's is partly
    # known, and what is in flight no measure of its load (hostile pass 65).
    counted = any(len(h.times) > 1 for h in histories)  # a window exists: not the first scrape
    rates_unknown = counted and None in (stable.prompt_token_rate, stable.generation_token_rate)
    missing = any(LOAD.intersection(s.missing) for s in latest)
    partial = up < replicas or missing or rates_unknown or estimated
    return EngineSignals(
        now,
        replicas,
        up,
        queue,
        running,
        kv,
        panic,
        stable,
        cost_total,
        cost_output,
        accelerator.price_is_default,
        partial,
        replicas_sleeping=_sleeping(latest, none_known),
    )


def _sleeping(latest: Sequence[EngineStats], none_known: bool) -> int | None:
    """Answering replicas asleep; None when one of them does not say (or none answers)."""
    if none_known:
        return 0
    if not latest or any(s.sleeping is None for s in latest):
        return None
    return sum(1 for s in latest if s.sleeping)


def _sum(*values: float | None) -> float | None:
    return (
        None if any(v is None for v in values) else float(sum(v for v in values if v is not None))
    )


def _cost(dollars_per_hour: float, tokens_per_second: float | None) -> float | None:
    """$ per 1M tokens; +Inf when paying for replicas that served nothing."""
    if tokens_per_second is None:
        return None
    if tokens_per_second <= 0:
        return math.inf if dollars_per_hour > 0 else None
    return dollars_per_hour / (tokens_per_second * 3600) * 1e6


def _gauge_sum(latest: Sequence[EngineStats], name: str, none_known: bool) -> float | None:
    """The deployment's gauge: None unless every replica answering has it.

    A sum over some replicas is not the deployment's: an idle replica's 0 beside a busy
    one whose gauge was rejected (NaN) read as "nothing in flight" and scaled to zero.
    """
    if none_known:
        return 0.0
    if not latest or any(name not in s.gauges for s in latest):
        return None
    return float(sum(s.gauges[name] for s in latest))


def _window(
    now: float,
    seconds: float,
    histories: Sequence[ReplicaHistory],
    none_known: bool,
    running: Sequence[float | None] = (),
) -> tuple[WindowSignals, bool]:
    """The deployment's window of ``seconds``, and whether a rate in it is estimated.

    A counter's rate unknown on fewer than half the replicas (NaN, missing, fallen twice
    in the window) is estimated (``_estimate``); on more, it is unknown. Unknown for
    good on one replica of ten, the deployment's throughput was, and its count was held
    at its peak for as long (hostile pass 65). ``running``: each history's replica's
    requests running now, in the same order (empty: not known).
    """
    if none_known:
        zeros = WindowSignals(seconds, 0.0, 0.0, 0.0, 0.0, queue_depth_mean=0.0, running_mean=0.0)
        return zeros, False
    per_history = [h.window(now, seconds) for h in histories]
    windows = [w for w in per_history if w is not None]
    if not windows:
        return WindowSignals(seconds), False
    # Running now, by window: for the estimate's weights, only with every one known.
    weights = [r for r, w in zip(running, per_history, strict=False) if w is not None]
    if len(weights) != len(windows) or None in weights:
        weights = []
    estimated = False

    def total(counter: str) -> float | None:
        nonlocal estimated
        rates = [w.rate(counter) for w in windows]
        if None not in rates:
            return float(sum(r for r in rates if r))
        estimate = _estimate(rates, weights)
        # Only a load's estimate makes the signal partial: SGLang has no preemptions
        # counter, and a deployment partial for good never scales to zero.
        estimated = estimated or (estimate is not None and counter in LOAD)
        return estimate

    quantiles: dict[str, Quantiles] = {}
    for histogram in HISTOGRAMS:
        merged = _merge_buckets(windows, histogram)
        if merged is not None:
            bounds, counts, members = merged
            pooled = bucket_quantiles(QUANTILES, bounds, counts)
            # One replica's own quantiles are the pooled ones (its counts summed alone).
            own = (
                [bucket_quantiles(QUANTILES, bounds, m) for m in members]
                if len(members) > 1
                else [pooled]
            )
            quantiles[histogram] = Quantiles(
                *(majority_floor(p, [o[j] for o in own]) for j, p in enumerate(pooled))
            )
    means = [w.gauge_means for w in windows]
    signals = WindowSignals(
        seconds,
        total("requests"),
        total("prompt_tokens"),
        total("generation_tokens"),
        total("preemptions"),
        **quantiles,
        queue_depth_mean=(
            float(sum(m["waiting"] for m in means)) if all("waiting" in m for m in means) else None
        ),
        running_mean=(
            float(sum(m["running"] for m in means)) if all("running" in m for m in means) else None
        ),
        mean_prompt_tokens=_mean_tokens(windows, "prompt_length"),
        mean_output_tokens=_mean_tokens(windows, "output_length"),
    )
    return signals, estimated


def _estimate(rates: Sequence[float | None], running: Sequence[float | None]) -> float | None:
    """The deployment's rate where some replicas' are unknown (None), if it can be said.

    Known on more than half the replicas: the known ones' sum, scaled by the replicas
    (their mean for each unknown one) or, with every replica's ``running`` known, by the
    requests running (their rate per running request for each unknown one's), whichever
    is larger. A mean over replicas idle or asleep read four busy replicas of ten that
    carried 90% of the load as 2 replicas' worth where 8 were needed; all the running on
    the unknown ones is unknown load, never 0 (it scaled a fleet serving 0.3 requests a
    second to zero: hostile pass 68). Weighed by their running, the unknown ones count
    for at most twice the known ones' mean each: a gauge is theirs to claim.

    >>> _estimate([10.0, 10.0, None], [])
    30.0
    >>> _estimate([10.0, 0.0, 0.0, None, None], [1.0, 0.0, 0.0, 3.0, 0.0])
    40.0
    >>> _estimate([10.0, 10.0, None], [1.0, 1.0, 256.0])
    40.0
    >>> _estimate([0.0, 0.0, None], [0.0, 0.0, 2.0]) is None
    True
    """
    known = [r for r in rates if r is not None]
    if 2 * len(known) <= len(rates):
        return None
    total = float(sum(known))
    by_replicas = total * len(rates) / len(known)
    if len(running) != len(rates):
        return by_replicas
    weights = [w or 0.0 for w in running]
    running_known = sum(w for w, r in zip(weights, rates, strict=True) if r is not None)
    running_all = sum(weights)
    if running_all <= 0.0:
        return by_replicas
    if running_known <= 0.0:
        return None
    # Each unknown one counts for at most twice the mean of the known ones running
    # requests: one replica's gauge of 256 beside its counters NaN read its fleet at
    # maxReplicas, for good.
    unknown = len(rates) - len(known)
    active = sum(1 for w, r in zip(weights, rates, strict=True) if r is not None and w > 0)
    by_running = total * running_all / running_known
    return max(by_replicas, min(by_running, total + 2.0 * unknown * total / active))


def _mean_tokens(windows: Sequence[ReplicaWindow], concept: str) -> float | None:
    """Tokens per request finished in the window, over the replicas that expose them.

    By the per-request histograms, or a replica's counters where it has none.

    As for latencies, a replica without the histogram is left out; weighted by requests,
    so a busy replica counts for its requests, not for one replica; never below what
    the lower half of the replicas say (``majority_floor``), nor above what the upper
    half say: one replica whose ``_sum`` alone jumped (every counter honest) made the
    mix of ten 167 times heavier, and every replica's capacity a sliver of it (issue
    27, hostile pass 32). Skewed routing can put the pooled mean above the upper median
    honestly; the planner reads the heavier of this and the token rates over the
    request rate (``scaler.core.capacity.observed_mix``), which that leaves whole.
    """
    found = [f for w in windows if (f := w.finished(concept) or w.counted(concept)) is not None]
    requests = sum(count for count, _ in found)
    pooled = sum(total for _, total in found) / requests if requests > 0 else None
    own = sorted(total / count for count, total in found if count > 0)
    floored = majority_floor(pooled, own)
    if floored is None or not own:
        return floored
    return min(floored, own[len(own) // 2])


def majority_floor(pooled: float | None, own: Sequence[float | None]) -> float | None:
    """``pooled``, raised to the lower median of the replicas' ``own`` figures.

    Pooling weighs a replica by what it claims to have served, so one replica claiming
    100,000 one-token requests a second set the deployment's mix and TTFT p95 alone and
    scaled a busy deployment from 21 replicas to 1 (issue 27, hostile pass 12). The
    lower median (the 5th of 10, the smaller of 2) is a figure of an honest replica
    while fewer than half lie; honest replicas' pooled figure sits about their median,
    so the floor seldom binds, and when it does it plans for the heavier reading.
    Example: pooled 1.5, own (1.5, 980, 1000, 1020) -> 980.
    """
    known = sorted(v for v in own if v is not None)
    if pooled is None or not known:
        return pooled
    return max(pooled, known[(len(known) - 1) // 2])


def _merge_buckets(
    windows: Sequence[ReplicaWindow], histogram: str
) -> tuple[tuple[float, ...], Vector, list[Vector]] | None:
    """Sum bucket increases across replicas that share bounds; each one's counts too.

    Replicas on different engine versions may bucket differently; bucket counts
    cannot be added across layouts, so the layout most replicas share wins, and a tie
    is no quantile. Not the layout with the most observations: one replica with bounds
    of its own claiming a million a window gave the deployment its quantiles (a 9.55 s
    TTFT p95 read as 0.001 s; issue 27, hostile pass 10).
    """
    groups: dict[tuple[float, ...], list[Vector]] = {}
    for window in windows:
        found = window.buckets(histogram)
        if found is not None:
            groups.setdefault(found[0], []).append(found[1])
    if not groups:
        return None
    ranked = sorted(groups.items(), key=lambda item: len(item[1]), reverse=True)
    if len(ranked) > 1 and len(ranked[0][1]) == len(ranked[1][1]):
        return None
    bounds, members = ranked[0]
    return bounds, np.sum(members, axis=0), members
