"""The gateway holds the scaler's standby plan: surplus idle replicas sleep, one wakes on demand.

``serving.routing.choose_standby`` in a table and a property; then real servers on
127.0.0.1 port 0: two simulated replicas with sleep mode, the gateway, and the scaler
watching the gateway's signals, with KEDA's calls made by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from foundation.replica_model import LLAMA3_8B_H200
from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler.config import ScalerConfig
from scaler.server import ScalerServer
from serving.gateway_replicas import ReplicaPool
from serving.gateway_settings import GatewaySettings
from serving.gateway_standby import Plan, StandbyClient
from serving.routing import ReplicaView, choose_standby
from serving.server import GatewayServer, SimReplicaServer
from tests.conftest import eventually, ref, served_app

FAST = 50.0


def view(name, *, ready=True, sleeping=False, waking=False, busy=0, idle=60.0, **extra):
    return ReplicaView(
        f"http://{name}",
        ready and not sleeping and not waking,
        busy,
        frozenset(),
        sleeping=sleeping,
        waking=waking,
        idle_seconds=0.0 if busy else idle,
        **extra,
    )


def urls(*names):
    return tuple(f"http://{n}" for n in names)


@pytest.mark.parametrize(
    ("replicas", "running", "sleeping", "slept", "woken"),
    [
        pytest.param(
            [view("a", idle=5), view("b", idle=50)], 0, 1, urls("b"), (),
            id="at zero running the least recently used replica sleeps",
        ),
        pytest.param(
            [view("a", idle=5), view("b", idle=50), view("c", idle=20)], 1, 1, urls("b"), (),
            id="one running and one asleep of three sleeps only the idlest",
        ),
        pytest.param(
            [view("a", idle=5), view("b", busy=2)], 1, 1, urls("a"), (),
            id="a replica with requests in flight is never slept, an idle one is",
        ),
        pytest.param(
            [view("a", busy=1), view("b", busy=3)], 0, 2, (), (),
            id="every replica busy sleeps none",
        ),
        pytest.param(
            [view("a", idle=0.5), view("b", idle=50)], 0, 2, urls("b"), (),
            id="a replica idle for less than sleep-after-idle is not slept yet",
        ),
        pytest.param(
            [view("a"), view("b")], 2, 1, (), (),
            id="no replica above the running target: none sleeps (the Deployment adds one)",
        ),
        pytest.param(
            [view("a"), view("b", sleeping=True)], 0, 1, (), (),
            id="the plan held: nothing to do",
        ),
        pytest.param(
            [view("a"), view("b", sleeping=True)], 2, 1, (), urls("b"),
            id="a running target above the awake replicas wakes a sleeper early",
        ),
        pytest.param(
            [view("a", sleeping=True), view("b", sleeping=True)], 0, 0, (), (),
            id="sleepers beyond the plan are left to the scale-down, not woken",
        ),
        pytest.param(
            [view("a"), view("b", sleeping=True, wake_failed=True)], 2, 1, (), (),
            id="a sleeper whose wake just failed is not woken again",
        ),
        pytest.param(
            [view("a", idle=99, sleep_mode=False), view("b", idle=5)], 0, 1, urls("b"), (),
            id="a replica without sleep mode is never chosen",
        ),
        pytest.param(
            [view("a", ready=False), view("b")], 0, 1, urls("b"), (),
            id="a replica not ready is not held and not slept",
        ),
        pytest.param(
            [view("a", waking=True), view("b", idle=50)], 1, 1, urls("b"), (),
            id="a replica waking counts as awake",
        ),
        pytest.param([], 0, 1, (), (), id="no replica at all: nothing to do"),
        pytest.param(
            [view("a", idle=99, sleep_failed=True), view("b", idle=5)], 0, 1, urls("b"), (),
            id="a replica backing off a refused sleep is passed over for another idle one",
        ),
        pytest.param(
            [view("a", sleep_failed=True), view("b", sleep_failed=True)], 0, 1, (), (),
            id="every idle replica backing off a refused sleep: none is asked",
        ),
    ],
)  # fmt: skip
def test_choose_standby(replicas, running, sleeping, slept, woken):
    moves = choose_standby(replicas, running, sleeping, min_idle=1.0)
    assert (moves.sleep, moves.wake) == (slept, woken)
    assert f"plan: {running} running, {sleeping} sleeping" in moves.reason


@pytest.mark.parametrize(
    ("replicas", "running", "sleeping", "slept", "surplus"),
    [
        pytest.param(
            [view("a", busy=3), view("b", busy=1), view("c", busy=2)], 1, 2, (), urls("b", "c"),
            id="busy replicas the plan would have asleep are surplus, least outstanding first",
        ),
        pytest.param(
            [view("a", busy=3), view("b", idle=50), view("c", busy=2)], 1, 2, urls("b"),
            urls("c"),
            id="an idle one sleeps and a busy one is made surplus to fall idle",
        ),
        pytest.param(
            [view("a", busy=3), view("b", busy=1)], 2, 2, (), (),
            id="nothing above the running target: none is surplus",
        ),
        pytest.param(
            [view("a", busy=3), view("b", busy=1, sleep_mode=False)], 1, 1, (), urls("a"),
            id="a replica that cannot sleep is never made surplus: the busier one that can is",
        ),
        pytest.param(
            [view("a", busy=3), view("b", busy=1), view("c", sleeping=True)], 1, 1, (), (),
            id="the plan's sleepers already asleep: none is surplus",
        ),
    ],
)  # fmt: skip
def test_replicas_the_plan_would_have_asleep_are_surplus_until_idle(
    replicas, running, sleeping, slept, surplus
):
    moves = choose_standby(replicas, running, sleeping, min_idle=1.0)
    assert (moves.sleep, moves.surplus) == (slept, surplus)


views = st.builds(
    view,
    st.sampled_from("abcdefgh"),
    ready=st.booleans(),
    sleeping=st.booleans(),
    waking=st.booleans(),
    busy=st.integers(0, 3),
    idle=st.floats(0, 100),
    sleep_mode=st.booleans(),
    wake_failed=st.booleans(),
    sleep_failed=st.booleans(),
)


@given(
    st.lists(views, max_size=8, unique_by=lambda v: v.url),
    st.integers(0, 8),
    st.integers(0, 8),
    st.floats(0, 100),
)
def test_never_sleeps_a_busy_replica_nor_more_than_the_plan_nor_one_the_running_need(
    replicas, running, sleeping, min_idle
):
    moves = choose_standby(replicas, running, sleeping, min_idle)
    by_url = {r.url: r for r in replicas}
    held = [r for r in replicas if r.ready or r.sleeping or r.waking]
    asleep = sum(1 for r in held if r.sleeping and not r.waking)
    assert not (moves.sleep and moves.wake)
    for url in moves.sleep:
        chosen = by_url[url]
        assert chosen.ready and chosen.outstanding == 0 and chosen.sleep_mode
        assert not chosen.sleep_failed  # a refused sleep is backed off from
        assert chosen.idle_seconds >= min_idle
    if moves.sleep:
        assert asleep + len(moves.sleep) <= sleeping  # never more than the plan holds
        assert len(held) - asleep - len(moves.sleep) >= running  # nor one the running need
    assert len(set(moves.sleep)) == len(moves.sleep)
    assert not set(moves.surplus) & set(moves.sleep)
    for url in moves.surplus:
        assert by_url[url].ready and by_url[url].sleep_mode and not by_url[url].sleep_failed
    assert len(moves.sleep) + len(moves.surplus) <= max(min(sleeping, len(held) - running), 0)
    for url in moves.wake:
        assert by_url[url].sleeping and not by_url[url].waking and not by_url[url].wake_failed
    assert len(held) - asleep + len(moves.wake) <= max(running, len(held) - asleep)


@pytest.mark.parametrize(
    ("idle_since", "outstanding", "idle"),
    [
        pytest.param(-math.inf, 0, math.inf, id="a replica never used is idle forever"),
        pytest.param(90.0, 0, 10.0, id="idle since its last request ended"),
        pytest.param(90.0, 1, 0.0, id="a request outstanding: not idle at all"),
        pytest.param(101.0, 0, 0.0, id="a clock step backwards is not negative idleness"),
    ],
)
def test_the_pool_s_view_of_idleness(idle_since, outstanding, idle):
    pool = ReplicaPool(["http://a"], GatewaySettings())
    (replica,) = pool.replicas
    replica.ready, replica.idle_since, replica.outstanding = True, idle_since, outstanding
    (seen,) = pool.views(now=100.0)
    assert seen.idle_seconds == idle


# --- real servers -------------------------------------------------------------------------

STANDBY = {"profile": LLAMA3_8B_H200.name, "standby": "true", "idleGrace": "2s"}


def completion():
    return {"model": "sim-llama", "prompt": "hello world", "max_tokens": 8}


def served(sim):
    return sim.replica.engine.metrics.success.labels("0", "sim-llama", "length")._value.get()


async def get_json(url):
    async with aiohttp.ClientSession() as client, client.get(url) as r:
        return await r.json()


async def samples(url, prefix):
    async with aiohttp.ClientSession() as client, client.get(url) as r:
        text = await r.text()
    return {
        (s.name, s.labels.get("sleep_state") or s.labels.get("result")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix)
    }


class Cluster:
    """Two sim replicas, the gateway in front of them, the scaler watching it."""

    async def start(self) -> None:
        self.sims = []
        for _ in range(2):
            sim = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", speedup=FAST)
            await sim.start()
            self.sims.append(sim)
        values: dict[str, Any] = {
            "namespace": "team-a",
            "deployment": "llama",
            "health_interval": 0.05,
            "signal_interval": 0.1,
            "rate_window": 1.0,  # the arrival rate falls to 0 a second after the last
            "standby_interval": 0.1,
            "sleep_after_idle": 0.3,
        }
        self.settings = GatewaySettings(**values)
        self.replicas = [sim.url for sim in self.sims]
        self.gateway = GatewayServer(self.replicas, self.settings, "127.0.0.1:0", "127.0.0.1:0")
        await self.gateway.start()
        source = {"address": f"127.0.0.1:{self.gateway.grpc_port}", "reconnect-min": "100ms"}
        self.scaler = ScalerServer(ScalerConfig.model_validate({"signal-sources": [source]}))
        await self.scaler.start()
        scaler = f"127.0.0.1:{self.scaler.port}"
        self.gateway.gateway.reconfigure(
            self.replicas, replace(self.settings, standby_scaler=scaler)
        )

    async def stop(self) -> None:
        await self.scaler.stop(grace=0)
        await self.gateway.stop()
        for sim in self.sims:
            await sim.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    def seen(self, sim):
        return self.gateway.gateway.pool.find(sim.url)


@pytest.fixture
async def cluster():
    made = Cluster()
    await made.start()
    yield made
    await made.stop()


async def test_after_traffic_the_surplus_replica_sleeps_and_a_request_wakes_it(cluster):
    first, second = cluster.sims
    address = f"127.0.0.1:{cluster.scaler.port}"
    async with aiohttp.ClientSession() as client:
        async with grpc.aio.insecure_channel(address) as channel:
            keda_stub = keda_grpc.ExternalScalerStub(channel)
            await keda_stub.GetMetricSpec(ref(**STANDBY), timeout=5)  # KEDA learns of it
            await eventually(lambda: cluster.seen(second).routable, "both replicas ready")
            for _ in range(5):  # one at a time: each goes to the first listed
                async with client.post(f"{cluster.url}/v1/completions", json=completion()) as r:
                    assert r.status == 200
            assert (served(first), served(second)) == (5, 0)

            # Idle past the grace: the decision runs none, the plan holds one asleep.
            await eventually(lambda: second.replica.engine.is_sleeping, "the surplus sleeps", 60)
            assert (await get_json(f"{second.url}/is_sleeping")) == {"is_sleeping": True}
            state = await samples(f"{second.url}/metrics", "vllm:engine_sleep_state")
            assert state[("vllm:engine_sleep_state", "weights_offloaded")] == 1.0
            assert state[("vllm:engine_sleep_state", "awake")] == 0.0
            assert not first.replica.engine.is_sleeping  # the used one stays awake
            request = keda.GetMetricsRequest(
                scaledObjectRef=ref(**STANDBY), metricName="unitscale-desired-replicas"
            )
            (value,) = (await keda_stub.GetMetrics(request, timeout=5)).metricValues
            assert value.metricValueFloat == 1.0  # 0 running + 1 sleeping: the pod is kept
            assert (await keda_stub.IsActive(ref(**STANDBY), timeout=5)).result
            decision = cluster.scaler.registry.get("team-a", "llama").decision
            assert (decision.desired_replicas, decision.sleeping_replicas) == (0, 1)
            gateway = await samples(f"{cluster.url}/metrics", "unitscale_gateway_sleeps")
            assert gateway[("unitscale_gateway_sleeps_total", "slept")] == 1.0
            assert gateway[("unitscale_gateway_sleeps_total", "failed")] == 0.0

            # The Deployment keeps one pod (metric 1): the awake surplus goes.
            await first.stop()
            await eventually(lambda: not cluster.seen(first).ready, "the stopped one is down")
            async with client.post(f"{cluster.url}/v1/completions", json=completion()) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 8
            assert served(second) == 1
            woken = await samples(f"{cluster.url}/metrics", "unitscale_gateway_wakes")
            assert woken[("unitscale_gateway_wakes_total", "woken")] == 1.0


async def test_without_a_standby_scaled_object_nothing_sleeps_and_the_reason_is_kept(cluster):
    await eventually(lambda: cluster.gateway.gateway.standby_problem is not None, "asked")
    assert "NOT_FOUND" in cluster.gateway.gateway.standby_problem
    assert "'team-a'/'llama' with standby: true" in cluster.gateway.gateway.standby_problem
    assert not any(sim.replica.engine.is_sleeping for sim in cluster.sims)


async def test_two_standby_scaled_objects_for_one_workload_are_not_guessed_between(scaler, stub):
    client = StandbyClient()
    try:
        address = f"127.0.0.1:{scaler.port}"
        assert "NOT_FOUND" in str(await client.plan(address, "team-a", "llama", 5))
        await stub.GetMetricSpec(ref(**STANDBY))
        waiting = await client.plan(address, "team-a", "llama", 5)
        assert "no standby plan yet from team-a/llama" in str(waiting)
        twin = keda.ScaledObjectRef(
            name="llama-twin", namespace="team-a", scalerMetadata=ref(**STANDBY).scalerMetadata
        )
        await stub.GetMetricSpec(twin)
        problem = await client.plan(address, "team-a", "llama", 5)
        assert getattr(problem, "message", problem) == (
            "2 ScaledObjects scale team-a/llama with standby: team-a/llama, team-a/llama-twin"
        )
    finally:
        await client.close()


class PlanFrom:
    """A scaler stand-in for one round: always this plan."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    async def plan(self, address: str, namespace: str, deployment: str, rpc_seconds: float) -> Plan:
        return self._plan


@contextlib.asynccontextmanager
async def engine_with_sleep(
    sleep: Callable[[web.Request], Awaitable[web.StreamResponse]], state: dict[str, bool]
) -> AsyncIterator[str]:
    """A vLLM stand-in on 127.0.0.1:0: healthy, one model, ``state`` as ``/is_sleeping``,
    ``sleep`` answering ``POST /sleep``; yields its URL."""

    async def health(request):
        return web.Response()

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "sim-llama"}]})

    async def is_sleeping(request):
        return web.json_response(state)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_post("/sleep", sleep)
    async with served_app(app) as url:
        yield url


async def test_a_sleep_the_replica_refuses_is_counted_and_it_stays_routable(caplog):
    caplog.set_level(logging.WARNING, logger="serving.gateway")

    async def refuse(request):
        return web.json_response({"error": "busy"}, status=500)

    async with engine_with_sleep(refuse, {"is_sleeping": False}) as url:
        settings = GatewaySettings(health_interval=0.05, sleep_after_idle=0.0)
        gateway = GatewayServer([url], settings, "127.0.0.1:0", "127.0.0.1:0")
        await gateway.start()
        try:
            replica = gateway.gateway.pool.find(url)
            await eventually(lambda: replica.routable, "ready")
            await gateway.gateway._standby_round(PlanFrom(Plan(0, 1, "test")), "unused")
            metrics = await samples(f"http://127.0.0.1:{gateway.port}/metrics", "unitscale_gateway")
        finally:
            await gateway.stop()
    assert metrics[("unitscale_gateway_sleeps_total", "failed")] == 1.0
    assert metrics[("unitscale_gateway_sleeps_total", "slept")] == 0.0
    assert replica.routable and not replica.sleeping and not replica.falling_asleep
    (warning,) = [r.getMessage() for r in caplog.records if "sleep failed" in r.getMessage()]
    assert url in warning and "HTTP 500" in warning


async def test_a_sleep_left_unanswered_is_routed_nothing_until_the_replica_says_it_is_awake():
    # vLLM's sleep with mode=wait pauses at once and answers once the batch ends: a batch
    # longer than the timeout leaves the engine pausing, and a request routed there then
    # waits unscheduled in its queue until someone wakes it.
    asked = asyncio.Event()
    release = asyncio.Event()
    state = {"is_sleeping": False}

    async def sleep_until_released(request):
        state["is_sleeping"] = True  # paused from the moment it is asked, as vLLM is
        asked.set()
        await release.wait()
        return web.json_response({})

    async with engine_with_sleep(sleep_until_released, state) as url:
        # One health check at the start, the next only when the test asks for it.
        settings = GatewaySettings(health_interval=600.0, sleep_after_idle=0.0, wake_timeout=0.2)
        gateway = GatewayServer([url], settings, "127.0.0.1:0", "127.0.0.1:0")
        await gateway.start()
        try:
            replica = gateway.gateway.pool.find(url)
            await eventually(lambda: replica.routable, "ready")
            await gateway.gateway._standby_round(PlanFrom(Plan(0, 1, "test")), "unused")
            assert asked.is_set()
            assert not replica.routable and replica.wakeable  # held asleep, woken on demand
            metrics = await samples(f"http://127.0.0.1:{gateway.port}/metrics", "unitscale_gateway")
            assert metrics[("unitscale_gateway_sleeps_total", "failed")] == 1.0

            state["is_sleeping"] = False  # the engine says it never slept: routable again
            gateway.gateway.pool._recheck.set()
            await eventually(lambda: replica.routable, "routable once it says it is awake")
        finally:
            release.set()
            await gateway.stop()
