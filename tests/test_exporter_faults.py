"""A hostile replica fails alone, and a broken scrape loop never looks healthy.

Every test here serves real HTTP on 127.0.0.1 (``tests.fake_engines``) and drives the
exporter's own loop, its ``/healthz`` and its gRPC health service.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from exporter import grpc_service
from exporter import runtime as runtime_module
from exporter import scrape as scrape_module
from exporter.app import ExporterServer
from exporter.config import ExporterConfig
from exporter.engines import read_exposition
from exporter.runtime import Exporter
from foundation.signals import Snapshot
from protos.unitscale.v1 import signals_pb2 as sig
from protos.unitscale.v1 import signals_pb2_grpc as sig_grpc
from scaler.core import DecisionState, Policy, decide
from scaler.signals import SignalStore, observe
from tests.conftest import FakeClock, eventually
from tests.fake_engines import LONG_LINE, FakeReplicaServer
from tests.test_watch_objects_hostile import FakeApi, listing

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def replicas():
    server = await FakeReplicaServer(2).start()
    yield server
    await server.stop()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as client:
        yield client


def config_for(*deployments, **top):
    return ExporterConfig.model_validate(
        {
            "interval": "5s",
            "timeout": "2s",
            "max-body-bytes": 1 << 20,
            "max-series": 1000,
            **top,
            "deployments": [
                {"namespace": "team-a", "deployment": name, "targets": targets}
                for name, targets in deployments
            ],
        }
    )


@pytest.mark.parametrize(
    ("mode", "reason", "missing"),
    [
        pytest.param(
            "bad-bucket-bound", "parse", None, id="a-bad-bucket-bound-fails-only-its-target"
        ),
        pytest.param(
            "non-utf8-comment", None, (), id="bytes-that-are-not-utf8-in-a-comment-are-harmless"
        ),
        pytest.param(
            "non-utf8-label", "parse", None, id="bytes-that-are-not-utf8-in-a-wanted-sample-fail-it"
        ),
        pytest.param("too-large", "too-large", None, id="a-body-over-the-cap-is-never-parsed"),
        pytest.param(
            "chunked-too-large",
            "too-large",
            None,
            id="a-body-without-content-length-is-cut-at-the-cap",
        ),
        pytest.param(
            "gzip-bomb", "too-large", None, id="a-gzip-bomb-is-cut-at-the-cap-after-decompressing"
        ),
        pytest.param(
            "too-many-series",
            "too-many-series",
            None,
            id="more-series-than-the-cap-fail-the-target",
        ),
        pytest.param(
            "negative-gauges",
            None,
            ("running", "waiting"),
            id="negative-gauges-are-no-measurement",
        ),
        pytest.param(
            "duplicate-series",
            None,
            ("running",),
            id="a-series-sent-twice-with-different-values-is-no-measurement",
        ),
        pytest.param(
            "long-malformed-line", "parse", None, id="a-megabyte-malformed-line-is-a-parse-failure"
        ),
    ],
)
async def test_a_hostile_replica_fails_alone(replicas, session, mode, reason, missing):
    good, bad = replicas.url(0), replicas.url(1)
    replicas.replicas[0].set_load(running=3, waiting=1, kv=0.2)
    replicas.replicas[1].set_load(running=7, waiting=4, kv=0.5)
    replicas.replicas[1].mode = mode
    exporter = Exporter(config_for(("llama", [good, bad])), FakeClock(1000.0))
    await exporter.cycle(session)  # raises nothing, whatever the replica sent

    state = exporter.deployments[0]
    assert state.status[good].up
    status = state.status[bad]
    signals = state.signals
    assert signals is not None
    if reason is not None:
        assert not status.up and status.errors[reason] == 1
        assert sum(status.errors.values()) == 1
        assert (signals.replicas, signals.replicas_up) == (2, 1)
        assert (signals.running, signals.queue_depth) == (3.0, 1.0)  # the good one's alone
    else:
        assert status.up and sum(status.errors.values()) == 0
        assert sum(status.rejected.values()) == len(missing)
        # Unmeasured on one answering replica is unmeasured for the deployment: never
        # 3 - 5, never 3 + max(7, 40), and never the good one's 3 alone (read as all of
        # it, an idle replica's 0 beside a busy one's NaN scaled to zero).
        if "running" in missing:
            assert signals.running is None
        if "waiting" in missing:
            assert signals.queue_depth is None
    assert signals.partial == (reason is not None or bool(missing))


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("http-500", id="a busy replica that fails its scrape hides its load"),
        pytest.param(
            "negative-gauges", id="a busy replica whose gauges are rejected hides its load"
        ),
    ],
)
async def test_a_replica_hiding_its_load_never_scales_the_deployment_to_zero(
    replicas, session, mode
):
    """An idle replica's 0 beside a busy one that says nothing usable is no idle deployment."""
    replicas.replicas[0].set_load(running=0, waiting=0, kv=0.0)
    replicas.replicas[1].set_load(running=7, waiting=4, kv=0.5)
    replicas.replicas[1].mode = mode
    clock = FakeClock(1000.0)
    exporter = Exporter(config_for(("llama", [replicas.url(0), replicas.url(1)])), clock)
    await exporter.cycle(session)
    clock.now += 5.0
    await exporter.cycle(session)  # rates over flat counters: 0 requests finished
    signals = exporter.deployments[0].signals
    assert signals is not None

    store = SignalStore(clock)
    store.update(Snapshot(exporter.deployments[0].key, signals))
    observation, _ = observe(
        exporter.deployments[0].key, store.get(exporter.deployments[0].key), clock(), 30.0
    )
    long_quiet = DecisionState(desired=2, last_activity=clock() - 10_000)
    decision = decide(observation, Policy(), long_quiet)
    assert decision.desired_replicas >= 1, decision.reason
    assert "scale to zero" not in decision.reason


async def test_a_reader_that_crashes_on_one_target_is_that_targets_internal_error(
    replicas, session, monkeypatch
):
    real = read_exposition

    def crashing(body, *args, **kwargs):
        if b'model_name="boom"' in body:
            raise RuntimeError("a bug in the reader")
        return real(body, *args, **kwargs)

    monkeypatch.setattr(scrape_module, "read_exposition", crashing)
    replicas.replicas[1].model = "boom"
    replicas.replicas[1].restart()
    exporter = Exporter(config_for(("llama", [replicas.url(0), replicas.url(1)])), FakeClock())
    await exporter.cycle(session)
    state = exporter.deployments[0]
    assert state.status[replicas.url(0)].up
    assert state.status[replicas.url(1)].errors["internal"] == 1
    assert "RuntimeError: a bug in the reader" in state.status[replicas.url(1)].last_error


async def test_a_deployment_whose_publishing_fails_leaves_the_others_published(replicas, session):
    config = config_for(("llama", [replicas.url(0)]), ("qwen", [replicas.url(1)]))
    exporter = Exporter(config, FakeClock())
    published = []

    def listener(state):
        if state.config.deployment == "llama":
            raise ValueError("cannot encode")
        published.append(state.config.deployment)

    exporter.add_listener(listener)
    await exporter.cycle(session)
    await exporter.cycle(session)
    assert published == ["qwen", "qwen"]
    assert exporter.cycles == 2


async def test_parsing_runs_off_the_event_loop_and_inside_the_scrape_deadline(
    replicas, session, monkeypatch
):
    release = threading.Event()
    threads = []

    def stuck(*args, **kwargs):
        threads.append(threading.current_thread())
        release.wait(5)  # a cap, not a synchronisation: the test releases it
        raise AssertionError("a parse past its deadline is never waited for")

    monkeypatch.setattr(scrape_module, "read_exposition", stuck)
    # Room for the connect and the fetch on busy cores (300 ms were spent connecting in
    # a CI run beside other work); the parse then holds until the deadline.
    config = config_for(("llama", [replicas.url(0)]), timeout="2s")
    exporter = Exporter(config, FakeClock())
    try:
        await exporter.cycle(session)
    finally:
        release.set()
    status = exporter.deployments[0].status[replicas.url(0)]
    assert threads and threads[0] is not threading.main_thread()
    assert status.errors["timeout"] == 1 and "parse" in status.last_error


async def test_a_malformed_megabyte_line_is_logged_once_in_a_bounded_excerpt(
    replicas, session, caplog
):
    replicas.replicas[1].mode = "long-malformed-line"
    exporter = Exporter(config_for(("llama", [replicas.url(0), replicas.url(1)])), FakeClock())
    with caplog.at_level(logging.WARNING, logger="exporter"):
        for _ in range(3):
            await exporter.cycle(session)
    about = [r.getMessage() for r in caplog.records if replicas.url(1) in r.getMessage()]
    assert len(about) == 1, about  # once per change, not once per scrape
    assert len(about[0]) < 500
    assert f"{LONG_LINE + len('vllm:num_requests_running{'):,} characters" in about[0]


def served(config, **kwargs):
    return ExporterServer(config.model_copy(update={"interval": 0.2, "timeout": 0.15}), **kwargs)


async def healthz(port):
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{port}/healthz") as response:
            return response.status, await response.json()


async def grpc_health(port):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = await stub.Check(health_pb2.HealthCheckRequest(service=""))
        return response.status


async def metric(port, name):
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} is not exported")


async def until(check, what, limit=15.0):
    """Poll an async ``check`` until it is true; the cap only guards against hangs."""
    result = {"ok": False}

    async def probe():
        result["ok"] = await check()

    deadline = asyncio.get_running_loop().time() + limit
    while True:
        await probe()
        if result["ok"]:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: still false after {limit:.0f}s")
        await asyncio.sleep(0.05)


async def test_the_loop_keeps_cycling_past_a_replica_with_a_bad_bucket_bound(replicas):
    replicas.replicas[0].set_load(running=2, waiting=5, kv=0.1)
    replicas.replicas[1].mode = "bad-bucket-bound"
    server = served(config_for(("llama", [replicas.url(0), replicas.url(1)])))
    http_port, grpc_port = await server.start()
    try:
        await eventually(lambda: server.exporter.cycles >= 3, "three cycles past the bad one")
        status, body = await healthz(http_port)
        assert status == 200 and body["cycles"] >= 3
        assert await grpc_health(grpc_port) == SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            got = await sig_grpc.SignalsServiceStub(channel).GetSignals(sig.GetSignalsRequest())
        (signals,) = got.signals
        assert signals.partial and signals.engine.queue_depth == 5.0
        assert server.exporter.deployments[0].status[replicas.url(1)].errors["parse"] >= 3
    finally:
        await server.stop()


async def test_a_failing_loop_restarts_with_backoff_and_is_unhealthy_until_it_recovers(
    replicas,
):
    server = served(config_for(("llama", [replicas.url(0)])))
    recovered = asyncio.Event()
    real = server.exporter.cycle

    async def failing(session):
        if not recovered.is_set():
            raise RuntimeError("the cycle broke")
        await real(session)

    server.exporter.cycle = failing
    http_port, grpc_port = await server.start()
    try:

        async def unhealthy():
            return (await healthz(http_port))[0] == 503 and await grpc_health(grpc_port) == (
                NOT_SERVING
            )

        await until(unhealthy, "unhealthy while every cycle fails")
        _, body = await healthz(http_port)
        assert "no scrape cycle completed" in body["problem"]
        await until(
            lambda: _at_least(metric(http_port, "unitscale_exporter_loop_restarts_total"), 2),
            "two restarts counted",
        )
        recovered.set()

        async def healthy():
            return (await healthz(http_port))[0] == 200 and await grpc_health(grpc_port) == SERVING

        await until(healthy, "healthy again once cycles complete")
        assert server.exporter.cycles >= 1
    finally:
        await server.stop()


async def test_parse_threads_that_cannot_start_make_it_unhealthy_until_they_start(
    replicas, monkeypatch
):
    """A failed ``Thread.start`` once froze every signal while health said ok."""
    replicas.replicas[0].set_load(running=2, waiting=5, kv=0.1)
    allowed, start = threading.Event(), threading.Thread.start

    def refusing(thread):
        if thread.name.startswith("exporter-parse") and not allowed.is_set():
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refusing)
    server = served(config_for(("llama", [replicas.url(0)])))
    http_port, grpc_port = await server.start()
    try:

        async def unhealthy():
            return (await healthz(http_port))[0] == 503 and await grpc_health(grpc_port) == (
                NOT_SERVING
            )

        await until(unhealthy, "unhealthy while no parse thread can start")
        _, body = await healthz(http_port)
        assert "parse threads not running" in body["problem"]
        await until(
            lambda: _at_least(
                metric(http_port, "unitscale_exporter_parse_thread_start_failures_total"), 3
            ),
            "failed starts counted",
        )
        allowed.set()

        async def serving():
            latest = server.exporter.deployments[0].signals
            return (
                (await healthz(http_port))[0] == 200
                and latest is not None
                and latest.queue_depth == 5.0
            )

        await until(serving, "healthy, and the replica's queue read, once threads start")
    finally:
        await server.stop()


async def _at_least(value, floor):
    return await value >= floor


class Fatal(BaseException):
    """Escapes every ``except Exception``: what only a dead loop lets through."""


async def test_a_dead_loop_fails_health_over_http_and_grpc(replicas):
    server = served(config_for(("llama", [replicas.url(0)])))
    real = server.exporter.cycle
    calls = 0

    async def dying(session):
        nonlocal calls
        calls += 1
        if calls > 2:
            raise Fatal("the loop task ends")
        await real(session)

    server.exporter.cycle = dying
    http_port, grpc_port = await server.start()
    try:

        async def dead():
            return (await healthz(http_port))[0] == 503 and await grpc_health(grpc_port) == (
                NOT_SERVING
            )

        await until(dead, "unhealthy once the loop has died")
        _, body = await healthz(http_port)
        assert "scrape loop stopped" in body["problem"] and "Fatal" in body["problem"]
    finally:
        await server.stop()


async def test_a_stuck_loop_fails_health(replicas):
    server = served(config_for(("llama", [replicas.url(0)])))
    never = asyncio.Event()
    real = server.exporter.cycle
    calls = 0

    async def stuck(session):
        nonlocal calls
        calls += 1
        if calls > 1:
            await never.wait()  # cancelled by stop()
        await real(session)

    server.exporter.cycle = stuck
    http_port, grpc_port = await server.start()
    try:
        await eventually(lambda: server.exporter.cycles >= 1, "the first cycle")

        async def unhealthy():
            return (await healthz(http_port))[0] == 503 and await grpc_health(grpc_port) == (
                NOT_SERVING
            )

        await until(unhealthy, "unhealthy while the loop is stuck")
        _, body = await healthz(http_port)
        assert "no scrape cycle completed" in body["problem"] and body["cycles"] == 1
    finally:
        await server.stop()


async def test_a_dns_lookup_that_hangs_costs_one_timeout_not_the_cycle(
    replicas, session, monkeypatch, caplog
):
    never = asyncio.Event()

    async def hanging(host_port):
        await never.wait()
        return []

    monkeypatch.setattr(runtime_module, "resolve_replicas", hanging)
    config = ExporterConfig.model_validate(
        {
            "timeout": "300ms",
            "deployments": [
                {
                    "deployment": "llama",
                    "dns": "llama.serving.svc:8000",
                    "targets": [replicas.url(0)],
                }
            ],
        }
    )
    exporter = Exporter(config, FakeClock())
    with caplog.at_level(logging.WARNING, logger="exporter"):
        for _ in range(3):
            await asyncio.wait_for(exporter.cycle(session), 10)  # a cap against the hang
    assert exporter.cycles == 3
    assert len([r for r in caplog.records if "cannot resolve" in r.getMessage()]) == 1
    assert exporter.deployments[0].status[replicas.url(0)].up  # the listed target still counts
    assert exporter.deployments[0].discovery_problem == "no answer within 0.3s"


async def test_a_deployment_whose_discovery_crashes_keeps_its_replicas_and_the_others_cycle(
    replicas, session, monkeypatch
):
    async def crashing(host_port):
        raise ValueError("a bug in discovery")

    monkeypatch.setattr(runtime_module, "resolve_replicas", crashing)
    config = ExporterConfig.model_validate(
        {
            "timeout": "300ms",
            "deployments": [
                {"deployment": "llama", "dns": "llama.serving.svc:8000"},
                {"deployment": "qwen", "targets": [replicas.url(1)]},
            ],
        }
    )
    exporter = Exporter(config, FakeClock())
    await exporter.cycle(session)
    llama, qwen = exporter.deployments
    assert "ValueError('a bug in discovery')" in llama.discovery_problem
    assert qwen.status[replicas.url(1)].up and exporter.cycles == 1


async def test_dns_that_never_answered_publishes_no_signals_until_it_does(
    replicas, session, monkeypatch
):
    """Before any lookup answered, "0 replicas, no load" is no fact: nothing is published."""
    answers: list[str] = []

    async def resolving(host_port):
        if not answers:
            raise TimeoutError
        return answers

    monkeypatch.setattr(runtime_module, "resolve_replicas", resolving)
    replicas.replicas[0].set_load(running=12, waiting=3, kv=0.4)
    config = ExporterConfig.model_validate(
        {"timeout": "300ms", "deployments": [{"deployment": "llama", "dns": "llama.svc:8000"}]}
    )
    exporter = Exporter(config, FakeClock())
    published = []
    exporter.add_listener(lambda state: published.append(state.signals))
    for _ in range(2):
        await exporter.cycle(session)
    assert exporter.deployments[0].signals is None and published == [None, None]

    answers.append(replicas.url(0))
    await exporter.cycle(session)
    signals = exporter.deployments[0].signals
    assert signals is not None and (signals.replicas, signals.running) == (1, 12.0)
    answers.clear()  # failing after it answered: the last list stays, and is published
    await exporter.cycle(session)
    assert exporter.deployments[0].signals is not None


class ForbiddenApi(FakeApi):
    """Answers every EndpointSlice list 403, as without the RBAC to list them."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.listed += 1
        status = {"kind": "Status", "code": 403, "reason": "Forbidden"}
        return web.json_response(status, status=403)


def slices_listing(port: int, *extra: dict[str, Any]) -> bytes:
    good = {
        "metadata": {"name": "s1", "namespace": "team-a"},
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": port}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
    }
    return listing(good, *extra)


BAD_SLICE = {
    "metadata": {"name": "s2", "namespace": "team-a"},
    "addressType": "IPv4",
    "ports": [{"name": "metrics", "port": 1}],
    "endpoints": [{"addresses": ["127.0.0.2"], "conditions": "ready"}],
}


@pytest.mark.parametrize(
    ("api_kind", "replicas_published"),
    [
        pytest.param("forbidden", None, id="slices never listed (403) publish no signals"),
        pytest.param("bad-slice", 1, id="one malformed slice is skipped and the good one counts"),
        pytest.param("good", 1, id="a listed slice publishes its replica"),
    ],
)
async def test_endpoint_slices_never_listed_publish_no_signals(
    tmp_path, api_kind, replicas_published
):
    replica = await FakeReplicaServer(1).start()
    replica.replicas[0].set_load(running=12, waiting=3, kv=0.4)
    if api_kind == "forbidden":
        api: FakeApi = ForbiddenApi([])
    else:
        api = FakeApi(
            [slices_listing(replica.port, *([BAD_SLICE] if api_kind == "bad-slice" else []))]
        )
    access = await api.start(tmp_path)
    config = ExporterConfig.model_validate(
        {
            "interval": "100ms",
            "timeout": "80ms",
            "deployments": [
                {
                    "namespace": "team-a",
                    "deployment": "llama",
                    "endpoint-slices": {
                        "service": "llama",
                        "port": "metrics",
                        "path": "/r0/metrics",
                    },
                }
            ],
        }
    )
    exporter = Exporter(config, FakeClock(), kube=access)
    task = asyncio.create_task(exporter.run())
    try:
        await eventually(lambda: api.listed >= 1 and exporter.cycles >= 3, "listed and cycled")
        if replicas_published is not None:
            await eventually(lambda: exporter.deployments[0].signals is not None, "published")
        signals = exporter.deployments[0].signals
        assert (signals and signals.replicas) == replicas_published
        if signals is not None:
            assert signals.running == 12.0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.stop()
        await replica.stop()


async def test_signal_watchers_past_the_cap_are_refused_and_counted():
    """32 idle WatchSignals streams are served; the 33rd is RESOURCE_EXHAUSTED, counted."""
    server = ExporterServer(config_for(("llama", [])))
    http_port, grpc_port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = sig_grpc.SignalsServiceStub(channel)
            streams = [
                stub.WatchSignals(sig.WatchSignalsRequest())
                for _ in range(grpc_service.MAX_WATCHERS)
            ]
            await eventually(lambda: server.signals.watchers == len(streams), "all watching")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.WatchSignals(sig.WatchSignalsRequest()).read()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert server.signals.refused == 1
            streams.pop().cancel()  # one closes: room for one more
            await eventually(lambda: server.signals.watchers == len(streams), "one gone")
            streams.append(stub.WatchSignals(sig.WatchSignalsRequest()))
            await eventually(lambda: server.signals.watchers == len(streams), "one more")
            for stream in streams:
                stream.cancel()
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{http_port}/metrics") as response:
                text = await response.text()
        assert "unitscale_exporter_signal_watchers_refused_total 1.0" in text
    finally:
        await server.stop(grace=0)
