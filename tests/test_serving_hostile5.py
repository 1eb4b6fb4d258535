"""The serving side under hostile input (issue 27's fifth hostile pass, findings V-1..V-9).

Each test injects what one finding found, at the boundary where it enters: replicas that
fail fast without a 5xx, requests that make healthy replicas answer 500, a sick replica
awake beside a healthy sleeper, vLLM's empty answer to a wake, durations with no ceiling,
a sleep that holds for one read, one model's load beside another's, a discovery naming
thousands of replicas, a stream with no token bound. Real servers on 127.0.0.1 port 0;
the times that matter are the gateway's own deadlines or passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from foundation.errors import ConfigError
from foundation.signals import GatewaySignals
from serving import gateway as gateway_module
from serving import gateway_replicas
from serving.config import MAX_REPLICAS, parse_config
from serving.gateway import EJECT_AFTER, Gateway
from serving.gateway_replicas import ReplicaPool
from serving.gateway_settings import GatewaySettings
from serving.gateway_signals import TrafficStats, gateway_signals
from serving.gateway_standby import Plan
from serving.replica_answers import MAX_CONTEXT_TOKENS, read_model_list, read_wake
from serving.routing import Backoff, ReplicaView, choose, choose_wakes
from serving.slo import ResponseMeter
from tests.conftest import eventually, streaming_forever
from tests.test_gateway_faults import Behaviour, Fake, upstream_errors
from tests.test_gateway_isolation import StandIn, gateway_for
from tests.test_gateway_standby import PlanFrom

LABELS = ("a", "llama")
ASLEEP = b'{"is_sleeping": true}'
AWAKE = b'{"is_sleeping": false}'
COMPLETION = {"model": "sim-llama", "prompt": "x"}


def counter(gateway: Any, metric: str, *labels: str) -> float:
    """A counter of the gateway's metrics, by its attribute on ``GatewayMetrics``."""
    return getattr(gateway.gateway.metrics, metric).labels(*LABELS, *labels)._value.get()


async def post(gateway: Any, body: dict[str, Any]) -> tuple[int | str, str]:
    """A completion through the gateway: its status (or the client error) and its text."""
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    try:
        async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
            return r.status, await r.text()
    except aiohttp.ClientError as err:
        return type(err).__name__, ""


@contextlib.asynccontextmanager
async def fakes(*behaviours: Behaviour) -> AsyncIterator[list[Fake]]:
    started = [await Fake(b).start() for b in behaviours]
    try:
        yield started
    finally:
        for fake in started:
            await fake.stop()


# --- V-1: a replica that fails fast without a 5xx is ejected as one that answers 500 ------


async def answers(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.json_response({"choices": [{"text": "ok"}]})


async def closes_after_its_headers(request: web.Request, fake: Fake) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Length": "100"})
    await response.prepare(request)
    await response.write(b'{"id"')
    assert request.transport is not None
    request.transport.close()
    return response


async def answers_no_http(request: web.Request, fake: Fake) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.write(b"NOT HTTP AT ALL\r\n\r\n")
    request.transport.close()
    return web.Response()


async def streams_an_error(request: web.Request, fake: Fake) -> web.StreamResponse:
    """vLLM's streamed error: a 200, one error event, [DONE]."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(
        b'data: {"error": {"message": "EngineCore encountered an issue", "code": 500}}\n\n'
        b"data: [DONE]\n\n"
    )
    return response


@pytest.mark.usefixtures("no_failure_weight")
@pytest.mark.parametrize(
    ("behaviour", "kind"),
    [
        pytest.param(
            closes_after_its_headers,
            "mid-response",
            id="one that closes every answer after its headers is ejected after a few",
        ),
        pytest.param(
            answers_no_http,
            "before-response",
            id="one that answers bytes that are no HTTP is ejected after a few",
        ),
        pytest.param(
            streams_an_error,
            "stream-error",
            id="one that streams an error event in a 200 is counted and ejected after a few",
        ),
    ],
)
async def test_a_replica_failing_fast_without_a_5xx_is_ejected_after_a_few(
    behaviour: Behaviour, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)  # however slow the machine
    # The sick one is listed first: ties of least-outstanding go to it.
    async with fakes(behaviour, answers) as (sick, well):
        async with gateway_for([sick.url, well.url]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            body = COMPLETION | {"stream": behaviour is streams_an_error}
            for _ in range(20):
                await post(gateway, body)
            # Before: all 20 went to the sick one (~98% of a steady load in the repro).
            assert (sick.received, well.received) == (EJECT_AFTER, 20 - EJECT_AFTER)
            assert upstream_errors(gateway).get(kind) == EJECT_AFTER


def test_a_stream_answered_whole_is_no_failure() -> None:
    meter = ResponseMeter(0.0)
    meter.begin(200, True)
    meter.feed(b'data: {"choices": [{"text": "error"}]}\n\ndata: [DONE]\n\n', 1.0)
    assert not meter.stream_error  # the word in a token is no error event
    meter.feed(b'data: {"object": "error", "message": "x"}\n\n', 2.0)
    assert meter.stream_error


# --- V-2: at most half the replicas serving a model are passed over -------------------------


def views(*flags: tuple[bool, int]) -> list[ReplicaView]:
    """Ready replicas r0, r1, ...: (ejected, outstanding) each."""
    return [
        ReplicaView(f"r{i}", True, load, frozenset(), ejected=ejected)
        for i, (ejected, load) in enumerate(flags)
    ]


@pytest.mark.parametrize(
    ("replicas", "chosen"),
    [
        pytest.param(
            views((True, 0), (True, 0), (True, 0), (False, 9)),
            "r2",
            id="three of four ejected: two are passed over, not three (all on one)",
        ),
        pytest.param(
            views((True, 0), (False, 9)),
            "r1",
            id="one of two ejected is passed over (the sick one beside a well one)",
        ),
        pytest.param(
            views(
                (True, 0),
            ),
            "r0",
            id="the only one serves, ejected or not",
        ),
    ],
)
def test_at_most_half_the_ready_replicas_are_passed_over(
    replicas: list[ReplicaView], chosen: str
) -> None:
    assert choose(replicas, "m") == chosen


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), min_size=1, max_size=12))
def test_no_more_than_half_are_ever_routed_nothing(flags: list[tuple[bool, int]]) -> None:
    reached: set[str] = set()
    for _ in flags:  # those chosen fill up: the next pick is another, while one is left
        loaded = [
            ReplicaView(url, True, load + 1000 * (url in reached), frozenset(), ejected=ejected)
            for url, (ejected, load) in ((f"r{i}", f) for i, f in enumerate(flags))
        ]
        url = choose(loaded, "m")
        assert url is not None
        reached.add(url)
    assert len(flags) - len(reached) <= len(flags) // 2


async def test_requests_that_make_replicas_fail_eject_at_most_half_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)

    async def poisoned(request: web.Request, fake: Fake) -> web.StreamResponse:
        if (await request.json()).get("prompt") == "poison":
            return web.json_response({"message": "Internal Server Error"}, status=500)
        return web.json_response({"choices": [{"text": "ok"}]})

    async with fakes(*[poisoned] * 4) as replicas:
        async with gateway_for([r.url for r in replicas]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "all ready")
            for _ in range(3 * EJECT_AFTER):
                assert (await post(gateway, COMPLETION | {"prompt": "poison"}))[0] == 500
            before = [r.received for r in replicas]
            got = await asyncio.gather(*(post(gateway, COMPLETION) for _ in range(40)))
            assert {status for status, _ in got} == {200}
            served = [r.received - b for r, b in zip(replicas, before, strict=True)]
            # Before: [0, 0, 0, 40], every request on the one not ejected.
            assert sum(n > 0 for n in served) >= 2


# --- V-3: a sick replica awake does not keep a healthy sleeper asleep ---------------------


def test_an_ejected_replica_is_no_reason_to_leave_a_sleeper_asleep() -> None:
    sick = ReplicaView("sick", True, 0, frozenset({"m"}), ejected=True)
    sleeper = ReplicaView("sleeper", False, 0, frozenset({"m"}), sleeping=True)
    assert choose_wakes([sick, sleeper], "m") == ("sleeper",)
    well = ReplicaView("well", True, 0, frozenset({"m"}))
    assert choose_wakes([sick, well, sleeper], "m") == ()


async def test_a_sick_replica_awake_beside_a_sleeper_wakes_it_and_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)

    async def fails_at_once(request: web.Request, fake: Fake) -> web.StreamResponse:
        return web.json_response({"message": "EngineCore encountered an issue"}, status=500)

    sleeper = StandIn(**{"/is_sleeping": ASLEEP})
    async with fakes(fails_at_once) as (sick,), sleeper.serving():
        async with gateway_for([sick.url, sleeper.url]) as gateway:
            g = gateway.gateway
            await eventually(
                lambda: g.replicas[0].routable and g.replicas[1].wakeable, "one up, one asleep"
            )
            # The last one finds the sick one ejected: it still serves (500), and wakes.
            tries = EJECT_AFTER + 1
            statuses = [(await post(gateway, COMPLETION))[0] for _ in range(tries)]
            assert statuses == [500] * tries
            # Before: every request 500 for good, the sleeper never woken.
            await eventually(lambda: sleeper.calls.get("/wake_up") == 1, "the sleeper woken")
            await eventually(lambda: g.replicas[1].routable, "the woken one routable")
            assert (await post(gateway, COMPLETION))[0] == 200


# --- V-4: vLLM's empty answer to a wake -----------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="an empty 200 (vLLM before its JSON answer) reads as awake"),
        pytest.param(b"\r\n ", id="whitespace alone reads as awake"),
    ],
)
def test_an_empty_wake_answer_is_awake_to_be_confirmed(body: bytes) -> None:
    assert read_wake(body) == "awake"


class WakesSilently(StandIn):
    """Asleep; its ``/wake_up`` wakes it and answers an empty 200, as vLLM before 0.1x."""

    def __init__(self) -> None:
        super().__init__(**{"/is_sleeping": ASLEEP, "/wake_up": b""})

    async def _answer(self, request: web.Request) -> web.Response:
        if request.path == "/wake_up":
            self.answers["/is_sleeping"] = AWAKE
        return await super()._answer(request)


async def test_a_wake_answered_by_an_empty_200_is_woken_not_backed_off() -> None:
    async with WakesSilently().serving() as replica:
        async with gateway_for([replica.url], wake_retry_after=3600.0) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].wakeable, "asleep")
            status, text = await post(gateway, COMPLETION)
            assert status == 200, text
            assert counter(gateway, "_wakes", "woken") == 1
            assert counter(gateway, "_wakes", "failed") == 0  # before: failed, backed off
            assert g.replicas[0].wake_backoff.allows(time.monotonic())


# --- V-5: durations with a ceiling ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(
            "rate-window: 1000h",
            "rate-window",
            id="a 1000 h rate window (10 req/s published as 0.00017) is refused naming the key",
        ),
        pytest.param(
            "health-interval: 2m",
            "health-interval",
            id="a health interval past a minute (a replica marked down stays down) is refused",
        ),
        pytest.param("standby-interval: 1000h", "standby-interval", id="standby-interval"),
        pytest.param("wake-retry-after: 2562047h", "wake-retry-after", id="wake-retry-after"),
        pytest.param("buffer-timeout: 1000h", "buffer-timeout", id="buffer-timeout"),
        pytest.param("upstream-timeout: 1000h", "upstream-timeout", id="upstream-timeout"),
        pytest.param("wake-timeout: 1000h", "wake-timeout", id="wake-timeout"),
        pytest.param("body-timeout: 1000h", "body-timeout", id="body-timeout"),
        pytest.param("sleep-after-idle: 25h", "sleep-after-idle", id="sleep-after-idle past a day"),
    ],
)
def test_a_duration_past_its_ceiling_is_refused_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_config(text, "cfg")


@given(st.integers(1, 3600))
def test_a_rate_window_within_its_ceiling_publishes_the_rate_it_saw(seconds: int) -> None:
    settings = parse_config(f"rate-window: {seconds}s", "cfg").settings()
    stats = TrafficStats()
    for i in range(seconds):  # one request a second for the whole window
        stats.arrivals.add(1000.0 + i, settings.rate_window)
    signals = gateway_signals(stats, settings, 0.0, 1000.0 + seconds - 1).signals
    assert isinstance(signals, GatewaySignals)
    assert signals.arrival_rate == pytest.approx(1.0, rel=0.01)


# --- V-6: a sleep that holds for one read, then wakes by itself --------------------------


class SleepsOnce(StandIn):
    """Its sleep answers 200; the first /is_sleeping after it says asleep, later ones awake."""

    def __init__(self) -> None:
        super().__init__()
        self.reads_since_sleep: int | None = None

    async def _answer(self, request: web.Request) -> web.Response:
        if request.path == "/sleep":
            self.reads_since_sleep = 0
        elif request.path == "/is_sleeping" and self.reads_since_sleep is not None:
            self.reads_since_sleep += 1
            self.answers["/is_sleeping"] = ASLEEP if self.reads_since_sleep == 1 else AWAKE
        return await super()._answer(request)


async def test_a_sleep_that_wakes_by_itself_soon_after_is_a_relapse_backed_off() -> None:
    replica = SleepsOnce()
    settings = {"sleep_after_idle": 0.0, "wake_retry_after": 3600.0}
    async with replica.serving(), gateway_for([replica.url], **settings) as gateway:
        g = gateway.gateway
        await eventually(lambda: g.replicas[0].routable, "ready")
        await g._standby_round(PlanFrom(Plan(0, 1, "test")), "unused")
        assert replica.calls.get("/sleep") == 1
        # Before: the first read confirmed it and reset the backoff; the second read woke
        # it unnoticed, and every standby round slept it again (40 in 20 s).
        await eventually(
            lambda: counter(gateway, "_sleeps", "relapsed") == 1, "the relapse counted", 10
        )
        await eventually(lambda: g.replicas[0].routable, "read awake again")
        await g._standby_round(PlanFrom(Plan(0, 1, "test")), "unused")
        assert replica.calls.get("/sleep") == 1  # backing off: not slept again at once


def test_a_sleep_held_through_its_probation_or_ended_by_a_wake_resets_the_backoff() -> None:
    pool = ReplicaPool(["http://r:1"], GatewaySettings(wake_retry_after=30.0))
    replica = pool.replicas[0]
    replica.sleep_backoff = Backoff(2, 0.0)
    replica.sleeping, replica.sleep_unconfirmed = True, True
    pool._judge_sleep(replica, True, 100.0)  # confirmed: on probation, not reset yet
    assert replica.sleep_backoff.failures == 2
    pool._judge_sleep(replica, True, 131.0)  # held through it
    assert replica.sleep_backoff == Backoff()
    replica.sleep_backoff, replica.sleep_unconfirmed = Backoff(2, 0.0), True
    pool._judge_sleep(replica, True, 200.0)
    replica.sleeping = False  # the gateway woke it for a request
    pool._judge_sleep(replica, False, 205.0)
    assert replica.sleep_backoff == Backoff()


# --- V-7: one model's load does not decide another's pressure wakes ------------------------


def test_one_models_steady_load_does_not_hide_anothers_burst(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    g = Gateway([], GatewaySettings(wake_at_outstanding=2))
    for _ in range(300):  # five minutes: X's replicas hold 20 each, Y's one holds 1
        clock[0] += 0.5
        g._pressure_threshold("x", [20, 20], 2)
        clock[0] += 0.5
        g._pressure_threshold("y", [1], 1)
    threshold, _ = g._pressure_threshold("y", [12], 1)
    assert threshold is not None and threshold <= 12  # before: 21.1, X's mean with Y's
    assert g._surplus_above["x"] > g._surplus_above["y"]


def test_the_models_kept_for_pressure_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_module, "MAX_PRESSURE_MODELS", 8)
    g = Gateway([], GatewaySettings(wake_at_outstanding=2))
    for i in range(100):  # a client naming a new model each time
        g._pressure_threshold(f"m{i}", [1], 1)
    assert len(g._baselines) == len(g._surplus_above) == 8
    assert "m99" in g._baselines and "m0" not in g._baselines


def sleeper_of(model: str) -> StandIn:
    models = json.dumps({"data": [{"id": model}]}).encode()
    return StandIn(**{"/is_sleeping": ASLEEP, "/v1/models": models})


async def test_a_wake_at_zero_is_sized_by_its_own_models_buffer() -> None:
    # Y's only replica sleeps and refuses its wakes: Y's requests wait in the buffer.
    refusing = sleeper_of("y")
    refusing.answers["/wake_up"] = 500
    xs = [sleeper_of("x") for _ in range(4)]
    async with contextlib.AsyncExitStack() as stack:
        for replica in (refusing, *xs):
            await stack.enter_async_context(replica.serving())
        urls = [refusing.url, *(x.url for x in xs)]
        gateway = await stack.enter_async_context(
            gateway_for(urls, wake_at_outstanding=2, wake_retry_after=3600.0)
        )
        g = gateway.gateway
        await eventually(lambda: all(r.wakeable for r in g.replicas), "all asleep")
        body = {"model": "y", "prompt": "p"}
        waiting = [asyncio.create_task(post(gateway, body)) for _ in range(8)]
        try:
            await eventually(lambda: g.stats.buffered == 8, "Y's requests buffered")
            status, text = await post(gateway, {"model": "x", "prompt": "p"})
            assert status == 200, text
            # Before: ceil(9 / 2) = 5 wakes wanted for one request: all 4 of X's sleepers.
            assert sum(x.calls.get("/wake_up", 0) for x in xs) == 1
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)


# --- V-8: replicas from discovery are bounded; a request reads the pool once ---------------


async def test_a_discovery_naming_thousands_tracks_at_most_the_static_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def five_thousand(dns: str) -> tuple[list[str], int]:
        return [f"10.0.{i // 256}.{i % 256}" for i in range(5000)], 8000

    monkeypatch.setattr(gateway_replicas, "resolve_addresses", five_thousand)
    caplog.set_level(logging.WARNING)
    static = "http://static:1"
    pool = ReplicaPool([static], GatewaySettings(dns="replicas.ns.svc:8000"))
    await pool._discover()
    first = [r.url for r in pool.replicas]
    # Before: 5,001 replicas, each checked every second and read by every request.
    assert len(first) == MAX_REPLICAS and static in first
    await pool._discover()
    assert [r.url for r in pool.replicas] == first  # those tracked stay tracked
    assert sum("at most 1024 are tracked" in r.getMessage() for r in caplog.records) == 1


async def test_a_request_reads_every_replicas_view_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async with fakes(answers) as (replica,):
        async with gateway_for([replica.url], health_interval=60.0) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].routable, "ready")
            built = 0
            views = g.pool.routing_views  # a request's read of the views (pass 6, W-3)

            def counted(now: float | None = None) -> list[ReplicaView]:
                nonlocal built
                built += 1
                return views(now)

            monkeypatch.setattr(g.pool, "routing_views", counted)
            assert (await post(gateway, COMPLETION))[0] == 200
            assert built == 1  # before: twice, 50 ms a request with 5,000 replicas


# --- V-10: replica URLs are printable ASCII ------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://\xa0", id="a no-break space (yarl read host ' ') is refused"),
        pytest.param("http://a\u3000b:1", id="an ideographic space inside a host is refused"),
        pytest.param(
            "http://\u2474:1", id="a parenthesised digit (yarl read host '(1)') is refused"
        ),
        pytest.param("http://a:\uff11", id="a full-width digit as the port is refused"),
        pytest.param("http://\u200b:1", id="a zero-width space is refused"),
    ],
)
def test_a_replica_url_outside_printable_ascii_is_refused_naming_it(url: str) -> None:
    with pytest.raises(ConfigError, match="non-ASCII"):
        parse_config(json.dumps({"replicas": [url]}), "gateway.yaml")


@given(st.text(max_size=30).map(lambda tail: "http://" + tail))
def test_a_replica_url_taken_is_the_ascii_host_it_reads_as(url: str) -> None:
    try:
        [taken] = parse_config(json.dumps({"replicas": [url]}), "gateway.yaml").replicas
    except ConfigError:
        return
    assert taken.isascii() and taken.isprintable() and " " not in taken


# --- V-9: a stream with no token bound is bounded by its replica's context -----------------


@pytest.mark.parametrize(
    ("cards", "longest"),
    [
        pytest.param([{"id": "m", "max_model_len": 4096}], 4096, id="vllm's card lists it"),
        pytest.param(
            [{"id": "m", "max_model_len": 4096}, {"id": "lora", "max_model_len": 8192}],
            8192,
            id="the longest of the models listed",
        ),
        pytest.param([{"id": "m"}], None, id="a card without it leaves it unmeasured"),
        pytest.param([{"id": "m", "max_model_len": True}], None, id="a boolean is no length"),
        pytest.param([{"id": "m", "max_model_len": "4096"}], None, id="a string is no length"),
        pytest.param([{"id": "m", "max_model_len": 0}], None, id="zero is no length"),
        pytest.param([{"id": "m", "max_model_len": 10**30}], None, id="past 10M is no length"),
        pytest.param([{"id": "m", "max_model_len": 4096.0}], None, id="a float is no length"),
    ],
)
def test_a_models_context_is_read_or_left_unmeasured(
    cards: list[dict[str, object]], longest: int | None
) -> None:
    listed = read_model_list(json.dumps({"data": cards}).encode())
    assert listed.max_model_len == longest
    assert listed.models == {card["id"] for card in cards}  # the list is read either way


@given(
    st.one_of(st.none(), st.integers(-5, 10**8), st.booleans(), st.floats(), st.text(max_size=5))
)
def test_any_max_model_len_is_a_bounded_count_or_none(value: object) -> None:
    body = json.dumps({"data": [{"id": "m", "max_model_len": value}]}).encode()
    length = read_model_list(body).max_model_len
    assert length is None or (type(length) is int and 1 <= length <= 10_000_000)


@pytest.mark.parametrize(
    ("max_tokens", "n", "context", "bound"),
    [
        pytest.param(None, 1, 4096, 4096, id="no max_tokens: the replica's context bounds it"),
        pytest.param(None, 2, 4096, 8192, id="times its choices"),
        pytest.param(16, 1, 4096, 16, id="the request's own bound wins"),
        pytest.param(
            None, 1, None, MAX_CONTEXT_TOKENS, id="no context listed: the longest context taken"
        ),
        pytest.param(
            None, None, 4096, MAX_CONTEXT_TOKENS, id="an n that is no count: the longest context"
        ),
    ],
)
def test_a_requests_token_bound(
    max_tokens: int | None, n: int | None, context: int | None, bound: int
) -> None:
    meter = ResponseMeter(0.0, max_tokens, n)
    meter.bound_by(context)
    assert meter.token_bound == bound


async def test_a_stream_with_no_bound_is_cut_past_its_replicas_context() -> None:
    card = {"id": "sim-llama", "max_model_len": 8}
    async with streaming_forever(card) as url, gateway_for([url]) as gateway:
        g = gateway.gateway
        await eventually(lambda: g.replicas[0].routable, "ready")
        assert g.replicas[0].max_model_len == 8
        chat = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"
        body = {"model": "sim-llama", "messages": [{"role": "user", "content": "hi"}]}
        # The cap makes the old gateway fail here instead of holding it for good.
        async with asyncio.timeout(20), aiohttp.ClientSession() as client:
            with contextlib.suppress(aiohttp.ClientPayloadError):
                async with client.post(chat, json=body | {"stream": True}) as r:
                    await r.read()
        assert upstream_errors(gateway).get("overrun") == 1
        await eventually(lambda: g.stats.in_flight == 0, "out of flight")


async def test_a_wake_the_gateway_began_ends_the_sleeps_probation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = Gateway(["http://127.0.0.1:9"], GatewaySettings(wake_retry_after=3600.0))
    replica = g.replicas[0]
    replica.sleeping, replica.sleep_probation = True, time.monotonic() + 3600.0
    replica.sleep_backoff = Backoff(1, 0.0)

    async def times_out(replica: object) -> str:
        return "no answer within 60s"  # a wake that failed, yet woke it

    monkeypatch.setattr(g, "_ask_wake", times_out)
    g._start_wake(replica)
    await asyncio.gather(*g._wakes)
    g.pool._judge_sleep(replica, False, time.monotonic())  # read awake after it
    assert replica.sleep_backoff == Backoff()  # not a relapse of the sleep


def test_with_none_ready_the_load_is_shared_as_the_last_running_replicas_shared_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Hostile review of the load baseline: ten replicas held 200 in all, then none was
    # ready; shared over one, the threshold was 400 and 300 waiting requests woke one.
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    g = Gateway([], GatewaySettings(wake_at_outstanding=2))
    for _ in range(120):
        clock[0] += 0.5
        g._pressure_threshold("m", [20] * 10, 10)
    threshold, fill = g._pressure_threshold("m", [], 0)
    assert threshold == pytest.approx(40.0, rel=0.01)
    assert fill == pytest.approx(20.0, rel=0.01)
