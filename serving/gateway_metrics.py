"""The gateway's Prometheus metrics (``/metrics``), every series labelled with its target.

Every series is labelled with the ``namespace`` and ``deployment`` the gateway started
with. The counters and histograms, and the buffer and in-flight gauges, exist from the
start (at 0, for every ``kind``, ``status``, ``result`` and ``reason`` the gateway uses):
prometheus_client would create a labelled series only at its first event, and a
``rate()`` never shows the event a series first appears with. The replica gauges appear
with the first health round: before it the gateway does not know them. With a
reloadable config, ``unitscale_config_reloads_total{result}`` counts its updates, as the
scaler and the exporter do.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from foundation.reload import ConfigStore
from foundation.reload_metrics import ConfigReloadCollector
from serving.gateway_replicas import PROBE_REASONS
from serving.gateway_standby import IGNORED_REASONS
from serving.slo import REASONS, Verdict

BUFFER_BUCKETS = (0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300)
"""Seconds in the buffer: up to well past the default timeout (120 s)."""
WAKE_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
"""Seconds a replica's ``POST /wake_up`` took: level 1 in seconds, level 2 up to a minute."""
UPSTREAM_ERROR_KINDS = (
    "connect",
    "before-response",
    "timeout",
    "mid-response",
    "stalled",
    "bad-headers",
    "status-5xx",
    "stream-error",
    "overrun",
    "redirect",
    "refused",
    "empty",
    "token-less",
)
"""The ``kind`` of ``unitscale_gateway_upstream_errors_total`` (``upstream_error``)."""
CLIENT_ERROR_KINDS = ("stalled", "malformed-http", "slow-head", "too-many-connections")
"""The ``kind`` of ``unitscale_gateway_client_errors_total`` (``client_error``)."""
REJECT_STATUSES = (400, 404, 408, 413, 429, 502, 503, 504)
"""The ``status`` of ``unitscale_gateway_rejected_total``: what ``serving.gateway`` answers."""
WAKE_RESULTS = ("woken", "failed", "relapsed")
"""``relapsed``: a wake it answered ``awake``, whose next ``/is_sleeping`` said asleep."""
SLEEP_RESULTS = ("slept", "failed", "relapsed")
"""The ``result`` of ``unitscale_gateway_sleeps_total``: the standby plan's sleeps;
``relapsed``: one answered 200 whose next ``/is_sleeping`` said awake."""
LOOPS = ("health", "signals", "standby", "requests", "wakes")
"""The ``loop`` of ``unitscale_gateway_loop_errors_total``: the gateway's background loops,
``requests``: judging and recording a request as it ends, and ``wakes``: deciding which
sleepers a request wakes."""
BACKOFF_ACTIONS = ("wake", "sleep")
"""The ``action`` of ``unitscale_gateway_replicas_backing_off``."""
SLO_SERIES = tuple(("within" if r == "met" else "outside", r) for r in REASONS)
"""The ``result`` and ``reason`` of ``unitscale_gateway_slo_requests_total`` (``serving.slo``)."""


class GatewayMetrics:
    """The gateway's counters, gauges and buffer-time histogram."""

    def __init__(self, namespace: str, deployment: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = (namespace, deployment)
        labels = ["namespace", "deployment"]
        r = self.registry
        self._arrivals = Counter(
            "unitscale_gateway_requests", "Requests that reached the gateway.", labels, registry=r
        )
        self._buffered = Gauge(
            "unitscale_gateway_buffered", "Requests waiting for a replica.", labels, registry=r
        )
        self._buffered_bytes = Gauge(
            "unitscale_gateway_buffered_bytes",
            "Bytes of the bodies of requests waiting for a replica.",
            labels,
            registry=r,
        )
        self._in_flight = Gauge(
            "unitscale_gateway_in_flight",
            "Requests sent upstream and not finished.",
            labels,
            registry=r,
        )
        self._client_errors = Counter(
            "unitscale_gateway_client_errors",
            "Clients cut or refused for what they did: stopped reading (stalled), sent"
            " malformed HTTP (malformed-http).",
            [*labels, "kind"],
            registry=r,
        )
        self._watchers_refused = Counter(
            "unitscale_gateway_signal_watchers_refused",
            "WatchSignals streams refused: as many as the gateway serves were open.",
            labels,
            registry=r,
        )
        self._usage_unmeasured = Counter(
            "unitscale_gateway_usage_unmeasured",
            "Answers whose usage token count was out of bounds: judged as if it had none.",
            labels,
            registry=r,
        )
        self._errors = Counter(
            "unitscale_gateway_upstream_errors",
            "Upstream failures by kind.",
            [*labels, "kind"],
            registry=r,
        )
        self._rejected = Counter(
            "unitscale_gateway_rejected",
            "Requests answered by the gateway itself.",
            [*labels, "status"],
            registry=r,
        )
        self._wait = Histogram(
            "unitscale_gateway_buffer_seconds",
            "Time requests waited for a replica.",
            labels,
            buckets=BUFFER_BUCKETS,
            registry=r,
        )
        self._slo = Counter(
            "unitscale_gateway_slo_requests",
            "Requests judged against the SLO when they ended: within or outside, and why"
            " (met; ttft, itl: a stream's target missed; latency: a non-streamed answer over"
            " ttft + (tokens - 1) * itl; failed: 5xx, 429, cut off).",
            [*labels, "result", "reason"],
            registry=r,
        )
        self._left = Counter(
            "unitscale_gateway_slo_unjudged_requests",
            "Requests whose client left before any token while still within the TTFT target:"
            " not judged, in neither result of unitscale_gateway_slo_requests_total.",
            labels,
            registry=r,
        )
        self._define_replica_metrics(labels)
        self._slo_attainment = Gauge(
            "unitscale_gateway_slo_attainment_target_ratio",
            "The share of requests the SLO asks to be within (the slo block's attainment).",
            labels,
            registry=r,
        )
        self._create_series()

    def _define_replica_metrics(self, labels: list[str]) -> None:
        """The replicas' side: ready and sleeping, wakes and sleeps, failed probes, loops."""
        r = self.registry
        self._ready = Gauge(
            "unitscale_gateway_replicas_ready",
            "Replicas answering /health, draining and sleeping ones excepted.",
            labels,
            registry=r,
        )
        self._sleeping = Gauge(
            "unitscale_gateway_replicas_sleeping",
            "Healthy replicas asleep (vLLM sleep mode): routed nothing until woken.",
            labels,
            registry=r,
        )
        self._wakes = Counter(
            "unitscale_gateway_wakes",
            "Wakes of sleeping replicas the gateway asked for, by result (woken, failed,"
            " relapsed: it said awake, then its /is_sleeping said asleep).",
            [*labels, "result"],
            registry=r,
        )
        self._wake_seconds = Histogram(
            "unitscale_gateway_wake_seconds",
            "Time a successful wake of a sleeping replica took.",
            labels,
            buckets=WAKE_BUCKETS,
            registry=r,
        )
        self._sleeps = Counter(
            "unitscale_gateway_sleeps",
            "Surplus idle replicas put to sleep for the scaler's standby plan, by result.",
            [*labels, "result"],
            registry=r,
        )
        self._plans_ignored = Counter(
            "unitscale_gateway_standby_plans_ignored",
            "Standby plans not acted on, by reason: undated, stale (decided too long ago) or"
            " future (stamped past the clock skew bound).",
            [*labels, "reason"],
            registry=r,
        )
        self._probe_failures = Counter(
            "unitscale_gateway_replica_probe_failures",
            "Replica health rounds that failed, by reason: down (connect, timeout, http-status),"
            " an answer refused (too-large, not-json, too-deep, wrong-shape) or internal (an"
            " exception met checking it). Only that replica's round fails.",
            [*labels, "reason"],
            registry=r,
        )
        self._loop_errors = Counter(
            "unitscale_gateway_loop_errors",
            "Rounds of a background loop that failed as a whole; the loop goes on.",
            [*labels, "loop"],
            registry=r,
        )
        self._backing_off = Gauge(
            "unitscale_gateway_replicas_backing_off",
            "Replicas not woken (or slept) again yet after failed wakes (or sleeps) in a row.",
            [*labels, "action"],
            registry=r,
        )

    def _create_series(self) -> None:
        """Every series whose labels are known now, so its first event shows in ``rate()``."""
        for metric in (
            self._arrivals,
            self._buffered,
            self._buffered_bytes,
            self._in_flight,
            self._wait,
            self._wake_seconds,
        ):
            metric.labels(*self._labels)
        for kind in UPSTREAM_ERROR_KINDS:
            self._errors.labels(*self._labels, kind)
        for kind in CLIENT_ERROR_KINDS:
            self._client_errors.labels(*self._labels, kind)
        for reason in IGNORED_REASONS:
            self._plans_ignored.labels(*self._labels, reason)
        self._watchers_refused.labels(*self._labels)
        self._usage_unmeasured.labels(*self._labels)
        self._left.labels(*self._labels)
        for status in REJECT_STATUSES:
            self._rejected.labels(*self._labels, str(status))
        for result in WAKE_RESULTS:
            self._wakes.labels(*self._labels, result)
        for result in SLEEP_RESULTS:
            self._sleeps.labels(*self._labels, result)
        for result, reason in SLO_SERIES:
            self._slo.labels(*self._labels, result, reason)
        for reason in PROBE_REASONS:
            self._probe_failures.labels(*self._labels, reason)
        for loop in LOOPS:
            self._loop_errors.labels(*self._labels, loop)
        for action in BACKOFF_ACTIONS:
            self._backing_off.labels(*self._labels, action)

    def arrived(self) -> None:
        """A request reached the gateway."""
        self._arrivals.labels(*self._labels).inc()

    def set_buffered(self, count: int, size: int) -> None:
        """``count`` requests wait for a replica, holding ``size`` bytes of bodies."""
        self._buffered.labels(*self._labels).set(count)
        self._buffered_bytes.labels(*self._labels).set(size)

    def set_in_flight(self, count: int) -> None:
        self._in_flight.labels(*self._labels).set(count)

    def upstream_error(self, kind: str) -> None:
        """An upstream failure, by kind.

        ``connect`` (nothing sent; tried elsewhere), ``before-response`` (failed after the
        request was sent: 502), ``timeout`` (no response headers within the upstream
        timeout: 504), ``mid-response`` (failed while the body streamed), ``stalled``
        (silent past the upstream timeout while the body streamed), ``bad-headers``,
        ``status-5xx`` (the replica answered a server error), ``stream-error`` (a stream
        answered 200 that carried an error event, vLLM's streamed error), ``overrun`` (a stream
        cut past its request's token bound, or a body past its deadline), ``redirect``,
        ``refused`` (a 429, or a 404 for a model the replica lists), ``empty`` (a success
        holding no choice) and ``token-less`` (a stream of lines without tokens, cut).
        """
        self._errors.labels(*self._labels, kind).inc()

    def client_error(self, kind: str) -> None:
        """A client cut or refused, by ``kind``.

        ``stalled``: it stopped reading a response past the upstream timeout;
        ``malformed-http``: aiohttp answered its bytes 400, or its body could not be
        decoded; ``slow-head``: its connection sent no whole request head in time
        (``serving.server.gateway_guard``); ``too-many-connections``: refused, 503.
        """
        self._client_errors.labels(*self._labels, kind).inc()

    def watcher_refused(self) -> None:
        """A ``WatchSignals`` stream refused past ``gateway_signals.MAX_WATCHERS``."""
        self._watchers_refused.labels(*self._labels).inc()

    def usage_unmeasured(self) -> None:
        """A replica's usage count was out of bounds (``serving.slo``): no count."""
        self._usage_unmeasured.labels(*self._labels).inc()

    def wake_relapsed(self) -> None:
        """A replica answered its wake ``awake`` and its next ``/is_sleeping`` said asleep."""
        self._wakes.labels(*self._labels, "relapsed").inc()

    def sleep_relapsed(self) -> None:
        """A replica answered its sleep 200 and its next ``/is_sleeping`` said awake."""
        self._sleeps.labels(*self._labels, "relapsed").inc()

    def standby_plan_ignored(self, reason: str) -> None:
        """A standby plan was not acted on: undated, stale or from the future."""
        self._plans_ignored.labels(*self._labels, reason).inc()

    def rejected(self, status: int) -> None:
        """The gateway answered a request itself, with ``status``."""
        self._rejected.labels(*self._labels, str(status)).inc()

    def waited(self, seconds: float) -> None:
        """A request left the buffer after ``seconds``."""
        self._wait.labels(*self._labels).observe(seconds)

    def set_replicas(self, ready: int, sleeping: int) -> None:
        """After a health round: replicas routable and replicas asleep."""
        self._ready.labels(*self._labels).set(ready)
        self._sleeping.labels(*self._labels).set(sleeping)

    def woke(self, seconds: float) -> None:
        """A sleeping replica answered its wake-up, awake, after ``seconds``."""
        self._wakes.labels(*self._labels, "woken").inc()
        self._wake_seconds.labels(*self._labels).observe(seconds)

    def wake_failed(self) -> None:
        """A wake-up failed (no answer in time, an error, or still asleep)."""
        self._wakes.labels(*self._labels, "failed").inc()

    def slept(self, ok: bool) -> None:
        """A ``POST /sleep`` for the standby plan succeeded (``ok``) or failed."""
        self._sleeps.labels(*self._labels, "slept" if ok else "failed").inc()

    def probe_failed(self, reason: str) -> None:
        """A replica's health round failed, for ``reason`` (one of ``PROBE_REASONS``)."""
        self._probe_failures.labels(*self._labels, reason).inc()

    def loop_failed(self, loop: str) -> None:
        """A round of the background ``loop`` (one of ``LOOPS``) failed as a whole."""
        self._loop_errors.labels(*self._labels, loop).inc()

    def set_backing_off(self, wake: int, sleep: int) -> None:
        """Replicas backing off a failed wake, and a failed sleep."""
        self._backing_off.labels(*self._labels, "wake").set(wake)
        self._backing_off.labels(*self._labels, "sleep").set(sleep)

    def judged(self, verdict: Verdict) -> None:
        """A request ended and was judged against the SLO (or its client left too early)."""
        if not verdict.judged:
            self._left.labels(*self._labels).inc()
            return
        result = "within" if verdict.within else "outside"
        self._slo.labels(*self._labels, result, verdict.reason).inc()

    def set_slo_attainment(self, share: float) -> None:
        """The attainment the SLO asks for (at the start and at every reload)."""
        self._slo_attainment.labels(*self._labels).set(share)

    def count_reloads(self, store: ConfigStore[Any]) -> None:
        """Export ``store``'s applied and refused updates from now on."""
        self.registry.register(ConfigReloadCollector(store))

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
