"""The scaler's own Prometheus metrics: every decision's inputs and outcome (Knative style).

Labels are bounded: ``namespace`` and ``scaled_object`` (one series per ScaledObject
KEDA asks about). Reasons go to the log on every change, not into labels. A
ScaledObject without usable signals reports ``unitscale_scaler_signals_available 0``
and no decision series, never a made-up 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from foundation.http_guard import ConnectionGuard, RefusedCollector
from foundation.loop_share import LoopShare
from foundation.reload import ConfigStore
from scaler.prewarm.plan import STATES
from scaler.prewarm.shell import Prewarmer
from scaler.registry import ScaledObjectRegistry, metric_value
from scaler.signals import SignalStore

_LABELS = ["namespace", "scaled_object"]
_GAUGES = {
    "desired": ("unitscale_scaler_desired_replicas", "Replicas decide() wants."),
    "metric": ("unitscale_scaler_metric_value", "The value GetMetrics returns (HPA target 1)."),
    "active": ("unitscale_scaler_active", "1 when the target should have replicas."),
    "load": ("unitscale_scaler_load_replicas", "Load in replicas' worth of work."),
    "load_panic": ("unitscale_scaler_load_panic_replicas", "Short-window load."),
    "need": ("unitscale_scaler_need_replicas", "Replicas needed before steps and bounds."),
    "capacity_scale": ("unitscale_scaler_capacity_scale", "Learned capacity over the priors."),
    "headroom": (
        "unitscale_scaler_headroom_ratio",
        "The attainment loop's headroom: the share of the need added (0 while attainment holds).",
    ),
    "attainment": (
        "unitscale_scaler_slo_attainment_ratio",
        "The share of requests within the SLO over the gateway's window (absent unjudged).",
    ),
    "attainment_long": (
        "unitscale_scaler_slo_attainment_long_ratio",
        "The same over the attainment loop's long window (30 min).",
    ),
    "sleeping": (
        "unitscale_scaler_sleeping_replicas",
        "With standby: replicas the warm-tier plan holds asleep beside the desired ones.",
    ),
    "step_scale": (
        "unitscale_scaler_profile_step_scale",
        "With a profile: its step times' fitted scale planned with (1: the profile holds).",
    ),
}


class DecisionCollector(Collector):
    """Reads the registry at scrape time."""

    def __init__(
        self,
        registry: ScaledObjectRegistry,
        configs: ConfigStore[Any] | None,
        prewarm: Prewarmer | None = None,
        store: SignalStore | None = None,
    ) -> None:
        self._registry = registry
        self._configs = configs
        self._prewarm = prewarm
        self._store = store

    def collect(self) -> Iterator[Metric]:
        """One family per decision input and outcome."""
        families = {k: GaugeMetricFamily(n, h, labels=_LABELS) for k, (n, h) in _GAUGES.items()}
        available = GaugeMetricFamily(
            "unitscale_scaler_signals_available",
            "1 when the last decision had signals.",
            labels=_LABELS,
        )
        failed = CounterMetricFamily(
            "unitscale_scaler_decision_errors",
            "Decisions that raised (KEDA got UNAVAILABLE); the log names the error.",
            labels=_LABELS,
        )
        listeners = CounterMetricFamily(
            "unitscale_scaler_activation_listener_errors",
            "Activation listeners (StreamIsActive) that raised on a transition; the others"
            " were told.",
            labels=_LABELS,
        )
        for scaled in self._registry.objects():
            labels = [scaled.key[0], scaled.key[1]]
            decision = scaled.decision
            available.add_metric(labels, 0.0 if decision is None else 1.0)
            failed.add_metric(labels, scaled.decision_errors)
            listeners.add_metric(labels, scaled.listener_errors)
            if decision is None:
                continue
            values = {
                "desired": float(decision.desired_replicas),
                "metric": metric_value(decision),
                "active": float(decision.active),
                **decision.inputs,
            }
            for key, family in families.items():
                value = values.get(key)
                if value is not None and not math.isnan(value):
                    family.add_metric(labels, value)
        yield from families.values()
        yield available
        yield failed
        yield listeners
        registry_errors = CounterMetricFamily(
            "unitscale_scaler_registry_errors",
            "New ScaledObjects refused (full), streams refused past their bounds (streams),"
            " streams ended for a host holding fewer (streams_given_up), hosts barred from"
            " that after a stream given room ended young (streams_barred) and pools whose"
            " demand did not encode.",
            labels=["reason"],
        )
        for reason, count in sorted(self._registry.errors.items()):
            registry_errors.add_metric([reason], count)
        yield registry_errors
        if self._store is not None:
            yield from source_families(self._store)
        if self._prewarm is not None:
            yield from prewarm_families(self._prewarm)
        if self._configs is not None:
            reloads = CounterMetricFamily(
                "unitscale_config_reloads", "Config updates by result.", labels=["result"]
            )
            reloads.add_metric(["success"], self._configs.reloads)
            reloads.add_metric(["error"], self._configs.errors)
            yield reloads


def source_families(store: SignalStore) -> Iterator[Metric]:
    """What the signal sources could not use (bounded labels: source and reason or field).

    ``source`` is ``prometheus`` or ``watch`` for failed units of work, ``exporter``
    (engine signals, from the exporter or Prometheus), ``gateway`` or ``wire`` (a message
    that could not be decoded) for refused snapshots and unmeasured values.
    """
    counters = (
        (
            "unitscale_scaler_source_errors",
            "Units of a source's work that failed (a target's query round, a message).",
            "reason",
            store.errors,
        ),
        (
            "unitscale_scaler_signals_refused",
            "Snapshots refused: dated in the future past the clock skew, no finite time,"
            " undecodable or a rate out of range.",
            "reason",
            store.refused,
        ),
        (
            "unitscale_scaler_signals_unmeasured",
            "Impossible values (negative, not finite) taken as unmeasured, by field.",
            "field",
            store.unmeasured,
        ),
    )
    for name, help_text, label, counts in counters:
        family = CounterMetricFamily(name, help_text, labels=["source", label])
        for (source, what), count in sorted(counts.items()):
            family.add_metric([source, what], count)
        yield family


def prewarm_families(prewarm: Prewarmer) -> Iterator[Metric]:
    """The Fluid prewarm's state per ScaledObject (docs/scaler.md, "Fluid prewarm")."""
    state = GaugeMetricFamily(
        "unitscale_scaler_prewarm_state",
        "1 for the prewarm's current state, 0 for the others.",
        labels=[*_LABELS, "state"],
    )
    cached = GaugeMetricFamily(
        "unitscale_scaler_prewarm_cached_percent",
        "The Dataset's cachedPercentage (absent when Fluid reports none).",
        labels=_LABELS,
    )
    warm = GaugeMetricFamily(
        "unitscale_scaler_prewarm_time_to_warm_seconds",
        "The last warm-up's time from its trigger to a warm cache.",
        labels=_LABELS,
    )
    counters = {
        "timeouts": CounterMetricFamily(
            "unitscale_scaler_prewarm_timeouts",
            "Warm-ups given up after prewarmTimeout.",
            labels=_LABELS,
        ),
        "created": CounterMetricFamily(
            "unitscale_scaler_prewarm_dataloads_created",
            "DataLoads this scaler created.",
            labels=_LABELS,
        ),
        "write_errors": CounterMetricFamily(
            "unitscale_scaler_prewarm_write_errors",
            "DataLoad creates and deletes the API server refused.",
            labels=_LABELS,
        ),
    }
    for status in prewarm.statuses():
        labels = list(status.key)
        for name in STATES:
            state.add_metric([*labels, name], 1.0 if status.plan.state == name else 0.0)
        if status.plan.cached_percent is not None:
            cached.add_metric(labels, status.plan.cached_percent)
        if status.plan.track.time_to_warm is not None:
            warm.add_metric(labels, status.plan.track.time_to_warm)
        counters["timeouts"].add_metric(labels, status.plan.track.timeouts)
        counters["created"].add_metric(labels, status.created)
        counters["write_errors"].add_metric(labels, status.write_errors)
    errors = CounterMetricFamily(
        "unitscale_scaler_prewarm_errors",
        "Prewarm units that failed: plan, write, access, unreadable (a Fluid object of the"
        " wrong shape), watch (a watch task ended and was started again).",
        labels=["reason"],
    )
    for reason, count in sorted(prewarm.errors.items()):
        errors.add_metric([reason], count)
    yield from (state, cached, warm, *counters.values(), errors)


def metrics_app(
    registry: ScaledObjectRegistry,
    configs: ConfigStore[Any] | None,
    prewarm: Prewarmer | None = None,
    store: SignalStore | None = None,
    guard: ConnectionGuard | None = None,
) -> web.Application:
    """An aiohttp app serving ``/metrics`` from a registry of its own.

    A body is made again only once the last is older than ten times what it cost
    (``foundation.loop_share``): scrapes cannot take more than a tenth of the loop.

    With ``guard``, what it refused is ``unitscale_scaler_http_refused_total{reason}``.
    """
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(DecisionCollector(registry, configs, prewarm, store))
    if guard is not None:
        collectors.register(RefusedCollector(guard, "unitscale_scaler_http_refused"))

    # At 10,000 ScaledObjects a body took 1.0 s of the event loop (6.9 MB): made at most
    # a tenth of the time, however often it is asked for (issue 27, hostile pass 7).
    body = LoopShare(lambda: generate_latest(collectors))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=body.get(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
