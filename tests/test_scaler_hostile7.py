"""Answers anyone may ask for back to back take at most a tenth of the scaler's event loop.

Issue 27, hostile pass 7:

- SY-H1: the scaler's ``/metrics`` (``--metrics-listen``) made its body afresh for every
  scrape on the event loop: 1.0 s and 6.9 MB at 10,000 ScaledObjects, so a few clients
  scraping in a loop left no time for KEDA's calls (their answers late past KEDA's
  timeout: its fallback), the signal watches or the push decisions.
- SY-H2: ``GetInferenceDemand`` walked and encoded every pooled ScaledObject per call:
  0.28 s at 10,000, the same starvation from anyone who can reach the gRPC port, with a
  pool name or none.

Both now answer through ``foundation.loop_share.LoopShare``: a new answer is made only
once the last is older than its CPU cost over a tenth. Its cost is faked here (each
answer "costs" a second of CPU), so the tests need no large registry and no timing.

- SY-H3: the registry kept a target's set when its last ScaledObject left it (an edit
  naming another deployment, or an eviction), so a client editing one ScaledObject to
  name a new deployment each call grew the scaler by a target a call, for good (50,000
  edits: +28 MiB), and every Prometheus round and eviction walked them all.
- SY-H4: a Prometheus round queried every target (18 queries each) with no bound, in
  name order: 10,000 ScaledObjects from anyone who can call GetMetricSpec made a round
  take about a minute, every deployment's signals stale between rounds (UNAVAILABLE),
  and names sorting first went first. A round now takes at most 100 targets per
  ``max-concurrent-queries``, the longest known first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

import scaler.service
import scaler.telemetry
from foundation.loop_share import FREE, SHARE, LoopShare
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc
from scaler.config import PrometheusSourceConfig, ScalerConfig
from scaler.registry import ScaledObjectRegistry
from scaler.server import ScalerServer
from scaler.signals import SignalStore
from scaler.sources import TARGETS_PER_QUERY_SLOT, prometheus_source, receive
from tests.conftest import T0, FakeClock, engine_signals, eventually, ref

ASKS = 20


@pytest.fixture
def a_second_of_cpu_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer made costs one second of CPU, as at 10,000 ScaledObjects."""
    spent = iter(range(10**9))
    monkeypatch.setattr(time, "thread_time", lambda: float(next(spent)))


def counted(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Count calls of ``owner.name``: the work behind one answer, fix or no fix."""
    calls: list[int] = []
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


async def scrape_metrics(server: ScalerServer) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(ASKS):
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            async with session.get(url) as response:
                assert response.status == 200
                assert b"unitscale_scaler_signals_available" in await response.read()


async def ask_demand(server: ScalerServer, pool: str = "") -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        keda = keda_grpc.ExternalScalerStub(channel)
        await keda.GetMetricSpec(ref("llama", pool="h200", acceleratorsPerReplica="8"))
        receive(server.store, engine_signals("llama", queue=8.0, running=32.0))
        capacity = capacity_pb2_grpc.CapacityServiceStub(channel)
        for _ in range(ASKS):
            request = capacity_pb2.GetInferenceDemandRequest(pool=pool)
            try:
                answer = await capacity.GetInferenceDemand(request)
                assert [p.pool for p in answer.pools] == ["h200"]
                assert answer.pools[0].accelerators_needed == 24.0
            except grpc.aio.AioRpcError as err:
                assert pool == "gpu-nobody-declares"
                assert err.code() == grpc.StatusCode.NOT_FOUND
                assert "(pools: h200)" in (err.details() or "")


CASES = [
    pytest.param(
        (scaler.telemetry.DecisionCollector, "collect"),
        scrape_metrics,
        id="scrapes of the scaler's /metrics in a loop make one body",
    ),
    pytest.param(
        (scaler.service, "pool_demand"),
        ask_demand,
        id="GetInferenceDemand for every pool in a loop makes one answer",
    ),
    pytest.param(
        (scaler.service, "pool_demand"),
        lambda server: ask_demand(server, "h200"),
        id="GetInferenceDemand for one pool in a loop makes one answer",
    ),
    pytest.param(
        (scaler.service, "pool_demand"),
        lambda server: ask_demand(server, "gpu-nobody-declares"),
        id="GetInferenceDemand for a pool nobody declares in a loop makes one answer",
    ),
]


@pytest.mark.usefixtures("a_second_of_cpu_each")
@pytest.mark.parametrize(("work", "ask"), CASES)
async def test_an_answer_costing_a_second_is_made_once_for_asks_within_ten_seconds(
    monkeypatch: pytest.MonkeyPatch,
    work: tuple[Any, str],
    ask: Callable[[ScalerServer], Any],
) -> None:
    calls = counted(monkeypatch, *work)
    server = ScalerServer(
        ScalerConfig(max_signal_age=30.0),
        "127.0.0.1:0",
        clock=FakeClock(),
        metrics_listen="127.0.0.1:0",
    )
    await server.start()
    try:
        await ask(server)
    finally:
        await server.stop(0)
    assert len(calls) == 1  # was one per ask: 20 seconds of the loop for 20 asks


class Clocks:
    """A monotonic clock and a CPU clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 0.0

    def making(self, cost: float, answer: str = "answer") -> Callable[[], str]:
        def make() -> str:
            self.cpu += cost
            return answer

        return make

    def share(self, make: Callable[[], str]) -> LoopShare[str]:
        return LoopShare(make, clock=lambda: self.now, cpu=lambda: self.cpu)


@pytest.mark.parametrize(
    ("cost", "later", "made"),
    [
        pytest.param(FREE / 2, 0.0, 2, id="an answer cheaper than free is made afresh each time"),
        pytest.param(1.0, 1.0 / SHARE - 0.01, 1, id="one costing a second is kept ten seconds"),
        pytest.param(1.0, 1.0 / SHARE, 2, id="and made again once ten seconds old"),
        pytest.param(1.0, -5.0, 2, id="a clock gone back makes a new one"),
    ],
)
def test_an_answer_lasts_its_cost_over_the_share(cost: float, later: float, made: int) -> None:
    clocks = Clocks()
    share = clocks.share(clocks.making(cost))
    share.get()
    clocks.now += later
    share.get()
    assert share.made == made


def test_an_answer_that_raises_keeps_nothing_and_the_next_ask_makes_one() -> None:
    clocks = Clocks()
    attempts = iter([True, False])

    def make() -> str:
        clocks.cpu += 1.0
        if next(attempts):
            raise RuntimeError("a bug")
        return "answer"

    share = clocks.share(make)
    with pytest.raises(RuntimeError):
        share.get()
    assert share.get() == "answer"


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=FREE, max_value=10.0),  # what each answer costs
            st.floats(min_value=0.0, max_value=5.0),  # seconds until the next ask
        ),
        min_size=1,
        max_size=60,
    )
)
def test_making_answers_takes_at_most_the_share_of_the_time_however_often_asked(
    asks: list[tuple[float, float]],
) -> None:
    clocks = Clocks()
    costs: Iterator[float] = iter(cost for cost, _ in asks)
    spent: list[tuple[float, float]] = []  # (when made, what it cost)

    def make() -> str:
        cost = next(costs)
        clocks.cpu += cost
        clocks.now += cost  # making it takes its time on the loop
        spent.append((clocks.now, cost))
        return "answer"

    share = clocks.share(make)
    for _, wait in asks:
        share.get()
        clocks.now += wait
    # Every answer but the last was kept for its cost over the share before the next.
    first, last = spent[0][0], spent[-1][0]
    assert sum(cost for _, cost in spent[:-1]) <= SHARE * (last - first) + 1e-9


def edits_of_one(registry: ScaledObjectRegistry, clock: FakeClock, count: int) -> None:
    for n in range(count):
        clock.now += 1.0
        registry.resolve("llama", "team-a", {"scalerAddress": "x:1", "deployment": f"d-{n}"})


def new_ones_forgotten(registry: ScaledObjectRegistry, clock: FakeClock, count: int) -> None:
    for n in range(count):
        registry.resolve(f"so-{n}", "team-a", {"scalerAddress": "x:1", "deployment": f"d-{n}"})
        clock.now += 120.0
        registry.evict_idle(60.0)


@pytest.mark.parametrize(
    ("churn", "left"),
    [
        pytest.param(edits_of_one, 1, id="an edit naming a new deployment each call"),
        pytest.param(new_ones_forgotten, 0, id="new ScaledObjects each forgotten after the ttl"),
    ],
)
def test_targets_nothing_scales_any_more_are_not_kept(
    churn: Callable[[ScaledObjectRegistry, FakeClock, int], None], left: int
) -> None:
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    churn(registry, clock, 2_000)
    assert len(registry.targets()) == left
    assert len(registry._by_target) == left  # was 2,000: one a call, for good


async def answer_one(request: web.Request) -> web.Response:
    """A Prometheus answering every query with one series of value 1."""
    sample = {"metric": {}, "value": [T0, "1"]}
    data = {"resultType": "vector", "result": [sample]}
    return web.json_response({"status": "success", "data": data})


@pytest.mark.parametrize(
    ("kept", "junk"),
    [
        pytest.param(
            TARGETS_PER_QUERY_SLOT,
            20,
            id="names sorting first asked about last get no signals past the bound",
        ),
        pytest.param(TARGETS_PER_QUERY_SLOT, 0, id="targets within the bound are all queried"),
    ],
)
async def test_a_round_queries_at_most_its_bound_the_longest_known_first(
    caplog: pytest.LogCaptureFixture, kept: int, junk: int
) -> None:
    app = web.Application()
    app.router.add_get("/api/v1/query", answer_one)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    known = [("team-a", f"zz-known-{n}", "") for n in range(kept)]  # KEDA's, asked first
    new = [("team-a", f"aa-junk-{n}", "") for n in range(junk)]
    store = SignalStore(FakeClock(T0))
    config = PrometheusSourceConfig.model_validate(
        {"url": f"http://127.0.0.1:{port}", "interval": "0.05s", "max-concurrent-queries": 1}
    )
    caplog.set_level(logging.WARNING, logger="scaler.sources")
    caplog.set_level(logging.WARNING, logger="scaler.signals")
    asked: list[int] = []

    def targets() -> list[tuple[str, str, str]]:
        asked.append(1)
        return [*known, *new]

    rounds = asyncio.create_task(prometheus_source(config, store, targets))
    try:
        # Every target's round runs on its own: wait for each known one's signals, and
        # for rounds after them (the warning is given once, not once a round).
        await eventually(
            lambda: all(store.get(target) is not None for target in known),
            "every known target's signals",
            limit=60,
        )
        seen = len(asked)
        await eventually(lambda: len(asked) >= seen + 2, "two rounds more", limit=60)
    finally:
        rounds.cancel()
        await runner.cleanup()
    assert all(store.get(target) is not None for target in known)
    assert all(store.get(target) is None for target in new)  # queried first, were
    warned = [r for r in caplog.records if "more targets than a round queries" in r.message]
    assert len(warned) == (1 if junk else 0)  # once, not once a round
