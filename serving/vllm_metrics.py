"""vLLM 0.32's ``/metrics`` families for one engine, rendered as vLLM renders them.

The simulated replica serves them and the exporter's tests drive them (``tests/fake_engines``):
metric names, labels, histogram buckets (``serving.vllm_buckets``) and the order of the
families are vLLM's, rendered by prometheus_client as vLLM renders its own, so the exporter
cannot tell them from vLLM by format.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from serving import vllm_buckets

LABELS = ["engine", "model_name"]

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
"""``vllm:request_success``'s ``finished_reason`` values, every one created at start-up."""

SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
"""``vllm:engine_sleep_state``'s ``sleep_state`` values (vllm/v1/metrics/loggers.py)."""
SLEEP_OPERATION_BUCKETS = (0.01, 0.1, 1, 10, 30, 60, 120, 300, 600)
"""``vllm:sleep_mode_operation_duration_seconds``'s buckets
(vllm/entrypoints/serve/dev/sleep/metrics.py)."""


class BulkHistogram:
    """One labelled histogram child, observed in bulk; a prometheus_client collector.

    ``observe(value, count)`` records ``count`` observations of ``value`` in O(log buckets),
    where ``Histogram.labels(...).observe`` takes one call (and a lock) per observation: one
    engine step gives every decoding request the same inter-token latency, so one call per
    step does. The exposition is the same as prometheus_client's ``Histogram`` with one
    child: buckets, ``_count``, ``_sum``, then ``_created``.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: dict[str, str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = dict(labels)
        self.bounds = tuple(float(b) for b in buckets)
        go_string = cast(Callable[[float], str], floatToGoString)  # untyped upstream
        self._le = [go_string(b) for b in self.bounds] + ["+Inf"]
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.created = time.time()
        registry.register(self)

    def observe(self, value: float, count: int = 1) -> None:
        """Record ``count`` observations of ``value``."""
        # Prometheus buckets are upper-inclusive: 0.01 falls in le="0.01".
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        cumulative = list(itertools.accumulate(self.counts))
        family.add_metric(
            list(self.labels.values()),
            [(le, float(n)) for le, n in zip(self._le, cumulative, strict=True)],
            self.sum,
        )
        family.samples.append(Sample(self.name + "_created", dict(self.labels), self.created))
        return [family]


DEFAULT_MAX_MODEL_LEN = 8192
"""Llama-3-8B's context: vLLM's ``max_model_len`` when none is given is the model's."""


class VllmMetrics:
    """vLLM's Prometheus families for one engine (``engine="0"``).

    Registered in vLLM's order (gauges, counters, histograms): the exposition lists the
    families in that order. ``max_model_len`` sets the per-request token histograms'
    buckets, as in vLLM.
    """

    def __init__(self, model: str, max_model_len: int = DEFAULT_MAX_MODEL_LEN) -> None:
        self.registry = CollectorRegistry()
        self.labels = ("0", model)
        self.running, self.waiting, self.sleep_state, self.kv = _gauges(self.registry)
        self.prompt, self.generation, self.success, self.preemptions = _counters(self.registry)
        child = dict(zip(LABELS, self.labels, strict=True))
        self.prompt_length, self.output_length = _token_histograms(
            self.registry, child, max_model_len
        )
        """Prompt and generated tokens, one observation per finished request."""
        self.ttft, self.itl, self.e2e, self.queue = _histograms(self.registry, child)
        self._create_every_child()
        self.set_sleep_state(0, 0)
        self._operations: tuple[Histogram, Gauge] | None = None

    def set_sleep_state(self, sleeping: int, level: int) -> None:
        """As vLLM's ``record_sleep_state``: awake, or asleep at ``level`` (0 sets no flag)."""
        values = {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        if sleeping:
            values = {
                "awake": 0,
                "weights_offloaded": int(level == 1),
                "discard_all": int(level == 2),
            }
        for state, value in values.items():
            self.sleep_state.labels(*self.labels, state).set(value)

    def operation_metrics(self) -> tuple[Histogram, Gauge]:
        """The sleep-mode operation families, created at the first operation as vLLM does.

        vLLM registers them in its global registry on the first ``/sleep`` or
        ``/wake_up``, so they come last in the exposition, labelled by ``operation`` only.
        """
        if self._operations is None:
            self._operations = (
                Histogram(
                    "vllm:sleep_mode_operation_duration_seconds",
                    "Duration of one sleep-mode operation.",
                    ["operation"],
                    buckets=SLEEP_OPERATION_BUCKETS,
                    registry=self.registry,
                ),
                Gauge(
                    "vllm:sleep_mode_operations_in_flight",
                    "Sleep-mode operations currently awaited.",
                    ["operation"],
                    registry=self.registry,
                ),
            )
        return self._operations

    def _create_every_child(self) -> None:
        # vLLM creates every child at start-up: every series exists from the first scrape.
        for reason in FINISHED_REASONS:
            self.success.labels(*self.labels, reason)
        for metric in (
            self.running,
            self.waiting,
            self.kv,
            self.prompt,
            self.generation,
            self.preemptions,
        ):
            metric.labels(*self.labels)

    def render(self) -> bytes:
        """The exposition text, as vLLM's /metrics serves it."""
        return generate_latest(self.registry)


def _gauges(r: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge, Gauge]:
    """Requests running, requests waiting, the sleep state, KV-cache usage."""
    return (
        Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            LABELS,
            registry=r,
        ),
        Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            LABELS,
            registry=r,
        ),
        Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; "
            "awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; "
            "discard_all = 1 means sleep level 2.",
            [*LABELS, "sleep_state"],
            registry=r,
        ),
        Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            LABELS,
            registry=r,
        ),
    )


def _counters(r: CollectorRegistry) -> tuple[Counter, Counter, Counter, Counter]:
    """Prompt tokens, generation tokens, finished requests (by reason), preemptions."""
    return (
        Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r),
        Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        ),
        Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=r,
        ),
        Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            LABELS,
            registry=r,
        ),
    )


def _token_histograms(
    r: CollectorRegistry, child: dict[str, str], max_model_len: int
) -> tuple[BulkHistogram, BulkHistogram]:
    """Tokens per finished request, prompt and generated (vLLM's help texts, verbatim)."""
    buckets = vllm_buckets.request_tokens(max_model_len)
    return (
        BulkHistogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", child, buckets, r
        ),
        BulkHistogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            child,
            buckets,
            r,
        ),
    )


def _histograms(
    r: CollectorRegistry, child: dict[str, str]
) -> tuple[BulkHistogram, BulkHistogram, BulkHistogram, BulkHistogram]:
    """TTFT, inter-token latency, e2e latency, queue time: one child each."""
    return (
        BulkHistogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            child,
            vllm_buckets.TTFT,
            r,
        ),
        BulkHistogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            child,
            vllm_buckets.ITL,
            r,
        ),
        BulkHistogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            child,
            vllm_buckets.E2E,
            r,
        ),
        BulkHistogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            child,
            vllm_buckets.E2E,
            r,
        ),
    )
