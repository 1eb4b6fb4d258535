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

from foundation.reload import ConfigStore
from scaler.registry import ScaledObjectRegistry, metric_value

_LABELS = ["namespace", "scaled_object"]
_GAUGES = {
    "desired": ("unitscale_scaler_desired_replicas", "Replicas decide() wants."),
    "metric": ("unitscale_scaler_metric_value", "The value GetMetrics returns (HPA target 1)."),
    "active": ("unitscale_scaler_active", "1 when the target should have replicas."),
    "panic": ("unitscale_scaler_panic_mode", "1 while in panic (no scale-down)."),
    "load": ("unitscale_scaler_load_replicas", "Load in replicas' worth of work."),
    "load_panic": ("unitscale_scaler_load_panic_replicas", "Short-window load."),
    "forecast": ("unitscale_scaler_forecast_replicas", "Load forecast one cold start ahead."),
    "need": ("unitscale_scaler_need_replicas", "Replicas needed before steps and bounds."),
    "capacity_scale": ("unitscale_scaler_capacity_scale", "Learned capacity over the priors."),
}


class DecisionCollector(Collector):
    """Reads the registry at scrape time."""

    def __init__(self, registry: ScaledObjectRegistry, configs: ConfigStore[Any] | None) -> None:
        self._registry = registry
        self._configs = configs

    def collect(self) -> Iterator[Metric]:
        """One family per decision input and outcome."""
        families = {k: GaugeMetricFamily(n, h, labels=_LABELS) for k, (n, h) in _GAUGES.items()}
        available = GaugeMetricFamily(
            "unitscale_scaler_signals_available",
            "1 when the last decision had signals.",
            labels=_LABELS,
        )
        for scaled in self._registry.objects():
            labels = [scaled.key[0], scaled.key[1]]
            decision = scaled.decision
            available.add_metric(labels, 0.0 if decision is None else 1.0)
            if decision is None:
                continue
            values = {
                "desired": float(decision.desired_replicas),
                "metric": metric_value(decision),
                "active": float(decision.active),
                "panic": float(decision.panic),
                **decision.inputs,
            }
            for key, family in families.items():
                value = values.get(key)
                if value is not None and not math.isnan(value):
                    family.add_metric(labels, value)
        yield from families.values()
        yield available
        if self._configs is not None:
            reloads = CounterMetricFamily(
                "unitscale_config_reloads", "Config updates by result.", labels=["result"]
            )
            reloads.add_metric(["success"], self._configs.reloads)
            reloads.add_metric(["error"], self._configs.errors)
            yield reloads


def metrics_app(
    registry: ScaledObjectRegistry, configs: ConfigStore[Any] | None
) -> web.Application:
    """An aiohttp app serving ``/metrics`` from a registry of its own."""
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(DecisionCollector(registry, configs))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(collectors), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
