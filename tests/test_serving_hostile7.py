"""The serving side under hostile input (issue 27's seventh hostile pass, findings GZ-1..GZ-5).

Each test injects what one finding found, at the boundary where it enters: a client's
model name longer than any replica lists, a gateway config's ``endpoint-slices`` without
``path: /``, a ``dns`` name no resolver can encode, an exception that stops the
simulated replica's engine, a ``sim-replica --model`` no gateway would route to. Real
servers on 127.0.0.1 port 0.
"""

from __future__ import annotations

import io
import json
import logging

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.discovery import EndpointSliceWatch
from foundation.errors import ConfigError
from foundation.reload import C, ConfigSource, ConfigStore
from foundation.replica_model import LLAMA3_8B_H200
from serving.config import parse_config
from serving.replica_answers import MAX_MODEL_ID_CHARS, read_model_list
from serving.server import GatewayServer, SimReplicaServer
from tests.conftest import eventually
from tests.test_gateway_isolation import gateway_for
from unitscale.cli import build_parser


def labelled(server: GatewayServer, metric: str, *labels: str) -> float:
    """A gateway metric's value for the gateway's own labels and ``labels``."""
    family = getattr(server.gateway.metrics, metric)
    return float(family.labels("a", "llama", *labels)._value.get())


# --- GZ-1: a model name no replica could list is a 404, never kept -----------------------


@pytest.mark.parametrize(
    ("length", "status", "kept"),
    [
        pytest.param(
            4 * 1024**2, 404, 0, id="a model name of 4 MiB is a 404 and nothing of it is kept"
        ),
        pytest.param(
            MAX_MODEL_ID_CHARS + 1, 404, 0, id="one character past what a replica lists is a 404"
        ),
        pytest.param(
            MAX_MODEL_ID_CHARS, 503, 1, id="a name a replica could list waits as any model may"
        ),
    ],
)
async def test_a_model_name_no_replica_could_list_is_404_and_never_kept(
    length: int, status: int, kept: int
) -> None:
    # Wake pressure on, nothing known yet (no replica, no models configured): every
    # model may wait, and each one asked was a key of the per-model pressure state.
    async with gateway_for([], wake_at_outstanding=8, buffer_timeout=0.2) as server:
        url = f"http://127.0.0.1:{server.port}/v1/completions"
        body = io.BytesIO(json.dumps({"model": "m" * length, "prompt": "hi"}).encode())
        async with aiohttp.ClientSession() as client, client.post(url, data=body) as r:
            answer = await r.json()
            assert r.status == status
        if status == 404:
            assert len(answer["message"]) < 200
            assert labelled(server, "_arrivals") == 0  # not an arrival: no scale-up for it
        gateway = server.gateway
        assert len(gateway._surplus_above) == kept
        assert sum(len(model or "") for model in gateway._surplus_above) <= MAX_MODEL_ID_CHARS


# --- GZ-2: endpoint-slices name replicas at their root ------------------------------------


SLICE = {
    "metadata": {"name": "llama-abc"},
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
}


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(
            "endpoint-slices: {service: llama, port: PORT}",
            id="written without a path the replicas are base urls, not their metrics",
        ),
        pytest.param(
            "endpoint-slices: {service: llama, port: PORT, path: /}",
            id="written with path / as the shipped config does",
        ),
    ],
)
async def test_replicas_from_endpoint_slices_are_checked_and_routed_at_their_root(
    config: str,
) -> None:
    sim = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", model="m")
    await sim.start()
    try:
        parsed = parse_config(config.replace("PORT", str(sim.port)), "gateway.yaml")
        assert parsed.endpoint_slices is not None
        # As GatewayServer.start builds it; the slices are handed in as the watch would.
        watch = EndpointSliceWatch("a", parsed.endpoint_slices)
        watch._changed({"llama-abc": {**SLICE, "ports": [{"port": sim.port}]}})
        async with gateway_for([]) as server:
            server.gateway.pool.endpoint_watch = watch
            server.gateway.pool.reconfigure([], server.gateway.settings)
            await eventually(
                lambda: any(r.routable for r in server.gateway.replicas), "ready", limit=5
            )
            assert [r.url for r in server.gateway.replicas] == [sim.url]
            url = f"http://127.0.0.1:{server.port}/v1/completions"
            body = {"model": "m", "prompt": "hi", "max_tokens": 2}
            async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
                assert r.status == 200
    finally:
        await sim.stop()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/metrics", id="the exporter's metrics path is refused naming the key"),
        pytest.param("/v1", id="any other path is refused as a prefix of every request"),
    ],
)
def test_an_endpoint_slices_path_that_would_prefix_every_request_is_refused(path: str) -> None:
    with pytest.raises(ConfigError, match=r"endpoint-slices.*prefix every request"):
        parse_config(f"endpoint-slices: {{service: llama, port: 8000, path: {path}}}", "g.yaml")


@given(st.text(max_size=40))
def test_any_endpoint_slices_path_is_the_root_or_refused(path: str) -> None:
    text = "endpoint-slices: " + json.dumps({"service": "llama", "port": 8000, "path": path})
    try:
        parsed = parse_config(text, "g.yaml")
    except ConfigError:
        return
    assert parsed.endpoint_slices is not None and parsed.endpoint_slices.path == "/"


# --- GZ-3: a DNS name no resolver can encode fails its lookup, not the health round -------


@pytest.mark.parametrize(
    "dns",
    [
        pytest.param("llama..serving:8000", id="an empty label"),
        pytest.param("a" * 64 + ".serving:8000", id="a label of 64 characters"),
    ],
)
async def test_a_dns_name_no_resolver_encodes_fails_its_lookup_not_the_health_round(
    dns: str, caplog: pytest.LogCaptureFixture
) -> None:
    parse_config(f"dns: {dns}", "gateway.yaml")  # the config takes it: it may resolve later
    sim = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", model="m")
    await sim.start()
    try:
        with caplog.at_level(logging.WARNING, logger="serving.gateway"):
            async with gateway_for([sim.url], dns=dns) as server:
                await eventually(lambda: labelled(server, "_ready") == 1, "the round reported")
                assert labelled(server, "_loop_errors", "health") == 0
        lookups = [r for r in caplog.records if "cannot resolve" in r.getMessage()]
        assert len(lookups) == 1 and lookups[0].exc_info is None
        assert not [r for r in caplog.records if "health round failed" in r.getMessage()]
    finally:
        await sim.stop()


# --- GZ-4: the simulated replica's health fails once its engine stopped -------------------


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(RuntimeError, id="a runtime error stepping the engine"),
        pytest.param(ZeroDivisionError, id="an arithmetic error stepping the engine"),
        pytest.param(KeyError, id="a lookup error stepping the engine"),
    ],
)
async def test_a_sim_replica_whose_engine_stopped_fails_its_health(
    error: type[Exception], caplog: pytest.LogCaptureFixture
) -> None:
    sim = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", model="m")
    await sim.start()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(sim.url + "/health") as r:
                assert r.status == 200

            def broken(start: float) -> float:
                raise error("injected")

            sim.replica.engine._schedule = broken  # type: ignore[method-assign]
            with caplog.at_level(logging.CRITICAL, logger="serving.sim_http"):
                sim.replica.engine.submit(3, 2)  # a step now raises
                engine = sim.replica._engine
                await eventually(lambda: engine is not None and engine.done(), "engine stopped")
            async with client.get(sim.url + "/health") as r:
                assert r.status == 503
        assert [r for r in caplog.records if "engine stopped" in r.getMessage()]
    finally:
        await sim.stop()


# --- GZ-5: sim-replica --model is a name a gateway takes ----------------------------------


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("", id="an empty model name is refused before the replica starts"),
        pytest.param("   ", id="a blank model name is refused"),
        pytest.param("m" * (MAX_MODEL_ID_CHARS + 1), id="a name longer than a gateway reads"),
    ],
)
def test_sim_replica_refuses_a_model_name_no_gateway_would_route_to(
    model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["sim-replica", "--model", model])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model" in err and len(err) < 300


@given(st.text(max_size=600))
def test_any_model_name_sim_replica_takes_is_one_a_gateway_reads(model: str) -> None:
    try:
        args = build_parser().parse_args(["sim-replica", "--model", model])
    except SystemExit:
        return
    listed = json.dumps({"data": [{"id": args.model, "object": "model"}]}).encode()
    assert read_model_list(listed).models == frozenset({model})


# --- GZ-6: /health names the config and discovery loops too ------------------------------


class StoppingSource(ConfigSource):
    """A config source whose follow loop ends on ``error`` (as no real one should)."""

    def __init__(self, error: type[Exception]) -> None:
        super().__init__()
        self.error = error

    async def follow(self, store: ConfigStore[C]) -> None:
        raise self.error("injected")


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(RuntimeError, id="a reload loop ending on a runtime error fails health"),
        pytest.param(MemoryError, id="a reload loop ending on a memory error fails health"),
    ],
)
async def test_a_config_loop_that_stops_anyway_fails_the_gateway_s_health(
    error: type[Exception],
) -> None:
    config = parse_config("namespace: a\ndeployment: llama\n", "gateway.yaml")
    server = GatewayServer(
        [], config.settings(), "127.0.0.1:0", "127.0.0.1:0",
        config=config, source=StoppingSource(error), parse=parse_config,
    )  # fmt: skip
    await server.start()
    try:
        loop = server.gateway.loops["config"]
        await eventually(loop.done, "the config loop ended")
        url = f"http://127.0.0.1:{server.port}/health"
        async with aiohttp.ClientSession() as client, client.get(url) as r:
            assert r.status == 503
            assert (await r.json())["stopped"] == ["config"]
    finally:
        await server.stop()  # a loop that ended on an exception does not stop the stop
