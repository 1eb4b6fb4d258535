"""The gateway finds replicas through a real API server's EndpointSlices."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from serving.config import GatewayConfig
from serving.server import GatewayServer
from tests.conftest import eventually
from tests.k8s.test_endpoint_slices import endpoint_slice

pytestmark = pytest.mark.k8s


async def test_ready_endpoints_of_the_service_are_gateway_replicas(
    kube_api, kube_access, namespace
):
    api = client.DiscoveryV1Api(kube_api)
    await api.create_namespaced_endpoint_slice(
        namespace, endpoint_slice("llama-a", "llama", 8000, (1, True), (2, False))
    )
    config = GatewayConfig.model_validate(
        {"namespace": namespace, "health-interval": "100ms",
         "endpoint-slices": {"service": "llama", "port": "metrics", "path": "/"}}
    )  # fmt: skip
    server = GatewayServer(
        config.replicas,
        config.settings(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        config=config,
        kube=kube_access,
    )
    await server.start()
    try:
        g = server.gateway
        await eventually(
            lambda: [r.url for r in g.replicas] == ["http://192.0.2.1:8000"], "discovery"
        )
        await api.delete_namespaced_endpoint_slice("llama-a", namespace)
        await eventually(lambda: g.replicas == [], "the deleted slice's replica gone")
    finally:
        await server.stop()
