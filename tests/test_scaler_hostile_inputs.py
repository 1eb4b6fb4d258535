"""Nothing a signal source answers can stop a scaler loop, freeze its signals or zero its load.

Issue 27, the scaler's side: each class of hostile input at the place it enters.

1. A loop dies on an exception nobody expected: one target's Prometheus round, one
   watched message, one ScaledObject's decision fail alone, counted and logged once;
   a loop that ends anyway fails the scaler's gRPC health.
2. Time from outside is trusted: a snapshot dated beyond ``MAX_CLOCK_SKEW`` ahead, or at
   no finite time, is refused by the store and cannot make later ones look older.
3. Impossible values are taken as facts: a negative or non-finite value, or 0 replicas
   beside running requests, is unmeasured, never the zero load that scales to zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable
from typing import Any, Self

import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundation.errors import NoDataError
from foundation.signals import (
    MAX_REQUESTS,
    EngineSignals,
    GatewaySignals,
    Snapshot,
    TargetKey,
    WindowSignals,
    checked,
)
from foundation.signals_wire import encode
from protos.externalscaler import externalscaler_pb2 as keda
from scaler import sources
from scaler.config import PrometheusSourceConfig, SignalSourceConfig, parse_config
from scaler.core import DecisionState, Policy, decide
from scaler.promql import (
    INSTANT,
    MAX_ANSWER_BYTES,
    PANIC,
    WINDOWED,
    AnswerError,
    answer_value,
    checked_answers,
    parse_answer,
    signals_from_answers,
)
from scaler.registry import ScaledObjectRegistry
from scaler.server import ScalerServer
from scaler.signals import MAX_CLOCK_SKEW, SignalStore, TargetSignals, observe
from scaler.sources import prometheus_source, receive, watch_signals
from tests.conftest import T0, FakeClock, engine_signals, gateway_signals, ref
from tests.test_signal_sources import start_publisher, wait_for

GOOD: TargetKey = ("team-a", "good", "")
BAD: TargetKey = ("team-a", "bad", "")
SAMPLE_TIME = 1_700_000_000.0  # a time in the past: never refused as from the future


def vector(value: object) -> dict[str, Any]:
    """A Prometheus instant-vector answer of one sample whose value is ``value``."""
    return {"status": "success", "data": {"resultType": "vector", "result": [value]}}


def sample(value: object) -> dict[str, Any]:
    return {"metric": {}, "value": [SAMPLE_TIME, value]}


NESTED = b'{"status": "success", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


# --- class 1: the parser never raises anything but AnswerError --------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(10**300, 10**400)
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from(["+Inf", "-Inf", "NaN", "1e999", "-1", "1.5"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["status", "data", "resultType", "result", "value", "metric", "error"])
            | st.text(max_size=5),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)
answer_shaped = st.builds(
    lambda value, kind: {"status": "success", "data": {"resultType": kind, "result": value}},
    json_values,
    st.sampled_from(["vector", "scalar", "matrix"]),
) | st.builds(lambda v: vector({"metric": {}, "value": v}), json_values)


@settings(max_examples=200, deadline=None)
@given(body=json_values | answer_shaped)
def test_any_json_answer_is_one_finite_value_none_or_an_answer_error(body):
    try:
        value = answer_value(body, "q")
    except AnswerError:
        return
    assert value is None or math.isfinite(value)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_are_one_finite_value_none_or_an_answer_error(body):
    try:
        value = parse_answer(body, "q")
    except AnswerError:
        return
    assert value is None or math.isfinite(value)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(json.dumps(vector({"metric": {}, "value": {}})).encode(),
                     id="a sample whose value is an object (was KeyError)"),
        pytest.param(json.dumps(vector(sample(10**400))).encode(),
                     id="an integer too large for a float (was OverflowError)"),
        pytest.param(NESTED, id="JSON nested 100000 deep (was RecursionError)"),
        pytest.param(b"[" * 5_000_000, id="a body over the size bound is not read as JSON"),
        pytest.param(b"\xff\xfe not utf-8", id="bytes that are no text"),
    ],
)  # fmt: skip
def test_a_hostile_answer_is_an_answer_error_naming_the_query(body):
    with pytest.raises(AnswerError, match="query 'q'"):
        parse_answer(body, "q")


def test_an_unaggregated_answer_is_refused_unparsed_by_its_size():
    """3,000 series of a query left unaggregated (146 KB; 1 MiB took 28 ms of the
    source's event loop a query) are refused by the bound, before any JSON is read
    (issue 27, hostile pass 35)."""
    series = [{"metric": {"pod": f"p{i}"}, "value": [SAMPLE_TIME, "1"]} for i in range(3_000)]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": series}})
    with pytest.raises(AnswerError, match=f"answered over {MAX_ANSWER_BYTES} bytes"):
        parse_answer(body.encode(), "q")


# --- class 1: the Prometheus loop isolates each target's round --------------------------


class HostilePrometheus:
    """Answers the good target's queries with 12 at a past time, the bad one's as told."""

    def __init__(self) -> None:
        self.bad_body: bytes | None = None
        """What the bad target's queries get; None: the good answer too."""
        self.bad_answers = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _query(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        if "timestamp(" in query:  # every target's signals are dated, in the past
            return web.json_response(vector(sample(str(SAMPLE_TIME))))
        if "engine_sleep_state" in query:  # none asleep: all asleep beside running is none
            return web.json_response(vector(sample("0")))
        if 'pod=~"bad-' in query and self.bad_body is not None:
            self.bad_answers += 1
            return web.Response(body=self.bad_body, content_type="application/json")
        return web.json_response(vector(sample("12")))


def prometheus_config(url: str) -> PrometheusSourceConfig:
    return PrometheusSourceConfig.model_validate(
        {"url": url, "interval": "20ms", "timeout": "10s", "panic-window": "2s",
         "stable-window": "4s"}
    )  # fmt: skip


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for ``predicate``: a cap against hangs, not a timing assertion."""
    deadline = asyncio.get_running_loop().time() + 30
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within 30s"
        await asyncio.sleep(0.01)


def engine(store: SignalStore, target: TargetKey) -> EngineSignals | None:
    signals = store.get(target)
    return signals.engine if signals is not None else None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(json.dumps(vector({"metric": {}, "value": {}})).encode(), "query",
                     id="a sample value that is an object fails that target's round only"),
        pytest.param(json.dumps(vector(sample(10**400))).encode(), "query",
                     id="an integer too large for a float fails that target's round only"),
        pytest.param(NESTED, "query",
                     id="deeply nested JSON fails that target's round only"),
    ],
)  # fmt: skip
async def test_a_hostile_answer_fails_its_targets_round_and_the_loop_goes_on(body, reason, caplog):
    caplog.set_level(logging.INFO, logger="scaler.sources")
    server = await HostilePrometheus().start()
    server.bad_body = body
    store = SignalStore()
    task = asyncio.create_task(
        prometheus_source(prometheus_config(server.url), store, lambda: [GOOD, BAD])
    )
    try:
        await until(lambda: store.errors[("prometheus", reason)] >= 3, "three bad rounds")
        assert not task.done()
        assert engine(store, BAD) is None  # its signals age: KEDA gets UNAVAILABLE
        good = engine(store, GOOD)
        assert good is not None and good.running == 12.0
        server.bad_body = None  # the bad target recovers
        await until(lambda: engine(store, BAD) is not None, "the bad target's signals")
    finally:
        await drain(task)
        await server.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "team-a/bad" in w]) == 1, warnings
    assert not [w for w in warnings if "team-a/good" in w]


async def drain(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class SurpriseError(Exception):
    """An exception class no code expects."""


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(KeyError("value"), id="KeyError in one target's round"),
        pytest.param(OverflowError("int too large"), id="OverflowError in one target's round"),
        pytest.param(RecursionError("too deep"), id="RecursionError in one target's round"),
        pytest.param(ZeroDivisionError("x / 0"), id="ZeroDivisionError in one target's round"),
        pytest.param(SurpriseError("nobody expects it"), id="an unknown exception class"),
    ],
)
async def test_any_exception_in_one_targets_round_fails_that_round_only(error, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="scaler.sources")
    server = await HostilePrometheus().start()
    armed = True
    real = sources._query_target

    async def flaky(session, limit, config, headers, target):
        if target == BAD and armed:
            raise error
        return await real(session, limit, config, headers, target)

    monkeypatch.setattr(sources, "_query_target", flaky)
    store = SignalStore()
    task = asyncio.create_task(
        prometheus_source(prometheus_config(server.url), store, lambda: [GOOD, BAD])
    )
    try:
        await until(lambda: store.errors[("prometheus", "exception")] >= 3, "three failed rounds")
        assert engine(store, GOOD) is not None and engine(store, BAD) is None
        armed = False
        await until(lambda: engine(store, BAD) is not None, "the target recovers")
        assert not task.done()
    finally:
        await drain(task)
        await server.stop()
    bad = [
        r for r in caplog.records if r.levelno == logging.WARNING and "team-a/bad" in r.getMessage()
    ]
    assert len(bad) == 1 and type(error).__name__ in bad[0].getMessage()


async def test_an_infinite_rate_never_reaches_decide_and_the_loop_goes_on():
    server = await HostilePrometheus().start()
    server.bad_body = json.dumps(vector(sample("+Inf"))).encode()
    clock = FakeClock(SAMPLE_TIME + 1)  # the answers' time: fresh signals, decided on
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    scaled = registry.resolve("bad", "team-a", dict(ref("bad").scalerMetadata))
    task = asyncio.create_task(
        prometheus_source(prometheus_config(server.url), store, registry.targets)
    )
    try:
        # Every query but the time answers +Inf: rounds of it, each decided on.
        await until(lambda: server.bad_answers >= 5 * len(WINDOWED), "rounds of +Inf")
        assert not task.done() and scaled.decision_errors == 0
        stored = engine(store, BAD)
        assert stored is not None and stored.running is None
        assert stored.stable.generation_token_rate is None
        with pytest.raises(NoDataError, match="neither engine nor gateway load"):
            registry.current(scaled)  # unmeasured: KEDA gets UNAVAILABLE, not a crash
    finally:
        await drain(task)
        await server.stop()


# --- class 1: a watch isolates each message; the registry each ScaledObject -------------


async def test_a_message_that_raises_while_stored_is_refused_and_the_watch_goes_on(caplog):
    caplog.set_level(logging.INFO)
    server, publisher, port = await start_publisher()
    store = SignalStore(FakeClock())
    failures = iter([SurpriseError("a listener's bug")])

    def listener(key: TargetKey) -> None:
        error = next(failures, None)
        if error is not None:
            raise error

    store.add_listener(listener)
    config = SignalSourceConfig(address=f"127.0.0.1:{port}", reconnect_min=5.0, reconnect_max=5.0)
    task = asyncio.create_task(watch_signals(config, store))
    try:
        await publisher.queue.put(engine_signals(running=1.0, at=T0))
        await publisher.queue.put(engine_signals(running=2.0, at=T0 + 1))
        llama = ("team-a", "llama", "")
        await wait_for(store, lambda: getattr(engine(store, llama), "running", 0) == 2.0, within=30)
        assert not task.done()
    finally:
        await drain(task)
        await server.stop(grace=0)
    assert store.errors[("watch", "exception")] == 1
    assert [r for r in caplog.records if "SurpriseError" in r.getMessage()]
    # Not a reconnect: the stream went on (a reconnect would wait reconnect_min, 5 s).
    assert not [r for r in caplog.records if "reconnecting" in r.getMessage()]


def test_one_scaled_objects_failing_decision_is_its_own_and_recovers():
    clock = FakeClock()
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    first = registry.resolve("first", "team-a", {**ref().scalerMetadata})
    second = registry.resolve("second", "team-a", {**ref().scalerMetadata})
    broken = {first.key}

    def hook(scaled, decision, now):
        if scaled.key in broken:
            raise SurpriseError("a hook's bug")
        return decision

    registry.add_decision_hook(hook)
    assert receive(store, engine_signals(running=32.0, at=T0))  # no exception escapes
    assert registry.current(second).desired_replicas == 2
    with pytest.raises(NoDataError, match="SurpriseError"):
        registry.current(first)  # KEDA: UNAVAILABLE, its fallback applies
    assert first.decision_errors >= 1
    broken.clear()
    clock.now += 1
    assert registry.current(first).desired_replicas == 2  # looked at again on the next call


async def test_a_loop_that_stops_anyway_fails_the_scalers_health(monkeypatch, caplog):
    async def dies(*args: object) -> None:
        raise SurpriseError("a loop's bug")

    monkeypatch.setattr("scaler.server.prometheus_source", dies)
    config = parse_config("prometheus-source: {url: 'http://127.0.0.1:9'}\n")
    server = ScalerServer(config)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
            async with asyncio.timeout(30):
                while (await watch.read()).status != health_pb2.HealthCheckResponse.NOT_SERVING:
                    pass
        assert "SurpriseError" in (server.problem() or "")
    finally:
        await server.stop(grace=0)
    assert [
        r
        for r in caplog.records
        if r.levelno == logging.CRITICAL and "prometheus" in r.getMessage()
    ]


# --- class 2: time from outside ---------------------------------------------------------


def gateway_at(at: float, in_flight: int = 0) -> Snapshot:
    return Snapshot(GOOD, GatewaySignals(at, 1.0, 0, in_flight))


@pytest.mark.parametrize(
    ("at", "kept", "reason"),
    [
        pytest.param(T0 + 86_400, False, "future", id="a snapshot a day ahead is refused"),
        pytest.param(T0 + MAX_CLOCK_SKEW + 1, False, "future",
                     id="a snapshot just past the clock skew is refused"),
        pytest.param(T0 + MAX_CLOCK_SKEW, True, None,
                     id="a snapshot within the clock skew is kept"),
        pytest.param(math.inf, False, "time-not-finite", id="a snapshot at +Inf is refused"),
        pytest.param(math.nan, False, "time-not-finite", id="a snapshot at NaN is refused"),
        pytest.param(-math.inf, False, "time-not-finite", id="a snapshot at -Inf is refused"),
        pytest.param(T0 - 3600, True, None, id="an old snapshot is kept (it is only stale)"),
    ],
)  # fmt: skip
def test_the_store_refuses_a_snapshot_from_the_future(at, kept, reason):
    store = SignalStore(FakeClock(T0))
    assert store.update(gateway_at(at)) is kept
    if reason is not None:
        assert store.refused[("gateway", reason)] == 1 and store.get(GOOD) is None


def test_a_refused_future_snapshot_cannot_make_later_ones_look_older(caplog):
    caplog.set_level(logging.WARNING, logger="scaler.signals")
    clock = FakeClock(T0)
    store = SignalStore(clock)
    for step in range(5):
        assert not store.update(gateway_at(T0 + 86_400 + step, in_flight=0))
    for step in range(3):
        clock.now = T0 + step
        assert store.update(gateway_at(clock.now, in_flight=40))
    signals = store.get(GOOD)
    assert signals is not None and signals.gateway is not None
    assert signals.gateway.in_flight == 40
    warnings = [r for r in caplog.records if r.name == "scaler.signals"]
    assert len(warnings) == 1  # one warning for five refusals in a row


async def test_a_future_round_does_not_freeze_what_keda_is_told(scaler, clock, stub):
    # A day ahead and idle: stored, it made every real round look older while it still
    # counted as fresh (GetMetrics 0 and IsActive false under heavy load, for a day).
    assert not receive(scaler.store, engine_signals(queue=0.0, running=0.0, at=T0 + 86_400))
    assert receive(scaler.store, engine_signals(queue=0.0, running=64.0, at=T0))
    request = keda.GetMetricsRequest(scaledObjectRef=ref(), metricName="unitscale-desired-replicas")
    response = await stub.GetMetrics(request)
    assert response.metricValues[0].metricValueFloat == 4
    assert (await stub.IsActive(ref())).result


def test_a_wire_time_far_in_the_future_is_refused():
    store = SignalStore(FakeClock(T0))
    message = engine_signals(running=1.0)
    message.observed_time.seconds = 253_402_300_799  # 9999-12-31, the Timestamp maximum
    assert not receive(store, message)
    assert store.refused[("exporter", "future")] == 1


# --- class 3: impossible values are unmeasured, never no load ---------------------------


@pytest.mark.parametrize(
    ("scraped", "up", "kept"),
    [
        pytest.param(4, 4, True, id="four replicas all up are kept"),
        pytest.param(4, 2, True, id="two of four up are kept (partial)"),
        pytest.param(
            4_294_967_295, 4_294_967_295, False, id="uint32 max replicas are no deployment's"
        ),
        pytest.param(10_001, 10_001, False, id="one past max replicas is refused"),
        pytest.param(0, 4_294_967_295, False, id="uint32 max up beside 0 known is refused"),
        pytest.param(2, 50, False, id="more replicas up than known is refused"),
    ],
)
def test_a_snapshot_whose_replica_counts_are_impossible_is_refused(scraped, up, kept):
    """The counts frame every sum in the snapshot: impossible ones make none of it a fact."""
    store = SignalStore(FakeClock(T0))
    registry = ScaledObjectRegistry(store, 30.0, FakeClock(T0))
    scaled = registry.resolve("llama", "team-a", {**ref().scalerMetadata})
    message = engine_signals(running=8.0, queue=0.0)
    message.engine.replicas_scraped, message.engine.replicas_up = scraped, up
    assert receive(store, message) is kept
    if kept:
        assert registry.current(scaled).current_replicas == scraped
    else:
        assert store.refused[("exporter", "replicas")] == 1
        with pytest.raises(NoDataError):  # KEDA: UNAVAILABLE, never maxReplicas nor a count
            registry.current(scaled)


def answers(**values: float | None) -> dict[tuple[str, str | None], float | None]:
    result: dict[tuple[str, str | None], float | None] = dict.fromkeys(
        [(n, None) for n in INSTANT]
        + [(n, "stable") for n in WINDOWED]
        + [(n, "panic") for n in PANIC]
    )
    result[("signal-time", None)] = SAMPLE_TIME
    for key, value in values.items():
        name, _, window = key.replace("_", "-").partition("--")
        result[(name, window or None)] = value
    return result


@pytest.mark.parametrize(
    ("given_answers", "running", "problem"),
    [
        pytest.param(answers(replicas=-3, replicas_up=-3, running=20), 20.0, "replicas is negative",
                     id="replicas -3 beside 20 running is unmeasured; the 20 stand"),
        pytest.param(answers(replicas=0, replicas_up=0, running=20), 20.0, "replicas is 0 beside",
                     id="replicas 0 beside 20 running contradicts them; the 20 stand"),
        pytest.param(answers(replicas=0, queue_depth=5), None, "replicas is 0 beside",
                     id="replicas 0 beside a queue contradicts it"),
        pytest.param(answers(replicas=2, running=-4), None, "running is negative",
                     id="a negative running count is unmeasured, not zero"),
        pytest.param(answers(replicas=2, running=3, generation_token_rate__stable=-1.0), 3.0,
                     "generation-token-rate (stable) is negative",
                     id="a negative rate is unmeasured"),
        pytest.param(answers(replicas=2, running=math.inf), None, "running is not finite",
                     id="an infinite gauge is unmeasured"),
        pytest.param(answers(replicas=0, replicas_up=0), 0.0, None,
                     id="zero replicas and no load at all is still the fact of no load"),
    ],
)  # fmt: skip
def test_impossible_answers_are_unmeasured_with_a_reason(given_answers, running, problem):
    _, problems = checked_answers(given_answers)
    assert (problem is None) == (not problems)
    if problem is not None:
        assert any(problem in p for p in problems), problems
    signals = signals_from_answers(given_answers, 2.0, 4.0)
    assert signals is not None and signals.running == running


finite_or_not = st.none() | st.floats() | st.sampled_from([math.inf, -math.inf, math.nan, -3.0])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.fixed_dictionaries({}, optional={
    key: finite_or_not for key in answers() if key != ("signal-time", None)}),
    running=st.floats(0.5, 1e4))  # fmt: skip
def test_no_answer_zeroes_running_requests_or_reaches_decide_unfinite(values, running):
    given_answers = {**answers(), **values, ("running", None): running}
    signals = signals_from_answers(given_answers, 2.0, 4.0)
    assert signals is not None and signals.running == running  # never read as no load
    # As the store keeps them: a queue of 2e156 is past ``MAX_REQUESTS``, unmeasured there.
    kept, _ = checked(signals)
    assert isinstance(kept, EngineSignals)
    observation, _ = observe(GOOD, TargetSignals(1, kept), SAMPLE_TIME + 1, 30.0)
    for name in observation.__dataclass_fields__:
        value = getattr(observation, name)
        if isinstance(value, float):
            assert math.isfinite(value) and value >= 0, (name, value)
    if observation.replicas_uncounted:
        # No count on a first look: no decision, never one that could be a scale-down.
        with pytest.raises(NoDataError, match="replica count is unknown"):
            decide(observation, Policy(), DecisionState())
        return
    decision = decide(observation, Policy(), DecisionState())  # nothing else raises
    assert decision.desired_replicas >= 1


def test_impossible_replicas_never_scale_a_loaded_deployment_to_zero():
    clock = FakeClock(SAMPLE_TIME)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    scaled = registry.resolve("good", "team-a", {**ref("good").scalerMetadata})
    for step in range(0, 600, 10):  # ten minutes: five idle graces
        clock.now = SAMPLE_TIME + step
        replicas = 2.0 if step == 0 else -3.0 if step % 20 else 0.0  # counted once
        signals = signals_from_answers(
            answers(signal_time=clock.now, replicas=replicas, replicas_up=replicas, running=20),
            2.0, 4.0,
        )  # fmt: skip
        assert signals is not None and store.update(Snapshot(GOOD, signals))
        decision = registry.current(scaled)
        assert decision.desired_replicas >= 2 and decision.active, decision.reason


ENGINE_DOUBLES = ("queue_depth", "requests_running", "kv_cache_usage")


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(ENGINE_DOUBLES), value=st.floats())
def test_any_float_in_an_engine_field_is_kept_finite_and_non_negative_or_unmeasured(field, value):
    store = SignalStore(FakeClock())
    message = engine_signals(running=1.0)
    setattr(message.engine, field, value)
    assert receive(store, message)
    stored = engine(store, ("team-a", "llama", ""))
    assert stored is not None
    got = {"queue_depth": stored.queue_depth, "requests_running": stored.running,
           "kv_cache_usage": stored.kv_usage}[field]  # fmt: skip
    bound = MAX_REQUESTS if field != "kv_cache_usage" else math.inf
    if math.isfinite(value) and 0 <= value <= bound:
        assert got == value
    else:
        assert got is None
        assert sum(store.unmeasured.values()) == 1


def test_an_impossible_engine_value_is_logged_once_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="scaler.signals")
    clock = FakeClock()
    store = SignalStore(clock)
    for step, running in enumerate([-3.0, -4.0, -5.0, 6.0]):
        clock.now = T0 + step
        assert receive(store, engine_signals(running=running, queue=0.0, at=clock.now))
    assert store.unmeasured[("exporter", "running")] == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "running" in warnings[0], warnings
    assert any("usable again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "window",
    [
        pytest.param(WindowSignals(60.0, request_rate=-1.0), id="a negative window rate"),
        pytest.param(WindowSignals(60.0, prompt_token_rate=math.inf), id="an infinite rate"),
        pytest.param(WindowSignals(60.0, running_mean=math.nan), id="a NaN mean"),
    ],
)
def test_impossible_window_values_from_the_wire_are_unmeasured(window):
    store = SignalStore(FakeClock())
    signals = EngineSignals(T0, 1, 1, 0.0, 1.0, None, window, window, None, None, False, False)
    assert receive(store, encode(Snapshot(GOOD, signals)))
    stored = engine(store, GOOD)
    assert stored is not None
    assert stored.stable == stored.panic == WindowSignals(60.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("arrival_rate", -1.0, id="a negative arrival rate refuses the message"),
        pytest.param("arrival_rate", math.nan, id="a NaN arrival rate refuses the message"),
        pytest.param("upstream_error_rate", math.inf, id="an infinite error rate refuses it"),
    ],
)
def test_a_gateway_rate_out_of_range_is_refused_and_counted(field, value):
    store = SignalStore(FakeClock())
    message = gateway_signals(arrival_rate=1.0)
    setattr(message.gateway, field, value)
    assert not receive(store, message)
    assert store.refused[("wire", "undecodable")] == 1 and store.keys() == []
