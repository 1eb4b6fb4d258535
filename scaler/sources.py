"""Where signals come from: watches on exporters and gateways, PromQL, or a demo generator.

Each source is a long-running coroutine that feeds a ``SignalStore``; the server
starts and cancels them. A broken watch reconnects with capped exponential backoff;
meanwhile the stored signals age and KEDA gets UNAVAILABLE once they pass
``max-signal-age``. The Prometheus source fails the same way: a round whose queries
fail publishes nothing, and the signals age.

Nothing a source answers can end its loop. The unit of work is one target's query round
(Prometheus) or one message (a watch): any exception in it fails that unit alone, is
counted in the store's ``errors`` by source and reason, and is logged once per target
until it changes; the next round or message is tried as usual. Whatever still ends a
loop ends its task, and the server's health says so (``scaler.server``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import ssl
import time
from collections.abc import Callable, Iterable

import aiohttp
import grpc

from foundation.errors import ConfigError, quote
from foundation.files import KiB, read_text
from foundation.signals import (
    EngineSignals,
    GatewaySignals,
    Snapshot,
    TargetKey,
    WindowSignals,
    describe_target,
)
from foundation.signals_wire import WireError, decode
from protos.unitscale.v1 import signals_pb2 as pb
from protos.unitscale.v1 import signals_pb2_grpc as pb_grpc
from scaler.config import (
    DemoSourceConfig,
    PrometheusSourceConfig,
    SignalSourceConfig,
    ca_context,
)
from scaler.fair_slots import FairSlots
from scaler.promql import (
    MAX_ANSWER_BYTES,
    AnswerError,
    Query,
    checked_answers,
    parse_answer,
    plan,
    signals_from_answers,
)
from scaler.signals import SignalStore

log = logging.getLogger(__name__)


async def watch_signals(config: SignalSourceConfig, store: SignalStore) -> None:
    """Keep a ``WatchSignals`` stream open to one source, forever.

    The backoff doubles from ``reconnect-min`` to ``reconnect-max`` and starts again
    only after a stream held ``reconnect-max``: a source that sends one message and
    ends the stream (a crash loop, a proxy cutting streams) was retried every 0.5 s,
    with a WARNING each time. A stream with no message for ``idle-timeout`` is broken
    too (counted ``silent``): nothing else ends a watch on a hung source. Every
    reconnect is counted (``store.errors``, source ``watch``, reason ``reconnect``).
    Logged on changes only: one WARNING per change of why the watch broke, DEBUG for the
    same again, INFO once it holds again.
    """
    delay = config.reconnect_min
    last = ""  # why the last attempt broke ("" while none has, or after one that held)
    announced = False  # "watching" logged at INFO since the last WARNING
    loop = asyncio.get_running_loop()
    while True:
        began, streaming = time.monotonic(), False
        try:
            async with (
                grpc.aio.insecure_channel(config.address) as channel,
                asyncio.timeout(config.idle_timeout) as quiet,
            ):
                stub = pb_grpc.SignalsServiceStub(channel)
                async for response in stub.WatchSignals(pb.WatchSignalsRequest()):
                    quiet.reschedule(loop.time() + config.idle_timeout)
                    if not streaming:
                        streaming = True
                        # Once after each WARNING: a source that recovers says so, one
                        # that ends every stream is not announced every reconnect.
                        level = logging.DEBUG if announced else logging.INFO
                        log.log(level, "watching signals from %s", config.address)
                        announced = True
                    receive(store, response.signals, config.address)
            problem, kind = "ended", "ended"
        except TimeoutError:
            # Silent past idle-timeout: a hung source or a dead peer's half-open connection
            # (no FIN ever comes) had held this watch for good while its signals went stale.
            store.count_error("watch", "silent")
            problem = f"sent nothing for {config.idle_timeout:g}s (idle-timeout)"
            kind = "silent"
        except grpc.aio.AioRpcError as err:
            problem = f"failed ({err.code().name}: {quote(err.details() or '', 200)})"
            kind = err.code().name
        except Exception as err:  # anything else the channel raises: reconnect, never end
            store.count_error("watch", "exception")
            problem, kind = f"failed ({_described(err)})", type(err).__name__
        store.count_error("watch", "reconnect")
        if streaming and time.monotonic() - began >= config.reconnect_max:
            delay = config.reconnect_min  # it held: a fresh start
            # ... but a source that goes silent on every stream is one WARNING, not one
            # an idle-timeout.
            last = last if kind == "silent" else ""
        if kind != last:
            log.warning("signal watch on %s %s; reconnecting", config.address, problem)
            announced = False
        else:
            log.debug("signal watch on %s %s; retrying in %.2fs", config.address, problem, delay)
        last = kind
        await asyncio.sleep(delay)
        delay = min(delay * 2, config.reconnect_max)


def receive(store: SignalStore, message: pb.Signals, origin: str = "a signal watch") -> bool:
    """Decode a wire message into ``store``; one that cannot be attributed is refused.

    The unit of a watch's work: whatever goes wrong with this message (it cannot be
    decoded, a rate is out of range, storing it raised) refuses it alone, counted and
    logged once per ``origin`` until it changes. Returns whether the store kept it.
    """
    about = (origin, "wire")
    try:
        snapshot = decode(message)
    except WireError as err:
        store.count_refused("wire", "undecodable")
        store.report(about, f"ignoring signals: {err}: {quote(str(message), 200)}")
        return False
    except Exception as err:  # a decoder bug must not end the watch
        store.count_error("watch", "exception")
        store.report(about, f"ignoring signals: {_described(err)}")
        return False
    try:
        kept = store.update(snapshot)
    except Exception as err:  # a listener's bug: the next message is tried as usual
        store.count_error("watch", "exception")
        store.report(
            about,
            f"storing signals for {describe_target(snapshot.target)} failed: {_described(err)}",
        )
        return False
    store.report(about, "")
    return kept


def _described(err: BaseException) -> str:
    """``Type: message`` of an exception, short whatever it carries."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def demo_concurrency(elapsed: float, period: float, peak: float) -> float:
    """Requests in flight in the demo's load cycle at ``elapsed`` seconds.

    One cycle: a ramp to 40% of peak, a burst to peak, a fall, an idle stretch at 0
    (so scale-to-zero happens), then the ramp again::

        share of period  0 ---- 0.25 ---- 0.4 ---- 0.55 ---- 0.7 ------ 1
        load             0 ramp  0.4  burst  1  fall  0.2  drop  0   idle
    """
    phase = (elapsed % period) / period
    if phase < 0.25:
        share = 0.4 * phase / 0.25
    elif phase < 0.4:
        share = 0.4 + 0.6 * math.sin((phase - 0.25) / 0.15 * math.pi / 2)
    elif phase < 0.55:
        share = 1.0 - 0.8 * (phase - 0.4) / 0.15
    elif phase < 0.7:
        share = 0.2 * (0.7 - phase) / 0.15
    else:
        share = 0.0
    return round(peak * share, 1)


def demo_signals(
    namespace: str, deployment: str, now: float, elapsed: float, config: DemoSourceConfig
) -> tuple[Snapshot, Snapshot]:
    """Engine and gateway snapshots for one demo deployment at ``elapsed``."""
    demand = demo_concurrency(elapsed, config.period, config.peak_concurrency)
    target = (namespace, deployment, "")
    running = min(demand, config.peak_concurrency / 2)
    engine = EngineSignals(
        time=now,
        replicas=0,
        replicas_up=0,
        queue_depth=demand - running,
        running=running,
        kv_usage=None,
        panic=WindowSignals(0.0),
        stable=WindowSignals(0.0),
        cost_per_million_tokens=None,
        cost_per_million_output_tokens=None,
        price_is_default=False,
        partial=False,
    )
    gateway = GatewaySignals(time=now, arrival_rate=demand / 2, buffered=0, in_flight=int(demand))
    return Snapshot(target, engine), Snapshot(target, gateway)


async def demo_source(
    config: DemoSourceConfig, store: SignalStore, clock: Callable[[], float] = time.time
) -> None:
    """Publish demo signals for every configured deployment every ``interval``.

    A deployment's round is its unit of work, as a Prometheus target's is: whatever it
    raises (the clock, a listener of the store) fails that round alone, counted in
    ``store.errors`` (source ``demo``) and logged once until it changes.
    """
    start = clock()
    while True:
        now = clock()
        for deployment in config.deployments:
            _demo_round(config, store, deployment, now, start)
        await asyncio.sleep(config.interval)


def _demo_round(
    config: DemoSourceConfig, store: SignalStore, deployment: str, now: float, start: float
) -> None:
    """One demo deployment's snapshots, isolated: an exception fails this round only."""
    about = ((config.namespace, deployment, ""), "demo")
    try:
        for snapshot in demo_signals(config.namespace, deployment, now, now - start, config):
            store.update(snapshot)
    except Exception as err:
        store.count_error("demo", "exception")
        store.report(about, f"round failed: {_described(err)}")
        return
    store.report(about, "")


TARGETS_PER_QUERY_SLOT = 100
"""Targets a round queries per ``max-concurrent-queries`` slot: 18 queries each, so 1,600
targets at the default 16 slots are 28,800 queries a round; at 10 ms a query, about 20 s,
within the default 30 s ``max-signal-age``."""


class PrometheusError(Exception):
    """A query round for one target failed: unreachable, an error status, a bad answer."""


async def prometheus_source(
    config: PrometheusSourceConfig,
    store: SignalStore,
    targets: Callable[[], Iterable[TargetKey]],
) -> None:
    """Query every target ``targets()`` names each ``interval``, forever.

    Logged on changes only, per target: a WARNING when its queries start failing, find
    no series or answer impossible values, INFO when signals come back. Each failed
    round is counted (``store.errors``, source ``prometheus``).
    """
    loop = asyncio.get_running_loop()
    problems: dict[TargetKey, str | None] = {}
    timeout = aiohttp.ClientTimeout(total=config.timeout)
    tls: ssl.SSLContext | bool = True
    try:  # the config's validation loaded it once; it may have gone since
        if config.ca_file is not None:
            tls = ca_context(config.ca_file)
    except ConfigError as err:
        log.error("prometheus-source stopped: cannot load ca-file %s: %s", config.ca_file, err)
        return
    connector = aiohttp.TCPConnector(ssl=tls)
    running: dict[TargetKey, asyncio.Task[None]] = {}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # A target's next round starts within an interval of its last one's end; a
        # query holds a slot a timeout at most, and a use three timeouts old fades by e.
        slots = FairSlots(
            config.max_concurrent_queries,
            grace=2 * config.interval,
            memory=3 * config.timeout,
        )
        try:
            while True:
                started = loop.time()
                try:
                    await _round(session, slots, config, store, targets, problems, running)
                except Exception as err:  # targets() or the bookkeeping: try the next round
                    store.count_error("prometheus", "exception")
                    store.report(
                        ("prometheus-source", "prometheus"), f"round failed: {_described(err)}"
                    )
                else:
                    store.report(("prometheus-source", "prometheus"), "")
                await asyncio.sleep(max(0.0, config.interval - (loop.time() - started)))
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)


async def _round(
    session: aiohttp.ClientSession,
    slots: FairSlots,
    config: PrometheusSourceConfig,
    store: SignalStore,
    targets: Callable[[], Iterable[TargetKey]],
    problems: dict[TargetKey, str | None],
    running: dict[TargetKey, asyncio.Task[None]],
) -> None:
    """Start a query of every target not still querying; each one's failure is its own.

    Each target's round is a task of its own (``_target_round``), and a target whose
    last round is still running is skipped: a round that waited for every target let a
    few targets whose queries take the whole timeout stall every other target's signals
    past ``maxSignalAge`` (issue 27, hostile pass 23).

    At most ``TARGETS_PER_QUERY_SLOT`` targets per ``max-concurrent-queries`` (1,600 at
    the default 16), the longest known first (``targets()`` is the registry's order): a
    round of 18 queries a target had no bound, so 10,000 ScaledObjects from anyone who
    can call GetMetricSpec made each round take about a minute and every deployment's
    signals go stale (UNAVAILABLE) between rounds, and names sorting first were queried
    first (issue 27, hostile pass 7, SY-H4). The newest past the bound get no signals
    (UNAVAILABLE, never a guess), counted ``too-many-targets`` and warned of once.
    """
    every = list(dict.fromkeys(targets()))
    room = config.max_concurrent_queries * TARGETS_PER_QUERY_SLOT
    wanted = every[:room]
    over = ""
    if len(every) > room:
        store.count_error("prometheus", "too-many-targets")
        over = (
            f"more targets than a round queries (at most {room:,}: max-concurrent-queries"
            f" x {TARGETS_PER_QUERY_SLOT}); the newest get no signals"
        )
    store.report(("every target", "prometheus-source"), over, f" ({len(every):,} now)")
    try:
        headers: dict[str, str] | str = await _headers(config)
    except PrometheusError as err:
        headers = str(err)
    for target in wanted:
        task = running.get(target)
        if task is None or task.done():
            running[target] = asyncio.create_task(
                _logged_round(session, slots, config, store, headers, target, problems)
            )
    for gone in set(running) - set(wanted):
        running.pop(gone).cancel()  # cancelled, it records nothing
        problems.pop(gone, None)


async def _logged_round(
    session: aiohttp.ClientSession,
    slots: FairSlots,
    config: PrometheusSourceConfig,
    store: SignalStore,
    headers: dict[str, str] | str,
    target: TargetKey,
    problems: dict[TargetKey, str | None],
) -> None:
    """One target's round, its change of problem logged."""
    problem = await _target_round(session, slots, config, store, headers, target)
    _log_change(target, problems.get(target, "new"), problem, config.url)
    problems[target] = problem


async def _target_round(
    session: aiohttp.ClientSession,
    slots: FairSlots,
    config: PrometheusSourceConfig,
    store: SignalStore,
    headers: dict[str, str] | str,
    target: TargetKey,
) -> str | None:
    """One target's round, isolated: its problem (None: signals stored, all possible).

    Any exception fails this target's round alone, never the others' or the loop.
    """
    try:
        outcome = await _query_target(session, slots, config, headers, target)
        if isinstance(outcome, str):
            store.count_error("prometheus", "query")
            return outcome
        signals, impossible, unmeasured = outcome
        for name in unmeasured:  # as the store counts what it unmeasures itself
            store.unmeasured[("prometheus", name)] += 1
        if signals is None:  # no sample to date signals by: nothing stored, they age
            store.count_error("prometheus", "impossible" if impossible else "no-series")
            return (
                f"impossible values, no signals: {'; '.join(impossible)}"
                if impossible
                else NO_SERIES
            )
        if not store.update(Snapshot(target, signals)):
            return "signals refused (see the store's warning)"
    except Exception as err:
        store.count_error("prometheus", "exception")
        return f"round failed: {_described(err)}"
    if impossible:
        return f"impossible values unmeasured: {'; '.join(impossible)}"
    return None


MAX_TOKEN_BYTES = 64 * KiB
"""A bearer token file: a service account's token is about 1 KiB."""


async def _headers(config: PrometheusSourceConfig) -> dict[str, str]:
    """The headers of this round's queries, the bearer token read afresh.

    The token file is read in a worker thread, only when it is a regular file of at
    most ``MAX_TOKEN_BYTES``: ``/dev/zero`` or a FIFO named there would otherwise
    exhaust memory or block the event loop (every RPC) once a round.

    Raises:
        PrometheusError: the token file cannot be read (never its content in the message).
    """
    headers = dict(config.headers)
    if config.bearer_token_file is not None:
        try:
            text = await asyncio.to_thread(
                read_text, config.bearer_token_file, MAX_TOKEN_BYTES, "bearer-token-file"
            )
        except ConfigError as err:
            raise PrometheusError(str(err)) from err
        headers["Authorization"] = f"Bearer {text.strip()}"
    return headers


# What an upstream writes into an error (a request id, a position, a time) changes every
# answer: the part after these is detail, logged, but no change of problem by itself.
_UPSTREAM_TEXT = re.compile(r"(answered \d+|\bfailed|Error): .*", re.DOTALL)
_SERIES_COUNT = re.compile(r"answered \d+ series")


def _problem_class(problem: str | None) -> str | None:
    """The problem less the upstream's own text: what "logged once a change" compares."""
    if problem is None:
        return None
    return _SERIES_COUNT.sub("answered several series", _UPSTREAM_TEXT.sub(r"\1", problem))


def _log_change(target: TargetKey, before: str | None, now: str | None, url: str) -> None:
    if _problem_class(now) == _problem_class(before):
        return
    where = describe_target(target)
    if now is None:
        log.info("querying signals for %s from %s", where, url)
    elif now.startswith("impossible"):
        log.warning("signals for %s from %s: %s", where, url, now)
    else:
        log.warning("no signals for %s from %s: %s", where, url, now)


async def _query_target(
    session: aiohttp.ClientSession,
    slots: FairSlots,
    config: PrometheusSourceConfig,
    headers: dict[str, str] | str,
    target: TargetKey,
) -> tuple[EngineSignals | None, list[str], list[str]] | str:
    """The target's signals, its impossible answers and what they left unmeasured.

    Signals are None without a sample to date them: no series answered, or the signal
    time was impossible. A failed query fails the round. ``headers`` is a string when
    this round cannot query at all: the reason.
    """
    if isinstance(headers, str):
        return headers
    queries = plan(
        target,
        config.effective_queries(),
        config.selector,
        config.model_label,
        config.panic_window,
        config.stable_window,
    )
    results = await asyncio.gather(
        *(_run(session, slots, target, config.url, headers, q) for q in queries),
        return_exceptions=True,
    )
    values: list[float | None] = []
    for result in results:
        if isinstance(result, PrometheusError):
            return str(result)  # the first in plan order: the same reason every round
        if isinstance(result, BaseException):
            raise result
        values.append(result)
    answers = {(q.signal, q.window): value for q, value in zip(queries, values, strict=True)}
    possible, impossible = checked_answers(answers)
    unmeasured = sorted(
        {name for (name, window), value in answers.items()
         if value is not None and possible.get((name, window)) is None}
    )  # fmt: skip
    signals = signals_from_answers(possible, config.panic_window, config.stable_window)
    return signals, impossible, unmeasured


NO_SERIES = "no series match (the replicas are not scraped, or the selector is wrong)"


async def _run(
    session: aiohttp.ClientSession,
    slots: FairSlots,
    target: TargetKey,
    url: str,
    headers: dict[str, str],
    query: Query,
) -> float | None:
    """One instant query's value (None: no series).

    Raises:
        PrometheusError: unreachable, timed out, a 5xx, or an answer that is not one
            number (Prometheus answers a bad query 400 with a JSON error, named here).
    """
    endpoint = url.rstrip("/") + "/api/v1/query"
    status, kind = 0, "no answer"
    async with slots.slot(target):
        try:
            params = {"query": query.promql}
            async with session.get(
                endpoint, params=params, headers=headers, allow_redirects=False
            ) as response:
                status, kind = response.status, response.content_type
                if status in _REDIRECTS:  # see ``_REDIRECTS``: never followed
                    raise PrometheusError(
                        f"{endpoint} answered {status}: a redirect (not followed)"
                    )
                # Prometheus answers a bad query 400/422 in JSON; anything else is not it.
                if status >= 500 or (status >= 400 and kind != "application/json"):
                    head = await _read_at_most(response, 200)
                    text = " ".join(head[:200].decode(errors="replace").split())
                    raise PrometheusError(f"{endpoint} answered {status}: {text}")
                body = await _read_at_most(response, MAX_ANSWER_BYTES)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise PrometheusError(f"{endpoint}: {type(err).__name__}: {err}") from err
    try:
        return parse_answer(body, query.promql)
    except AnswerError as err:
        if "no JSON" in str(err):  # a proxy's page, not the API
            raise PrometheusError(f"{endpoint} answered {status} {kind}, not JSON") from err
        raise PrometheusError(str(err)) from err


_REDIRECTS = frozenset({301, 302, 303, 307, 308})
"""Answers the query API never gives; a query answered so fails its round.

aiohttp followed them: a URL answering ``302`` to another host had that host asked every
query with the configured ``headers`` (a tenant's ``X-Scope-OrgID``, an API key; only
``Authorization`` is dropped across hosts), and its answers stored as the deployment's
signals, read by the decision as Prometheus's (issue 27, hostile pass 8, SU-1)."""


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or its first chunks once past ``limit`` bytes (never read further)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)
