"""The inference gateway and activator in front of the replicas: the proxy.

An aiohttp reverse proxy for the OpenAI-compatible API: requests go to the ready
replica serving their model with the fewest outstanding requests (``serving.routing``);
responses, streamed or not, pass through chunk by chunk. With no ready replica a
request waits in a buffer bounded in requests and in bytes (429 when full, 503 with
``Retry-After`` after the timeout) and the scaler hears of it at once
(``serving.gateway_signals``), so ``StreamIsActive`` pushes KEDA to scale from zero
without waiting for a poll. A body over ``max_request_bytes`` is 413, one that is not a
JSON object 400, a model certainly served by nobody 404: none of them is buffered or
counted as an arrival.

Connection failures are retried on another replica, and so is a request whose replica
dropped the connection before answering a byte (killed, or a pooled connection it had
just closed): a completion has no effect but its answer, so the client gets one from the
next replica instead of a 502 (at most ``connect_retries`` more tries, so a request that
kills replicas is not sent to all of them). A replica that answers broken HTTP is a 502,
one silent past ``upstream_timeout`` a 504: those are not retried. A replica that fails
mid-stream, or goes silent past ``upstream_timeout`` between two chunks, ends that
client's response; the gateway carries on, as does a stream far past its request's token
bound or a non-streamed body not whole within ``upstream_timeout`` of its headers
(``overrun``). A replica's quick failures and refusals weigh in routing as requests
outstanding for a while (``serving.routing.FAILURE_SECONDS``); one answering server errors
in a row, more often than its peers do, is ejected: routed to only when no other serves
the model (``EJECT_AFTER``, ``PEER_MARGIN``). Every one of these upstream failures is
counted (by kind) in the metrics and in the ``upstream_error_rate`` the scaler reads;
every error the gateway answers itself is ``{"object": "error", "message": ...,
"code": status}``.

A replica asleep (vLLM sleep mode, from its ``/is_sleeping``) is routed nothing. When a
request finds no ready replica for its model the gateway wakes one sleeping replica
(``POST /wake_up``, one wake per model at a time, ``serving.routing.choose_wakes``) while
the request waits in the buffer as at zero replicas. With ``wake_at_outstanding``, when
every ready one holds the pressure threshold (that floor, or twice the last minute's mean
per replica: ``serving.routing.WakePressure``) it wakes as many as bring the load under it
at once; those are surplus, routed to only above the threshold, so they fall idle and
sleep again once the scaler has caught up. A wake that fails, times out
(``wake_timeout``) or leaves it asleep is logged, counted, and the next wake goes to
another replica while it backs off: ``wake_retry_after``, doubled per failed wake in a row
up to eight times (``serving.routing.Backoff``). Its answer is read at one boundary
(``serving.replica_answers``): a garbled or nested one is a failed wake like any other,
counted and backed off from.

With ``standby-scaler`` the gateway asks the scaler for its standby plan every
``standby-interval`` (``serving.gateway_standby``: replicas to run, and to hold asleep
beside them, for ``standby: true`` ScaledObjects) and holds it (``serving.routing.
choose_standby``): a surplus replica idle for ``sleep-after-idle`` is put to sleep
(``POST /sleep?level=1&mode=wait``, least recently used first, routed nothing from the moment it is
chosen), and a sleeper is woken early when the running target lacks awake replicas.
Without a plan to act on (no scaler, no ScaledObject, no decision) nothing is slept. A
replica that refuses its sleep backs off as a failed wake does and another idle one is
slept meanwhile, where the plan has one.

Every request that counts as an arrival is judged against the SLO when it ends
(``serving.slo``: a stream's TTFT from its arrival here and its mean inter-token latency,
a non-streamed answer's whole latency against the budget both give its tokens, whether it
failed or was dropped from the buffer) and counted within or outside, in the metrics and
in the ``slo_within_rate`` and ``slo_outside_rate`` the scaler reads. With
``arrivals.directory`` set it is also recorded then (its arrival time and token counts,
never its content) in rotated files ``unitscale replay --trace`` reads
(``serving.arrivals``), written off the event loop.

Which replicas there are, and which are healthy or draining, is ``serving.gateway_replicas``;
a reloaded config is acted on at once, so a newly listed ready replica takes traffic within
milliseconds. The gateway's own metrics are ``serving.gateway_metrics``.

No answer and no exception stops a background loop (health, signals, standby): a failure
is that replica's or that round's, counted and logged. Should a loop stop anyway, ``/health``
(the pod's liveness and readiness probe) answers 503 naming it, so the pod is restarted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Mapping

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST

from foundation.errors import quote
from serving.arrival_recorder import ArrivalRecorder
from serving.arrivals import estimate_prompt_tokens
from serving.gateway_metrics import GatewayMetrics
from serving.gateway_replicas import (
    ANSWERED,
    EJECT_WINDOW,
    FAILED,
    PROBE_TIMEOUT,
    REFUSED,
    Replica,
    ReplicaPool,
    read_answer,
)
from serving.gateway_settings import GatewaySettings
from serving.gateway_signals import SignalsFeed, TrafficStats, gateway_signals
from serving.gateway_standby import IGNORED_REASONS, NoPlan, PlanSource, StandbyClient
from serving.replica_answers import (
    MAX_MODEL_ID_CHARS,
    AnswerError,
    read_is_sleeping,
    read_wake,
)
from serving.routing import (
    Backoff,
    ReplicaView,
    WakePressure,
    choose,
    choose_standby,
    choose_wakes,
    is_unserved,
    known_models,
    may_buffer,
)
from serving.slo import CLIENT_CLOSED, ResponseMeter, choices, output_token_limit

log = logging.getLogger(__name__)

PROBE_SECONDS = float(PROBE_TIMEOUT.total or 2.0)
"""The least a wake's ``/is_sleeping`` read after it is given: a health probe's time."""

PROXIED = ("/v1/completions", "/v1/chat/completions")
EJECT_AFTER = 3
"""Fast failures among a replica's last ``EJECT_WINDOW`` answers that eject it from
routing (``_failed_fast``): three in a row, or three of ten. Counted only in a row, a
replica answering 500, 500, 200 over and over was never ejected, and kept ~65% of the
traffic (two in three answers failed) beside an idle healthy one (hostile pass 62)."""
REFUSING_AFTER = 8
"""Refusals of the client's requests (4xx) among a replica's last ``EJECT_WINDOW``
answers that eject it, beside peers refusing less (``_failed_fast``): one answering 401
to everything is ejected at its eighth; a client's few invalid requests landing on a
replica never make most of its answers."""
PEER_MARGIN = 2.0
"""How many times its peers' share of fast failures a replica's own must reach to eject
it (``_peers_bar``): one request's failure ahead of them is no sign of a sick replica."""
FAST_FAILURES = frozenset(
    {
        "before-response",
        "mid-response",
        "bad-headers",
        "status-5xx",
        "stream-error",
        "redirect",
        "refused",
        "empty",
        "token-less",
        "overrun",
        "timeout",
        "stalled",
    }
)
"""Upstream failures a replica answers at once, counted toward its ejection: a server
error, broken HTTP, a body cut off, a stream carrying an error event, a redirect, a
refusal (429, or 404 for a model it lists), a success holding no choice, a stream of
lines without a choice, a stream past its request's bound (one listing a context of 1
had 94% of the streams cut, never ejected: hostile pass 63). Counting only 5xx left one
that closed every answer after its headers ~98% of the traffic; one answering 404 or
non-JSON 200s at once, ~95%. Not at once, but its own too: no response, or silence
mid-response, past ``upstream_timeout`` (a hung engine behind a live /health kept 27.5%
of the traffic, each request a 504 after 30 s: hostile pass 69), compared with its
peers as the others are."""
REDIRECTS = frozenset({301, 302, 303, 307, 308})
"""Statuses aiohttp follows unless told not to: no replica's answer is followed anywhere
(``_forward``, ``gateway_replicas``), and a completion answered by one is the replica's 502."""
EJECT_SECONDS = 10.0
"""How long a first ejection lasts; doubled per ejection in a row (``Backoff``), at most 8x."""
MAX_PRESSURE_MODELS = 4096
"""Models whose pressure baseline is kept (``_pressure_threshold``): as many as the
gateway remembers served (``gateway_replicas.MAX_SERVED_MODELS``)."""
MAX_REQUEST_JSON_ITEMS = 2**20
"""Commas, braces and brackets a request body may hold (``_read_body``), counted as it
arrives: parsing is ~85 ns a byte for 16 MiB of ``{},`` (1.4 s of the event loop a
request, every client's streams held meanwhile) against ~1 ns for a string of that size
(a base64 image). At the bound a body parses in under 0.1 s; a prompt of a million
token ids, or a text prompt of 16 MiB (~250,000 commas), is still taken."""
OVERRUN_EVENTS = 16
"""Token events a stream may carry past its request's token bound before it is cut."""
SLEEP_QUERY = {"level": "1", "mode": "wait"}
"""The standby plan's sleep: level 1 (weights to host memory), in-flight requests finish."""
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
DECODED_HOP_HEADERS = HOP_HEADERS | {"content-encoding"}
"""What is not relayed of a body: hop-by-hop headers and its encoding."""
NOT_FORWARDED = frozenset({*DECODED_HOP_HEADERS, "accept-encoding", "x-data-parallel-rank"})
"""What of a client's request is not sent on: the body sent is the decoded one, and the
answer is asked plain (``PLAIN``), whatever the client takes. vLLM's data-parallel rank
is its router's to pick, not a client's through the gateway: a rank the replica lacks
failed every stream of it (hostile pass 65)."""
PLAIN = {"Accept-Encoding": "identity"}
"""What the gateway asks every replica for, and all it takes (``check_encoding``): it reads
every body it relays (tokens, usage, SSE events). A replica's gzip stream of empty events
was inflated on the event loop faster than any read could yield: the whole gateway froze,
its health and every other replica's requests with it (hostile pass 55)."""
_FORBIDDEN_HEADER_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""What aiohttp refuses to write in a header (a ValueError at ``prepare``): CR, LF, CTLs."""


def check_encoding(headers: Mapping[str, str]) -> str:
    """The problem with a replica's ``Content-Encoding`` (empty: none, the body is plain).

    The gateway asked for ``identity`` (``PLAIN``) and never decodes: any other encoding is
    the replica's broken answer, as a header that cannot be relayed is.
    """
    encoding = headers.get("Content-Encoding", "").strip().lower()
    if encoding in {"", "identity"}:
        return ""
    return f"Content-Encoding {quote(encoding, 40)} where identity was asked"


def relayable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A replica's response headers as the gateway may relay them.

    Hop-by-hop headers go; so does a header whose name or value holds a control
    character (the client would get a broken answer, the gateway a ValueError). The body
    relayed is plain (``check_encoding``) and streamed: no ``Content-Encoding`` or
    ``Content-Length`` of the replica's describes what the client gets.
    """
    return {
        name: value
        for name, value in headers.items()
        if name.lower() not in DECODED_HOP_HEADERS
        and _FORBIDDEN_HEADER_CHARS.search(name) is None
        and _FORBIDDEN_HEADER_CHARS.search(value) is None
    }


def control_session() -> aiohttp.ClientSession:
    """The session of health checks, wakes and sleeps, apart from the proxied requests'.

    However many requests are proxied, a check never waits behind them for a connection.
    Unbounded: with aiohttp's default of 100 connections, 100 replicas whose ``/health``
    hangs, or 100 wakes of up to a minute each, made every other replica's check wait
    past its own timeout, and healthy replicas went unroutable. What it carries is
    bounded by the replicas (``MAX_REPLICAS``): a check and a wake or sleep each.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        headers=PLAIN,
        auto_decompress=False,  # a compressed answer is malformed JSON, never inflated
    )


class Gateway:
    """State, routing and the HTTP handlers."""

    def __init__(self, replicas: list[str], settings: GatewaySettings) -> None:
        self.settings = settings
        self.pool = ReplicaPool(replicas, settings)
        self._ready = self.pool.ready
        """Buffered requests wait on it for a routable replica."""
        self.stats = TrafficStats.starting(time.monotonic())
        self.metrics = GatewayMetrics(settings.namespace, settings.deployment)
        self.metrics.set_slo_attainment(settings.slo.attainment)
        self.feed = SignalsFeed(
            lambda now: gateway_signals(self.stats, self.settings, now, time.monotonic())
        )
        self.feed.on_refused = self.metrics.watcher_refused
        self._session: aiohttp.ClientSession | None = None
        """The proxied requests' session."""
        self._control: aiohttp.ClientSession | None = None
        """Health checks', wakes' and sleeps' session (``_background``)."""
        self._wakes: set[asyncio.Task[None]] = set()
        self._sleeps: set[asyncio.Task[None]] = set()
        """Wakes under way (kept so they are not collected, cancelled at shutdown)."""
        self._pressure: WakePressure | None = None
        """``wake_at_outstanding`` as ``serving.routing.WakePressure`` (None: wake at zero only)."""
        self._baselines: dict[str | None, tuple[float | None, float, int]] = {}
        """Per model: the mean load, requests outstanding on the ready replicas serving it
        (``WakePressure.baseline``), when it was taken (``time.monotonic``) and the running
        replicas that shared it. Per model: one gateway-wide mean let one model's steady
        load hide another's burst."""
        self._surplus_above: dict[str | None, float] = {}
        """Per model, its last pressure threshold: its surplus is routed to only above it."""
        self._set_pressure(settings.wake_at_outstanding, settings.slo.window_seconds)
        self._waiting: dict[int, tuple[str | None, asyncio.Future[Replica]]] = {}
        """Buffered requests, first come first: their model and the replica they get
        (``_dispatch``)."""
        self._waiting_for: dict[str | None, int] = {}
        """Buffered requests per model: wakes at zero are sized by the model's own."""
        self._failed_wakes: set[str] = set()
        """Exception types met deciding wakes, each logged once."""
        self.standby_problem: str | None = None
        """Why the last standby round acted on no plan; None when it had one."""
        self._standby_kind: str | None = None
        """The kind of ``standby_problem``: a WARNING is logged when it changes, not per round."""
        self._failed_bookkeeping: set[str] = set()
        """Exception types met judging or recording a request, each logged once."""
        self.loops: dict[str, asyncio.Task[None]] = {}
        """The background loops by name: ``/health`` fails when one has stopped. The
        server adds its config-reload (``config``) and EndpointSlice (``discovery``) loops."""
        self.arrivals = ArrivalRecorder(
            settings.arrivals, self.metrics.registry, (settings.namespace, settings.deployment)
        )
        """The record of the traffic (``serving.arrivals``), written off the event loop."""
        self.pool.on_probe_failure = self.metrics.probe_failed
        self.pool.on_round_failure = lambda: self.metrics.loop_failed("health")
        self.pool.on_wake_relapse = self.metrics.wake_relapsed
        self.pool.on_sleep_relapse = self.metrics.sleep_relapsed
        self.pool.on_routable = self._dispatch

    @property
    def replicas(self) -> list[Replica]:
        """Every replica named or draining, in the pool's order."""
        return self.pool.replicas

    # --- lifecycle ----------------------------------------------------------------------

    def app(self) -> web.Application:
        # Bodies are read in _read, which enforces max_request_bytes (reloadable).
        app = web.Application()
        for path in PROXIED:
            app.router.add_post(path, self._proxy)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.cleanup_ctx.append(self._background)
        return app

    async def _background(self, app: web.Application) -> AsyncIterator[None]:
        # Idle connections go before uvicorn's (vLLM's server) 5 s keep-alive closes
        # them: a POST on a connection the replica is closing fails after sending.
        # The proxy's pool is unbounded (limit=0): aiohttp's default of 100 connections
        # made request 101 wait for a pooled one and end a 504 blamed on a replica that
        # never saw it (one vLLM takes 256 at once). The requests it carries are bounded
        # where they enter (the buffer, the connections the server accepts).
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,  # never inflated here: refused (``check_encoding``)
        )
        self._control = control_session()
        self.loops = {
            "health": asyncio.create_task(self.pool.check_forever(self._control, self._report)),
            "signals": asyncio.create_task(self._signal_loop()),
            "standby": asyncio.create_task(self._standby_loop()),
            "arrivals": asyncio.create_task(self.arrivals.run()),
        }
        yield
        tasks = [*self.loops.values(), *self._wakes, *self._sleeps]
        for task in tasks:
            task.cancel()
        # A loop that stopped on an exception (named by /health) does not stop the shutdown.
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._session.close()
        await self._control.close()

    def reconfigure(self, replicas: list[str], settings: GatewaySettings) -> None:
        """A reloaded config: new static replicas and settings (buffered requests stay).

        Replicas it no longer names start draining now; discovery and health checks run at
        once, so new ones are checked (and take traffic) without waiting for the interval.
        """
        self.settings = settings
        self.metrics.set_slo_attainment(settings.slo.attainment)
        self.arrivals.configure(settings.arrivals)
        self.pool.reconfigure(replicas, settings)
        self._set_pressure(settings.wake_at_outstanding, settings.slo.window_seconds)

    def _set_pressure(self, at: int | None, window: float) -> None:
        """Wake under pressure at ``at`` outstanding (None: at zero only), started afresh.

        The baseline's window is the SLO's (``slo.window``, a minute): both are "the last
        minute", and a compressed clock (the demo's) compresses both. A reload that changes
        either is acted on at once: one that turned pressure wakes off kept waking
        sleepers. Turned off, the surplus marks go, as nothing routes by them.
        """
        wanted = None if at is None else WakePressure(at, window_seconds=window)
        if wanted == self._pressure and wanted is not None:
            return
        self._pressure = wanted
        self._baselines.clear()
        self._surplus_above.clear()
        if at is None:
            for replica in self.pool.replicas:
                replica.surplus = False

    def _report(self, routable: int, asleep: int) -> None:
        """After each health round: the replica gauges, those backing off included."""
        self.metrics.set_replicas(routable, asleep)
        views = self.pool.views()
        self.metrics.set_backing_off(
            sum(v.wake_failed for v in views), sum(v.sleep_failed for v in views)
        )

    def stopped_loops(self) -> list[str]:
        """The background loops that have ended (crashed, or cancelled outside shutdown)."""
        return sorted(name for name, task in self.loops.items() if task.done())

    async def _signal_loop(self) -> None:
        while True:
            try:
                self.feed.publish()
            except Exception:  # a watcher's bug must not stop the signals for the others
                self.metrics.loop_failed("signals")
                log.warning("publishing the gateway's signals failed", exc_info=True)
            await asyncio.sleep(self.settings.signal_interval)

    # --- requests -----------------------------------------------------------------------

    async def _wait_for_replica(
        self,
        model: str | None,
        size: int,
        views: list[ReplicaView] | None = None,
        deadline: float | None = None,
    ) -> Replica:
        """A ready replica for ``model``, waiting in the buffer (``size`` bytes) if none.

        ``views``: the pool's views, if built since the last await. ``deadline`` (the
        loop's time): the end of the request's buffer timeout, over all its attempts;
        None: ``buffer_timeout`` from now.
        """
        views = self.pool.routing_views() if views is None else views
        buffered = self._waiting_for.get(model, 0) + 1
        if self._pressure is not None:  # first: it sets the threshold the surplus waits for
            self._wake_if_needed(model, views, buffered)
        url = choose(views, model, self._surplus_above.get(model, math.inf))
        replica = None if url is None else self.pool.find(url)
        ejected = replica is not None and not replica.eject_backoff.allows(time.monotonic())
        if self._pressure is None and (replica is None or ejected):
            # Without pressure wakes a sleeper wakes only when no ready replica that is not
            # ejected serves the model: a walk of every replica a request, skipped when
            # the one chosen shows there is one.
            self._wake_if_needed(model, views, buffered)
        if replica is not None:
            return replica
        s, stats = self.settings, self.stats
        if not may_buffer(
            stats.buffered, s.buffer_size, stats.buffered_bytes, size, s.buffer_bytes
        ):
            if stats.buffered >= s.buffer_size:
                message = f"the gateway's buffer is full ({s.buffer_size} requests)"
            else:
                message = (
                    f"the gateway's buffer is full: {stats.buffered_bytes} of its "
                    f"{s.buffer_bytes} bytes are taken and this request has {size}"
                )
            raise self._reject(429, message, s.buffer_timeout)
        self._set_buffered(+1, size)
        self.feed.publish()  # the scaler hears at once: StreamIsActive can push true
        started = time.monotonic()
        chosen: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        key = id(chosen)
        self._queue(key, model, chosen)
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.settings.buffer_timeout
        try:
            async with asyncio.timeout_at(deadline):
                return await chosen
        except TimeoutError:
            raise self._reject(
                503, f"no replica became ready within {self.settings.buffer_timeout:g}s", 10
            ) from None
        finally:
            self._unqueue(key)
            self._set_buffered(-1, -size)
            self.metrics.waited(time.monotonic() - started)

    def _dispatch(self) -> None:
        """Hand buffered requests the replicas that can take them, first come first.

        Called whenever a replica may have turned routable (a health round, a wake's or a
        sleep's end). The views are built once per call and the wakes decided once per
        model, not per buffered request: 1,000 buffered requests each rebuilding 1,024
        replicas' views took seconds of event loop per notify. A model no replica takes
        now is skipped for the rest of the call (what it is handed only adds load).
        """
        if not self._waiting:
            return
        views = self.pool.routing_views()
        where = {v.url: i for i, v in enumerate(views)}
        blocked: set[str | None] = set()
        for key, (model, chosen) in list(self._waiting.items()):
            if chosen.done():  # timed out or cancelled: its finally removes it
                continue
            if model in blocked:
                continue
            url = choose(views, model, self._surplus_above.get(model, math.inf))
            if url is None:
                blocked.add(model)
                continue
            i = where[url]  # counted at once, so the next one sees its load
            views[i] = dataclasses.replace(views[i], outstanding=views[i].outstanding + 1)
            self._unqueue(key)
            chosen.set_result(self.pool.find(url))
        for model in blocked:  # again: the last wake may have failed
            self._wake_if_needed(model, views, self._waiting_for.get(model, 0))

    def _queue(self, key: int, model: str | None, chosen: asyncio.Future[Replica]) -> None:
        self._waiting[key] = (model, chosen)
        self._waiting_for[model] = self._waiting_for.get(model, 0) + 1

    def _unqueue(self, key: int) -> None:
        """Take a buffered request out of the queue (once: a second call does nothing)."""
        entry = self._waiting.pop(key, None)
        if entry is None:
            return
        model = entry[0]
        left = self._waiting_for[model] - 1
        if left:
            self._waiting_for[model] = left
        else:
            del self._waiting_for[model]

    def _wake_if_needed(
        self, model: str | None, views: list[ReplicaView] | None = None, buffered: int = 1
    ) -> None:
        """Start waking the sleepers ``model`` needs (``serving.routing.choose_wakes``).

        At zero, one (one per threshold of waiting requests with ``wake_at_outstanding``);
        with every ready replica at the pressure threshold, as many as bring the load under
        it, each marked surplus (routed to only above the threshold) until it sleeps again
        or the standby plan's running count takes it. Whatever goes wrong deciding is
        counted and logged once per kind: it never fails the request it runs for.
        """
        try:
            views = self.pool.routing_views() if views is None else views
            serving = [v for v in views if v.ready and not v.ejected and v.serves(model)]
            ready = [v.outstanding for v in serving]
            running = sum(not v.surplus for v in serving) or len(serving)
            threshold, fill = self._pressure_threshold(model, ready, running)
            for url in choose_wakes(views, model, threshold, max(1, buffered), fill):
                replica = self.pool.find(url)
                replica.surplus = bool(ready)
                self._start_wake(replica)
        except Exception as err:
            self.metrics.loop_failed("wakes")
            name = type(err).__name__
            if name not in self._failed_wakes and len(self._failed_wakes) < 64:
                self._failed_wakes.add(name)
                log.warning("deciding wakes failed (%s); requests go on", name, exc_info=True)

    def _pressure_threshold(
        self, model: str | None, ready: list[int], running: int
    ) -> tuple[float | None, float | None]:
        """``WakePressure``'s threshold and fill over ``model``'s baseline, with ``ready``.

        ``ready``: what the ready replicas serving ``model`` hold outstanding; their sum
        updates the baseline (the load). ``running``: those of them not surplus (with none
        ready, the count that last shared the baseline stands). Kept per
        model, for at most ``MAX_PRESSURE_MODELS`` (the least recently updated forgotten
        first): a model's name comes from its clients.
        """
        if self._pressure is None:
            return None, None
        now = time.monotonic()
        baseline, at, shared = self._baselines.pop(model, (None, now, running))
        if ready:
            baseline = self._pressure.baseline(baseline, float(sum(ready)), now - at)
            at, shared = now, running
        # With none ready the load is still shared as the last running replicas shared
        # it: over one, a fleet's load at zero woke one sleeper for 300 waiting requests.
        threshold = self._pressure.threshold(baseline, shared)
        self._surplus_above.pop(model, None)
        if baseline is not None:
            self._baselines[model] = (baseline, at, shared)  # last: the most recently updated
        self._surplus_above[model] = threshold
        for kept in (self._baselines, self._surplus_above):
            while len(kept) > MAX_PRESSURE_MODELS:
                del kept[next(iter(kept))]
        return threshold, self._pressure.fill(baseline, shared)

    def _start_wake(self, replica: Replica) -> None:
        replica.waking = True  # before any await: one wake per replica, per model
        replica.wake_started = time.monotonic()
        if replica.sleep_probation > -math.inf:
            # Its sleep held until the gateway woke it: awake after this (even after a
            # wake that failed, yet woke it) is no relapse of the sleep.
            replica.sleep_backoff, replica.sleep_probation = Backoff(), -math.inf
        task = asyncio.create_task(self._wake(replica))
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def _wake(self, replica: Replica) -> None:
        """``POST /wake_up``; awake: routable at once; otherwise logged, backed off from."""
        log.info("waking replica %s for buffered or waiting requests", replica.url)
        started = time.monotonic()
        try:
            problem = await self._ask_wake(replica)
        except Exception as err:  # a bug met on one wake must never pass unbacked-off
            problem = f"{type(err).__name__}: {err}"
        finally:
            replica.waking = False
        now = time.monotonic()
        if problem is None:
            log.info("replica %s is awake after %.2fs", replica.url, now - started)
            # Its backoff is reset once its /is_sleeping confirms it (gateway_replicas): a
            # replica that says "awake" and stays asleep is woken less and less often.
            replica.sleeping, replica.wake_unconfirmed = False, True
            replica.sleep_changes += 1
            replica.idle_since = now  # not slept again before it served
            self.metrics.woke(now - started)
            self.pool.woke(now - started)
        else:
            replica.wake_backoff = replica.wake_backoff.failed(now, self.settings.wake_retry_after)
            log.warning(
                "waking replica %s failed (%s); not woken again for %gs, the next wake tries"
                " another",
                replica.url,
                problem,
                replica.wake_backoff.until - now,
            )
            self.metrics.wake_failed()
        self._dispatch()  # buffered requests route to it, or wake another
        async with self._ready:
            self._ready.notify_all()

    async def _ask_wake(self, replica: Replica) -> str | None:
        """Its ``POST /wake_up``, then its ``/is_sleeping``: None once both say awake.

        Else what went wrong. A wake answered "awake" was routed every buffered request
        before anything confirmed it: a replica that stayed asleep held them all to the
        upstream timeout (504s), and one whose ``/is_sleeping`` was unreadable afterwards
        was never found out (hostile pass 27). vLLM answers ``/wake_up`` once awake, so
        the read agrees.
        """
        assert self._control is not None
        started = time.monotonic()
        try:
            async with (
                asyncio.timeout(self.settings.wake_timeout),
                self._control.post(replica.url + "/wake_up", allow_redirects=False) as r,
            ):
                if r.status != 200:
                    return f"it answered HTTP {r.status}"
                status = read_wake(await read_answer(r, "/wake_up"))
        except TimeoutError:
            return f"no answer within {self.settings.wake_timeout:g}s"
        except (aiohttp.ClientError, AnswerError) as err:
            return f"{type(err).__name__}: {err}"
        if status != "awake":
            return f"it answered status {status[:40]!r}"
        # The wake's own time left: a replica awake whose /is_sleeping took 2.3 s failed
        # every wake at a probe's 2 s, and served nothing (hostile pass 28).
        left = self.settings.wake_timeout - (time.monotonic() - started)
        return await self._confirm_awake(replica, max(left, PROBE_SECONDS))

    async def _confirm_awake(self, replica: Replica, within: float) -> str | None:
        """Its ``/is_sleeping`` after a wake: None when it says awake, else why not.

        A 404 (no sleep mode any more) is awake.
        """
        assert self._control is not None
        try:
            async with self._control.get(
                replica.url + "/is_sleeping",
                timeout=aiohttp.ClientTimeout(total=within),
                allow_redirects=False,
            ) as r:
                if r.status == 404:
                    return None
                if r.status != 200:
                    return f"its /is_sleeping after the wake answered HTTP {r.status}"
                asleep = read_is_sleeping(await read_answer(r, "/is_sleeping"))
        except TimeoutError:
            return f"its /is_sleeping after the wake did not answer within {within:.3g}s"
        except (aiohttp.ClientError, AnswerError) as err:
            return f"its /is_sleeping after the wake: {type(err).__name__}: {err}"
        return "it answered the wake, but its /is_sleeping says it is asleep" if asleep else None

    # --- the standby plan -----------------------------------------------------------------

    async def _standby_loop(self, source: PlanSource | None = None) -> None:
        """Hold the standby plan every interval; ``source``: the scaler's (``StandbyClient``)."""
        client = StandbyClient()
        failing: str | None = None
        try:
            while True:
                scaler = self.settings.standby_scaler
                try:
                    if scaler is not None:
                        await self._standby_moves(source or client, scaler)
                    else:
                        self._release_surplus()
                    failing = None
                except Exception as err:  # a bug here must never stop the proxy's other work
                    self.metrics.loop_failed("standby")
                    if type(err).__name__ != failing:  # once per kind, not every round
                        log.warning("standby round failed; trying again", exc_info=True)
                    failing = type(err).__name__
                await asyncio.sleep(self.settings.standby_interval)
        finally:
            await client.close()

    async def _standby_round(
        self, client: PlanSource, scaler: str, now: float | None = None
    ) -> None:
        """``_standby_moves``, its sleeps awaited: one round and all it did."""
        await asyncio.gather(*await self._standby_moves(client, scaler, now))

    async def _standby_moves(
        self, client: PlanSource, scaler: str, now: float | None = None
    ) -> list[asyncio.Task[None]]:
        """Ask for the plan; sleep the surplus idle replicas, wake those the running lack.

        ``now`` (``time.monotonic``): when the round decides, for who is backing off.
        Wakes and sleeps run as tasks of their own, returned for the sleeps: the loop
        does not wait for them. A replica whose ``/sleep`` never answered held the loop
        for ``wake-timeout`` (60 s), a scale-up's wakes and every other sleep with it
        (issue 27, hostile pass 26); it is left out of the rounds meanwhile (not routable,
        not asleep).
        """
        s = self.settings
        plan = await client.plan(scaler, s.namespace, s.deployment, s.standby_interval)
        if isinstance(plan, NoPlan):
            # Once per kind of problem: its text changes every round (a signal's age).
            if plan.kind != self._standby_kind:
                log.warning("standby: sleeping none (%s)", plan.message)
            else:
                log.debug("standby: sleeping none (%s)", plan.message)
            if plan.kind in IGNORED_REASONS:
                self.metrics.standby_plan_ignored(plan.kind)
            self.standby_problem, self._standby_kind = plan.message, plan.kind
            self._release_surplus(now)
            return []
        if self._standby_kind is not None:
            log.info("standby: acting on the scaler's plan again")
        self.standby_problem, self._standby_kind = None, None
        views = self.pool.views(now)
        moves = choose_standby(views, plan.running, plan.sleeping, s.sleep_after_idle)
        if moves.sleep or moves.wake:
            log.info("standby: %s (scaler: %s)", moves.reason, plan.reason)
        for url in moves.wake:
            self._start_wake(self.pool.find(url))
        # The surplus is this plan's, no more: a mark left from an earlier plan (fewer
        # running) kept three of four replicas routed nothing once the scaler wanted
        # three running. With the running count covering every ready replica, the
        # scaler's count takes the woken ones: none is surplus.
        covered = sum(v.ready for v in views) <= plan.running
        marked = frozenset() if covered else frozenset(moves.surplus)
        for replica in self.pool.replicas:
            replica.surplus = replica.url in marked
        chosen = [self.pool.find(url) for url in moves.sleep]
        sleeps = []
        for replica in chosen:
            replica.falling_asleep = True  # before any await: no request is routed there
            task = asyncio.create_task(self._sleep(replica, now))
            self._sleeps.add(task)
            task.add_done_callback(self._sleeps.discard)
            sleeps.append(task)
        return sleeps

    def _release_surplus(self, now: float | None = None) -> None:
        """With no plan to sleep it, a surplus replica idle ``sleep_after_idle`` runs.

        The mark exists so that the plan sleeps it once idle; with no plan (no
        ``standby-scaler``, or none to act on) nothing ever would, and below the
        threshold it was routed nothing for good while the others took every request.
        """
        now = time.monotonic() if now is None else now
        for replica in self.pool.replicas:
            idle = (
                not replica.outstanding
                and now - replica.idle_since >= self.settings.sleep_after_idle
            )
            if replica.surplus and idle:
                log.info("replica %s is no longer surplus: no standby plan sleeps it", replica.url)
                replica.surplus = False

    async def _sleep(self, replica: Replica, now: float | None = None) -> None:
        """``POST /sleep?level=1&mode=wait``: asleep, or logged and left to the health check.

        ``wait``: a request the gateway does not know of (another gateway's, a direct
        client's) finishes before the engine sleeps; vLLM's default, ``abort``, would end it.
        A refusal leaves it routable; a sleep sent but not answered (timed out, cut off)
        may still be pausing the engine, where a request would wait unscheduled: it is
        held asleep (woken on demand) until its ``/is_sleeping`` says it is awake. Either
        way it is not slept again while it backs off (``wake_retry_after``, doubled per
        failure in a row, from ``now``, the round's time): another idle replica is.
        """
        try:
            problem, sent = await self._ask_sleep(replica)
        except Exception as err:  # a bug met on one replica's sleep: as if sent, unanswered
            problem, sent = f"{type(err).__name__}: {err}", True
        finally:
            replica.falling_asleep = False
        self.metrics.slept(problem is None)
        if problem is None or sent:
            replica.sleeping, replica.surplus = True, False
            replica.sleep_changes += 1  # a /is_sleeping read from before is stale
        if problem is None:
            # Its backoff is reset once its /is_sleeping confirms it (gateway_replicas): a
            # replica that answers 200 and stays awake is slept less and less often.
            replica.sleep_unconfirmed = True
            log.info("replica %s is asleep (the standby plan's)", replica.url)
        else:
            at = time.monotonic() if now is None else now
            replica.sleep_backoff = replica.sleep_backoff.failed(at, self.settings.wake_retry_after)
            log.warning(
                "putting replica %s to sleep failed (%s); %snot slept again for %gs",
                replica.url,
                problem,
                "routed nothing until its /is_sleeping says it is awake; " if sent else "",
                replica.sleep_backoff.until - at,
            )
        self._dispatch()  # a buffered request may wake it, or route to it
        async with self._ready:
            self._ready.notify_all()

    async def _ask_sleep(self, replica: Replica) -> tuple[str | None, bool]:
        """Its ``POST /sleep``: what went wrong (None: asleep), and whether it was sent."""
        assert self._control is not None
        try:
            async with (
                asyncio.timeout(self.settings.wake_timeout),
                self._control.post(
                    replica.url + "/sleep", params=SLEEP_QUERY, allow_redirects=False
                ) as r,
            ):
                if r.status != 200:
                    return f"it answered HTTP {r.status}", False
        except TimeoutError:
            return f"no answer within {self.settings.wake_timeout:g}s", True
        except aiohttp.ClientError as err:
            sent = not isinstance(err, aiohttp.ClientConnectorError)
            return f"{type(err).__name__}: {err}", sent
        return None, True

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        raw, model, prompt, max_tokens, n = await self._read(request)
        # Once a listed model went unremembered, no model is certainly unserved at zero:
        # a replica listing fresh names each time back turned a new model's requests at
        # zero into 404s, never counted as arrivals (issue 27, hostile pass 25).
        configured = frozenset(self.settings.models)
        known = frozenset() if self.pool.served_full else configured | self.pool.served
        views = self.pool.routing_views()  # once a request, each kept while unchanged
        if model and is_unserved(views, model, known, configured):
            # Before it counts as an arrival: the scaler must not scale up for it.
            raise self._reject(404, f"no replica serves model {model!r}", None)
        now = time.time()
        # The rate windows keep the monotonic clock: a wall-clock step moves no rate.
        self.stats.arrivals.add(time.monotonic(), self.settings.rate_window)
        self.stats.last_arrival = now
        self.metrics.arrived()
        meter = ResponseMeter(time.monotonic(), max_tokens, n)
        status: int | None = 500  # an unexpected error: aiohttp answers 500
        try:
            response = await self._forward(request, raw, model, meter, views)
            status = meter.status
            return response
        except web.HTTPException as err:  # the gateway's own answer: 429, 502, 503, 504
            status = err.status
            raise
        except asyncio.CancelledError:  # the client left (handler cancellation)
            status = CLIENT_CLOSED
            raise
        finally:
            self._end(meter, status, now, prompt)

    def _end(self, meter: ResponseMeter, status: int | None, arrival: float, prompt: int) -> None:
        """Judge and record a request that ended; neither can stop the other, nor raise."""
        try:
            self._judge(meter, status)
        except Exception as err:  # a bug must not cost the request its record
            self._bookkeeping_failed("judging", err)
        try:
            tokens = meter.output_tokens() or 0
            self.arrivals.record(arrival, meter.prompt_tokens or prompt, tokens)
        except Exception as err:
            self._bookkeeping_failed("recording", err)
        if meter.usage_unmeasured:
            self.metrics.usage_unmeasured()

    def _bookkeeping_failed(self, what: str, err: Exception) -> None:
        """Logged once per exception type (with its traceback), counted every time."""
        self.metrics.loop_failed("requests")
        name = type(err).__name__
        if name not in self._failed_bookkeeping and len(self._failed_bookkeeping) < 64:
            self._failed_bookkeeping.add(name)
            log.warning("%s a request that ended failed (%s)", what, name, exc_info=True)

    def _judge(self, meter: ResponseMeter, status: int | None) -> None:
        """Judge a request that ended against the SLO; count it within or outside."""
        end = time.monotonic()
        verdict = meter.verdict(self.settings.slo, end, status)
        self.metrics.judged(verdict)
        if not verdict.judged:
            return  # left too early to tell: no evidence for the scaler either way
        window = self.settings.slo.window_seconds
        (self.stats.within if verdict.within else self.stats.outside).add(end, window)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request judged %s (%s): status %s, ttft %s s, mean itl %s s",
                "within" if verdict.within else "outside",
                verdict.reason,
                status,
                verdict.ttft_seconds,
                verdict.itl_seconds,
            )

    async def _read(
        self, request: web.Request
    ) -> tuple[bytes, str | None, int, int | None, int | None]:
        """The request's body, its model, estimated prompt tokens, output token bound, ``n``.

        The bound is the most output tokens it may get (``output_token_limit``); ``n``
        its choices (``serving.slo.choices``).

        A body over ``max_request_bytes`` is 413 (refused on its Content-Length, before
        it is read, or as soon as it grows past the limit); one that is not a JSON object
        is the client's 400, whatever is wrong with it. A model name longer than any
        replica may list (``MAX_MODEL_ID_CHARS``) is served by nobody: 404, never kept.
        """
        raw = await self._read_body(request)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            # ValueError: malformed, not UTF-8, an integer past Python's 4,300 digits;
            # RecursionError: nested deeper than the parser's stack.
            raise self._reject(400, "request body is not valid JSON", None) from None
        if not isinstance(body, dict):
            raise self._reject(400, "request body must be a JSON object", None)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise self._reject(400, "model must be a string", None)
        if model is not None and len(model) > MAX_MODEL_ID_CHARS:
            # No replica lists such a name (``replica_answers`` refuses it) and no config
            # holds one: served by nobody. Taken, it was kept as a key of the per-model
            # pressure state after its request ended: 4,096 names of 16 MiB each.
            raise self._reject(404, f"no replica serves model {quote(model, 80)}", None)
        chat = request.path == "/v1/chat/completions"
        bound = output_token_limit(body, chat=chat)
        return raw, model, estimate_prompt_tokens(body), bound, choices(body, chat)

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, read within ``body_timeout`` (408) and the bytes budget (429).

        Bodies being read are held in memory before any bound of the buffer applies: a
        client that sends all but the last byte of each and waits would hold them for
        good. So together they may hold at most ``buffer_bytes``, charged as the bytes
        arrive (a declared Content-Length charged up front let 16 sockets that sent no
        byte refuse everyone else), and each must arrive whole within ``body_timeout``.
        A body its ``Content-Encoding`` cannot decode is the client's 400; one holding more
        than ``MAX_REQUEST_JSON_ITEMS`` commas, braces and brackets is 413 (its parse
        would hold the event loop).
        """
        s = self.settings
        limit = s.max_request_bytes
        too_large = f"request body is larger than {limit} bytes"
        declared = request.content_length
        if declared is not None and declared > limit:
            raise self._reject(413, too_large, None)
        charged, chunks, size, items = 0, [], 0, 0
        try:
            async with asyncio.timeout(s.body_timeout):
                async for chunk in request.content.iter_any():
                    size += len(chunk)
                    if size > limit:
                        raise self._reject(413, too_large, None)
                    # Counted chunk by chunk (~1 ms a MiB): no read holds the loop for long.
                    items += chunk.count(b",") + chunk.count(b"{") + chunk.count(b"[")
                    if items > MAX_REQUEST_JSON_ITEMS:
                        message = (
                            f"request body holds more than {MAX_REQUEST_JSON_ITEMS} JSON"
                            " items (commas, objects and arrays)"
                        )
                        raise self._reject(413, message, None)
                    charged += self._charge_body(len(chunk))
                    chunks.append(chunk)
        except TimeoutError:
            message = f"the request body did not arrive within {s.body_timeout:g}s"
            raise self._reject(408, message, None) from None
        except (web.RequestPayloadError, HttpProcessingError):
            # Labelled gzip (or deflate) and not: aiohttp's decoder fails mid-read. The
            # rest is not read (aiohttp would, after the answer, and log the error again
            # as unhandled) and the connection closes: its next bytes mean nothing.
            self.metrics.client_error("malformed-http")
            request.content.feed_eof()
            refused = self._reject(400, "request body could not be decoded", None)
            refused.force_close()
            raise refused from None
        finally:
            self.stats.reading_bytes -= charged
        return b"".join(chunks)

    def _charge_body(self, size: int) -> int:
        """Charge ``size`` more bytes of bodies being read; 429 past ``buffer_bytes``."""
        stats, budget = self.stats, self.settings.buffer_bytes
        if size and stats.reading_bytes + size > budget:
            message = (
                f"the gateway is reading too many request bodies: {stats.reading_bytes} of"
                f" its {budget} bytes are taken and this request needs {size} more"
            )
            raise self._reject(429, message, 1)
        stats.reading_bytes += size
        return size

    async def _forward(
        self,
        request: web.Request,
        raw: bytes,
        model: str | None,
        meter: ResponseMeter,
        views: list[ReplicaView] | None = None,
    ) -> web.StreamResponse:
        """Send upstream, trying another replica while a connection fails or drops unanswered.

        A replica that answers broken HTTP before its headers is a 502, one silent past
        ``upstream_timeout`` a 504; neither is retried. ``views``: the replicas as the
        request found them (nothing awaited since), for its first try.
        """
        assert self._session is not None
        headers = {
            **{k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED},
            **PLAIN,
        }
        timeout = self.settings.upstream_timeout
        dropped = False
        # One buffer timeout over every attempt: each retry waiting a whole one of its own
        # held a request behind a crash-looping replica 11 x 120 s (hostile pass 27).
        deadline = asyncio.get_running_loop().time() + self.settings.buffer_timeout
        for _attempt in range(self.settings.connect_retries + 1):
            replica = await self._wait_for_replica(model, len(raw), views, deadline)
            views = None  # a retry looks afresh: the last one was marked down
            meter.bound_by(replica.max_model_len)
            replica.outstanding += 1
            self._set_in_flight(+1)
            try:
                try:
                    async with asyncio.timeout(timeout):
                        # Never followed: a replica answering 307 elsewhere had the client's
                        # body and headers (API keys, cookies) sent to a host no config
                        # names, and its answer relayed as the replica's.
                        upstream = await self._session.post(
                            replica.url + request.path,
                            data=raw,
                            headers=headers,
                            allow_redirects=False,
                        )
                except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as err:
                    # Nothing was sent: safe to try another replica.
                    self._upstream_failed(
                        replica, "connect", "cannot connect to %s (%s)", replica.url, err
                    )
                    self.pool.mark_down(replica)
                    continue
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
                    # The connection dropped with no byte of an answer: the replica died
                    # (or closed a pooled connection as it was reused). It is health-checked
                    # again before it gets more; the request goes to another one.
                    self._upstream_failed(
                        replica,
                        "before-response",
                        "%s dropped the connection before answering (%s: %s)",
                        replica.url,
                        type(err).__name__,
                        err,
                    )
                    self.pool.mark_down(replica)
                    dropped = True
                    continue
                except TimeoutError:
                    self._upstream_failed(
                        replica, "timeout", "%s sent no response within %gs", replica.url, timeout
                    )
                    raise self._reject(
                        504, f"the replica sent no response within {timeout:g}s", None
                    ) from None
                except aiohttp.ClientError as err:
                    # str, never repr: an error's repr carries the request's headers.
                    self._upstream_failed(
                        replica,
                        "before-response",
                        "%s failed before its response: %s: %s",
                        replica.url,
                        type(err).__name__,
                        err,
                    )
                    raise self._reject(502, "the replica failed before answering", None) from None
                async with upstream:
                    if 300 <= upstream.status < 400:  # a 300 or 304 too: no completion
                        raise self._redirected(replica, upstream)
                    return await self._relay(request, upstream, meter, replica, model)
            finally:
                replica.outstanding -= 1
                replica.idle_since = time.monotonic()
                self.pool.drop_if_drained(replica)
                self._set_in_flight(-1)
        if dropped:
            raise self._reject(502, "the replica failed before answering", None)
        raise self._reject(503, "no replica accepted the connection", 5)

    def _redirected(self, replica: Replica, upstream: aiohttp.ClientResponse) -> web.HTTPException:
        """A completion the replica answered with a redirect: its 502, counted, not followed.

        vLLM never redirects a completion; a replica that does points its clients (and,
        followed, their prompts and keys) at a host behind the gateway. Relayed, the
        client would be sent there; followed (aiohttp's default), the gateway sent it.
        A fast failure: one redirecting every request at once is ejected.
        """
        where = quote(upstream.headers.get("Location", ""), 80)
        self._upstream_failed(
            replica,
            "redirect",
            "%s answered HTTP %d to %s (not followed)",
            replica.url,
            upstream.status,
            where,
        )
        return self._reject(502, "the replica answered a redirect (not followed)", None)

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        meter: ResponseMeter,
        replica: Replica,
        model: str | None,
    ) -> web.StreamResponse:
        """Pass the response on chunk by chunk, however long, while no gap passes the timeout.

        A gap in a stream is one without a token: a replica that sends keep-alive comments
        and never a token (an engine wedged behind a live HTTP server) held its request in
        flight for good. A stream far past its request's token bound, or a non-streamed
        body not whole within the timeout of its headers, is cut too (``overrun``), as is
        one of lines without tokens (``ResponseMeter.flooded``).
        ``meter`` sees every chunk as it comes, for the SLO's judgment;
        its ``status`` ends None when the response is cut off, ``CLIENT_CLOSED`` when the
        client left.
        """
        response = await self._begin(request, upstream, meter, replica)
        gap = self.settings.upstream_timeout
        since = time.monotonic()  # the headers: a stream's first token comes within a gap
        last_byte = since
        while True:
            chunk = await self._next_chunk(upstream, meter, replica, since, last_byte)
            if chunk is None:
                return self._broken(request, response, meter)
            last_byte = time.monotonic()
            meter.feed(chunk, last_byte)
            if overrun(meter):
                self._upstream_failed(
                    replica,
                    "overrun",
                    "%s streamed %d events (%d with text) for a request allowing %s tokens",
                    replica.url,
                    meter.choice_events,
                    meter.token_events,
                    meter.token_bound,
                )
                return self._broken(request, response, meter)
            if meter.flooded:
                self._upstream_failed(
                    replica,
                    "token-less",
                    "%s streamed %d lines for %d events holding a choice",
                    replica.url,
                    meter.lines,
                    meter.choice_events,
                )
                return self._broken(request, response, meter)
            try:
                # A client that stops reading (its socket open) would block this write,
                # its replica slot and its place in_flight for good: it gets as long as a
                # replica may stay silent, then it is cut and counted.
                async with asyncio.timeout(gap):
                    if not chunk:
                        await response.write_eof()
                        self._answered(replica, upstream.status, meter, model)
                        return response
                    await response.write(chunk)
            except ConnectionResetError:
                log.debug("the client of %s left mid-response", request.path)
                meter.status = CLIENT_CLOSED
                return response
            except TimeoutError:
                log.debug("the client of %s read nothing for %gs: cut", request.path, gap)
                self.metrics.client_error("stalled")
                meter.status = CLIENT_CLOSED
                if request.transport is not None:
                    request.transport.abort()
                return response

    async def _next_chunk(
        self,
        upstream: aiohttp.ClientResponse,
        meter: ResponseMeter,
        replica: Replica,
        since: float,
        last_byte: float,
    ) -> bytes | None:
        """The next chunk of the body (empty at its end); None, counted, when it must be cut.

        ``since``: when the headers came; ``last_byte``: when the last chunk did.
        """
        gap = self.settings.upstream_timeout
        try:
            async with asyncio.timeout(self._silence_left(meter, since, gap)):
                return await upstream.content.readany()
        except TimeoutError:
            if not meter.streamed and time.monotonic() - last_byte < gap:
                self._upstream_failed(
                    replica, "overrun", "%s sent a body for over %gs", replica.url, gap
                )
            else:
                self._upstream_failed(
                    replica,
                    "stalled",
                    "%s sent %s for %gs mid-response",
                    replica.url,
                    "no token" if meter.streamed else "nothing",
                    gap,
                )
        except aiohttp.ClientError as err:
            # The replica died mid-response: this client's response ends broken; we go on.
            self._upstream_failed(
                replica,
                "mid-response",
                "%s failed mid-response: %s: %s",
                replica.url,
                type(err).__name__,
                err,
            )
        return None

    @staticmethod
    def _silence_left(meter: ResponseMeter, since: float, gap: float) -> float:
        """How long the next read may wait: a stream's to its token, a body's to its end.

        A stream's next token comes within ``gap`` of the last; a non-streamed body
        ends within ``gap`` of its headers.

        A non-streamed answer is sent once its last token is generated, so its whole body
        gets ``gap``: one that sent a space a second held its request in flight for good.
        """
        last = since if not meter.streamed or meter.last_token is None else meter.last_token
        if meter.streamed and not meter.read_whole:
            # Its tokens are no longer read: its events tell it is alive (an honest stream
            # past the parse budget was cut as stalled while tokens flowed, pass 64; timed
            # from its bytes, a byte a gap held it for good, pass 65).
            last = since if meter.last_data_line is None else meter.last_data_line
        return max(0.0, min(gap, last + gap - time.monotonic()))

    async def _begin(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        meter: ResponseMeter,
        replica: Replica,
    ) -> web.StreamResponse:
        """Send the client the replica's status and the headers it may relay.

        A status or header the gateway cannot write (``relayable_headers`` drops those it
        knows of) is the replica's 502 (``bad-headers``), before a byte is sent.
        """
        headers = relayable_headers(upstream.headers)
        meter.begin(upstream.status, upstream.content_type == "text/event-stream")
        encoded = check_encoding(upstream.headers)
        if encoded:
            self._upstream_failed(replica, "bad-headers", "%s answered %s", replica.url, encoded)
            meter.status = 502
            raise self._reject(502, "the replica's answer could not be relayed", None)
        try:
            response = web.StreamResponse(status=upstream.status, headers=headers)
            await response.prepare(request)
        except (ValueError, TypeError) as err:
            if request.writer is not None and request.writer.output_size:
                raise  # bytes went out: no 502 can follow them
            self._upstream_failed(
                replica,
                "bad-headers",
                "%s answered headers that cannot be relayed: %s",
                replica.url,
                str(err)[:200],
            )
            meter.status = 502
            raise self._reject(502, "the replica's answer could not be relayed", None) from None
        return response

    def _broken(
        self, request: web.Request, response: web.StreamResponse, meter: ResponseMeter
    ) -> web.StreamResponse:
        """End a response whose upstream failed: the client sees it cut, not complete."""
        meter.status = None
        if request.transport is not None:
            request.transport.close()
        return response

    def _set_buffered(self, change: int, size: int) -> None:
        self.stats.buffered += change
        self.stats.buffered_bytes += size
        self.metrics.set_buffered(self.stats.buffered, self.stats.buffered_bytes)

    def _set_in_flight(self, change: int) -> None:
        self.stats.in_flight += change
        self.metrics.set_in_flight(self.stats.in_flight)

    def _upstream_failed(self, replica: Replica, kind: str, message: str, *args: object) -> None:
        """Count an upstream failure; log it at WARNING once per replica and kind.

        Until the replica answers a request whole again the same kind is logged at DEBUG:
        one that drops every request would log a line per request, the counters (and the
        ``upstream_error_rate``) carry the rate.
        """
        self.stats.errors.add(time.monotonic(), self.settings.rate_window)
        self.metrics.upstream_error(kind)
        ejected_for = self._failed_fast(replica) if kind in FAST_FAILURES else None
        if ejected_for is not None:
            message += "; routed to only when no other replica serves the model for %gs"
            args = (*args, ejected_for)
        if kind in replica.failing:
            log.debug(message, *args)
            return
        replica.failing.add(kind)
        log.warning(message + "; logged once until it answers a request whole", *args)

    def _answered(
        self, replica: Replica, status: int, meter: ResponseMeter, model: str | None
    ) -> None:
        """A response relayed whole: an answer of its replica's, or a failure it counts.

        A server error, a stream carrying an error event of the replica's (one of a 4xx
        code refuses the client's request, as a 400 does), a refusal (429, or 404 for a
        model it lists) and a success holding no choice count against it
        (``_failed_fast``); all but the first are judged failed too (``meter.unanswered``:
        a 5xx is by its status). The client's request refused (a 4xx) is no failure of
        the replica's: it counts among its answers as a refusal (``REFUSED``), which
        weighs in routing, and most of its answers refused eject it (``REFUSING_AFTER``).
        """
        url = replica.url
        if status >= 500:
            self._upstream_failed(replica, "status-5xx", "%s answered HTTP %d", url, status)
        elif meter.stream_error:
            meter.unanswered = True  # an error in a 200 is no answer: it was judged within
            message = "%s streamed an error event in an answer of HTTP %d"
            self._upstream_failed(replica, "stream-error", message, url, status)
        elif status == 429 or (status == 404 and model in replica.models):
            meter.unanswered = True
            message = "%s refused a request for %s (HTTP %d%s)"
            lists = ", a model it lists" if status == 404 else ""
            name = quote(model or "", 80)
            self._upstream_failed(replica, "refused", message, url, name, status, lists)
        elif meter.client_error or 400 <= status < 500:
            # The client's request refused: no failure of the replica's, but one quick to
            # answer it is idle again at once, so it weighs in routing, and one refusing
            # most of what it is sent, more than its peers, is ejected (one answering 401
            # to everything kept 69% of the traffic beside a replica busy with long ones).
            ejected_for = self._failed_fast(replica, REFUSED)
            if ejected_for is not None:
                message = "%s refuses requests far more often than its peers (HTTP %d)"
                message += "; routed to only when no other replica serves the model for %gs"
                log.warning(message, url, status, ejected_for)
        elif 200 <= status < 300 and not meter.holds_choices():
            meter.unanswered = True
            message = "%s answered HTTP %d holding no choice (no completion)"
            self._upstream_failed(replica, "empty", message, url, status)
        else:
            self._answered_well(replica)

    def _answered_well(self, replica: Replica) -> None:
        """An answer, counted among its last ones.

        A window of answers without failure ends its ejections in a row; its failures
        are logged again.
        """
        replica.recent.append(ANSWERED)
        replica.fresh.append(ANSWERED)
        clean = len(replica.recent) == EJECT_WINDOW and not any(replica.recent)
        if clean and replica.eject_backoff.failures:
            replica.eject_backoff = Backoff()
        if replica.failing:
            log.info("replica %s answered a request whole again", replica.url)
            replica.failing.clear()

    def _failed_fast(self, replica: Replica, outcome: int = FAILED) -> float | None:
        """One more fast failure (or refusal) of ``replica``; the seconds it is ejected for.

        None when it is not ejected now. ``EJECT_AFTER`` failures among its last
        ``EJECT_WINDOW`` answers, and more than its peers fail (``_peers_bar``), eject it
        (passed over while others serve the model) for ``EJECT_SECONDS``, doubled per
        ejection until it answers a window without failure: a sick engine behind a live
        HTTP server answers at once, so least-outstanding routing sent it ~99% of the
        traffic. Only its failures since its last ejection count (``fresh``); its window
        is kept whole for its peers' bar (cleared, an ejected peer's read as answering
        well, and two replicas of a model took turns being ejected by a client's failing
        requests). One still routed to while ejected (past half) is not ejected again.
        Refusals of the client's requests eject it only at ``REFUSING_AFTER``: at three,
        ordinary clients' 5% of invalid requests ejected one replica of two 43% of the
        time (hostile pass 69).
        """
        now = time.monotonic()
        replica.failed(now)
        replica.recent.append(outcome)
        replica.fresh.append(outcome)
        if not replica.eject_backoff.allows(now):
            return None
        own = replica.fresh.count(outcome)
        if own < (EJECT_AFTER if outcome == FAILED else REFUSING_AFTER):
            return None  # the peers' bar is walked only past this
        if own < self._peers_bar(replica, outcome):
            return None
        replica.fresh.clear()
        replica.eject_backoff = replica.eject_backoff.failed(now, EJECT_SECONDS)
        return replica.eject_backoff.until - now

    def _peers_bar(self, replica: Replica, outcome: int = FAILED) -> float:
        """The failures among ``replica``'s last answers that set it apart from its peers.

        ``PEER_MARGIN`` times as many as their share of failures among their own last
        answers gives it, plus one; its peers serve a model it serves (or have not
        listed theirs), so that replicas of another model do not thin their share.

        A client's request that makes every replica answer 500 fails on whichever gets
        it; spread by their weight (``Replica.failed``) such requests fail each replica
        about as often, and none is ejected (four requests ejected a healthy replica
        each, three of four: hostile pass 65). One failing everything beside peers that
        answer is ejected at ``EJECT_AFTER``.
        """
        failed = answered = 0
        models = replica.models
        for peer in self.pool.replicas:
            if peer is not replica and (not models or not peer.models or models & peer.models):
                failed += peer.recent.count(outcome)
                answered += len(peer.recent)
        share = failed / answered if answered else 0.0
        if share >= 1.0:
            return math.inf  # every answer fails everywhere: the requests', not its
        # Never past a whole window: peers made to fail half their answers shielded a
        # replica failing everything (10 of 10 short of a bar of 11).
        return min(PEER_MARGIN * share * len(replica.fresh) + 1, EJECT_WINDOW)

    def _reject(self, status: int, message: str, retry_after: float | None) -> web.HTTPException:
        """An error the gateway answers itself, counted, with ``Retry-After`` when it helps."""
        self.metrics.rejected(status)
        return rejection(status, message, retry_after)

    # --- the gateway's own endpoints ----------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        """The ready replicas' models; with none ready, the models known (as requests see)."""
        views = self.pool.views()
        if any(v.ready for v in views):
            models = sorted(known_models(views))
        else:
            models = sorted(frozenset(self.settings.models) | self.pool.served)
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": m, "object": "model", "owned_by": "unitscale"} for m in models],
            }
        )

    async def _health(self, request: web.Request) -> web.Response:
        """Liveness and readiness: 503 naming the loops that stopped, should one stop."""
        stopped = self.stopped_loops()
        return web.json_response(
            {
                "status": "ok" if not stopped else "a background loop stopped",
                "stopped": stopped,
                "replicas": len(self.replicas),
                "ready": sum(r.routable for r in self.replicas),
                "sleeping": sum(r.wakeable for r in self.replicas),
                "draining": sum(r.draining for r in self.replicas),
                "buffered": self.stats.buffered,
                "in_flight": self.stats.in_flight,
                # A write that hangs holds the record, not the requests: named, not a 503.
                "arrivals_writer": "stuck" if self.arrivals.stuck else "ok",
            },
            status=503 if stopped else 200,
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


class _RequestTooLarge(web.HTTPClientError):
    """413 without ``web.HTTPRequestEntityTooLarge``'s required sizes and its own text."""

    status_code = 413


_HTTP: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    408: web.HTTPRequestTimeout,
    404: web.HTTPNotFound,
    413: _RequestTooLarge,
    429: web.HTTPTooManyRequests,
    502: web.HTTPBadGateway,
    503: web.HTTPServiceUnavailable,
    504: web.HTTPGatewayTimeout,
}


def overrun(meter: ResponseMeter) -> bool:
    """Whether a stream carries far more token events than its request allows.

    An event carrying tokens carries at least one, so a stream ``OVERRUN_EVENTS`` past the
    bound (slack for an echoed prompt or an odd event) is a replica that keeps generating:
    one that sent a token a second to a request for five held its slot and its place in
    flight for good. The bound is the request's within its replica's ``max_model_len``
    (``ResponseMeter.token_bound``): every stream has one.
    """
    bound = meter.token_bound + OVERRUN_EVENTS
    choices = meter.choices or 1
    # Every event holding a choice is a token generated, or a choice's role or its end;
    # an echo is one text event a choice before its tokens (hostile pass 64).
    if meter.token_events > bound + choices or meter.choice_events > bound + 2 * choices:
        return True
    # Past the parse budget its events are counted, not read: a usage event and the
    # closing [DONE] come beside the choices' (slack for as many more).
    return not meter.read_whole and meter.data_lines > bound + 2 * choices + OVERRUN_EVENTS


def rejection(status: int, message: str, retry_after: float | None) -> web.HTTPException:
    """The gateway's own error answer: a JSON body, ``Retry-After`` when given."""
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
    body = json.dumps({"object": "error", "message": message, "code": status})
    return _HTTP[status](text=body, content_type="application/json", headers=headers)
