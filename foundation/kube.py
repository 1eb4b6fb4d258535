"""Talking to the Kubernetes API: client access and a list-then-watch loop.

``watch_objects`` is a small informer: it lists the selected objects, then watches from
the list's ``resourceVersion``; every change hands the whole current set (name -> raw
JSON object) to a callback. The watch ends after ``resync`` seconds (server-side
timeout) and the loop lists again, so a missed event is repaired within one resync. A
broken connection (an API server restart) or a ``410 GoneError`` relists after a capped,
doubling backoff; meanwhile the last known set stays in use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
from kubernetes_asyncio import client, config

from foundation.errors import ConfigError

log = logging.getLogger(__name__)

RawObject = dict[str, Any]
"""An API object as the server's JSON (camelCase keys), never a generated model."""


@dataclass(frozen=True, slots=True)
class KubeAccess:
    """How to reach the API server: a kubeconfig file, or the pod's service account.

    ``kubeconfig=None`` means in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else
    ``$KUBECONFIG`` or ``~/.kube/config`` (kubectl's order).
    """

    kubeconfig: Path | None = None

    async def client(self) -> client.ApiClient:
        """A new API client; the caller closes it.

        Raises:
            ConfigError: no usable kubeconfig or service account.
        """
        configuration = client.Configuration()
        try:
            if self.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                await config.load_kube_config(
                    config_file=self._kubeconfig_file(),
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (config.ConfigException, OSError) as err:
            where = self.kubeconfig or "in-cluster/KUBECONFIG/~/.kube/config"
            raise ConfigError(f"--kubeconfig {where}: {err}") from err
        return client.ApiClient(configuration)

    def _kubeconfig_file(self) -> str:
        path = self.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        return os.path.expanduser(path)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects to watch: one resource in one namespace, narrowed by selectors."""

    resource: Literal["configmaps", "endpointslices"]
    namespace: str
    label_selector: str = ""
    field_selector: str = ""

    def __str__(self) -> str:
        narrowed = ",".join(s for s in (self.label_selector, self.field_selector) if s)
        return f"{self.resource} in {self.namespace}" + (f" ({narrowed})" if narrowed else "")


def _list_method(api: client.ApiClient, resource: str) -> Callable[..., Awaitable[Any]]:
    if resource == "configmaps":
        return client.CoreV1Api(api).list_namespaced_config_map
    return client.DiscoveryV1Api(api).list_namespaced_endpoint_slice


class GoneError(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


async def watch_objects(
    access: KubeAccess,
    selection: Selection,
    on_change: Callable[[dict[str, RawObject]], None],
    *,
    resync: float = 300.0,
    reconnect_min: float = 0.5,
    reconnect_max: float = 30.0,
) -> None:
    """List and watch ``selection`` forever, calling ``on_change`` with every new set.

    ``on_change`` runs after each list and after each watch event, with a dict of
    object name to raw object; it must not block.
    """
    delay = reconnect_min
    while True:
        try:
            api = await access.client()
        except ConfigError as err:
            log.error("cannot watch %s: %s; retrying in %.1fs", selection, err, delay)
        else:
            try:
                async with api:
                    while True:
                        objects, version = await _list(api, selection)
                        on_change(dict(objects))
                        delay = reconnect_min
                        await _watch(api, selection, objects, version, on_change, resync)
            except GoneError:
                log.info("watch on %s expired (410 GoneError); listing again", selection)
                continue
            except (aiohttp.ClientError, client.ApiException, TimeoutError, ValueError) as err:
                log.warning(
                    "watch on %s failed (%s: %s); retrying in %.1fs",
                    selection,
                    type(err).__name__,
                    err,
                    delay,
                )
        await asyncio.sleep(delay)
        delay = min(delay * 2, reconnect_max)


async def _list(api: client.ApiClient, selection: Selection) -> tuple[dict[str, RawObject], str]:
    method = _list_method(api, selection.resource)
    response = await method(
        selection.namespace,
        label_selector=selection.label_selector,
        field_selector=selection.field_selector,
        _preload_content=False,
        _request_timeout=30,
    )
    body = json.loads(await response.read())
    items = {item["metadata"]["name"]: item for item in body.get("items") or []}
    return items, str(body["metadata"]["resourceVersion"])


async def _watch(
    api: client.ApiClient,
    selection: Selection,
    objects: dict[str, RawObject],
    version: str,
    on_change: Callable[[dict[str, RawObject]], None],
    resync: float,
) -> None:
    """Apply watch events to ``objects`` until the server ends the watch after ``resync``."""
    method = _list_method(api, selection.resource)
    response = await method(
        selection.namespace,
        label_selector=selection.label_selector,
        field_selector=selection.field_selector,
        watch=True,
        allow_watch_bookmarks=True,
        resource_version=version,
        timeout_seconds=int(resync),
        _preload_content=False,
        # The client-side limit only guards against a silently dead connection.
        _request_timeout=resync + 30,
    )
    async with response:
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise GoneError
                raise ValueError(f"watch error: {obj.get('message', obj)}")
            if kind == "BOOKMARK":
                continue
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                objects.pop(name, None)
            else:
                objects[name] = obj
            on_change(dict(objects))
