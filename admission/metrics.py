"""The admission controller's own Prometheus metrics and its ``/metrics``, ``/healthz``.

Labels are bounded: ``check`` (our AdmissionChecks, a handful), ``outcome`` (the four
check states), ``pool`` (the pools our checks guard: ``inferenceHeadroom.pool``, else the
poolNodeSelector as ``key=value,...``, ``*`` for every node HAMi registered; never the
check's name), ``base_model`` (LoRA base models in use), ``result`` (of a status write).
Never a Workload or pod name.

- ``unitscale_admission_decisions_total{check,outcome}``: check states written
  (``Pending`` counts message updates);
- ``unitscale_admission_check_latency_seconds{check,outcome}``: from a check becoming
  Pending to our Ready, Retry or Rejected landing;
- ``unitscale_admission_inventory_gpus{pool,state}``: ``total`` cards HAMi registered in
  the pool, ``free`` cards no pod holds anything on; one series per pool, however many
  checks guard it;
- ``unitscale_admission_lora_tenants{base_model}``: admitted LoRA tenants per base model
  (this and the inventory are computed from the view when ``/metrics`` is scraped, at
  most once every ``MIN_REFRESH_SECONDS``); at
  most ``MAX_MODEL_SERIES`` models by name, the rest summed as ``other``;
- ``unitscale_admission_check_active{check}``: 1 while the check is Active;
- ``unitscale_admission_training_allowance_accelerators{pool,check}``,
  ``unitscale_admission_inference_shortfall_accelerators{pool,check}``: the capacity
  manager's plan of each reclaiming check's pool (``inferenceHeadroom.pool``), set each
  pass, absent while the forecast is unknown; two reclaiming checks on one pool plan by
  their own policies, so each has its series; ``unitscale_admission_reclaims_total{pool}``,
  ``unitscale_admission_reclaimed_accelerator_hours_total{pool}``: reclaims written;
- ``unitscale_admission_lora_tenants_per_instance{base_model}``: the adaptive density
  (the same bound; ``other`` is the lowest of the rest);
- ``unitscale_admission_writes_total{result}``, ``unitscale_admission_passes_total``,
  ``unitscale_admission_pass_seconds``: the controller's own work;
- ``unitscale_admission_unit_failures_total{unit}``: rounds of one unit that raised
  (``workload``: deciding one check; ``pool``: planning one pool; ``write``: writing one
  decision; ``density``: the LoRA density step; ``check``: reading one AdmissionCheck's
  parameters, which then stays inactive; ``resync``: deciding a pass's view from scratch
  beside the loop), each with one WARNING; the pass went on;
- ``unitscale_admission_resync_differences_total{kind}``: answers (``decision``, ``plan``,
  ``inventory``) the state kept from pass to pass gave otherwise than the pass from
  scratch of the resync (every ``incremental.RESYNC_SECONDS``; 0 unless there is a bug;
  one WARNING per kind); ``unitscale_admission_pool_inventories_total{result}``: pools ``built``,
  ``reused`` unchanged from an earlier pass, or ``extended`` by the gangs admitted since;
- ``unitscale_admission_unreadable_objects_total{kind}``: node or pod versions whose HAMi
  annotation could not be read (``node``, ``pod``), each with one WARNING naming it; such
  a node offers no GPUs, nor does the node such a pod runs on. Also ``workload`` versions
  dating a Ready entry or ``Admitted`` before their creation (read as the creation).
  Also objects left out of
  the view for their JSON shape (``admission.shape``; also ``workload``, ``dataset``,
  ``dataload``, ``admissioncheck``), counted as their problem appears or changes;
- ``unitscale_admission_http_refused_total{reason}``: connections and requests the HTTP
  port refused (``too-many-connections``, ``slow-head``, ``malformed-http``:
  ``foundation.http_guard``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from admission.pool import PoolPlan
from foundation.errors import ConfigError
from foundation.http_guard import ConnectionGuard, GuardedSite, RefusedCollector, bind
from foundation.net import split_listen

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
"""Seconds: a fit decides within a pass (< 1 s), a cache warm-up takes minutes to hours."""


class AdmissionMetrics:
    """Every series the controller exports, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.refresh: Callable[[], None] | None = None
        """Called before each scrape, to set the gauges that describe the view."""
        self.decisions = Counter(
            "unitscale_admission_decisions",
            "Check states written, by check and outcome.",
            ["check", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "unitscale_admission_check_latency_seconds",
            "Seconds from a check becoming Pending to our Ready, Retry or Rejected.",
            ["check", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inventory = Gauge(
            "unitscale_admission_inventory_gpus",
            "GPUs of a pool our checks guard: total registered, free (nothing held on them).",
            ["pool", "state"],
            registry=self.registry,
        )
        self.lora_tenants = Gauge(
            "unitscale_admission_lora_tenants",
            "Admitted LoRA fine-tuning tenants per base model.",
            ["base_model"],
            registry=self.registry,
        )
        self._capacity_series()
        self.active = Gauge(
            "unitscale_admission_check_active",
            "1 while the AdmissionCheck is Active, 0 while its parameters are bad.",
            ["check"],
            registry=self.registry,
        )
        self.writes = Counter(
            "unitscale_admission_writes",
            "API writes by result: applied, conflict (the object changed first), error.",
            ["result"],
            registry=self.registry,
        )
        self.unit_failures = Counter(
            "unitscale_admission_unit_failures",
            "Rounds of one unit (workload, pool, write, density, check) that raised; the pass "
            "went on.",
            ["unit"],
            registry=self.registry,
        )
        self.unreadable = Counter(
            "unitscale_admission_unreadable_objects",
            "Node or pod versions whose HAMi annotation could not be read (no GPUs offered), "
            "and objects of the wrong JSON shape (left out).",
            ["kind"],
            registry=self.registry,
        )
        self.passes = Counter(
            "unitscale_admission_passes", "Reconcile passes run.", registry=self.registry
        )
        self.resync_differences = Counter(
            "unitscale_admission_resync_differences",
            "Answers (kind: decision, plan, inventory) the state kept from pass to pass gave "
            "otherwise than the periodic pass from scratch; 0 unless there is a bug.",
            ["kind"],
            registry=self.registry,
        )
        self.pools = Counter(
            "unitscale_admission_pool_inventories",
            "Pool inventories a pass read, by result: built, reused (nothing on the pool "
            "changed since an earlier pass), extended (gangs admitted since held back on it).",
            ["result"],
            registry=self.registry,
        )
        self.pass_seconds = Histogram(
            "unitscale_admission_pass_seconds",
            "Seconds one reconcile pass took (decisions and writes).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )

    def _capacity_series(self) -> None:
        """The capacity manager's plan, the reclaims, the adaptive LoRA density."""
        self.training_allowance = Gauge(
            "unitscale_admission_training_allowance_accelerators",
            "Cards training may hold now on the pool (the capacity manager's allowance); "
            "absent while the inference forecast is unknown.",
            ["pool", "check"],
            registry=self.registry,
        )
        self.inference_shortfall = Gauge(
            "unitscale_admission_inference_shortfall_accelerators",
            "Whole cards inference is forecast to need beyond what it holds and what is "
            "free; absent while the forecast is unknown.",
            ["pool", "check"],
            registry=self.registry,
        )
        self.reclaims = Counter(
            "unitscale_admission_reclaims",
            "Admitted training workloads set to Retry (Kueue evicts them) to give inference "
            "cards back.",
            ["pool"],
            registry=self.registry,
        )
        self.reclaimed_hours = Counter(
            "unitscale_admission_reclaimed_accelerator_hours",
            "Cards times hours run of the reclaimed workloads: the work at stake without "
            "a checkpoint.",
            ["pool"],
            registry=self.registry,
        )
        self.lora_density = Gauge(
            "unitscale_admission_lora_tenants_per_instance",
            "LoRA tenants a base-model instance takes now (adaptive density; absent for "
            "models the controller does not adapt).",
            ["base_model"],
            registry=self.registry,
        )

    def decided(self, check: str, outcome: str, latency: float | None) -> None:
        """One check state written; ``latency`` for a final (non-Pending) one."""
        self.decisions.labels(check, outcome).inc()
        if latency is not None and outcome != "Pending":
            self.latency.labels(check, outcome).observe(max(0.0, latency))

    def set_inventory(self, pools: Mapping[str, tuple[int, int]]) -> None:
        """``pool -> (total, free)`` now; pools gone since are dropped."""
        self.inventory.clear()
        for pool, (total, free) in pools.items():
            self.inventory.labels(pool, "total").set(total)
            self.inventory.labels(pool, "free").set(free)

    def set_lora_tenants(self, tenants: Mapping[str, int]) -> None:
        """``base model -> admitted tenants`` now (past ``MAX_MODEL_SERIES``: ``other``)."""
        self.lora_tenants.clear()
        for model, count in _bounded_models(tenants, sum).items():
            self.lora_tenants.labels(model).set(count)

    def set_plans(self, plans: Mapping[str, tuple[str, PoolPlan]]) -> None:
        """``check -> (pool, plan)`` now; a plan not known leaves its gauges absent."""
        self.training_allowance.clear()
        self.inference_shortfall.clear()
        for check, (pool, plan) in plans.items():
            if not plan.known or plan.allowance is None:
                continue
            self.training_allowance.labels(pool, check).set(plan.allowance)
            self.inference_shortfall.labels(pool, check).set(plan.shortfall)

    def reclaimed(self, pool: str, accelerator_hours: float) -> None:
        """One reclaim's Retry landed."""
        self.reclaims.labels(pool).inc()
        self.reclaimed_hours.labels(pool).inc(max(0.0, accelerator_hours))

    def set_lora_density(self, density: Mapping[str, int]) -> None:
        """``base model -> tenants per instance`` of the adaptive models now.

        Past ``MAX_MODEL_SERIES`` models: ``other``, the lowest of the rest.
        """
        self.lora_density.clear()
        for model, tenants in _bounded_models(density, min).items():
            self.lora_density.labels(model).set(tenants)

    def set_active(self, checks: Mapping[str, bool]) -> None:
        """``check -> Active`` now."""
        self.active.clear()
        for check, is_active in checks.items():
            self.active.labels(check).set(1 if is_active else 0)


MIN_REFRESH_SECONDS = 1.0
"""The view's gauges are computed at most this often; scrapes in between serve them as
they are. Each refresh reads the whole view (0.14 s at 500 nodes, 5,000 pods and 5,000
Workloads) in the controller's event loop: ten scrapes a second from anyone who can reach
the port left no time for reconcile passes (hostile pass 6, M4)."""


class MetricsServer:
    """``/metrics`` and ``/healthz`` over HTTP; ``start()`` returns the bound port.

    Served through a ``foundation.http_guard.ConnectionGuard`` (``guard``), as the
    exporter's and the scaler's ports are: aiohttp's defaults held every unfinished
    request head for good (300 trickled heads all still open 12 s later) and logged a
    traceback per malformed request (issue 27, hostile pass 7). What it refuses is
    ``unitscale_admission_http_refused_total{reason}``.
    """

    def __init__(
        self,
        metrics: AdmissionMetrics,
        listen: str,
        health: Callable[[], tuple[bool, Mapping[str, Any]]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._listen = split_listen(listen)
        self._health = health
        self._clock = clock
        self._refreshed = -math.inf
        self.guard = ConnectionGuard("admission.metrics")
        metrics.registry.register(RefusedCollector(self.guard, "unitscale_admission_http_refused"))
        self._site: GuardedSite | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind and serve.

        Raises:
            ConfigError: the address cannot be bound (named).
        """
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_health)
        # Bind first so that port 0 works and the chosen port is known.
        host, port = self._listen
        try:
            sock = bind(host, port)
        except (OSError, TypeError, ValueError, UnicodeError) as err:
            # TypeError/UnicodeError: a host the resolver cannot encode (NUL, non-IDNA).
            why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ConfigError(f"metrics-listen {host[:300]}:{port}: {why[:200]}") from err
        self._site = GuardedSite(app, self.guard)
        self.port = await self._site.start(sock)
        return self.port

    async def stop(self) -> None:
        """Stop serving."""
        if self._site is not None:
            await self._site.stop()

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        now = self._clock()
        if (
            self._metrics.refresh is not None
            and not 0 <= now - self._refreshed < MIN_REFRESH_SECONDS
        ):
            self._refreshed = now
            try:
                self._metrics.refresh()
            except Exception as err:  # stale gauges beat no /metrics at all
                log.warning("refreshing the view's gauges failed: %r", err)
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _serve_health(self, request: web.Request) -> web.Response:
        healthy, details = self._health()
        return web.json_response({"healthy": healthy, **details}, status=200 if healthy else 503)


MAX_MODEL_SERIES = 32
"""Base models the LoRA gauges name; the rest (in name order) fold into ``other``, so
tenants naming a new model each cannot grow ``/metrics`` without bound."""
OTHER_MODELS = "other"


def _bounded_models(
    values: Mapping[str, int], fold: Callable[[Iterable[int]], int]
) -> dict[str, int]:
    """The first ``MAX_MODEL_SERIES`` models by name, the rest folded into ``other``."""
    names = sorted(values)
    kept = {model: values[model] for model in names[:MAX_MODEL_SERIES]}
    rest = [values[model] for model in names[MAX_MODEL_SERIES:]]
    if rest:
        kept[OTHER_MODELS] = fold(rest)
    return kept
