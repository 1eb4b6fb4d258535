"""What each serving engine calls things: vLLM and SGLang metrics to one ``EngineStats``.

One scrape of one replica becomes one ``EngineStats``: gauges (requests running and
waiting, KV-cache use), counters (tokens, finished requests, preemptions), latency
histograms and per-request token histograms, each under a name of ours. Per concept the
newest metric name wins and older names are the fallback (vLLM renamed
``gpu_cache_usage_perc`` and ``time_per_output_token_seconds``; SGLang
``time_per_output_token_seconds``).

Series that differ only in a replica-internal label are combined:

- vLLM's ``engine`` label (data-parallel engines) and SGLang's ``dp_rank``: summed,
  they are separate engines in one replica.
- vLLM's ``pid`` label (a gauge without a multiprocess mode, one copy per API-server
  process) and SGLang's ``tp_rank``/``pp_rank``/``moe_ep_rank``: the same engine seen
  by several processes, so the largest copy is kept, never the sum.

A value that cannot be a measurement makes its concept missing and is named in
``EngineStats.rejected``: a negative gauge, counter or bucket count (``negative``), NaN
or an infinity (``not-finite``), and one series (same name, same labels) sent twice with
different values (``duplicate``: which one is true is unknowable, and taking either would
be a guess), a histogram of over ``MAX_BUCKETS`` bounds (``too-many-buckets``). One bad
concept never spoils the others.

The per-request token histograms (``LENGTHS``) are optional: SGLang exposes them only
with ``--collect-tokens-histogram``, so a replica without them is not ``missing`` anything
(its request mix is unknown); one with implausible values is, like any other concept.

The sleep state (vLLM sleep mode, ``vllm:engine_sleep_state{sleep_state}``: ``awake`` 1
or 0, ``weights_offloaded`` 1 at level 1, ``discard_all`` 1 at level 2) is optional too:
``EngineStats.sleeping`` is None, unknown, when the family is absent (SGLang, vLLM before
0.11) or unreadable, never "awake". A replica sleeps when any of its engines reports
``awake`` 0 (vLLM sleeps and wakes every engine at once); its level is the deepest. A
flag other than 0 or 1 is rejected (``not-a-flag``) and, like any rejected value, makes
``sleep`` missing. A ``model_name`` over ``MAX_MODEL_LENGTH`` characters or not printable
is rejected (``not-a-name``) and ``model`` missing: the model is unknown, the load read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.parse import (
    DEFAULT_LIMITS,
    ExpositionError,
    Limits,
    Sample,
    TooLargeError,
    excerpt,
    parse_samples,
)
from foundation.signals import LATENCIES, MAX_MODEL_LENGTH

COUNTERS = ("prompt_tokens", "generation_tokens", "requests", "preemptions")
HISTOGRAMS = LATENCIES
"""Latency histograms by concept: each becomes one ``Quantiles`` per window."""
LENGTHS = ("prompt_length", "output_length")
"""Tokens per finished request, prompt and output: their window means are the mix."""

# Labels that split one replica's engine into parts to add up, or into copies.
_SUMMED = frozenset({"engine", "dp_rank"})
_COPIES = frozenset({"pid", "tp_rank", "pp_rank", "moe_ep_rank"})


@dataclass(frozen=True, slots=True)
class Contract:
    """Exposed metric names per concept, newest first."""

    engine: str
    gauges: Mapping[str, tuple[str, ...]]
    counters: Mapping[str, tuple[str, ...]]
    histograms: Mapping[str, tuple[str, ...]]
    lengths: Mapping[str, tuple[str, ...]]
    """``LENGTHS`` histograms, observed once per finished request; optional."""
    model_label: str = "model_name"
    counters_at_first_use: bool = False
    """Its counters appear at their first increment (labelled on first use): one absent
    beside nothing running or waiting is 0, not missing. Missing, an SGLang pod that had
    served nothing left its idle deployment partial, held at its count for good."""
    sleep_state: str | None = None
    """The sleep-state gauge (one series per ``sleep_state`` label value), if any."""

    def wanted(self) -> frozenset[str]:
        """Every sample name the parser must keep for this engine."""
        names: set[str] = {self.sleep_state} if self.sleep_state else set()
        for options in (*self.gauges.values(), *self.counters.values()):
            names.update(options)
            names.update(f"{name.removesuffix('_total')}_created" for name in options)
        for options in (*self.histograms.values(), *self.lengths.values()):
            for base in options:
                names.update(f"{base}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
                names.add(f"{base}_created")
        return frozenset(names)


VLLM = Contract(
    engine="vllm",
    gauges={
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    counters={
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        "requests": ("vllm:request_success_total",),  # every finished request, all reasons
        "preemptions": ("vllm:num_preemptions_total",),
    },
    histograms={
        "ttft": ("vllm:time_to_first_token_seconds",),
        "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e": ("vllm:e2e_request_latency_seconds",),
        "queue_time": ("vllm:request_queue_time_seconds",),
    },
    lengths={
        "prompt_length": ("vllm:request_prompt_tokens",),
        "output_length": ("vllm:request_generation_tokens",),
    },
    # vllm/v1/metrics/loggers.py (0.11 on): awake, weights_offloaded, discard_all.
    sleep_state="vllm:engine_sleep_state",
)

# Names from sgl-project/sglang python/sglang/srt/metrics/collector.py and its docs
# (docs/references/production_metrics.md); read from source, not yet seen from a
# running SGLang here.
SGLANG = Contract(
    engine="sglang",
    gauges={
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
    },
    counters={
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "requests": ("sglang:num_requests_total",),
        "preemptions": ("sglang:num_retracted_requests_total",),
    },
    histograms={
        "ttft": ("sglang:time_to_first_token_seconds",),
        "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "e2e": ("sglang:e2e_request_latency_seconds",),
        "queue_time": ("sglang:queue_time_seconds",),
    },
    # Only with --collect-tokens-histogram; observed once per finished request.
    lengths={
        "prompt_length": ("sglang:prompt_tokens_histogram",),
        "output_length": ("sglang:generation_tokens_histogram",),
    },
    counters_at_first_use=True,
)

CONTRACTS = {"vllm": VLLM, "sglang": SGLANG}
WANTED_ANY = VLLM.wanted() | SGLANG.wanted()


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts by upper bound (the last bound is +Inf)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    count: float
    total: float


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One replica's metrics at one scrape, by concept; absent concepts are missing."""

    engine: str
    model: str | None
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    """Latency histograms (``HISTOGRAMS``) and per-request token ones (``LENGTHS``)."""
    created: float | None = None
    """Newest ``_created`` timestamp of any counter: a change means a restart."""
    missing: tuple[str, ...] = ()
    rejected: dict[str, str] = field(default_factory=dict)
    """Concepts whose values were no measurement, with why: one of ``REJECTIONS``."""
    sleeping: bool | None = None
    """Asleep (vLLM sleep mode, any level), awake, or None: unknown (no sleep-state metric)."""
    sleep_level: int | None = None
    """0, 1 or 2 while asleep (0: scheduling paused only); None while awake or unknown."""


REJECTIONS = ("negative", "not-finite", "duplicate", "not-a-flag", "not-a-name", "too-many-buckets")
"""Why a concept's values were rejected (bounded: a Prometheus label)."""
MAX_BUCKETS = 256
"""Bounds one histogram may have (vLLM's and SGLang's have at most a few dozen): each
scrape's counts are kept for the stable window, and one replica's 9,900 buckets a
histogram held 58 MB and 56 ms of every cycle (hostile pass 65)."""


def detect_engine(samples: Iterable[Sample]) -> str | None:
    """``"vllm"`` or ``"sglang"`` from the sample names, or None if neither appears."""
    for sample in samples:
        if sample.name.startswith("vllm:"):
            return "vllm"
        if sample.name.startswith("sglang:"):
            return "sglang"
    return None


class NoEngineMetricsError(ValueError):
    """The exposition holds no metric of a known engine."""


def read_exposition(
    body: str | bytes, engine: str = "auto", limits: Limits = DEFAULT_LIMITS
) -> EngineStats:
    """One replica's ``/metrics`` body as engine-neutral stats: the one entry point.

    ``engine`` is ``vllm``, ``sglang`` or ``auto`` (told by the metric names). A body in
    bytes is UTF-8: bytes that are not UTF-8 are harmless in comments and families the
    exporter does not read, and an ``ExpositionError`` in a sample it reads. Pure and
    thread-safe: the exporter runs it in a worker thread.

    Raises:
        TooLargeError: the body is over ``limits.max_bytes`` (bytes, or characters of
            text); it is not parsed.
        TooManySeriesError: over ``limits.max_series`` wanted samples.
        ExpositionError: the body is not a valid exposition.
        NoEngineMetricsError: no ``vllm:`` or ``sglang:`` metric in it.
    """
    if len(body) > limits.max_bytes:
        unit = "bytes" if isinstance(body, bytes) else "characters"
        raise TooLargeError(f"body of {len(body):,} {unit} is over {limits.max_bytes:,}")
    lossy = False
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            # Keep the bad bytes as lone surrogates: no valid text holds one, so a wanted
            # sample that does is told apart below; comments never matter.
            text, lossy = body.decode("utf-8", "surrogateescape"), True
    else:
        text = body
    samples = parse_samples(text, WANTED_ANY, max_samples=limits.max_series)
    if lossy:
        _refuse_undecodable(samples)
    kind = detect_engine(samples) if engine == "auto" else engine
    if kind is None:
        raise NoEngineMetricsError("no vllm: or sglang: metrics in the response")
    return engine_stats(samples, CONTRACTS[kind])


def _refuse_undecodable(samples: list[Sample]) -> None:
    for sample in samples:
        for text in (sample.name, *sample.labels.keys(), *sample.labels.values()):
            if any("\udc80" <= char <= "\udcff" for char in text):
                raise ExpositionError(f"{sample.name}: bytes that are not UTF-8 in {excerpt(text)}")


def engine_stats(samples: list[Sample], contract: Contract) -> EngineStats:
    """Combine one scrape's samples into concepts under ``contract``.

    Raises:
        ExpositionError: a histogram bucket bound (``le``) is not a number.
    """
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)

    missing: list[str] = []
    rejected: dict[str, str] = {}
    model = _model(samples, contract.model_label, rejected)
    if "model" in rejected:
        missing.append("model")
    gauges = _gauges(by_name, contract, missing, rejected)
    counters: dict[str, float] = {}
    created: float | None = None
    idle = gauges.get("running") == 0.0 and gauges.get("waiting") == 0.0
    for concept, options in contract.counters.items():
        value = _first(by_name, options)
        if value is None and idle and contract.counters_at_first_use:
            value = 0.0
        if isinstance(value, str):
            rejected[concept] = value
        if value is None or isinstance(value, str):
            missing.append(concept)
        else:
            counters[concept] = value
        for name in options:
            for sample in by_name.get(name.removesuffix("_total") + "_created", ()):
                if not math.isfinite(sample.value):  # NaN != NaN: a restart at every step
                    rejected["created"] = "not-finite"
                    continue
                created = sample.value if created is None else max(created, sample.value)
    if "created" in rejected:  # what is rejected is missing too: the stats say so whole
        missing.append("created")

    histograms: dict[str, Histogram] = {}
    for concept, options in contract.histograms.items():
        _read_histogram(by_name, concept, options, histograms, rejected)
        if concept not in histograms:
            missing.append(concept)
    for concept, options in contract.lengths.items():
        _read_histogram(by_name, concept, options, histograms, rejected)
        if concept in rejected:  # absent is fine (optional), implausible is not
            missing.append(concept)
    sleep = _sleep_state(by_name.get(contract.sleep_state or "", []))
    if isinstance(sleep, str):  # absent is fine (optional), implausible is not
        rejected["sleep"] = sleep
        missing.append("sleep")
    sleeping, level = sleep if isinstance(sleep, tuple) else (None, None)
    if sleeping and (gauges.get("running", 0.0) > 0 or gauges.get("waiting", 0.0) > 0):
        # Asleep it serves nothing: requests on it say the flag is wrong, and a sleeper
        # counted so would be capacity the scaler takes away.
        rejected["sleep"] = "asleep-with-requests"
        missing.append("sleep")
        sleeping, level = None, None
    return EngineStats(
        contract.engine,
        model,
        gauges,
        counters,
        histograms,
        created,
        tuple(missing),
        rejected,
        sleeping,
        level,
    )


def _model(samples: list[Sample], label: str, rejected: dict[str, str]) -> str | None:
    """The served model's name, or None: absent, or no name (``not-a-name``, rejected).

    The name becomes the ``model`` label of every family the exporter serves: a
    megabyte one made each Prometheus scrape of the exporter ten times the replica's
    body. At most ``MAX_MODEL_LENGTH`` printable characters, the wire's bound.
    """
    for sample in samples:
        if label in sample.labels:
            model = sample.labels[label]
            if len(model) <= MAX_MODEL_LENGTH and model.isprintable():
                return model
            rejected["model"] = "not-a-name"
            return None
    return None


def _gauges(
    by_name: dict[str, list[Sample]],
    contract: Contract,
    missing: list[str],
    rejected: dict[str, str],
) -> dict[str, float]:
    """The gauge concepts; the others go to ``missing`` (and why to ``rejected``)."""
    gauges: dict[str, float] = {}
    for concept, options in contract.gauges.items():
        value = _first(by_name, options)
        if isinstance(value, str):
            rejected[concept] = value
        if value is None or isinstance(value, str):
            missing.append(concept)
        else:
            gauges[concept] = value
    if "kv_usage" in gauges:  # a sum over engines would exceed 1: use their mean
        engines = _engine_count(by_name, contract.gauges["kv_usage"])
        gauges["kv_usage"] /= max(engines, 1)
    return gauges


def _sleep_state(samples: list[Sample]) -> tuple[bool, int | None] | str | None:
    """(asleep, level) from the sleep-state series; why not (a rejection); None if absent.

    Each engine (series without ``sleep_state``) is awake, or asleep at level 2
    (``discard_all``), 1 (``weights_offloaded``) or 0 (neither flag).
    """
    if not samples:
        return None
    problem = _implausible(samples)
    if problem is not None:
        return problem
    engines: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for sample in samples:
        if sample.value not in (0.0, 1.0):
            return "not-a-flag"
        key = _identity(sample.labels, _COPIES | {"sleep_state"})
        flags = engines.setdefault(key, {})
        state = sample.labels.get("sleep_state", "")
        flags[state] = max(flags.get(state, 0.0), sample.value)
    if any("awake" not in flags for flags in engines.values()):
        return None  # an engine without its awake flag: its state is unknown
    asleep = [flags for flags in engines.values() if flags["awake"] == 0.0]
    if not asleep:
        return False, None
    levels = [
        2 if flags.get("discard_all") else 1 if flags.get("weights_offloaded") else 0
        for flags in asleep
    ]
    return True, max(levels)


def _read_histogram(
    by_name: dict[str, list[Sample]],
    concept: str,
    options: tuple[str, ...],
    histograms: dict[str, Histogram],
    rejected: dict[str, str],
) -> None:
    """Put ``concept``'s histogram in ``histograms``, or why not in ``rejected``."""
    for base in options:
        if base + "_bucket" not in by_name:
            continue
        histogram = _histogram(by_name, base)
        if isinstance(histogram, str):
            rejected[concept] = histogram
        elif histogram is not None:
            histograms[concept] = histogram
        return  # the newest name exposed decides, good or bad


def _first(by_name: dict[str, list[Sample]], options: tuple[str, ...]) -> float | str | None:
    """The combined value of the newest name exposed; why not (a rejection); or None."""
    for name in options:
        samples = by_name.get(name)
        if samples:
            problem = _implausible(samples)
            return problem if problem is not None else _combine(samples)
    return None


def _implausible(samples: list[Sample], ignore: frozenset[str] = frozenset()) -> str | None:
    """Why these samples of one name are no measurement (``REJECTIONS``), or None."""
    seen: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in samples:
        value = sample.value
        if not math.isfinite(value):
            return "not-finite"
        if value < 0:
            return "negative"
        key = _identity(sample.labels, ignore)
        if seen.setdefault(key, value) != value:
            return "duplicate"
    return None


def _identity(labels: Mapping[str, str], drop: frozenset[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _combine(samples: list[Sample]) -> float:
    # Copies (pid, tp_rank, ...) of the same series: keep the largest; then sum engines
    # (and, for counters, reasons).
    per_series: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in samples:
        key = _identity(sample.labels, _COPIES)
        per_series[key] = max(per_series.get(key, sample.value), sample.value)
    return float(sum(per_series.values()))


def _engine_count(by_name: dict[str, list[Sample]], options: tuple[str, ...]) -> int:
    for name in options:
        samples = by_name.get(name)
        if samples:
            return len({_identity(s.labels, _COPIES) for s in samples})
    return 0


def _bound(sample: Sample, base: str) -> float:
    le = sample.labels.get("le", "nan")
    try:
        return float(le)
    except ValueError:
        raise ExpositionError(
            f"{base}_bucket: bucket bound le={excerpt(le)} is not a number"
        ) from None


def _histogram(by_name: dict[str, list[Sample]], base: str) -> Histogram | str | None:
    """The histogram under ``base``; why its counts are no measurement; or None."""
    buckets = by_name.get(base + "_bucket")
    if not buckets:
        return None
    counts_series = by_name.get(base + "_count") or []
    problem = _implausible(buckets) or _implausible(counts_series)
    if problem is not None:
        return problem
    per_bound: dict[float, dict[tuple[tuple[str, str], ...], float]] = {}
    for sample in buckets:
        bound = _bound(sample, base)
        key = _identity(sample.labels, _COPIES | {"le"})
        series = per_bound.setdefault(bound, {})
        series[key] = max(series.get(key, sample.value), sample.value)
    bounds = tuple(sorted(b for b in per_bound if b == b))  # drop a NaN "le"
    if not bounds:
        return None  # no bucket with a usable bound: nothing to read quantiles from
    if len(bounds) > MAX_BUCKETS:
        return "too-many-buckets"
    counts = tuple(float(sum(per_bound[b].values())) for b in bounds)
    count = _combine(counts_series) if counts_series else counts[-1]
    sums = by_name.get(base + "_sum")
    total = _combine(sums) if sums else math.nan
    return Histogram(bounds, counts, count, total)
