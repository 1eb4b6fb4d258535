"""The exporter under hostile pass 7 (issue 27): its ``/metrics``, and replicas' buckets.

XS-M1: the exporter made its ``/metrics`` body afresh for every
scrape on the event loop that also runs the scrape cycle and the signal streams: 0.5 s
and 5.8 MB at 3,000 replicas, so a few clients scraping in a loop delayed every cycle
(its replicas' scrapes timing out, the deployment partial) and the scaler's signals.
It now answers through ``foundation.loop_share.LoopShare``: a new body only once the
last is older than its CPU cost over a tenth. The cost is faked (a second of CPU a body).

XS-M3: the ``model`` label of every family was the last answering replica's
``model_name``, each cycle: a replica naming a new model each scrape gave each family a new
series each cycle, for good in Prometheus. It now stays while an answering replica
reports it, and moves at most once every ``MODEL_LABEL_HOLD``.

XS-M4: aiohttp followed any redirect a replica answered: one answering ``302`` to
another host had the exporter fetch it (a cloud metadata URL, an internal service) and
the first line of that answer was quoted in the exporter's log as a parse error. A
scrape now follows at most two redirects, each within the replica's own origin.

XS-H2: a replica whose histogram buckets changed dropped its history whole, counters
too, so it had no window and the deployment's rates were the other replicas' alone,
neither partial nor missing: one whose buckets moved every scrape hid its load for good
(two replicas at 20 requests/s each published 20), and the scaler planned for half the
load. The counters now go on under the new buckets; only the buckets are unknown over
the change.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.core import Metric

import exporter.collector
from exporter.app import ExporterServer
from exporter.config import ExporterConfig
from exporter.runtime import MODEL_LABEL_HOLD, Exporter
from exporter.scrape import scrape
from tests.conftest import FakeClock
from tests.fake_engines import HOSTILE, FakeReplicaServer, FakeVllm

ASKS = 20


@pytest.mark.parametrize(
    ("path", "bodies"),
    [
        pytest.param("/metrics", 1, id="scrapes of /metrics in a loop make one body"),
        pytest.param(
            "/metrics?name[]=unitscale_target_up",
            1,
            id="scrapes asking for one family in a loop make one body too",
        ),
    ],
)
async def test_a_body_costing_a_second_is_made_once_for_scrapes_within_ten_seconds(
    monkeypatch: pytest.MonkeyPatch, path: str, bodies: int
) -> None:
    spent = iter(range(10**9))
    monkeypatch.setattr(time, "thread_time", lambda: float(next(spent)))
    made: list[int] = []
    collect = exporter.collector.SignalsCollector.collect

    def counted(self: exporter.collector.SignalsCollector) -> Iterator[Metric]:
        made.append(1)
        return collect(self)

    monkeypatch.setattr(exporter.collector.SignalsCollector, "collect", counted)
    server = ExporterServer(ExporterConfig(), "127.0.0.1:0", "127.0.0.1:0")
    http_port, _ = await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(ASKS):
                async with session.get(f"http://127.0.0.1:{http_port}{path}") as response:
                    await response.read()
                    assert response.status == 200
    finally:
        await server.stop(0)
    assert len(made) == bodies  # was one a scrape: 20 seconds of the loop for 20 scrapes


CYCLES = 6
"""Scrapes 5 s apart, each after both replicas finished 100 requests: 20 a second each."""


@pytest.mark.parametrize(
    "moves",
    [
        pytest.param(
            set(range(CYCLES)), id="a replica whose buckets move every scrape counts in the rates"
        ),
        pytest.param(
            {CYCLES - 1},
            id="a replica whose buckets change at the last scrape (an upgrade) counts in the rates",
        ),
    ],
)
async def test_a_replica_whose_buckets_change_still_counts_in_the_rates(
    monkeypatch: pytest.MonkeyPatch, moves: set[int]
) -> None:
    cycle = 0

    def moving(body: bytes) -> bytes:  # the first ttft bound, moved on the cycles named
        bound = f'le="{0.001 + cycle * 1e-6:g}"' if cycle in moves else 'le="0.001"'
        return body.replace(b'le="0.001"', bound.encode())

    monkeypatch.setitem(HOSTILE, "moving-buckets", moving)
    replicas = await FakeReplicaServer(2).start()
    replicas.replicas[1].mode = "moving-buckets"
    clock = FakeClock(1000.0)
    config = ExporterConfig.model_validate(
        {
            "interval": "5s",
            "timeout": "2s",
            "deployments": [
                {"namespace": "team-a", "deployment": "llama", "targets": [
                    replicas.url(0), replicas.url(1)
                ]}
            ],
        }
    )  # fmt: skip
    exporter = Exporter(config, clock)
    try:
        async with aiohttp.ClientSession() as session:
            for cycle in range(CYCLES):  # noqa: B007 - moving() reads it
                for replica in replicas.replicas:
                    replica.finish(100, prompt=100, output=50, ttft=0.1, itl=0.02, e2e=1.0)
                await exporter.cycle(session)
                clock.now += 5.0
    finally:
        exporter.close()
        await replicas.stop()
    signals = exporter.deployments[0].signals
    assert signals is not None
    assert signals.stable.request_rate == pytest.approx(40.0)  # was 20: one replica's
    assert signals.stable.generation_token_rate == pytest.approx(2000.0)
    assert signals.stable.ttft.p95 is not None  # the steady replica's buckets still read


@pytest.mark.parametrize(
    ("names", "step", "labels"),
    [
        pytest.param(
            [("a",), ("b",), ("c",), ("d",), ("e",)],
            5.0,
            ["a"],
            id="a replica naming a new model each scrape keeps its first label",
        ),
        pytest.param(
            [("a", "a"), ("a", "b"), ("b", "a"), ("a", "b")],
            5.0,
            ["a"],
            id="two replicas on different models keep the label either reports",
        ),
        pytest.param(
            [("a", "a"), ("b", "b"), ("b", "b")],
            MODEL_LABEL_HOLD,
            ["a", "b"],
            id="every replica moving to a new model (an upgrade) moves the label",
        ),
        pytest.param(
            [("a",), ("b",), ("c",), ("d",)],
            MODEL_LABEL_HOLD / 2,
            ["a", "c"],
            id="a label moves at most once a hold",
        ),
    ],
)
async def test_the_model_label_stays_while_a_replica_reports_it(
    names: list[tuple[str, ...]], step: float, labels: list[str]
) -> None:
    replicas = await FakeReplicaServer(len(names[0])).start()
    clock = FakeClock(1000.0)
    config = ExporterConfig.model_validate(
        {
            "interval": "5s",
            "timeout": "2s",
            "deployments": [
                {
                    "namespace": "team-a",
                    "deployment": "llama",
                    "targets": [replicas.url(i) for i in range(len(names[0]))],
                }
            ],
        }
    )
    exporter = Exporter(config, clock)
    seen: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            for cycle in names:
                for replica, name in zip(replicas.replicas, cycle, strict=True):
                    replica.model = name
                    replica.restart()
                await exporter.cycle(session)
                label = exporter.deployments[0].model_label
                if not seen or seen[-1] != label:
                    seen.append(label)
                clock.now += step
    finally:
        exporter.close()
        await replicas.stop()
    assert seen == labels


async def serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


@pytest.mark.parametrize(
    ("where", "error", "detail"),
    [
        pytest.param(
            "http://localhost:{secret}/latest/meta-data",
            "http",
            "HTTP 302: redirected off the replica (not followed)",
            id="a redirect to another host is not followed and nothing of its answer is logged",
        ),
        pytest.param(
            "/metrics/",
            None,
            "",
            id="a redirect within the replica (/metrics to /metrics/) is followed",
        ),
        pytest.param(
            "/metrics",
            "http",
            "HTTP 302: redirected again",
            id="a redirect loop within the replica stops after two",
        ),
    ],
)
async def test_a_scrape_follows_redirects_only_within_the_replica(
    where: str, error: str | None, detail: str
) -> None:
    asked: list[str] = []
    secret = web.Application()

    async def metadata(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(text="internal-secret-token\n")

    secret.router.add_get("/latest/meta-data", metadata)
    secret_runner, secret_port = await serve(secret)
    body = FakeVllm().body()
    replica = web.Application()

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound(where.format(secret=secret_port))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body)

    replica.router.add_get("/metrics", moved)
    replica.router.add_get("/metrics/", metrics)
    replica_runner, port = await serve(replica)
    try:
        async with aiohttp.ClientSession() as session:
            result = await scrape(session, f"http://127.0.0.1:{port}/metrics", 5.0)
    finally:
        await replica_runner.cleanup()
        await secret_runner.cleanup()
    assert (result.error, result.detail) == (error, detail)
    assert asked == []  # the other host was never asked
    assert (result.stats is not None) == (error is None)
