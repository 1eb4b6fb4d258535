"""Nothing a replica answers stops the gateway's loops, and failing replicas back off.

Issue 27, classes 1 and 6, on real servers on 127.0.0.1 port 0: replica stand-ins whose
``/v1/models``, ``/is_sleeping``, ``/wake_up`` and ``/sleep`` answer what the test says.

- A hostile answer (or any exception met checking one replica) fails that replica's round
  only: it is counted by reason and logged once as a WARNING naming it, the other replicas
  are checked as before, a replica listed later is still contacted, and the hostile one
  recovers once it answers well. ``/health`` answers 503 should a loop stop anyway.
- A wake or a sleep that fails (however garbled the answer) is counted, backs off per
  replica, and the next one goes to another replica; the standby round is driven with
  its time passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from serving.gateway import control_session
from serving.gateway_replicas import ReplicaPool
from serving.gateway_settings import GatewaySettings
from serving.gateway_standby import Plan
from serving.replica_answers import MAX_ANSWER_BYTES
from serving.server import GatewayServer
from tests.conftest import eventually

GOOD_MODELS = json.dumps({"object": "list", "data": [{"id": "sim-llama"}]}).encode()
AWAKE = b'{"status": "awake"}'
DEEP = b"[" * 100_000 + b"]" * 100_000
"""JSON nested past the parser's stack: ``json.loads`` raises RecursionError."""


class StandIn:
    """A vLLM stand-in: healthy; ``answers`` holds the bodies of its GETs and POSTs."""

    def __init__(self, **answers: bytes | int) -> None:
        self.answers: dict[str, bytes | int] = {
            "/v1/models": GOOD_MODELS,
            "/is_sleeping": b'{"is_sleeping": false}',
            "/wake_up": AWAKE,
            "/sleep": b"{}",
            "/v1/completions": b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}',
        }
        self.answers |= answers
        """A path's body, or an int: answer that HTTP status."""
        self.calls: dict[str, int] = {}
        self.url = ""

    async def _answer(self, request: web.Request) -> web.Response:
        self.calls[request.path] = self.calls.get(request.path, 0) + 1
        answer = self.answers[request.path]
        if request.path == "/wake_up" and answer == AWAKE:  # woken, it says so from now on
            self.answers["/is_sleeping"] = b'{"is_sleeping": false}'
        if isinstance(answer, int):
            return web.json_response({"error": "refused"}, status=answer)
        return web.Response(body=answer, content_type="application/json")

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[StandIn]:
        async def health(request: web.Request) -> web.Response:
            return web.Response()

        app = web.Application()
        app.router.add_get("/health", health)
        for path in ("/v1/models", "/is_sleeping"):
            app.router.add_get(path, self._answer)
        for path in ("/wake_up", "/sleep", "/v1/completions"):
            app.router.add_post(path, self._answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def gateway_for(replicas: list[str], **settings: Any) -> AsyncIterator[GatewayServer]:
    values: dict[str, Any] = {"health_interval": 0.05, "namespace": "a", "deployment": "llama"}
    server = GatewayServer(
        replicas, GatewaySettings(**(values | settings)), "127.0.0.1:0", "127.0.0.1:0"
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def samples(gateway: GatewayServer) -> dict[tuple[str, str | None], float]:
    url = f"http://127.0.0.1:{gateway.port}/metrics"
    async with aiohttp.ClientSession() as client, client.get(url) as r:
        text = await r.text()
    return {
        (s.name, s.labels.get("reason") or s.labels.get("result") or s.labels.get("action")): (
            s.value
        )
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("unitscale_gateway_")
    }


def probe_failures(gateway: GatewayServer, reason: str) -> float:
    metric = gateway.gateway.metrics._probe_failures
    return metric.labels("a", "llama", reason)._value.get()


async def health(gateway: GatewayServer) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{gateway.port}/health"
    async with aiohttp.ClientSession() as client, client.get(url) as r:
        return r.status, await r.json()


def warnings_naming(caplog: pytest.LogCaptureFixture, url: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and url in r.getMessage()
    ]


# --- class 1: one replica's answer fails its own round, never the loop ---------------------


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        pytest.param("/v1/models", b'[{"id": "sim-llama"}]', "wrong-shape",
                     id="models answered as a JSON list"),
        pytest.param("/v1/models", DEEP, "too-deep", id="models nested 100000 deep"),
        pytest.param("/v1/models", b'{"data": [{"id": 7}]}', "wrong-shape",
                     id="a model id that is a number"),
        pytest.param("/v1/models", b'{"data": "x' + b"x" * MAX_ANSWER_BYTES + b'"}', "too-large",
                     id="models answered in more than a mebibyte"),
        pytest.param("/v1/models", b"\xff\xfe garbage", "not-json", id="models as garbage bytes"),
        pytest.param("/v1/models", b"9" * 5000, "not-json", id="models as a 5000-digit integer"),
        pytest.param("/is_sleeping", DEEP, "too-deep", id="is_sleeping nested 100000 deep"),
        pytest.param("/is_sleeping", b"[true]", "wrong-shape", id="is_sleeping as a JSON list"),
        pytest.param("/is_sleeping", b'{"is_sleeping": "no"}', "wrong-shape",
                     id="is_sleeping as a string"),
    ],
)  # fmt: skip
async def test_a_hostile_answer_fails_that_replica_s_round_only_and_it_recovers(
    caplog, path, body, reason
):
    caplog.set_level(logging.INFO, logger="serving.gateway")
    async with (
        StandIn(**{path: body}).serving() as hostile,
        StandIn().serving() as good,
        StandIn().serving() as late,
        gateway_for([hostile.url, good.url]) as gateway,
    ):
        pool = gateway.gateway.pool
        await eventually(lambda: pool.find(good.url).routable, "the good replica is ready")
        await eventually(lambda: probe_failures(gateway, reason) >= 3, "three failed rounds")
        assert pool.find(hostile.url).problem == reason
        # The loop still runs: a replica listed now is contacted and takes traffic.
        settings = gateway.gateway.settings
        gateway.gateway.reconfigure([hostile.url, good.url, late.url], settings)
        await eventually(lambda: pool.find(late.url).routable, "the late replica is ready")
        status, answer = await health(gateway)
        assert (status, answer["status"], answer["stopped"]) == (200, "ok", [])
        # One WARNING for the hostile replica, however many rounds it failed.
        (warning,) = warnings_naming(caplog, hostile.url)
        assert reason in warning
        # It answers well again (and says it sleeps): it is read again, and recovers.
        hostile.answers |= {path: StandIn().answers[path], "/is_sleeping": b'{"is_sleeping":true}'}
        await eventually(lambda: pool.find(hostile.url).wakeable, "the hostile one recovers")
        assert pool.find(hostile.url).problem is None
        assert pool.find(good.url).routable
    assert any("answers well again" in r.getMessage() for r in caplog.records)


class SurpriseError(Exception):
    """An exception class no code of the gateway knows."""


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(SurpriseError("boom"), id="an exception class nobody expected"),
        pytest.param(KeyError("value"), id="a key error"),
        pytest.param(OverflowError("int too large to convert to float"), id="an overflow"),
        pytest.param(RecursionError("maximum recursion depth"), id="a recursion error"),
        pytest.param(AttributeError("'list' has no attribute 'get'"), id="an attribute error"),
        pytest.param(ZeroDivisionError("division by zero"), id="a division by zero"),
        pytest.param(AssertionError("a broken invariant"), id="an assertion"),
    ],
)  # fmt: skip
async def test_any_exception_checking_one_replica_fails_its_round_and_the_others_go_on(
    caplog, monkeypatch, error
):
    caplog.set_level(logging.INFO, logger="serving.gateway")
    broken: set[str] = set()
    probe = ReplicaPool._probe

    async def faulty(self, session, replica):
        if replica.url in broken:
            raise error
        return await probe(self, session, replica)

    monkeypatch.setattr(ReplicaPool, "_probe", faulty)
    async with (
        StandIn().serving() as victim,
        StandIn().serving() as good,
        StandIn().serving() as late,
        gateway_for([victim.url, good.url]) as gateway,
    ):
        pool = gateway.gateway.pool
        await eventually(lambda: pool.find(victim.url).routable, "both ready")
        broken.add(victim.url)
        await eventually(lambda: probe_failures(gateway, "internal") >= 3, "three failed rounds")
        assert not pool.find(victim.url).ready and pool.find(good.url).routable
        gateway.gateway.reconfigure([victim.url, good.url, late.url], gateway.gateway.settings)
        await eventually(lambda: pool.find(late.url).routable, "the late replica is ready")
        (warning,) = warnings_naming(caplog, victim.url)
        assert "internal" in warning and type(error).__name__ in warning
        broken.clear()
        await eventually(lambda: pool.find(victim.url).routable, "the victim recovers")
        assert (await health(gateway))[0] == 200


async def test_a_health_round_failing_as_a_whole_is_counted_and_the_next_one_runs(
    caplog, monkeypatch
):
    caplog.set_level(logging.WARNING, logger="serving.gateway")
    failing = True
    discover = ReplicaPool._discover

    async def faulty(self):
        if failing:
            raise SurpriseError("discovery met something new")
        await discover(self)

    async with StandIn().serving() as replica, gateway_for([]) as gateway:
        g = gateway.gateway
        errors = g.metrics._loop_errors.labels("a", "llama", "health")
        monkeypatch.setattr(ReplicaPool, "_discover", faulty)
        g.reconfigure([replica.url], g.settings)  # a round now, and every 50 ms: all fail
        await eventually(lambda: errors._value.get() >= 3, "three failed rounds")
        failing = False
        await eventually(lambda: g.pool.find(replica.url).routable, "checked once discovery works")
        assert (await health(gateway))[0] == 200
    assert len([r for r in caplog.records if "health round failed" in r.getMessage()]) == 1


@pytest.mark.parametrize("loop", ["health", "signals", "standby"])
async def test_health_fails_naming_a_background_loop_that_stopped(loop):
    async with StandIn().serving() as replica, gateway_for([replica.url]) as gateway:
        assert (await health(gateway))[0] == 200
        task = gateway.gateway.loops[loop]
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        status, answer = await health(gateway)
    assert status == 503
    assert answer["stopped"] == [loop] and answer["status"] == "a background loop stopped"


async def test_a_failing_standby_round_is_counted_and_the_loop_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="serving.gateway")
    rounds = 0

    class Failing:
        async def plan(self, *args: object) -> Plan:
            nonlocal rounds
            rounds += 1
            raise SurpriseError("a plan source's bug")

    async with StandIn().serving() as replica, gateway_for([replica.url]) as gateway:
        g = gateway.gateway
        g.settings = replace(g.settings, standby_scaler="unused", standby_interval=0.01)
        g.loops["standby"].cancel()  # the loop again, with a source that always fails
        g.loops["standby"] = task = asyncio.create_task(g._standby_loop(Failing()))
        await eventually(lambda: rounds >= 3, "three rounds")
        assert not task.done() and (await health(gateway))[0] == 200
        errors = g.metrics._loop_errors.labels("a", "llama", "standby")._value.get()
        assert errors >= 3
    assert len([r for r in caplog.records if "standby round failed" in r.getMessage()]) == 1


# --- class 6: wakes and sleeps back off per replica, are counted, move on ---------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(DEEP, id="a wake answered with JSON nested 100000 deep"),
        pytest.param(b"[" * 40 + b"]" * 40, id="a wake answered with JSON nested 40 deep"),
        pytest.param(b"\x00\xff not json", id="a wake answered with garbage"),
        pytest.param(b'{"status": "awake", "x": "' + b"x" * MAX_ANSWER_BYTES + b'"}',
                     id="a wake answered with more than a mebibyte"),
        pytest.param(b'{"status": ["awake"]}', id="a wake whose status is a list"),
        pytest.param(500, id="a wake refused with HTTP 500"),
    ],
)  # fmt: skip
async def test_a_garbled_wake_is_counted_backed_off_and_the_next_sleeper_is_woken(caplog, answer):
    caplog.set_level(logging.WARNING, logger="serving.gateway")
    asleep = b'{"is_sleeping": true}'
    async with (
        StandIn(**{"/wake_up": answer, "/is_sleeping": asleep}).serving() as garbled,
        StandIn(**{"/is_sleeping": asleep}).serving() as sound,
        gateway_for([garbled.url, sound.url], buffer_timeout=20) as gateway,
    ):
        pool = gateway.gateway.pool
        for url in (garbled.url, sound.url):
            await eventually(lambda u=url: pool.find(u).wakeable, "both sleepers are seen")
        body = {"model": "sim-llama", "prompt": "hi", "max_tokens": 1}
        url = f"http://127.0.0.1:{gateway.port}/v1/completions"
        async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
            status = r.status
        metrics = await samples(gateway)
        backoff = pool.find(garbled.url).wake_backoff
    # Served by the sound one, not a 503 from a gateway that kept waking the garbled one.
    assert (status, sound.calls["/v1/completions"]) == (200, 1)
    assert "/v1/completions" not in garbled.calls
    assert (garbled.calls["/wake_up"], sound.calls["/wake_up"]) == (1, 1)
    assert metrics[("unitscale_gateway_wakes_total", "failed")] == 1
    assert metrics[("unitscale_gateway_wakes_total", "woken")] == 1
    assert backoff.failures == 1
    (warning,) = warnings_naming(caplog, garbled.url)
    assert "not woken again for 30s" in warning


async def test_a_wake_that_keeps_failing_is_not_asked_again_while_it_backs_off():
    # Issue 27: a nested /wake_up answer bypassed wake-retry-after, 41 wakes in 20 s. Every
    # health round (each 50 ms) wakes buffered requests to look again; none may re-wake it.
    asleep = b'{"is_sleeping": true}'
    async with (
        StandIn(**{"/wake_up": DEEP, "/is_sleeping": asleep}).serving() as replica,
        gateway_for([replica.url], buffer_timeout=1.0) as gateway,
    ):
        pool = gateway.gateway.pool
        await eventually(lambda: pool.find(replica.url).wakeable, "the sleeper is seen")
        body = {"model": "sim-llama", "prompt": "hi", "max_tokens": 1}
        url = f"http://127.0.0.1:{gateway.port}/v1/completions"
        async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
            assert r.status == 503  # the buffer's timeout, with nothing else to wake
        gateway.gateway._report(0, 1)  # what a health round reports
        metrics = await samples(gateway)
        until = pool.find(replica.url).wake_backoff.until
    assert replica.calls["/wake_up"] == 1
    assert metrics[("unitscale_gateway_wakes_total", "failed")] == 1
    assert metrics[("unitscale_gateway_replicas_backing_off", "wake")] == 1
    assert pool.views(until - 0.001)[0].wake_failed  # passed over until its backoff ends
    assert not pool.views(until)[0].wake_failed  # and woken again from then on


class PlanFrom:
    """A scaler stand-in: always this plan."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    async def plan(self, address: str, namespace: str, deployment: str, rpc_seconds: float) -> Plan:
        return self._plan


@pytest.mark.parametrize(
    ("offsets", "asked"),
    [
        pytest.param([0, 1, 2, 29], 1, id="a refused sleep is not asked again within 30 s"),
        pytest.param([0, 30], 2, id="it is asked again once the base delay passed"),
        pytest.param([0, 30, 31, 89], 2, id="the second refusal doubles the wait to 60 s"),
        pytest.param([0, 30, 90, 209, 210], 4, id="then 120 s"),
        pytest.param([0, 30, 90, 210, 449, 450, 689, 690], 6, id="capped at 240 s"),
        pytest.param(list(range(300)), 4, id="rounds every second for 5 minutes ask 4 times"),
    ],
)
async def test_a_refused_sleep_backs_off_exponentially_with_time_passed_in(offsets, asked):
    async with (
        StandIn(**{"/sleep": 500}).serving() as refusing,
        gateway_for([refusing.url], health_interval=600.0, sleep_after_idle=0.0) as gateway,
    ):
        g = gateway.gateway
        replica = g.pool.find(refusing.url)
        await eventually(lambda: replica.routable, "ready")
        start = time.monotonic()
        for offset in offsets:
            await g._standby_round(PlanFrom(Plan(0, 1, "test")), "unused", now=start + offset)
        metrics = await samples(gateway)
    assert refusing.calls["/sleep"] == asked
    assert metrics[("unitscale_gateway_sleeps_total", "failed")] == asked
    assert replica.routable  # a refusal leaves it serving


async def test_a_refused_sleep_moves_on_to_another_idle_replica(caplog):
    caplog.set_level(logging.WARNING, logger="serving.gateway")
    async with (
        StandIn(**{"/sleep": 503}).serving() as refusing,
        StandIn().serving() as willing,
        gateway_for(
            [refusing.url, willing.url], health_interval=600.0, sleep_after_idle=0.0
        ) as gateway,
    ):
        g = gateway.gateway
        first, second = g.pool.find(refusing.url), g.pool.find(willing.url)
        await eventually(lambda: first.routable and second.routable, "both ready")
        now = time.monotonic()
        first.idle_since, second.idle_since = now - 100, now - 50  # the refusing one is idlest
        plan = PlanFrom(Plan(0, 1, "test"))
        await g._standby_round(plan, "unused", now=now)
        await g._standby_round(plan, "unused", now=now + 1)
        await g._standby_round(plan, "unused", now=now + 2)
        metrics = await samples(gateway)
    assert (refusing.calls["/sleep"], willing.calls["/sleep"]) == (1, 1)
    assert first.routable and second.wakeable
    assert metrics[("unitscale_gateway_sleeps_total", "failed")] == 1
    assert metrics[("unitscale_gateway_sleeps_total", "slept")] == 1
    (warning,) = warnings_naming(caplog, refusing.url)
    assert "HTTP 503" in warning and "not slept again for 30s" in warning


async def test_replicas_whose_health_hangs_never_hold_another_replica_s_check() -> None:
    """aiohttp's default of 100 connections: 100 hung checks made every later one time out."""
    hung = asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        await hung.wait()
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", never)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for _ in range(120):  # one server, 120 ports: 120 hung replicas
        await web.TCPSite(runner, "127.0.0.1", 0).start()
    urls = [f"http://127.0.0.1:{port}" for _, port in runner.addresses]
    session = control_session()
    try:
        async with StandIn().serving() as honest:
            pool = ReplicaPool([*urls, honest.url], GatewaySettings(health_interval=0.05))
            await pool.check_round(session, lambda routable, asleep: None)
            await pool._checks[honest.url]
            # It went while every hung check still waited: none gave a connection back.
            assert not any(pool._checks[url].done() for url in urls)
            assert pool.find(honest.url).routable
            assert pool.find(honest.url).problem is None
            for task in pool._checks.values():
                task.cancel()
            await asyncio.gather(*pool._checks.values(), return_exceptions=True)
    finally:
        hung.set()
        await session.close()
        await runner.cleanup()


class HangingSleep(StandIn):
    """A stand-in whose ``/sleep`` is taken and not answered until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def _answer(self, request: web.Request) -> web.Response:
        if request.path == "/sleep":
            self.calls["/sleep"] = self.calls.get("/sleep", 0) + 1
            await self.release.wait()
        return await super()._answer(request)


async def test_a_sleep_never_answered_holds_no_round_back():
    """A hanging ``/sleep`` held the standby loop for ``wake-timeout`` (60 s): the plan's
    next wake of a sleeper came 5.2 s late at a 5 s timeout. Sleeps run on their own."""
    hanging, sleeper = HangingSleep(), StandIn()
    sleeper.answers["/is_sleeping"] = b'{"is_sleeping": true}'
    plan = PlanFrom(Plan(0, 2, "no load"))
    async with (
        hanging.serving(),
        sleeper.serving(),
        gateway_for(
            [hanging.url, sleeper.url],
            standby_scaler="scaler:1",
            standby_interval=0.05,
            sleep_after_idle=0.0,
            wake_timeout=300.0,
        ) as server,
    ):
        try:
            g = server.gateway
            views = g.pool.views
            await eventually(lambda: sum(v.ready or v.sleeping for v in views()) == 2, "2 up")
            g.loops["standby"].cancel()
            g.loops["standby"] = asyncio.create_task(g._standby_loop(plan))
            await eventually(lambda: hanging.calls.get("/sleep"), "the hanging replica slept")
            plan._plan = Plan(2, 0, "load rose")
            # A cap against hangs, far below the 300 s a hanging sleep held the loop.
            await eventually(lambda: sleeper.calls.get("/wake_up"), "the sleeper woken", limit=20)
        finally:
            hanging.release.set()


async def test_a_replica_whose_health_hangs_leaves_rounds_an_interval_apart() -> None:
    """Each round waited its whole interval for the hung check, then slept an interval
    more: every other replica was checked every other interval (hostile pass 62)."""
    hung = asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        await hung.wait()
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", never)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    (_, port), *_ = runner.addresses
    session = control_session()
    interval = 0.2
    loop = asyncio.get_running_loop()
    ends: list[float] = []
    try:
        async with StandIn().serving() as honest:
            urls = [f"http://127.0.0.1:{port}", honest.url]
            pool = ReplicaPool(urls, GatewaySettings(health_interval=interval))
            rounds = asyncio.create_task(
                pool.check_forever(session, lambda routable, asleep: ends.append(loop.time()))
            )
            await eventually(lambda: len(ends) >= 8, "eight rounds")
            rounds.cancel()
            await asyncio.gather(rounds, return_exceptions=True)
    finally:
        hung.set()
        await session.close()
        await runner.cleanup()
    gaps = sorted(b - a for a, b in itertools.pairwise(ends))
    assert gaps[len(gaps) // 2] < 1.5 * interval  # before: 2 intervals
