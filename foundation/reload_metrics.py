"""``unitscale_config_reloads_total{result}`` for any process with a hot-reloaded config."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from foundation.reload import ConfigStore


class ConfigReloadCollector(Collector):
    """Applied (``success``) and refused (``error``) config updates of one store."""

    def __init__(self, store: ConfigStore[Any]) -> None:
        self._store = store

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One counter family, both results always present."""
        family = CounterMetricFamily(
            "unitscale_config_reloads",
            "Config updates: success (applied) or error (refused, the last good stays).",
            labels=["result"],
        )
        family.add_metric(["success"], self._store.reloads)
        family.add_metric(["error"], self._store.errors)
        yield family
