"""The serving side under hostile input (issue 27's sixth hostile pass, findings W-1..W-5).

Each test injects what one finding found, at the boundary where it enters: standby plans
that change their running count, streams whose bound came from nowhere (no context
listed, a request's bound past its context, ``"n": null``), a reload naming a DNS name
that does not resolve, a gateway (re)started with a window not yet covered. Real servers
on 127.0.0.1 port 0; the times that matter are passed in, or the gateway's own deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from foundation.replica_model import LLAMA3_8B_H200
from foundation.signals import GatewaySignals
from serving import gateway_replicas, slo
from serving.config import MAX_REPLICAS
from serving.gateway import Gateway, overrun
from serving.gateway_replicas import Replica, ReplicaPool
from serving.gateway_settings import GatewaySettings
from serving.gateway_signals import MIN_RATE_SECONDS, EventWindow, TrafficStats, gateway_signals
from serving.gateway_standby import Plan
from serving.replica_answers import MAX_CONTEXT_TOKENS
from serving.routing import Backoff, ReplicaView, choose, choose_standby
from serving.server import SimReplicaServer
from serving.slo import ResponseMeter, choices
from tests.conftest import eventually, served_app, streaming_forever
from tests.test_gateway_faults import upstream_errors
from tests.test_gateway_isolation import gateway_for
from tests.test_gateway_standby import PlanFrom

# --- W-1: the standby plan's surplus is this plan's, no more ----------------------------


def busy_gateway(count: int, outstanding: int = 2) -> Gateway:
    """A gateway over ``count`` ready replicas serving "m", each with requests outstanding."""
    gateway = Gateway([f"http://127.0.0.1:{9001 + i}" for i in range(count)], GatewaySettings())
    for replica in gateway.pool.replicas:
        replica.ready, replica.models, replica.outstanding = True, frozenset({"m"}), outstanding
    return gateway


def routed(gateway: Gateway, requests: int) -> list[int]:
    """Where ``requests`` go, each counted outstanding as it is routed (from none)."""
    for replica in gateway.pool.replicas:
        replica.outstanding = 0
    for _ in range(requests):
        url = choose(gateway.pool.views(), "m", gateway._surplus_above.get("m", math.inf))
        assert url is not None
        gateway.pool.find(url).outstanding += 1
    return [r.outstanding for r in gateway.pool.replicas]


@pytest.mark.parametrize(
    ("later", "surplus"),
    [
        pytest.param(
            Plan(3, 1, "load rose"),
            [True, False, False, False],
            id="more running wanted: one surplus kept where it was, the others routed again",
        ),
        pytest.param(
            Plan(3, 0, "no sleepers"),
            [False, False, False, False],
            id="no sleepers wanted: no replica is surplus",
        ),
        pytest.param(
            Plan(4, 0, "every replica runs"),
            [False, False, False, False],
            id="the running count covers every ready replica: none is surplus",
        ),
        pytest.param(
            Plan(1, 3, "the same plan again"),
            [True, True, True, False],
            id="the same plan keeps the same marks",
        ),
    ],
)
async def test_a_later_plan_takes_back_the_surplus_an_earlier_one_marked(
    later: Plan, surplus: list[bool]
) -> None:
    gateway = busy_gateway(4)
    await gateway._standby_round(PlanFrom(Plan(1, 3, "low load")), "unused")
    assert [r.surplus for r in gateway.pool.replicas] == [True, True, True, False]
    await gateway._standby_round(PlanFrom(later), "unused")
    assert [r.surplus for r in gateway.pool.replicas] == surplus


async def test_replicas_an_old_plan_marked_take_requests_once_the_plan_runs_them() -> None:
    gateway = busy_gateway(4)
    await gateway._standby_round(PlanFrom(Plan(1, 3, "low load")), "unused")
    await gateway._standby_round(PlanFrom(Plan(3, 0, "load rose")), "unused")
    assert routed(gateway, 40) == [10, 10, 10, 10]  # was [0, 0, 0, 40]


def test_the_surplus_stays_on_the_replicas_marked_already() -> None:
    def view(name: str, outstanding: int, surplus: bool) -> ReplicaView:
        return ReplicaView(name, True, outstanding, frozenset({"m"}), surplus=surplus)

    views = [view("a", 1, False), view("b", 5, True), view("c", 3, False)]
    moves = choose_standby(views, running=2, sleeping=1, min_idle=60.0)
    assert moves.surplus == ("b",)  # marked, though the busiest: not moved to "a"


# --- W-2: every stream has a bound --------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "context", "bound"),
    [
        pytest.param(
            {"max_tokens": 10_000_000},
            8,
            8,
            id="a request's bound past its replica's context: the context bounds it",
        ),
        pytest.param({"max_tokens": 4, "n": 2}, 4096, 8, id="a request's bound within it: its own"),
        pytest.param({"n": None}, 8, 8, id="n null is one choice, as vLLM reads it"),
        pytest.param({}, None, MAX_CONTEXT_TOKENS, id="no context listed: the longest taken"),
        pytest.param(
            {"n": "2"}, 8, MAX_CONTEXT_TOKENS, id="an n that is no count: the longest context"
        ),
    ],
)
def test_every_stream_has_a_bound(body: dict[str, object], context: int | None, bound: int) -> None:
    meter = ResponseMeter(0.0, slo.output_token_limit(body), choices(body))
    meter.bound_by(context)
    assert meter.token_bound == bound


def test_a_meter_not_yet_bound_by_a_replica_has_a_bound() -> None:
    meter = ResponseMeter(0.0)
    assert meter.token_bound == MAX_CONTEXT_TOKENS
    assert not overrun(meter)


@pytest.mark.parametrize(
    ("card", "extra"),
    [
        pytest.param(
            {"id": "sim-llama"}, {}, id="a replica listing no context: cut past the longest taken"
        ),
        pytest.param(
            {"id": "sim-llama", "max_model_len": 8},
            {"max_tokens": 10_000_000},
            id="a request's bound past the context: cut past the context",
        ),
        pytest.param(
            {"id": "sim-llama", "max_model_len": 8},
            {"n": None},
            id="n null: cut past the context",
        ),
    ],
)
async def test_a_stream_of_any_request_is_cut_past_its_bound(
    card: dict[str, object], extra: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The longest context taken, made small: 10M token events would take hours here.
    monkeypatch.setattr(slo, "MAX_CONTEXT_TOKENS", 64)
    async with streaming_forever(card) as url, gateway_for([url]) as gateway:
        g = gateway.gateway
        await eventually(lambda: g.replicas[0].routable, "ready")
        chat = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"
        body = {"model": "sim-llama", "messages": [{"role": "user", "content": "hi"}]}
        # The bound makes the old gateway fail here instead of holding it for good.
        async with asyncio.timeout(20), aiohttp.ClientSession() as client:
            with contextlib.suppress(aiohttp.ClientPayloadError):
                async with client.post(chat, json=body | extra | {"stream": True}) as r:
                    await r.read()
        assert upstream_errors(gateway).get("overrun") == 1
        await eventually(lambda: g.stats.in_flight == 0, "out of flight")


# --- W-4: a DNS name's replicas are its own answer's --------------------------------------


async def test_a_reload_to_a_name_that_does_not_resolve_keeps_none_of_the_old_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def resolve(host_port: str) -> tuple[list[str], int]:
        host, _, port = host_port.rpartition(":")
        if host == "llama.team-a.svc":
            return ["10.0.0.1", "10.0.0.2"], int(port)
        raise OSError(f"{host}: Name or service not known")

    monkeypatch.setattr(gateway_replicas, "resolve_addresses", resolve)
    settings = GatewaySettings(dns="llama.team-a.svc:8000")
    pool = ReplicaPool([], settings)
    await pool._discover()
    assert [r.url for r in pool.replicas] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]

    pool.reconfigure([], dataclasses.replace(settings, dns="qwen.team-b.svc:8000"))
    await pool._discover()
    assert pool.replicas == []  # the old name's pods were routed to for good

    pool.reconfigure([], settings)  # back to the first name: its last answer is its own
    await pool._discover()
    assert len(pool.replicas) == 2


async def test_a_name_that_stops_resolving_keeps_its_own_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: list[list[str]] = [["10.0.0.1"]]

    async def resolve(host_port: str) -> tuple[list[str], int]:
        if not answers:
            raise OSError("no answer")
        return answers.pop(), 8000

    monkeypatch.setattr(gateway_replicas, "resolve_addresses", resolve)
    pool = ReplicaPool([], GatewaySettings(dns="llama.team-a.svc:8000"))
    await pool._discover()
    await pool._discover()  # fails: the last answer stays, as before
    assert [r.url for r in pool.replicas] == ["http://10.0.0.1:8000"]


# --- W-5: a rate over the part of its window the gateway has seen ------------------------


def steady(stats: TrafficStats, start: float, seconds: float, window: float) -> None:
    """Ten arrivals a second from ``start`` for ``seconds``, a snapshot every second."""
    for tick in range(int(seconds * 10)):
        now = start + tick / 10
        stats.arrivals.add(now, window)
        if tick % 10 == 0:
            stats.arrivals.count(now, window)  # the signal loop's snapshot forgets


def published(stats: TrafficStats, window: float, elapsed: float) -> float:
    signals = gateway_signals(stats, GatewaySettings(rate_window=window), 0.0, elapsed).signals
    assert isinstance(signals, GatewaySignals) and signals.arrival_rate is not None
    return signals.arrival_rate


@pytest.mark.parametrize(
    "window",
    [
        pytest.param(10.0, id="a gateway a second old publishes the rate it saw, not a tenth"),
        pytest.param(300.0, id="thirty seconds into a five-minute window: not a tenth of it"),
        pytest.param(3600.0, id="six minutes into an hour's window: not a tenth of it"),
    ],
)
def test_a_started_gateway_publishes_the_rate_it_saw(window: float) -> None:
    stats = TrafficStats.starting(1000.0)
    steady(stats, 1000.0, window / 10, window)
    assert published(stats, window, 1000.0 + window / 10) == pytest.approx(10.0, rel=0.02)


def test_a_reload_that_widens_the_window_publishes_the_rate_it_saw() -> None:
    stats = TrafficStats.starting(0.0)
    steady(stats, 0.0, 100.0, 10.0)  # the 10 s window forgot all but its last 10 s
    assert published(stats, 10.0, 100.0) == pytest.approx(10.0, rel=0.02)
    assert published(stats, 300.0, 100.0) == pytest.approx(10.0, rel=0.02)  # was 0.33


def test_a_first_arrival_in_a_gateways_first_millisecond_is_not_a_thousand_a_second() -> None:
    stats = TrafficStats.starting(1000.0)
    stats.arrivals.add(1000.001, 10.0)
    assert published(stats, 10.0, 1000.001) == 1.0 / MIN_RATE_SECONDS


def test_the_gateway_counts_its_rates_from_its_start() -> None:
    gateway = Gateway(["http://127.0.0.1:9"], GatewaySettings())
    assert gateway.stats.arrivals.covered_from > -math.inf
    assert gateway.stats.errors.covered_from > -math.inf


@given(
    st.floats(0, 1e5),
    st.lists(st.floats(0, 1e4), max_size=100),
    st.floats(0.1, 3600),
    st.floats(0, 1e4),
)
def test_a_rate_lies_between_its_count_over_the_window_and_over_a_second(
    start: float, offsets: list[float], window: float, later: float
) -> None:
    events = EventWindow(start)
    for offset in sorted(offsets):
        events.add(start + offset, window)
    now = start + max(offsets, default=0.0) + later
    rate = events.rate(now, window)
    count = events.count(now, window)
    assert count / window <= rate <= count / min(window, MIN_RATE_SECONDS)


# --- W-3: a request reads the views kept, rebuilding those that changed ------------------


SETTINGS = GatewaySettings()


def fleet(count: int) -> Gateway:
    gateway = Gateway([f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(count)], SETTINGS)
    for replica in gateway.pool.replicas:
        replica.ready, replica.models = True, frozenset({"m"})
    return gateway


async def test_routing_a_request_at_the_cap_builds_only_the_views_that_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = fleet(MAX_REPLICAS)
    gateway.pool.routing_views()  # the first request builds them all
    built = 0
    build = ReplicaPool._view

    def counted(replica: Replica, now: float, patience: float) -> ReplicaView:
        nonlocal built
        built += 1
        return build(replica, now, patience)

    monkeypatch.setattr(ReplicaPool, "_view", staticmethod(counted))
    for _ in range(10):  # each request's life, as _forward counts it
        views = gateway.pool.routing_views()
        replica = await gateway._wait_for_replica("m", 10, views)
        replica.outstanding += 1
        replica.outstanding -= 1
    # Before: every request built all 1,024 (~4 ms a request; ~144 requests/s).
    assert built <= 10


async def test_without_pressure_a_request_a_ready_replica_takes_decides_no_wakes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = fleet(4)
    decided: list[str | None] = []
    monkeypatch.setattr(
        gateway, "_wake_if_needed", lambda model, views=None, buffered=1: decided.append(model)
    )
    await gateway._wait_for_replica("m", 10)
    assert decided == []
    for replica in gateway.pool.replicas:
        replica.eject_backoff = Backoff(1, math.inf)  # every one ejected: a sleeper may help
    await gateway._wait_for_replica("m", 10)
    assert decided == ["m"]


CHANGES = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.sampled_from(
            [
                ("outstanding", 2),
                ("outstanding", 0),
                ("ready", False),
                ("ready", True),
                ("sleeping", True),
                ("sleeping", False),
                ("waking", True),
                ("waking", False),
                ("draining", True),
                ("falling_asleep", True),
                ("surplus", True),
                ("surplus", False),
                ("models", frozenset({"other"})),
                ("sleep_mode", False),
                ("wake_backoff", Backoff(1, 5.0)),
                ("sleep_backoff", Backoff(1, 7.0)),
                ("eject_backoff", Backoff(1, 3.0)),
                ("eject_backoff", Backoff()),
            ]
        ),
        st.floats(0, 4),
    ),
    max_size=30,
)


@given(CHANGES)
def test_the_views_kept_are_the_views_built_afresh(
    changes: list[tuple[int, tuple[str, object], float]],
) -> None:
    pool = ReplicaPool([f"http://127.0.0.1:{9000 + i}" for i in range(4)], SETTINGS)
    now = 0.0
    for index, (name, value), later in changes:
        setattr(pool.replicas[index], name, value)
        now += later
        kept = pool.routing_views(now)
        fresh = pool.views(now)
        # idle_seconds is as of when a kept view was built; nothing routing reads it.
        assert [dataclasses.replace(v, idle_seconds=0.0) for v in kept] == [
            dataclasses.replace(v, idle_seconds=0.0) for v in fresh
        ]


# --- W-6: a chat request's max_completion_tokens comes first, as vLLM reads it ------------


@pytest.mark.parametrize(
    ("body", "chat", "limit"),
    [
        pytest.param(
            {"max_tokens": 5, "max_completion_tokens": 100},
            True,
            100,
            id="a chat request giving both is bounded by max_completion_tokens, as vLLM",
        ),
        pytest.param(
            {"max_tokens": 5, "max_completion_tokens": 100},
            False,
            5,
            id="a completion is bounded by max_tokens: vLLM's completions take no other",
        ),
        pytest.param(
            {"max_completion_tokens": 5}, False, None, id="a completion with only the chat name"
        ),
        pytest.param(
            {"max_tokens": 5, "max_completion_tokens": 0},
            True,
            5,
            id="a zero max_completion_tokens falls through to max_tokens, as vLLM's 'or'",
        ),
        pytest.param(
            {"max_tokens": 5, "max_completion_tokens": "100"},
            True,
            None,
            id="a max_completion_tokens vLLM reads and this does not leaves the bound unknown",
        ),  # pass 67: vLLM reads "100" and 100.0 as 100; a bound of 5 cut its streams
        pytest.param(
            {"max_tokens": 5, "max_completion_tokens": 300.0},
            True,
            None,
            id="a float max_completion_tokens leaves the bound unknown, never max_tokens",
        ),
        pytest.param(
            {"max_tokens": 5, "prompt": ["a"] * 1000},
            True,
            5,
            id="a chat request's unused prompt list multiplies no bound",  # pass 67
        ),
    ],
)
def test_the_bound_vllm_generates_to(
    body: dict[str, object], chat: bool, limit: int | None
) -> None:
    assert slo.output_token_limit(body, chat) == limit


async def test_a_chat_stream_to_its_max_completion_tokens_is_relayed_whole() -> None:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16  # vLLM's
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(tokens):
            await response.write(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "sim-llama"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    async with served_app(app) as url, gateway_for([url]) as gateway:
        await eventually(lambda: gateway.gateway.replicas[0].routable, "ready")
        body = {
            "model": "sim-llama",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": 5,
            "max_completion_tokens": 100,
        }
        chat_url = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"
        async with aiohttp.ClientSession() as client, client.post(chat_url, json=body) as r:
            text = await r.text()  # before: cut after 21 events, ClientPayloadError
        assert (r.status, text.count('"content"'), "[DONE]" in text) == (200, 100, True)
        assert upstream_errors(gateway).get("overrun") is None


COMPLETION_BOTH = {
    "model": "sim-llama",
    "prompt": "hi",
    "max_tokens": 5,
    "max_completion_tokens": 12,
}


async def test_the_sim_replica_generates_a_chat_requests_max_completion_tokens() -> None:
    sim = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", speedup=1000.0)
    await sim.start()
    try:
        body = {
            "model": "sim-llama",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "max_completion_tokens": 12,
        }
        async with aiohttp.ClientSession() as client:
            async with client.post(sim.url + "/v1/chat/completions", json=body) as r:
                chat = await r.json()
            async with client.post(sim.url + "/v1/completions", json=COMPLETION_BOTH) as r:
                completion = await r.json()
        assert chat["usage"]["completion_tokens"] == 12
        assert completion["usage"]["completion_tokens"] == 5  # completions: max_tokens
    finally:
        await sim.stop()
