"""The gateway and the simulated replica, as real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml

from exporter.engines import VLLM, WANTED_ANY, detect_engine, engine_stats
from exporter.parse import parse_samples
from foundation.net import free_port
from foundation.replica_model import LLAMA3_8B_H200
from protos.unitscale.v1 import signals_pb2 as sig
from protos.unitscale.v1 import signals_pb2_grpc as sig_grpc
from serving.config import GatewayConfig
from serving.gateway_replicas import Replica, ReplicaPool
from serving.gateway_settings import GatewaySettings
from serving.server import GatewayServer, SimReplicaServer
from tests.conftest import eventually

DEPLOY = Path(__file__).parent.parent / "deploy"
FAST = 50.0  # engine steps 50x faster than an H200: tests take milliseconds per request


async def start_sim(port=0, speedup=FAST):
    server = SimReplicaServer(LLAMA3_8B_H200, f"127.0.0.1:{port}", speedup=speedup)
    await server.start()
    return server


async def start_gateway(replicas, **settings):
    values: dict[str, Any] = {"health_interval": 0.05, "deployment": "llama", "namespace": "team-a"}
    values |= settings
    server = GatewayServer(replicas, GatewaySettings(**values), "127.0.0.1:0", "127.0.0.1:0")
    await server.start()
    return server


async def wait_ready(gateway, count):
    g = gateway.gateway
    async with asyncio.timeout(10), g._ready:  # notified whenever a replica turns ready
        await g._ready.wait_for(lambda: sum(r.ready for r in g.replicas) >= count)


def completion(stream=False, max_tokens=8, **extra):
    return {
        "model": "sim-llama",
        "prompt": "hello world",
        "max_tokens": max_tokens,
        "stream": stream,
    } | extra


async def sse_events(response):
    events = []
    async for line in response.content:
        text = line.decode().strip()
        if text.startswith("data: "):
            events.append(text[len("data: ") :])
    return events


async def test_the_sim_replica_looks_like_vllm_to_the_exporter():
    sim = await start_sim()
    try:
        async with aiohttp.ClientSession() as client:
            for _ in range(3):
                async with client.post(f"{sim.url}/v1/completions", json=completion()) as r:
                    usage = (await r.json())["usage"]
                    assert usage["completion_tokens"] == 8
            async with client.get(f"{sim.url}/metrics") as r:
                assert r.headers["Content-Type"].startswith("text/plain")
                text = await r.text()
        samples = parse_samples(text, WANTED_ANY)
        assert detect_engine(samples) == "vllm"
        stats = engine_stats(samples, VLLM)
        assert stats.missing == ()
        assert stats.counters["requests"] == 3 and stats.counters["generation_tokens"] == 24
        assert stats.counters["prompt_tokens"] == 3 * usage["prompt_tokens"]
        assert stats.histograms["itl"].count == 3 * 7
    finally:
        await sim.stop()


async def test_streaming_passes_through_chunk_by_chunk():
    sim = await start_sim()
    gateway = await start_gateway([sim.url])
    try:
        await wait_ready(gateway, 1)
        body = completion(stream=True, stream_options={"include_usage": True})
        async with aiohttp.ClientSession() as client:
            async with client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions", json=body
            ) as r:
                assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
                events = await sse_events(r)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert sum(1 for c in chunks if c["choices"]) == 8
        assert chunks[-1]["usage"]["completion_tokens"] == 8
    finally:
        await gateway.stop()
        await sim.stop()


async def test_requests_are_balanced_across_ready_replicas():
    sims = [await start_sim(), await start_sim()]
    gateway = await start_gateway([s.url for s in sims])
    try:
        await wait_ready(gateway, 2)
        async with aiohttp.ClientSession() as client:

            async def one():
                async with client.post(
                    f"http://127.0.0.1:{gateway.port}/v1/completions",
                    json=completion(max_tokens=32),
                ) as r:
                    assert r.status == 200

            await asyncio.gather(*(one() for _ in range(20)))
        served = [
            s.replica.engine.metrics.success.labels("0", "sim-llama", "length")._value.get()
            for s in sims
        ]
        assert sum(served) == 20 and min(served) >= 8, served
    finally:
        await gateway.stop()
        for s in sims:
            await s.stop()


async def test_a_request_at_zero_replicas_waits_activates_the_scaler_and_is_served():
    port = free_port()
    gateway = await start_gateway([f"http://127.0.0.1:{port}"])
    sim = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
            watch = sig_grpc.SignalsServiceStub(channel).WatchSignals(sig.WatchSignalsRequest())
            first = await asyncio.wait_for(watch.read(), 5)
            assert first.signals.gateway.buffered == 0
            assert first.signals.target == sig.Target(namespace="team-a", deployment="llama")
            async with aiohttp.ClientSession() as client:
                pending = asyncio.create_task(
                    client.post(
                        f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()
                    )
                )
                async with asyncio.timeout(5):  # pushed at once, not at the next periodic update
                    while (await watch.read()).signals.gateway.buffered != 1:
                        pass
                sim = await start_sim(port)  # the replica becomes ready
                response = await asyncio.wait_for(pending, 10)
                assert response.status == 200
                assert (await response.json())["usage"]["completion_tokens"] == 8
                response.release()
            watch.cancel()
    finally:
        await gateway.stop()
        if sim is not None:
            await sim.stop()


@pytest.mark.parametrize(
    ("settings", "status", "retry_after"),
    [
        pytest.param(
            {"buffer_timeout": 0.3}, 503, True, id="a-wait-past-the-timeout-is-503-with-retry-after"
        ),
        pytest.param({"buffer_size": 0}, 429, True, id="a-full-buffer-is-429-with-retry-after"),
    ],
)
async def test_buffer_limits(settings, status, retry_after):
    gateway = await start_gateway([f"http://127.0.0.1:{free_port()}"], **settings)
    try:
        async with aiohttp.ClientSession() as client:
            async with client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()
            ) as r:
                assert r.status == status
                assert ("Retry-After" in r.headers) is retry_after
                assert "message" in await r.json()
    finally:
        await gateway.stop()


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        pytest.param(b"{not json", 400, "not valid JSON", id="malformed-json"),
        pytest.param(b"[1, 2]", 400, "JSON object", id="not-an-object"),
        pytest.param(
            b'{"model": 7, "prompt": "x"}', 400, "model must be a string", id="model-not-a-string"
        ),
        pytest.param(
            b'{"model": "gpt-5", "prompt": "x"}', 404, "no replica serves model", id="unknown-model"
        ),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, 400, "not valid JSON", id="deep-arrays"),
        pytest.param(b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 400, "not valid JSON", id="deep"),
        pytest.param(b'{"model": "\xff"}', 400, "not valid JSON", id="not-utf-8"),
        pytest.param(b'{"n": ' + b"9" * 5000 + b"}", 400, "not valid JSON", id="a-huge-integer"),
        pytest.param(b"", 400, "not valid JSON", id="an-empty-body"),
    ],
)
async def test_malformed_client_input_gets_a_clear_4xx(body, status, fragment):
    sim = await start_sim()
    gateway = await start_gateway([sim.url])
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            async with client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == status
                assert fragment in (await r.json())["message"]
    finally:
        await gateway.stop()
        await sim.stop()


async def test_a_replica_dying_mid_stream_fails_that_client_only():
    port = free_port()
    replica = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "unitscale.cli",
        "--log-level",
        "warning",
        "sim-replica",
        "--listen",
        f"127.0.0.1:{port}",  # real H200 pace: ~7 ms a token
    )
    gateway = await start_gateway([f"http://127.0.0.1:{port}"])
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            response = await client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions",
                json=completion(stream=True, max_tokens=2000),
            )
            assert response.status == 200
            await response.content.readline()  # the stream has started
            replica.kill()  # the replica dies: SIGKILL, no goodbye
            await replica.wait()
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
            async with client.get(f"http://127.0.0.1:{gateway.port}/health") as r:
                assert r.status == 200  # the gateway carries on
    finally:
        if replica.returncode is None:
            replica.kill()
            await replica.wait()
        await gateway.stop()


async def test_replicas_are_discovered_from_dns():
    sim = await start_sim()
    gateway = await start_gateway([], dns=f"localhost:{sim.port}")
    try:
        await wait_ready(gateway, 1)
        assert [r.url for r in gateway.gateway.replicas] == [f"http://127.0.0.1:{sim.port}"]
        async with aiohttp.ClientSession() as client:
            async with client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()
            ) as r:
                assert r.status == 200
    finally:
        await gateway.stop()
        await sim.stop()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("buffer-timeout: soon", "key 'buffer-timeout'='soon'", id="bad-duration"),
        pytest.param(
            "replicas: [10.0.0.1:8000]", "expected http://host:port", id="url-without-scheme"
        ),
        pytest.param("buffer-sizes: 3", "unknown key 'buffer-sizes'", id="typo"),
        pytest.param(
            "endpoint-slices: {port: 8000}", "endpoint-slices.service", id="slices-need-a-service"
        ),
        pytest.param(
            'buffer-bytes: "\u0663Gi"',
            "key 'buffer-bytes'",
            id="a-size-in-other-scripts-digits",
        ),
        pytest.param(
            "max-request-bytes: 16MB", "key 'max-request-bytes'='16MB'", id="a-size-in-megabytes"
        ),
        pytest.param(
            "buffer-bytes: 1Mi",
            "buffer-bytes (1048576) is below max-request-bytes (16777216)",
            id="a-buffer-smaller-than-the-largest-request",
        ),
        pytest.param("upstream-timeout: 0s", "key 'upstream-timeout'", id="no-upstream-timeout"),
        pytest.param("models: ['']", "key 'models.0'", id="an-empty-model-name"),
    ],
)
def test_bad_gateway_config_names_the_key(text, fragment):
    from foundation.errors import ConfigError
    from serving.config import parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config(text, "gateway.yaml")
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        pytest.param("1048576", 1048576, id="bare-bytes"),
        pytest.param("16Mi", 16 * 1024**2, id="mebibytes"),
        pytest.param("2Gi", 2 * 1024**3, id="gibibytes"),
        pytest.param("500k", 500_000, id="kilobytes-are-thousands"),
    ],
)
def test_sizes_are_bytes_or_kubernetes_quantities(text, size):
    from serving.config import parse_config

    config = parse_config(f"max-request-bytes: {text}\nbuffer-bytes: 4Gi\n", "gateway.yaml")
    assert config.settings().max_request_bytes == size


def test_flags_win_over_the_file():
    from serving.config import parse_config

    config = parse_config("buffer-size: 5\nnamespace: a\n", "gateway.yaml", {"buffer-size": 9})
    assert (config.buffer_size, config.namespace, config.settings().buffer_size) == (9, "a", 9)


SETTINGS_IN_THE_CONFIG = [
    pytest.param("namespace", id="the-target-namespace-has-one-default"),
    pytest.param("deployment", id="the-target-deployment-has-one-default"),
    pytest.param("buffer_size", id="the-buffer-size-has-one-default"),
    pytest.param("buffer_timeout", id="the-buffer-timeout-has-one-default"),
    pytest.param("health_interval", id="the-health-interval-has-one-default"),
    pytest.param("rate_window", id="the-rate-window-has-one-default"),
    pytest.param("connect_retries", id="the-connect-retries-have-one-default"),
    pytest.param("dns", id="no-dns-name-is-the-default-everywhere"),
    pytest.param("upstream_timeout", id="the-upstream-timeout-has-one-default"),
    pytest.param("body_timeout", id="the-body-timeout-has-one-default"),
    pytest.param("max_request_bytes", id="the-request-size-limit-has-one-default"),
    pytest.param("buffer_bytes", id="the-buffer-bytes-have-one-default"),
    pytest.param("models", id="no-configured-model-is-the-default-everywhere"),
    pytest.param("wake_timeout", id="the-wake-timeout-has-one-default"),
    pytest.param("wake_at_outstanding", id="waking-only-at-zero-ready-is-the-default"),
    pytest.param("wake_retry_after", id="the-wake-retry-delay-has-one-default"),
    pytest.param("standby_scaler", id="asking-no-scaler-for-a-standby-plan-is-the-default"),
    pytest.param("standby_interval", id="the-standby-interval-has-one-default"),
    pytest.param("sleep_after_idle", id="the-sleep-after-idle-has-one-default"),
    pytest.param("slo", id="the-slo-targets-have-one-default"),
    pytest.param("arrivals", id="recording-no-arrivals-is-the-default-everywhere"),
]


def documented_example():
    from serving.config import parse_config

    configmap = yaml.safe_load((DEPLOY / "gateway" / "configmap.yaml").read_text())
    return parse_config(configmap["data"]["_example"], "_example")


@pytest.mark.parametrize("key", SETTINGS_IN_THE_CONFIG)
def test_a_gateway_default_is_the_settings_one_in_the_config_and_the_documented_example(key):
    default = getattr(GatewaySettings(), key)
    # As the gateway gets them: the slo block is a model of its own, SloTargets once set.
    assert getattr(GatewayConfig().settings(), key) == default
    assert getattr(documented_example().settings(), key) == default


def test_the_defaults_table_names_every_setting_the_config_sets():
    settings = {f.name for f in dataclasses.fields(GatewaySettings)}
    assert set(GatewayConfig.model_fields) & settings == {
        p.values[0] for p in SETTINGS_IN_THE_CONFIG
    }
    assert GatewayConfig().settings() == GatewaySettings()


async def test_a_reloaded_config_file_swaps_the_replicas(tmp_path):
    from foundation.reload import ConfigSource
    from serving.config import parse_config
    from tests.kubelet_volume import KubeletVolume

    first, second = await start_sim(), await start_sim()
    volume = KubeletVolume(tmp_path / "config")
    volume.write({"gateway.yaml": f"replicas: [{first.url}]\nhealth-interval: 100ms\n"})
    source = ConfigSource(volume.path("gateway.yaml"), poll_interval=0.05)
    config = parse_config(await source.read(), source.origin)
    gateway = GatewayServer(
        config.replicas, config.settings(), "127.0.0.1:0", "127.0.0.1:0",
        config=config, source=source, parse=parse_config,
    )  # fmt: skip
    await gateway.start()
    try:
        await wait_ready(gateway, 1)
        volume.write({"gateway.yaml": f"replicas: [{second.url}]\nhealth-interval: 100ms\n"})
        g = gateway.gateway
        async with asyncio.timeout(10), g._ready:
            await g._ready.wait_for(lambda: [r.url for r in g.replicas if r.ready] == [second.url])
        assert gateway.configs is not None and gateway.configs.reloads == 1
    finally:
        await gateway.stop()
        await first.stop()
        await second.stop()


@pytest.mark.parametrize(
    ("replicas", "unserved"),
    [
        pytest.param([(True, {"llama"})], True, id="ready-replicas-list-other-models"),
        pytest.param([(True, {"llama", "m"})], False, id="a-lora-adapter-counts-as-a-model"),
        pytest.param([(True, set())], False, id="a-replica-whose-models-are-unknown-may-serve-it"),
        pytest.param([(False, {"llama"})], False, id="no-ready-replica-means-wait-not-404"),
    ],
)
def test_is_unserved(replicas, unserved):
    from serving.routing import ReplicaView, is_unserved

    views = [
        ReplicaView(f"http://r{i}", ready, 0, frozenset(models))
        for i, (ready, models) in enumerate(replicas)
    ]
    assert is_unserved(views, "m") is unserved


def served(sim):
    return sim.replica.engine.metrics.success.labels("0", "sim-llama", "length")._value.get()


async def test_a_replica_no_longer_listed_drains_then_goes():
    slow = await start_sim(speedup=1.0)  # real H200 pace: a 2,000-token answer takes ~13 s
    fresh = await start_sim()
    gateway = await start_gateway([slow.url], health_interval=0.01)
    g = gateway.gateway
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            long = await client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions",
                json=completion(stream=True, max_tokens=2000),
            )
            await long.content.readline()  # in flight on the slow replica
            g.reconfigure([fresh.url], g.settings)
            old = next(r for r in g.replicas if r.url == slow.url)
            assert old.draining and old.outstanding == 1  # at once, not at the next check
            async with asyncio.timeout(10), g._ready:
                await g._ready.wait_for(lambda: any(r.routable for r in g.replicas))

            async def one():
                async with client.post(
                    f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion()
                ) as r:
                    assert r.status == 200

            # At once: by fewest-outstanding alone some would go to the slow one (1 in flight).
            # Health checks (every 10 ms) keep finding it healthy meanwhile.
            await asyncio.gather(*(one() for _ in range(20)))
            async with client.get(f"http://127.0.0.1:{gateway.port}/health") as r:
                health = await r.json()
            assert (health["ready"], health["draining"]) == (1, 1)
            assert (served(slow), served(fresh)) == (0, 20)
            long.close()  # the client leaves: its upstream request ends, the replica goes
            await eventually(lambda: [r.url for r in g.replicas] == [fresh.url], "drained")
    finally:
        await gateway.stop()
        await slow.stop()
        await fresh.stop()


async def test_a_reload_checks_new_replicas_at_once():
    first, second = await start_sim(), await start_sim()
    gateway = await start_gateway([first.url], health_interval=3600)  # one check, at start
    g = gateway.gateway
    try:
        await wait_ready(gateway, 1)
        g.reconfigure([first.url, second.url], g.settings)
        await wait_ready(gateway, 2)  # within the hour only if the reload woke the checks
    finally:
        await gateway.stop()
        await first.stop()
        await second.stop()


@pytest.mark.parametrize(
    ("before", "named", "after"),
    [
        pytest.param([("a", 0, False)], set(), [], id="an-idle-replica-no-longer-named-goes"),
        pytest.param(
            [("a", 2, False)], set(), [("a", True)], id="a-busy-replica-no-longer-named-drains"
        ),
        pytest.param(
            [("a", 1, True)], {"a"}, [("a", False)], id="a-draining-replica-named-again-returns"
        ),
        pytest.param(
            [("b", 0, False)],
            {"b", "a"},
            [("b", False), ("a", False)],
            id="new-replicas-come-after-the-known-ones",
        ),
    ],
)
def test_apply_named(before, named, after):
    g = ReplicaPool([], GatewaySettings())
    g.replicas = [Replica(url, ready=True, outstanding=n, draining=d) for url, n, d in before]
    g.apply_named(named)
    assert [(r.url, r.draining) for r in g.replicas] == after
