"""``watch_objects`` on any resource: cluster-scoped, across namespaces, a CRD installed late."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from kubernetes_asyncio import client

from foundation.kube import NODES, PODS, Resource, Selection, watch_objects

pytestmark = pytest.mark.k8s


async def until(what, check, limit=30.0):
    async with asyncio.timeout(limit):
        while not check():
            await asyncio.sleep(0.05)


def pod(name):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/x:1"}]},
    }


async def test_a_cluster_scoped_resource_is_keyed_by_name(control_plane, kube_access):
    name = f"node-{secrets.token_hex(3)}"
    seen: dict = {}
    task = asyncio.create_task(
        watch_objects(
            kube_access,
            Selection(NODES, field_selector=f"metadata.name={name}"),
            lambda objects: (seen.clear(), seen.update(objects)),
        )
    )
    try:
        control_plane.ensure("/api/v1/nodes", {"metadata": {"name": name}})
        await until("the node", lambda: name in seen)
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")
        await until("the node gone", lambda: name not in seen)
    finally:
        task.cancel()


async def test_all_namespaces_are_keyed_namespace_slash_name(control_plane, kube_access):
    first, second = f"w1-{secrets.token_hex(3)}", f"w2-{secrets.token_hex(3)}"
    for namespace in (first, second):
        control_plane.create_namespace(namespace)
        control_plane.ensure(f"/api/v1/namespaces/{namespace}/pods", pod("same-name"))
    seen: dict = {}
    task = asyncio.create_task(
        watch_objects(
            kube_access,
            Selection(PODS, field_selector="metadata.name=same-name"),
            lambda objects: (seen.clear(), seen.update(objects)),
        )
    )
    try:
        await until("both pods", lambda: {f"{first}/same-name", f"{second}/same-name"} <= set(seen))
    finally:
        task.cancel()


async def test_a_crd_installed_after_the_watch_started_is_picked_up(control_plane, kube_access):
    group = f"t{secrets.token_hex(3)}.example.com"
    widgets = Resource(group, "v1", "widgets", namespaced=False)
    errors: list[Exception] = []
    seen: dict = {}
    task = asyncio.create_task(
        watch_objects(
            kube_access,
            Selection(widgets),
            lambda objects: (seen.clear(), seen.update(objects)),
            reconnect_min=0.1,
            reconnect_max=0.5,
            on_error=errors.append,
        )
    )
    try:
        await until("a 404 for the missing CRD", lambda: bool(errors))
        assert isinstance(errors[0], client.ApiException) and errors[0].status == 404
        assert seen == {}
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{group}"},
            "spec": {
                "group": group,
                "scope": "Cluster",
                "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object"}},
                    }
                ],
            },
        }
        control_plane.ensure("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

        def create() -> bool:
            try:
                control_plane.ensure(
                    f"/apis/{group}/v1/widgets",
                    {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w"}},
                )
            except Exception:  # the CRD is not served yet
                return False
            return True

        await until("the widget created", create)
        await until("the widget seen", lambda: "w" in seen)
    finally:
        task.cancel()
