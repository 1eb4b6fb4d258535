"""The serving side under hostile input (issue 27's fourth hostile pass, findings U-1..U-10).

Each test injects what one finding found, at the boundary where it enters: a config with a
400-digit or boolean number, a model only a sleeper serves, a replica that answers 500 at
once, wakes and sleeps that do not hold, answers that never end, adapters loaded at
runtime, a reload of ``wake-at-outstanding``, a thousand buffered requests on one notify,
and a surplus no standby plan will ever sleep. Real servers on 127.0.0.1 port 0; the
times that matter are the gateway's own deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from foundation.errors import ConfigError
from serving import gateway as gateway_module
from serving.config import parse_config
from serving.gateway import EJECT_AFTER, OVERRUN_EVENTS, Gateway
from serving.gateway_replicas import MODELS_EVERY_ROUNDS
from serving.gateway_settings import GatewaySettings
from serving.gateway_standby import NoPlan, Plan
from serving.routing import MAX_WAKE_FLOOR, ReplicaView, WakePressure, choose, is_unserved
from tests.conftest import eventually
from tests.test_gateway_faults import Behaviour, Fake, upstream_errors
from tests.test_gateway_isolation import StandIn, gateway_for, probe_failures
from tests.test_gateway_standby import PlanFrom

LABELS = ("a", "llama")


def counter(gateway: Any, metric: str, *labels: str) -> float:
    """A counter of the gateway's metrics, by its attribute on ``GatewayMetrics``."""
    return getattr(gateway.gateway.metrics, metric).labels(*LABELS, *labels)._value.get()


def models(*names: str) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": n} for n in names]}).encode()


async def post(gateway: Any, body: dict[str, Any]) -> tuple[int, str]:
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
        return r.status, await r.text()


# --- U-1 and U-9: numbers in the config that are no numbers, or too large to be one --------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(
            "wake-at-outstanding: " + "9" * 400,
            "wake-at-outstanding",
            id="a 400-digit wake-at-outstanding is refused, not an OverflowError per request",
        ),
        pytest.param(
            f"wake-at-outstanding: {MAX_WAKE_FLOOR + 1}",
            "wake-at-outstanding",
            id="a wake-at-outstanding past its bound is refused naming the key",
        ),
        pytest.param(
            "wake-at-outstanding: true", "wake-at-outstanding", id="a boolean is no count"
        ),
        pytest.param(
            "wake-at-outstanding: '5'", "wake-at-outstanding", id="a quoted number is no count"
        ),
        pytest.param("wake-at-outstanding: 5.0", "wake-at-outstanding", id="a float is no count"),
        pytest.param(
            "buffer-size: false",
            "buffer-size",
            id="buffer-size false is refused, not a buffer of 0 answering every request 429",
        ),
        pytest.param("connect-retries: true", "connect-retries", id="connect-retries true"),
        pytest.param(
            "arrivals: {directory: /tmp/x, max-files: true}",
            "arrivals.max-files",
            id="a nested integer key refuses a boolean too",
        ),
        pytest.param("slo: {attainment: true}", "slo.attainment", id="attainment true is no ratio"),
    ],
)
def test_the_gateway_config_refuses_what_is_no_number_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        parse_config(text, "gateway.yaml")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("wake-at-outstanding: 8", 8, id="a plain count is taken"),
        pytest.param(f"wake-at-outstanding: {MAX_WAKE_FLOOR}", MAX_WAKE_FLOOR, id="its bound too"),
    ],
)
def test_a_count_within_bounds_is_taken(text: str, value: int) -> None:
    assert parse_config(text, "gateway.yaml").wake_at_outstanding == value


@given(st.integers(min_value=-(10**400), max_value=10**400))
def test_a_wake_pressure_is_made_only_with_a_floor_its_threshold_can_hold(floor: int) -> None:
    if 1 <= floor <= MAX_WAKE_FLOOR:
        assert math.isfinite(WakePressure(floor).threshold(None))
    else:
        with pytest.raises(ValueError, match="floor"):
            WakePressure(floor)


class Raising:
    """A wake pressure whose threshold raises, as the 400-digit floor's did."""

    floor = 1

    def baseline(self, previous: float | None, per_replica: float, elapsed: float) -> float:
        return per_replica

    def threshold(self, baseline: float | None) -> float:
        raise OverflowError("int too large to convert to float")


async def test_a_failure_deciding_wakes_never_fails_the_request_it_runs_for(caplog):
    caplog.set_level(logging.WARNING)
    async with StandIn().serving() as replica, gateway_for([replica.url]) as gateway:
        g = gateway.gateway
        await eventually(lambda: g.replicas[0].routable, "ready")
        g._pressure = Raising()  # type: ignore[assignment]
        for _ in range(3):
            status, text = await post(gateway, {"model": "sim-llama", "prompt": "x"})
            assert status == 200, text  # before: 500, and no request reached the replica
        assert counter(gateway, "_loop_errors", "wakes") == 3
        assert [r.levelno for r in caplog.records if "deciding wakes" in r.getMessage()] == [
            logging.WARNING
        ]


# --- U-2: a model only a sleeping replica serves ------------------------------------------


def view(url: str, models_: tuple[str, ...], **flags: bool) -> ReplicaView:
    return ReplicaView(url, flags.pop("ready", False), 0, frozenset(models_), **flags)


@pytest.mark.parametrize(
    ("replicas", "unserved"),
    [
        pytest.param(
            [view("a", ("base",), ready=True), view("b", ("base", "sql"), sleeping=True)],
            False,
            id="a model only a sleeper serves waits and wakes it, while another is awake",
        ),
        pytest.param(
            [view("a", ("base",), ready=True), view("b", ("base", "sql"), waking=True)],
            False,
            id="a model only a waking replica serves waits for it",
        ),
        pytest.param(
            [view("a", ("base",), ready=True), view("b", ("base",), sleeping=True)],
            True,
            id="a model nobody awake or asleep lists is 404",
        ),
        pytest.param(
            [view("a", ("base",), ready=True), view("b", ("sql",))],
            True,
            id="a replica down (neither ready nor asleep) does not count",
        ),
    ],
)
def test_a_sleepers_models_count_as_served(replicas: list[ReplicaView], unserved: bool) -> None:
    assert is_unserved(replicas, "sql", frozenset({"base", "sql"})) is unserved


async def test_a_request_for_a_model_only_a_sleeper_serves_wakes_it_and_is_served():
    awake = StandIn(**{"/v1/models": models("base")})
    asleep = StandIn(
        **{"/v1/models": models("base", "sql-adapter"), "/is_sleeping": b'{"is_sleeping": true}'}
    )
    async with awake.serving(), asleep.serving():
        async with gateway_for([awake.url, asleep.url]) as gateway:
            g = gateway.gateway
            await eventually(
                lambda: g.replicas[0].routable and g.replicas[1].wakeable, "one up, one asleep"
            )
            status, text = await post(gateway, {"model": "sql-adapter", "prompt": "x"})
            assert status == 200, text  # before: 404, and the sleeper was never woken
            assert asleep.calls.get("/wake_up") == 1
            assert asleep.calls.get("/v1/completions") == 1


# --- U-3: a replica that passes /health and answers every completion 500 at once ----------


@pytest.mark.parametrize(
    ("replicas", "chosen"),
    [
        pytest.param(
            [view("sick", (), ready=True, ejected=True), view("well", (), ready=True)],
            "well",
            id="an ejected replica is passed over for a ready one however loaded",
        ),
        pytest.param(
            [view("sick", (), ready=True, ejected=True)],
            "sick",
            id="an ejected replica still serves when it is the only one",
        ),
        pytest.param(
            [view("sick", ("m",), ready=True, ejected=True), view("other", ("x",), ready=True)],
            "sick",
            id="an ejected replica serves a model no other ready replica serves",
        ),
    ],
)
def test_an_ejected_replica_is_the_last_resort(replicas: list[ReplicaView], chosen: str) -> None:
    assert choose(replicas, "m") == chosen


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), min_size=1, max_size=8))
def test_an_ejected_replica_is_chosen_beside_a_ready_one_only_past_half(
    replicas: list[tuple[bool, int]],
) -> None:
    # At most half are passed over (pass 5, V-2): a few requests ejected most of a fleet.
    views = [
        ReplicaView(f"r{i}", True, load, frozenset(), ejected=ejected)
        for i, (ejected, load) in enumerate(replicas)
    ]
    url = choose(views, "m")
    picked = next(v for v in views if v.url == url)
    assert not picked.ejected or sum(v.ejected for v in views) > len(views) // 2


async def fails_at_once(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.json_response({"message": "EngineCore encountered an issue"}, status=500)


async def answers(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.json_response({"choices": [{"text": "ok"}]})


@contextlib.asynccontextmanager
async def fakes(*behaviours: Behaviour) -> AsyncIterator[list[Fake]]:
    started = [await Fake(b).start() for b in behaviours]
    try:
        yield started
    finally:
        for fake in started:
            await fake.stop()


@pytest.mark.usefixtures("no_failure_weight")
async def test_a_replica_answering_500_at_once_is_ejected_after_a_few_and_counted(
    caplog, monkeypatch
):
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)  # however slow the machine
    # The sick one is listed first: ties of least-outstanding went to it, every time.
    async with fakes(fails_at_once, answers) as (sick, well):
        async with gateway_for([sick.url, well.url]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            statuses = [
                (await post(gateway, {"model": "sim-llama", "prompt": "x"}))[0] for _ in range(20)
            ]
            # Before: all 20 went to the sick one, nothing counted as an upstream error.
            assert statuses == [500] * EJECT_AFTER + [200] * (20 - EJECT_AFTER)
            assert (sick.received, well.received) == (EJECT_AFTER, 20 - EJECT_AFTER)
            assert upstream_errors(gateway) == {"status-5xx": EJECT_AFTER}
            assert "status-5xx" in g.replicas[0].failing  # a 5xx no longer clears it
            assert sum(sick.url in r.getMessage() for r in caplog.records) == 1


# --- U-4 and U-5: wakes and sleeps that say they held, and do not -------------------------


class Relapsing(StandIn):
    """Asleep; woken, it says awake to the wake and to the next /is_sleeping, then asleep."""

    def __init__(self) -> None:
        super().__init__(**{"/is_sleeping": b'{"is_sleeping": true}'})
        self.reads_awake = 0

    async def _answer(self, request: web.Request) -> web.Response:
        if (
            request.path == "/is_sleeping"
            and self.answers[request.path] == b'{"is_sleeping": false}'
        ):
            self.reads_awake += 1
            if self.reads_awake > 1:  # the second read after a wake: asleep again
                self.answers["/is_sleeping"] = b'{"is_sleeping": true}'
        elif request.path == "/wake_up":
            self.reads_awake = 0
        return await super()._answer(request)


async def test_a_wake_that_falls_asleep_soon_after_it_held_is_a_relapse_backed_off():
    async with Relapsing().serving() as replica:
        async with gateway_for([replica.url], wake_retry_after=60.0) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].wakeable, "asleep")
            status, text = await post(gateway, {"model": "sim-llama", "prompt": "x"})
            assert status == 200, text
            # Before: the first read confirmed it and reset the backoff; the second read
            # put it to sleep unnoticed, and every request woke it again.
            await eventually(
                lambda: counter(gateway, "_wakes", "relapsed") == 1, "the relapse counted", 10
            )
            assert g.replicas[0].wake_backoff.failures == 1
            assert not g.replicas[0].wake_backoff.allows(time.monotonic())


async def test_a_sleep_answered_200_that_leaves_it_awake_is_a_relapse_backed_off():
    replica = StandIn()  # /sleep answers 200; /is_sleeping always says awake
    async with replica.serving(), gateway_for([replica.url], sleep_after_idle=0.0) as gateway:
        g = gateway.gateway
        await eventually(lambda: g.replicas[0].routable, "ready")
        await g._standby_round(PlanFrom(Plan(0, 1, "test")), "unused")
        assert replica.calls.get("/sleep") == 1
        # Before: counted slept, read awake again, and slept every round with no backoff.
        await eventually(
            lambda: counter(gateway, "_sleeps", "relapsed") == 1, "the relapse counted", 10
        )
        await eventually(lambda: g.replicas[0].routable, "read awake again")
        await g._standby_round(PlanFrom(Plan(0, 1, "test")), "unused")
        assert replica.calls.get("/sleep") == 1  # backing off: not slept again at once


# --- U-6: answers that never end ---------------------------------------------------------


async def trickles_json(request: web.Request, fake: Fake) -> web.StreamResponse:
    """A JSON answer that sends a space now and then, forever."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"choices": ')
    while True:
        await response.write(b" ")
        await asyncio.sleep(0.05)  # the replica's pace, not the test's synchronisation


async def tokens_forever(request: web.Request, fake: Fake) -> web.StreamResponse:
    """A stream that carries a token per event, far past the request's max_tokens."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    while True:
        await response.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await asyncio.sleep(0.001)


@pytest.mark.parametrize(
    ("behaviour", "body"),
    [
        pytest.param(
            trickles_json,
            {"model": "sim-llama", "prompt": "x"},
            id="a non-streamed body trickling forever is cut upstream-timeout after its headers",
        ),
        pytest.param(
            tokens_forever,
            {"model": "sim-llama", "prompt": "x", "max_tokens": 5, "stream": True},
            id="a stream far past its max_tokens is cut",
        ),
    ],
)
async def test_an_answer_that_never_ends_is_cut_counted_and_leaves_flight(behaviour, body):
    async with fakes(behaviour) as (replica,):
        async with gateway_for([replica.url], upstream_timeout=1.0) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].routable, "ready")
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            # The cap makes the old gateway fail here instead of holding it for good.
            async with asyncio.timeout(20), aiohttp.ClientSession() as client:
                with contextlib.suppress(aiohttp.ClientPayloadError):
                    async with client.post(url, json=body) as r:
                        await r.read()
            await eventually(lambda: g.stats.in_flight == 0, "out of flight", 5)
            assert upstream_errors(gateway) == {"overrun": 1}
            assert g.replicas[0].outstanding == 0


def test_a_stream_is_cut_only_well_past_its_bound():
    from serving.gateway import overrun
    from serving.slo import ResponseMeter

    meter = ResponseMeter(0.0, 5)
    meter.begin(200, True)
    for i in range(5 + OVERRUN_EVENTS + 1):  # and an echo's event a choice
        meter.feed(b'data: {"choices": [{"text": "x"}]}\n\n', float(i))
    assert not overrun(meter)
    meter.feed(b'data: {"choices": [{"text": "x"}]}\n\n', 99.0)
    assert overrun(meter)
    assert not overrun(ResponseMeter(0.0, None))


# --- U-7: a healthy replica's models are read again -------------------------------------


async def test_an_adapter_loaded_at_runtime_is_routed_and_a_bad_relist_keeps_the_list():
    replica = StandIn(**{"/v1/models": models("base")})
    async with replica.serving(), gateway_for([replica.url]) as gateway:
        g = gateway.gateway
        await eventually(lambda: g.replicas[0].models == {"base"}, "listed")
        replica.answers["/v1/models"] = models("base", "new-adapter")
        # Before: /v1/models was asked once, while the list was empty.
        await eventually(lambda: "new-adapter" in g.replicas[0].models, "listed again", 10)
        status, text = await post(gateway, {"model": "new-adapter", "prompt": "x"})
        assert status == 200, text
        replica.answers["/v1/models"] = 500
        await eventually(lambda: probe_failures(gateway, "http-status") >= 1, "refused", 10)
        assert g.replicas[0].models == {"base", "new-adapter"}
        assert g.replicas[0].routable
    assert MODELS_EVERY_ROUNDS > 1  # not every round: each ask is one more request


# --- U-8: wake-at-outstanding is reloaded -----------------------------------------------


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(None, 1, id="a reload that turns pressure wakes on is acted on"),
        pytest.param(1, None, id="a reload that turns them off stops them and clears the surplus"),
        pytest.param(4, 8, id="a reload that moves the floor starts its baseline afresh"),
    ],
)
def test_a_reloaded_wake_at_outstanding_is_applied(before: int | None, after: int | None) -> None:
    g = Gateway(["http://127.0.0.1:9"], GatewaySettings(wake_at_outstanding=before))
    g.replicas[0].surplus = True
    g._baselines["m"] = (3.0, 0.0, 1)
    g.reconfigure(["http://127.0.0.1:9"], GatewaySettings(wake_at_outstanding=after))
    assert (g._pressure.floor if g._pressure else None) == after
    assert not g._baselines
    assert g.replicas[0].surplus is (after is not None)


# --- U-10: buffered requests are handed replicas once per notify -------------------------


async def test_one_notify_builds_the_views_once_however_many_requests_wait():
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(2)]
    g = Gateway(urls, GatewaySettings(buffer_size=1000))
    waiting = [
        asyncio.create_task(g._wait_for_replica("sim-llama", 0)) for _ in range(200)
    ]  # no replica ready: every one buffers
    await eventually(lambda: g.stats.buffered == 200, "all buffered")
    built = 0
    views = g.pool.routing_views  # a request's read of the views (pass 6, W-3)

    def counted(now: float | None = None) -> list[ReplicaView]:
        nonlocal built
        built += 1
        return views(now)

    g.pool.routing_views = counted  # type: ignore[method-assign]
    for replica in g.replicas:
        replica.ready = True
    g.pool.on_routable()  # what a health round that finds them does
    async with g._ready:
        g._ready.notify_all()
    chosen = await asyncio.gather(*waiting)
    # Before: each of the 200 rebuilt every view twice per notify.
    assert built == 1
    # Handed out as they would be routed: each sees the load of those before it.
    assert sorted(sum(r is c for c in chosen) for r in g.replicas) == [100, 100]


# --- LOW: a surplus replica with no standby plan to sleep it ------------------------------


async def test_a_surplus_replica_no_plan_will_sleep_runs_once_idle():
    async with StandIn().serving() as replica:
        async with gateway_for(
            [replica.url], wake_at_outstanding=2, standby_interval=0.05, sleep_after_idle=0.0
        ) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].routable, "ready")
            g.replicas[0].surplus = True  # woken under pressure
            # Before: nothing ever cleared it, and below the threshold it got nothing.
            await eventually(lambda: not g.replicas[0].surplus, "no longer surplus", 10)


class NoPlanFrom:
    """A scaler stand-in with no plan to act on."""

    async def plan(
        self, address: str, namespace: str, deployment: str, rpc_seconds: float
    ) -> NoPlan:
        return NoPlan("no-decision", "the scaler has not decided yet")


@pytest.mark.parametrize(
    ("outstanding", "surplus"),
    [
        pytest.param(0, False, id="with no plan to act on an idle surplus replica runs"),
        pytest.param(1, True, id="one with a request outstanding keeps its mark until idle"),
    ],
)
async def test_a_round_without_a_plan_releases_the_idle_surplus(outstanding: int, surplus: bool):
    g = Gateway(["http://127.0.0.1:9"], GatewaySettings(wake_at_outstanding=2))
    replica = g.replicas[0]
    replica.surplus, replica.outstanding, replica.idle_since = True, outstanding, -math.inf
    await g._standby_round(NoPlanFrom(), "unused")
    assert replica.surplus is surplus
