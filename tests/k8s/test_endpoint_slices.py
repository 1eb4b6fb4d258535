"""The exporter finds replicas through a real API server's EndpointSlices.

The API refuses loopback addresses in EndpointSlices (and FQDNs need two labels), so
the replicas here are TEST-NET-1 addresses (192.0.2.0/24, RFC 5737): discovery is what
is tested; scraping discovered targets is the same code as for ``targets``.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from kubernetes_asyncio import client

from exporter.config import ExporterConfig
from exporter.runtime import Exporter
from tests.conftest import eventually

pytestmark = pytest.mark.k8s


def endpoint_slice(name, service, port, *endpoints):
    """One slice of ``service``: endpoints ``(last octet, ready)`` on a "metrics" port."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [f"192.0.2.{octet}"], "conditions": {"ready": ready}}
            for octet, ready in endpoints
        ],
    }


def url(octet, port=8000):
    return f"http://192.0.2.{octet}:{port}/metrics"


@contextlib.asynccontextmanager
async def running(exporter):
    task = asyncio.create_task(exporter.run())
    try:
        yield exporter
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def exporter_for(namespace, kube_access, targets=()):
    config = ExporterConfig.model_validate(
        {
            "interval": "300ms",
            "timeout": "100ms",
            "deployments": [
                {
                    "namespace": namespace,
                    "deployment": "llama",
                    "targets": list(targets),
                    "endpoint-slices": {"service": "llama", "port": "metrics"},
                }
            ],
        }
    )
    return Exporter(config, kube=kube_access)


async def test_ready_endpoints_of_the_service_are_replicas(kube_api, kube_access, namespace):
    api = client.DiscoveryV1Api(kube_api)
    create = api.create_namespaced_endpoint_slice
    await create(namespace, endpoint_slice("llama-a", "llama", 8000, (1, True), (2, False)))
    await create(namespace, endpoint_slice("llama-b", "llama", 9000, (3, True)))
    await create(namespace, endpoint_slice("other", "other", 8000, (9, True)))
    exporter = exporter_for(namespace, kube_access, targets=["127.0.0.1:1"])
    state = exporter.deployments[0]
    async with running(exporter):
        # Flag targets and slices together; a not-ready endpoint and another Service's
        # slices are left out; each slice's own "metrics" port is used.
        want = sorted([url(1), url(3, 9000), "http://127.0.0.1:1/metrics"])
        await eventually(lambda: state.targets == want, "first discovery")

        # 192.0.2.2 turns ready: the watch delivers it without waiting for a resync.
        await api.patch_namespaced_endpoint_slice(
            "llama-a",
            namespace,
            {
                "endpoints": [
                    {"addresses": ["192.0.2.1"], "conditions": {"ready": True}},
                    {"addresses": ["192.0.2.2"], "conditions": {"ready": True}},
                ]
            },
        )
        await eventually(lambda: url(2) in state.targets, "192.0.2.2 after it turned ready")

        # A deleted slice takes its replicas with it.
        await api.delete_namespaced_endpoint_slice("llama-b", namespace)
        await eventually(lambda: url(3, 9000) not in state.targets, "llama-b's replica gone")


async def test_discovery_recovers_after_the_api_server_restarts(
    control_plane, kube_api, kube_access, namespace
):
    api = client.DiscoveryV1Api(kube_api)
    await api.create_namespaced_endpoint_slice(
        namespace, endpoint_slice("llama-a", "llama", 8000, (1, True))
    )
    exporter = exporter_for(namespace, kube_access)
    state = exporter.deployments[0]
    async with running(exporter):
        await eventually(lambda: state.targets == [url(1)], "first discovery")

        await asyncio.to_thread(control_plane.restart_apiserver)
        # While the API server was away the last known replicas stayed in use.
        assert state.targets == [url(1)]

        async with await kube_access.client() as fresh:
            await client.DiscoveryV1Api(fresh).create_namespaced_endpoint_slice(
                namespace, endpoint_slice("llama-b", "llama", 8000, (2, True))
            )
        await eventually(lambda: state.targets == [url(1), url(2)], "discovery after restart")
