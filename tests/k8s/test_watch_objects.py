"""``watch_objects`` on any resource: cluster-scoped, across namespaces, a CRD installed late."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from foundation.kube import NODES, PODS, Resource, Selection, watch_objects

pytestmark = pytest.mark.k8s


class Seen:
    """The latest set a watch handed over, and an event per change to wait on."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.changed = asyncio.Event()

    def update(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.changed.set()

    async def until(self, what: str, check: Callable[[dict[str, Any]], bool]) -> None:
        async with asyncio.timeout(30):
            while not check(self.objects):
                self.changed.clear()
                await self.changed.wait()


def pod(name):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/x:1"}]},
    }


async def test_a_cluster_scoped_resource_is_keyed_by_name(control_plane, kube_access):
    name = f"node-{secrets.token_hex(3)}"
    seen = Seen()
    task = asyncio.create_task(
        watch_objects(
            kube_access,
            Selection(NODES, field_selector=f"metadata.name={name}"),
            seen.update,
        )
    )
    try:
        control_plane.ensure("/api/v1/nodes", {"metadata": {"name": name}})
        await seen.until("the node", lambda objects: name in objects)
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")
        await seen.until("the node gone", lambda objects: name not in objects)
    finally:
        task.cancel()


async def test_all_namespaces_are_keyed_namespace_slash_name(control_plane, kube_access):
    first, second = f"w1-{secrets.token_hex(3)}", f"w2-{secrets.token_hex(3)}"
    for namespace in (first, second):
        control_plane.create_namespace(namespace)
        control_plane.ensure(f"/api/v1/namespaces/{namespace}/pods", pod("same-name"))
    seen = Seen()
    task = asyncio.create_task(
        watch_objects(
            kube_access,
            Selection(PODS, field_selector="metadata.name=same-name"),
            seen.update,
        )
    )
    try:
        await seen.until(
            "both pods",
            lambda objects: {f"{first}/same-name", f"{second}/same-name"} <= set(objects),
        )
    finally:
        task.cancel()


async def test_a_crd_installed_after_the_watch_started_is_picked_up(control_plane, kube_access):
    group = f"t{secrets.token_hex(3)}.example.com"
    widgets = Resource(group, "v1", "widgets", namespaced=False)
    errors: list[Exception] = []
    seen = Seen()
    task = asyncio.create_task(
        watch_objects(
            kube_access,
            Selection(widgets),
            seen.update,
            reconnect_min=0.1,
            reconnect_max=0.5,
            on_error=errors.append,
        )
    )
    try:
        async with asyncio.timeout(30):
            while not errors:  # noqa: ASYNC110 - on_error must not block: no event to set
                await asyncio.sleep(0.05)
        assert isinstance(errors[0], client.ApiException) and errors[0].status == 404
        assert seen.objects == {}
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

        async with asyncio.timeout(30):
            while not create():  # noqa: ASYNC110 - the API server has no event to wait on
                await asyncio.sleep(0.1)
        await seen.until("the widget seen", lambda objects: "w" in objects)
    finally:
        task.cancel()
