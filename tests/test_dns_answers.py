"""A DNS answer naming no address a pod can have is a failed lookup, not an empty fleet.

A filtering resolver answers 0.0.0.0 for a name it blocks; a bad rewrite or a forged
answer can name a multicast group. Such addresses were dropped and the empty rest taken
as the replica list: the exporter published 0 replicas and no load for a busy fleet (the
scaler scaled it to zero after its idle grace) and the gateway drained every replica
(issue 27, hostile pass 53). ``socket.getaddrinfo``'s answer is replaced; no real DNS.
"""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from exporter.config import ExporterConfig
from exporter.runtime import Exporter
from foundation import dns
from foundation.dns import resolve_addresses
from foundation.replica_model import LLAMA3_8B_H200
from serving.server import SimReplicaServer
from tests.conftest import FakeClock, eventually
from tests.test_gateway_isolation import gateway_for
from tests.test_serving_hostile7 import labelled

BUSY = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 50
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 20
"""


class Resolver:
    """``getaddrinfo`` answering ``addresses`` for every name, counting its lookups."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
        self.addresses, self.lookups = list(addresses), 0
        monkeypatch.setattr(dns, "_getaddrinfo", self)

    def __call__(self, host: str, port: int) -> list[Any]:
        self.lookups += 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in self.addresses]


@pytest.mark.parametrize(
    ("answer", "replicas"),
    [
        pytest.param(["10.0.0.7", "10.0.0.3"], ["10.0.0.3", "10.0.0.7"],
                     id="pod addresses are the replicas, sorted"),
        pytest.param(["10.0.0.7", "0.0.0.0"], ["10.0.0.7"],
                     id="an unspecified address beside a pod's is left out"),
        pytest.param(["0.0.0.0"], None, id="only the unspecified address is no answer"),
        pytest.param(["255.255.255.255"], None, id="only the broadcast address is no answer"),
        pytest.param(["224.0.0.1", "0.0.0.0"], None, id="only multicast and 0.0.0.0 is no answer"),
    ],
)  # fmt: skip
async def test_an_answer_of_no_pod_address_fails_the_lookup(
    monkeypatch: pytest.MonkeyPatch, answer: list[str], replicas: list[str] | None
) -> None:
    Resolver(monkeypatch, *answer)
    if replicas is None:
        with pytest.raises(OSError, match="resolves to no address a pod can have"):
            await resolve_addresses("llama.serving:8000")
    else:
        assert await resolve_addresses("llama.serving:8000") == (replicas, 8000)


async def test_the_exporter_keeps_a_busy_fleet_through_an_answer_of_no_pod_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=BUSY)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    resolver = Resolver(monkeypatch, "127.0.0.1")
    config = ExporterConfig.model_validate(
        {"deployments": [{"deployment": "llama", "dns": f"llama.serving.svc:{port}"}]}
    )
    exporter = Exporter(config, FakeClock())
    try:
        async with aiohttp.ClientSession() as session:
            await exporter.cycle(session)
            resolver.addresses = ["0.0.0.0"]
            await exporter.cycle(session)
    finally:
        await runner.cleanup()
    state = exporter.deployments[0]
    assert resolver.lookups == 2 and state.signals is not None
    assert (state.signals.replicas, state.signals.running) == (1, 20.0)
    assert "no address a pod can have (0.0.0.0)" in state.discovery_problem


async def test_the_gateway_keeps_routing_through_an_answer_of_no_pod_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", model="m")
    await sim.start()
    port = sim.url.rsplit(":", 1)[1]
    resolver = Resolver(monkeypatch, "127.0.0.1")
    try:
        async with gateway_for([], dns=f"llama.serving.svc:{port}") as server:
            await eventually(lambda: labelled(server, "_ready") == 1, "the replica found")
            resolver.addresses, asked = ["224.0.0.1"], resolver.lookups
            await eventually(lambda: resolver.lookups >= asked + 3, "three lookups since")
            assert labelled(server, "_ready") == 1
            assert [r.url for r in server.gateway.replicas] == [f"http://127.0.0.1:{port}"]
    finally:
        await sim.stop()
