"""The exporter against real HTTP replicas: signals, failures, outputs."""

from __future__ import annotations

import asyncio
import ipaddress
from urllib.parse import urlsplit

import aiohttp
import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import ExporterServer
from exporter.collector import registry_for
from exporter.config import ExporterConfig, load_config, metrics_url
from exporter.parse import Limits
from exporter.runtime import Exporter
from foundation.errors import ConfigError
from foundation.net import free_port
from protos.unitscale.v1 import signals_pb2 as sig
from protos.unitscale.v1 import signals_pb2_grpc as sig_grpc
from tests.conftest import FakeClock
from tests.fake_engines import FakeReplicaServer


@pytest.fixture
async def replicas():
    server = await FakeReplicaServer(3).start()
    yield server
    await server.stop()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as client:
        yield client


def config_for(targets, **extra):
    return ExporterConfig.model_validate(
        {
            "timeout": "1s",  # a healthy loopback scrape within it under a loaded suite
            "panic-window": "10s",
            "stable-window": "60s",
            "deployments": [
                {"namespace": "team-a", "deployment": "llama", "targets": targets, **extra}
            ],
        }
    )


def signals_of(exporter):
    signals = exporter.deployments[0].signals
    assert signals is not None
    return signals


def dead_url():
    return f"http://127.0.0.1:{free_port()}/metrics"


async def test_signals_follow_what_the_replicas_served(replicas, session):
    clock = FakeClock(1000.0)
    exporter = Exporter(config_for([replicas.url(0), replicas.url(1)]), clock)
    await exporter.cycle(session)  # the baseline scrape
    a, b = replicas.replicas[0], replicas.replicas[1]
    a.finish(10, prompt=100, output=20, ttft=0.3, itl=0.02, e2e=1.2)
    b.finish(30, prompt=100, output=20, ttft=0.7, itl=0.04, e2e=2.2)
    a.set_load(running=4, waiting=2, kv=0.4)
    b.set_load(running=6, waiting=0, kv=0.6)
    clock.now += 10
    await exporter.cycle(session)

    signals = signals_of(exporter)
    assert not signals.partial
    assert (signals.queue_depth, signals.running) == (2.0, 10.0)
    assert signals.kv_usage == pytest.approx(0.5)
    assert signals.stable.request_rate == pytest.approx(4.0)  # 40 requests in 10 s
    assert signals.stable.prompt_token_rate == pytest.approx(400.0)
    assert signals.stable.generation_token_rate == pytest.approx(80.0)
    ttft = signals.stable.ttft
    assert 0.25 <= ttft.p50 <= 0.75  # 30 of 40 requests took 0.7 s, 10 took 0.3 s
    assert 0.5 <= ttft.p99 <= 0.75
    # 2 whole cards at the default $3.50/h for 480 tok/s
    assert signals.price_is_default
    assert signals.cost_per_million_tokens == pytest.approx(7.0 / (480 * 3600) * 1e6)


def tokens_per_request(exporter):
    text = generate_latest(registry_for(exporter)).decode()
    return {
        (s.labels["window"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "unitscale_tokens_per_request"
    }


async def test_the_request_mix_is_the_finished_requests_mean_and_is_exported(replicas, session):
    clock = FakeClock(1000.0)
    exporter = Exporter(config_for([replicas.url(0), replicas.url(1)]), clock)
    await exporter.cycle(session)
    assert signals_of(exporter).stable.mean_prompt_tokens is None  # one scrape: no window
    assert tokens_per_request(exporter) == {}  # unknown is absent, never 0
    a, b = replicas.replicas[0], replicas.replicas[1]
    a.finish(10, prompt=100, output=20, ttft=0.3, itl=0.02, e2e=1.2)
    b.finish(30, prompt=300, output=60, ttft=0.7, itl=0.04, e2e=2.2)
    clock.now += 10
    await exporter.cycle(session)

    signals = signals_of(exporter)
    assert not signals.partial
    # 40 requests: (10 x 100 + 30 x 300) / 40 prompt tokens, (10 x 20 + 30 x 60) / 40 output
    assert signals.stable.mean_prompt_tokens == pytest.approx(250.0)
    assert signals.stable.mean_output_tokens == pytest.approx(50.0)
    assert tokens_per_request(exporter) == {
        ("panic", "prompt"): pytest.approx(250.0),
        ("panic", "output"): pytest.approx(50.0),
        ("stable", "prompt"): pytest.approx(250.0),
        ("stable", "output"): pytest.approx(50.0),
    }


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        pytest.param("slow", "timeout", id="a-slow-replica-times-out-alone"),
        pytest.param("http-500", "http", id="an-http-error-is-counted"),
        pytest.param("garbage", "parse", id="malformed-exposition-is-counted"),
        pytest.param("not-vllm", "no-engine-metrics", id="a-replica-without-engine-metrics"),
        pytest.param("dead", "connect", id="a-dead-replica-is-counted"),
    ],
)
async def test_a_bad_replica_is_counted_and_marks_the_signal_partial(
    replicas, session, mode, reason
):
    targets = [replicas.url(0), replicas.url(1)]
    if mode == "dead":
        targets[1] = dead_url()
    else:
        replicas.replicas[1].mode = mode
    clock = FakeClock(1000.0)
    exporter = Exporter(config_for(targets), clock)
    replicas.replicas[0].set_load(running=3, waiting=1, kv=0.2)
    await exporter.cycle(session)
    state = exporter.deployments[0]
    assert state.status[targets[0]].up
    bad = state.status[targets[1]]
    assert not bad.up and bad.errors[reason] == 1
    signals = signals_of(exporter)
    assert signals.partial
    assert (signals.replicas, signals.replicas_up) == (2, 1)
    assert signals.queue_depth == 1.0  # the good replica still counts


async def test_a_restarted_replica_never_gives_a_negative_rate(replicas, session):
    clock = FakeClock(1000.0)
    exporter = Exporter(config_for([replicas.url(0)]), clock)
    replica = replicas.replicas[0]
    replica.finish(50, prompt=10, output=10, ttft=0.1, itl=0.01, e2e=0.5)
    await exporter.cycle(session)
    replica.restart()
    replica.finish(5, prompt=10, output=10, ttft=0.1, itl=0.01, e2e=0.5)
    clock.now += 10
    await exporter.cycle(session)
    stable = signals_of(exporter).stable
    assert stable.request_rate == pytest.approx(0.5)
    assert stable.generation_token_rate == pytest.approx(5.0)


async def test_nan_gauges_are_missing_not_zero(replicas, session):
    replica = replicas.replicas[0]
    replica.set_load(running=float("nan"), waiting=2, kv=0.1)
    exporter = Exporter(config_for([replicas.url(0)]), FakeClock())
    await exporter.cycle(session)
    signals = signals_of(exporter)
    assert signals.running is None and signals.queue_depth == 2.0 and signals.partial


async def test_dns_names_every_a_record_as_a_replica(replicas, session):
    config = ExporterConfig.model_validate(
        {"deployments": [{"deployment": "llama", "dns": f"localhost:{replicas.port}"}]}
    )
    exporter = Exporter(config, FakeClock())
    await exporter.cycle(session)
    assert exporter.deployments[0].targets == [f"http://127.0.0.1:{replicas.port}/metrics"]


async def test_metrics_and_signals_are_served_over_http_and_grpc(replicas):
    replicas.replicas[0].set_load(running=5, waiting=3, kv=0.3)
    config = config_for([replicas.url(0), dead_url()], accelerator={"price-per-hour": 2.0})
    config = config.model_copy(update={"interval": 0.5})
    server = ExporterServer(config)
    http_port, grpc_port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            watch = sig_grpc.SignalsServiceStub(channel).WatchSignals(sig.WatchSignalsRequest())
            first = (await asyncio.wait_for(watch.read(), 10)).signals
            watch.cancel()
            got = await sig_grpc.SignalsServiceStub(channel).GetSignals(
                sig.GetSignalsRequest(selector=sig.TargetSelector(deployment="llama"))
            )
        assert first.target == sig.Target(namespace="team-a", deployment="llama")
        assert first.engine.queue_depth == 3.0 and first.engine.requests_running == 5.0
        assert (
            first.partial and first.engine.replicas_up == 1 and first.engine.replicas_scraped == 2
        )
        assert not first.engine.HasField("cost_per_million_tokens")  # no tokens yet: unknown
        assert [s.target.deployment for s in got.signals] == ["llama"]

        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{http_port}/metrics") as response:
                text = await response.text()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        labels = (("deployment", "llama"), ("model", "tiny-llama"), ("namespace", "team-a"))
        assert samples[("unitscale_queue_depth", labels)] == 3.0
        assert samples[("unitscale_requests_running", labels)] == 5.0
        assert samples[("unitscale_kv_cache_usage", labels)] == pytest.approx(0.3)
        assert (
            samples[("unitscale_replicas", (*labels[:2], ("namespace", "team-a"), ("state", "up")))]
            == 1
        )
        assert not any(name == "unitscale_cost_per_million_tokens" for name, _ in samples)
        # Both replicas hold a card, the one not answering too: accelerator-hours and spend.
        assert samples[("unitscale_accelerators", labels)] == 2.0
        assert samples[("unitscale_cost_per_hour", (*labels, ("price", "configured")))] == 4.0
        up = {dict(k)["target"]: v for (n, k), v in samples.items() if n == "unitscale_target_up"}
        assert sorted(up.values()) == [0.0, 1.0]
        errors = [
            v
            for (n, k), v in samples.items()
            if n == "unitscale_target_scrape_errors_total" and dict(k)["reason"] == "connect"
        ]
        assert sum(errors) >= 1
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        pytest.param(
            {"timeout": "10s", "interval": "5s"},
            "must be shorter than interval",
            id="timeout-vs-interval",
        ),
        pytest.param(
            {"deployments": [{"targets": ["ftp://x"]}]}, "expected http://host:port", id="bad-url"
        ),
        pytest.param(
            {"deployments": [{"accelerator": {"hami-gpucores": 150}}]},
            "deployments.0.accelerator.hami-gpucores",
            id="hami-share-over-100-percent",
        ),
        pytest.param(
            {"deployments": [{"dns": "no-port"}]}, "expected host:port", id="dns-without-port"
        ),
        pytest.param(
            {"max-body-bytes": 10},
            "'max-body-bytes'=10: Input should be greater than or equal to 1024",
            id="a-body-cap-below-1-kib",
        ),
        pytest.param(
            {"max-series": 0},
            "'max-series'=0: Input should be greater than or equal to 1",
            id="a-series-cap-of-zero",
        ),
        pytest.param(
            {"deployments": [{"targets": ["b" * 64 + ".example:80"]}]},
            "labels are 1-63 characters",
            id="a-host-label-of-64-characters-no-resolver-takes-is-refused",
        ),
        pytest.param(
            {"deployments": [{"dns": "b" * 64 + ".example:8000"}]},
            "labels are 1-63 characters",
            id="S4-L1-a-dns-host-label-of-64-characters-no-resolver-takes-is-refused",
        ),
        pytest.param(
            {"deployments": [{"dns": "a..b:8000"}]},
            "labels are 1-63 characters",
            id="S4-L1-a-dns-host-with-an-empty-label-is-refused",
        ),
        pytest.param(
            {"deployments": [{"targets": ["a." * 130 + "example:80"]}]},
            "a host name of 1-253 characters",
            id="a-host-name-over-253-characters-is-refused",
        ),
        pytest.param(
            {"deployments": [{"targets": ["http://" + "x" * 70_000 + ":80"]}]},
            "a target of at most 2048 characters",
            id="a-target-of-70000-characters-is-refused-in-a-short-message",
        ),
        pytest.param(
            {"deployments": [{"targets": ["http://user:s3cret@127.0.0.1:8000"]}]},
            "a target without user info",
            id="a-target-with-a-password-is-refused-the-target-label-would-publish-it",
        ),
        pytest.param(
            {"deployments": [{"targets": ["http://h\uff0eevil:8000"]}]},
            "printable ASCII",
            id="a-fullwidth-dot-that-would-reach-another-host-is-refused",
        ),
        pytest.param(
            {"deployments": [{"targets": ["http://[::1]x:8000"]}]},
            "expected http://host:port",
            id="text-after-an-ipv6-literal-is-refused",
        ),
        pytest.param(
            {"deployments": [{"targets": ["http://replica\n:8000"]}]},
            "no spaces, no control characters",
            id="a-target-with-a-newline-in-its-host-is-refused-at-start",
        ),
        pytest.param(
            {"deployments": [{"targets": ["host:99999"]}]},
            "expected http://host:port",
            id="a-port-over-65535-is-refused",
        ),
        pytest.param(
            {"deployments": [{"deployment": "d" * 254}]},
            "at most 253 characters",
            id="a-deployment-name-the-wire-refuses-is-refused-at-start",
        ),
        pytest.param(
            {"deployments": [{"namespace": "n" * 64}]},
            "at most 63 characters",
            id="a-namespace-over-63-characters-is-refused",
        ),
        pytest.param(
            {"deployments": [{"model": "m" * 513}]},
            "at most 512 characters",
            id="a-model-name-over-512-characters-is-refused",
        ),
    ],
)
def test_bad_exporter_config_names_the_key(overrides, fragment):
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert fragment in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert len(str(caught.value)) < 1000  # never the whole hostile value


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.integers(0, 70_000))
def test_any_target_host_is_one_a_resolver_takes_or_refused(host, port):
    """Taken: an IP literal or an ASCII name of 253/63 at most; else a ValueError."""
    try:
        url = metrics_url(f"http://{host}:{port}")
    except ValueError:
        return
    assert url.isascii()
    parts = urlsplit(url)
    hostname = parts.hostname
    assert hostname is not None and (parts.port or 0) <= 65535  # .port raises past it
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        hostname.removesuffix(".").encode("idna")  # raises nothing
        assert len(hostname.removesuffix(".")) <= 253


@pytest.mark.parametrize(
    ("accelerator", "fraction"),
    [
        pytest.param({}, 1.0, id="one-whole-card-by-default"),
        pytest.param({"count": 2}, 2.0, id="two-cards"),
        pytest.param({"hami-gpucores": 30}, 0.3, id="hami-compute-share"),
        pytest.param(
            {"hami-gpucores": 30, "hami-gpumem-mib": 71885}, 0.5, id="hami-memory-share-is-larger"
        ),
    ],
)
def test_accelerator_fraction(accelerator, fraction):
    config = load_config(None, {"deployments": [{"accelerator": accelerator}]})
    assert config.deployments[0].accelerator.fraction() == pytest.approx(fraction, rel=1e-4)


def test_limits_have_documented_defaults_and_are_configurable():
    assert load_config(None).limits() == Limits(max_bytes=4 * 1024 * 1024, max_series=10_000)
    config = load_config(None, {"max-body-bytes": 65536, "max-series": 500})
    assert config.limits() == Limits(max_bytes=65536, max_series=500)


async def test_a_replica_that_stopped_answering_adds_no_old_rates(replicas, session):
    # Its last minute of traffic is history, not load now: the rates are the answering
    # replicas' own, and the signals say some are missing (the scaler then holds).
    clock = FakeClock(1000.0)
    exporter = Exporter(config_for([replicas.url(0), replicas.url(1)]), clock)
    await exporter.cycle(session)
    a, b = replicas.replicas[0], replicas.replicas[1]
    a.finish(10, prompt=100, output=20, ttft=0.3, itl=0.02, e2e=1.2)
    b.finish(30, prompt=100, output=20, ttft=0.7, itl=0.04, e2e=2.2)
    clock.now += 10
    await exporter.cycle(session)
    assert signals_of(exporter).stable.request_rate == pytest.approx(4.0)
    b.mode = "http-500"
    clock.now += 10
    await exporter.cycle(session)
    signals = signals_of(exporter)
    assert signals.partial and (signals.replicas, signals.replicas_up) == (2, 1)
    assert signals.stable.request_rate == pytest.approx(10 / 20)  # a's 10 over 20 s


async def test_replicas_asleep_are_a_signal_and_a_metric(replicas, session):
    exporter = Exporter(config_for([replicas.url(i) for i in range(3)]), FakeClock(1000.0))
    replicas.replicas[1].metrics.set_sleep_state(1, 1)  # vLLM after POST /sleep?level=1
    await exporter.cycle(session)
    assert signals_of(exporter).replicas_sleeping == 1
    text = generate_latest(registry_for(exporter)).decode()
    states = {
        s.labels["state"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "unitscale_replicas"
    }
    assert states == {"known": 3, "up": 3, "sleeping": 1}


async def listed_in_turn(session, count, steps):
    """``count`` fake replicas, each finishing 10 requests of 20 tokens a cycle, scraped
    by an exporter whose discovery lists ``listed`` before each cycle, the clock moved
    ``step`` s after it (``steps``: (listed indexes, step) pairs): the signals of each."""
    replicas = await FakeReplicaServer(count).start()
    try:
        clock = FakeClock(1000.0)
        urls = [replicas.url(i) for i in range(count)]
        exporter = Exporter(config_for(urls), clock)
        state = exporter.deployments[0]
        seen = []
        for listed, step in steps:
            targets = [urls[i] for i in listed]
            state.config = state.config.model_copy(update={"targets": targets})
            for replica in replicas.replicas:
                replica.finish(10, prompt=100, output=20, ttft=0.3, itl=0.02, e2e=1.2)
            await exporter.cycle(session)
            seen.append(state.signals)
            clock.now += step
        return seen
    finally:
        await replicas.stop()


async def test_a_replica_listed_again_keeps_its_rates(session):
    """Readiness flapping: each replica listed again had lost its history and answered
    without a window, its load left out of a signal read whole (hostile pass 68)."""
    every, half = range(4), range(2)
    signals = (await listed_in_turn(session, 4, [(every, 10), (half, 10), (every, 10)]))[-1]
    # 10 requests of 20 tokens each 10 s on each of the 4: before, 40 (two of them).
    assert signals.stable.generation_token_rate == pytest.approx(80.0)
    assert not signals.partial


async def test_an_empty_list_after_replicas_is_unknown_until_the_horizon(session):
    """Every pod unready under load, or one empty answer: read as 0 replicas at once, a
    fleet running 640 requests went to zero, and the histories dropped left the next
    rates unknown (hostile pass 69)."""
    both, none = range(2), range(0)
    steps = [(both, 10), (both, 10), (none, 10), (both, 10), (none, 1000), (none, 10)]
    signals = await listed_in_turn(session, 2, steps)
    seen = [None if s is None else s.stable.generation_token_rate for s in signals]
    # Listed again, the rates go on; past the horizon, an empty list is 0 replicas.
    assert seen[:4] == [None, 40.0, None, 40.0]
    assert seen[4] is None and seen[5] == 0.0
