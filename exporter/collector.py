"""Prometheus exposition of the exporter's signals (for Prometheus and Grafana).

A custom collector reads the latest signals at scrape time, in a registry of its
own. Labels stay bounded: namespace, deployment, model, plus ``window``, ``kind``,
``quantile`` and ``price`` with a few fixed values; per-target series carry the
replica's URL (one per replica, never per request). A signal that is unknown is
left out, never written as 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.runtime import DeploymentState, Exporter
from exporter.signals import Accelerator
from foundation.signals import QUANTILES, EngineSignals, WindowSignals

LABELS = ["namespace", "deployment", "model"]
_LATENCIES = {
    "ttft": ("unitscale_ttft_seconds", "Time to first token"),
    "itl": ("unitscale_inter_token_seconds", "Time between output tokens"),
    "e2e": ("unitscale_e2e_seconds", "Request latency, arrival to last token"),
    "queue_time": ("unitscale_queue_time_seconds", "Time waiting in the engine queue"),
}


class SignalsCollector(Collector):
    """Yields fresh metric families from the exporter's state on every scrape."""

    def __init__(self, exporter: Exporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        """Every exported family; samples only for known values."""
        families, latencies = _signal_families()
        targets = _TargetFamilies()
        now = self._exporter.clock()
        for state in self._exporter.deployments:
            targets.add(state)
            if state.signals is not None:
                labels = [state.config.namespace, state.config.deployment, state.model_label]
                _deployment_samples(families, latencies, labels, state.signals, now)
                accelerator = state.config.accelerator.accelerator()
                _held_samples(families, labels, state.signals, accelerator)
        yield from families.values()
        yield from latencies.values()
        yield from (targets.up, targets.errors, targets.rejected, targets.duration)
        yield from _loop_families(self._exporter)


def _loop_families(exporter: Exporter) -> Iterator[Metric]:
    """The scrape loop's own health: cycle duration, cycles and restarts."""
    cycle = GaugeMetricFamily(
        "unitscale_exporter_cycle_seconds",
        "Duration of the last scrape cycle over all replicas.",
    )
    if exporter.last_cycle_seconds is not None:
        cycle.add_metric([], exporter.last_cycle_seconds)
    yield cycle
    yield CounterMetricFamily(
        "unitscale_exporter_cycles", "Scrape cycles completed.", value=exporter.cycles
    )
    yield CounterMetricFamily(
        "unitscale_exporter_loop_restarts",
        "Scrape loop restarts after a cycle failed (with backoff).",
        value=exporter.loop_restarts,
    )
    yield CounterMetricFamily(
        "unitscale_exporter_parse_thread_start_failures",
        "Parse threads that could not start; each is tried again with the next body.",
        value=exporter.parse_thread_start_failures,
    )


def _signal_families() -> tuple[dict[str, GaugeMetricFamily], dict[str, GaugeMetricFamily]]:
    """Fresh per-deployment families, and one latency family per histogram concept."""
    window_labels = [*LABELS, "window"]
    families = {
        "request_rate": GaugeMetricFamily(
            "unitscale_request_rate", "Finished requests per second.", labels=window_labels
        ),
        "token_rate": GaugeMetricFamily(
            "unitscale_token_rate", "Tokens per second.", labels=[*window_labels, "kind"]
        ),
        "preemption_rate": GaugeMetricFamily(
            "unitscale_preemption_rate", "Preempted sequences per second.", labels=window_labels
        ),
        "tokens_per_request": GaugeMetricFamily(
            "unitscale_tokens_per_request",
            "Mean tokens per request finished in the window (the request mix).",
            labels=[*window_labels, "kind"],
        ),
        "queue": GaugeMetricFamily(
            "unitscale_queue_depth", "Requests waiting in the engines' queues.", labels=LABELS
        ),
        "running": GaugeMetricFamily(
            "unitscale_requests_running", "Requests in the engines' batches.", labels=LABELS
        ),
        "kv": GaugeMetricFamily(
            "unitscale_kv_cache_usage",
            "Mean KV-cache use across replicas (0-1).",
            labels=LABELS,
        ),
        "cost": GaugeMetricFamily(
            "unitscale_cost_per_million_tokens",
            "US$ per 1M tokens over the stable window (price: default or configured).",
            labels=[*LABELS, "kind", "price"],
        ),
        "replicas": GaugeMetricFamily(
            "unitscale_replicas",
            "Replicas known, answering, and asleep (vLLM sleep mode; absent when unknown).",
            labels=[*LABELS, "state"],
        ),
        "accelerators": GaugeMetricFamily(
            "unitscale_accelerators",
            "Accelerators the known replicas hold (cards; a HAMi share counts its fraction).",
            labels=LABELS,
        ),
        "spend": GaugeMetricFamily(
            "unitscale_cost_per_hour",
            "US$ per hour the known replicas' accelerators cost (price: default or configured).",
            labels=[*LABELS, "price"],
        ),
        "age": GaugeMetricFamily(
            "unitscale_signal_age_seconds", "Age of the newest derived signals.", labels=LABELS
        ),
        "partial": GaugeMetricFamily(
            "unitscale_signal_partial",
            "1 when some replicas or metric families were missing.",
            labels=LABELS,
        ),
    }
    latencies = {
        concept: GaugeMetricFamily(
            name, f"{help_text}, by quantile.", labels=[*window_labels, "quantile"]
        )
        for concept, (name, help_text) in _LATENCIES.items()
    }
    return families, latencies


class _TargetFamilies:
    """Per-replica scrape health: up, errors by reason, last scrape's duration."""

    def __init__(self) -> None:
        target_labels = ["namespace", "deployment", "target"]
        self.up = GaugeMetricFamily(
            "unitscale_target_up", "1 if the last scrape worked.", labels=target_labels
        )
        self.errors = CounterMetricFamily(
            "unitscale_target_scrape_errors",
            "Failed scrapes by reason.",
            labels=[*target_labels, "reason"],
        )
        self.rejected = CounterMetricFamily(
            "unitscale_target_rejected_values",
            "Concepts whose values were no measurement (negative, not-finite, duplicate).",
            labels=[*target_labels, "reason"],
        )
        self.duration = GaugeMetricFamily(
            "unitscale_target_scrape_duration_seconds",
            "Last scrape's duration.",
            labels=target_labels,
        )

    def add(self, state: DeploymentState) -> None:
        namespace, deployment = state.config.namespace, state.config.deployment
        for target, status in state.status.items():
            self.up.add_metric([namespace, deployment, target], 1.0 if status.up else 0.0)
            self.duration.add_metric([namespace, deployment, target], status.scrape_seconds)
            for reason, count in status.errors.items():
                self.errors.add_metric([namespace, deployment, target, reason], count)
            for why, count in status.rejected.items():
                self.rejected.add_metric([namespace, deployment, target, why], count)


def _deployment_samples(
    families: dict[str, GaugeMetricFamily],
    latencies: dict[str, GaugeMetricFamily],
    labels: list[str],
    signals: EngineSignals,
    now: float,
) -> None:
    for window in (signals.panic, signals.stable):
        name = "panic" if window is signals.panic else "stable"
        _window_samples(families, latencies, [*labels, name], window)
    _maybe(families["queue"], labels, signals.queue_depth)
    _maybe(families["running"], labels, signals.running)
    _maybe(families["kv"], labels, signals.kv_usage)
    price = "default" if signals.price_is_default else "configured"
    _maybe(families["cost"], [*labels, "total", price], signals.cost_per_million_tokens)
    _maybe(families["cost"], [*labels, "output", price], signals.cost_per_million_output_tokens)
    _maybe(families["replicas"], [*labels, "known"], signals.replicas)
    _maybe(families["replicas"], [*labels, "up"], signals.replicas_up)
    _maybe(families["replicas"], [*labels, "sleeping"], signals.replicas_sleeping)
    families["age"].add_metric(labels, max(0.0, now - signals.time))
    families["partial"].add_metric(labels, 1.0 if signals.partial else 0.0)


def _held_samples(
    families: dict[str, GaugeMetricFamily],
    labels: list[str],
    signals: EngineSignals,
    accelerator: Accelerator,
) -> None:
    """What the deployment holds, answering or not: the base of accelerator-hours and cost."""
    if signals.replicas is None:
        return  # the exporter always counts; no count is no sample, never 0 held
    held = accelerator.fraction * signals.replicas
    price = "default" if accelerator.price_is_default else "configured"
    families["accelerators"].add_metric(labels, held)
    families["spend"].add_metric([*labels, price], held * accelerator.price_per_hour)


def _maybe(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, value)


def _window_samples(
    families: dict[str, GaugeMetricFamily],
    latencies: dict[str, GaugeMetricFamily],
    labels: list[str],
    window: WindowSignals,
) -> None:
    _maybe(families["request_rate"], labels, window.request_rate)
    _maybe(families["token_rate"], [*labels, "prompt"], window.prompt_token_rate)
    _maybe(families["token_rate"], [*labels, "generation"], window.generation_token_rate)
    _maybe(families["preemption_rate"], labels, window.preemption_rate)
    _maybe(families["tokens_per_request"], [*labels, "prompt"], window.mean_prompt_tokens)
    _maybe(families["tokens_per_request"], [*labels, "output"], window.mean_output_tokens)
    for concept, family in latencies.items():
        for q in QUANTILES:
            _maybe(family, [*labels, f"{q:g}"], window.latency(concept).at(q))


class Watched(Protocol):
    """What ``WatchersCollector`` reads: the signals service's stream counts."""

    @property
    def watchers(self) -> int: ...

    @property
    def refused(self) -> int: ...


class WatchersCollector(Collector):
    """The ``WatchSignals`` streams served now and those refused past the cap."""

    def __init__(self, service: Watched) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        """Two families, read fresh on every scrape."""
        yield GaugeMetricFamily(
            "unitscale_exporter_signal_watchers",
            "WatchSignals streams served now.",
            value=self._service.watchers,
        )
        yield CounterMetricFamily(
            "unitscale_exporter_signal_watchers_refused",
            "WatchSignals streams refused past the cap (RESOURCE_EXHAUSTED).",
            value=self._service.refused,
        )


def registry_for(exporter: Exporter) -> CollectorRegistry:
    """A registry of its own holding only the signals collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SignalsCollector(exporter))
    return registry
