"""Each component's RBAC in deploy/ is enough for its real API calls, and each rule is needed.

``as_shipped`` takes a component's ServiceAccount, Roles and bindings from ``kustomize
build deploy/base`` (the real kustomize, as ``tests/test_deploy.py`` renders it), puts
them into the test's namespaces (``unitscale`` and the served namespace ``serving`` each
mapped to a fresh one; cluster-scoped names suffixed), creates them, and returns a
``KubeAccess`` whose kubeconfig holds only a token of that ServiceAccount from the
TokenRequest API. With RBAC on (the fixture's API server authorizes with ``RBAC``), any
request the rules miss answers 403.

Enough: the scaler, the exporter and the gateway start with ``--config-configmap`` on
that token (a get at start, then a list and a watch), follow an edit of their ConfigMap,
and the exporter and the gateway find replicas through the EndpointSlices of the served
namespace, as deploy/ runs them. Needed: with any one verb of ``USED`` taken out of the
rules, the call that needs it is refused with 403. Fluid prewarm's rights
(``deploy/components/scaler-prewarm``, rendered in ``overlays/production``) alike: the
scaler's ``Prewarmer`` itself (``tests/k8s/test_prewarm.py``'s scenario of an evicted
cache: its watches, a DataLoad created, deleted under its UID and created again), and a
403 for each verb taken away. The admission controller runs on its token in
``tests/k8s/test_admission_rbac.py`` (on the same helper); here each request it sends
(``tests.test_admission_deploy.used_by_the_controller``) passes the shipped role and gets
403 from the role less that one rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from exporter.app import ExporterServer
from exporter.config import parse_config as parse_exporter
from foundation.discovery import EndpointSlicesConfig, EndpointSliceWatch
from foundation.errors import ConfigError
from foundation.kube import DATALOADS, DATASETS, KubeAccess, Selection, create, watch_objects
from foundation.reload import ConfigSource, ConfigStore, read_configmap, watch_configmap
from scaler.config import parse_config as parse_scaler
from scaler.registry import ScaledObjectRegistry
from scaler.scaled_objects import ScaledObjectWatch
from scaler.server import ScalerServer
from scaler.signals import SignalStore
from serving.config import parse_config as parse_gateway
from serving.server import GatewayServer
from tests.conftest import eventually
from tests.k8s import test_prewarm as prewarm
from tests.k8s.control_plane import ControlPlane
from tests.k8s.test_endpoint_slices import endpoint_slice
from tests.shared_data import shared
from tests.test_deploy import PREWARM, USED, render

pytestmark = pytest.mark.k8s

BINDINGS = ("RoleBinding", "ClusterRoleBinding")
CLUSTER_SCOPED = ("ClusterRole", "ClusterRoleBinding")
Rule = tuple[str, str, str]  # (API group, resource, verb)
# A cap against hangs, not a timing assertion: a watch refused for a moment (a fresh
# CRD's watch cache answers 429) backs off up to 30 s, and this machine may be loaded.
CAP = 60.0  # (pytest-timeout ends a test at 120 s)


# --- the identity -------------------------------------------------------------------------


def role_key(kind: str, name: str, namespace: str | None) -> tuple[str, str, str | None]:
    return (kind, name, namespace if kind == "Role" else None)


def identity_objects(docs: list[dict[str, Any]], account: str) -> list[dict[str, Any]]:
    """The ServiceAccount ``account``, the bindings naming it and the roles they bind."""
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account]
    bindings = [
        d
        for d in docs
        if d["kind"] in BINDINGS
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in d["subjects"])
    ]
    wanted = {
        role_key(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in bindings
    }
    roles = [
        d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        and role_key(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) in wanted
    ]
    assert len(roles) == len(wanted), f"{account}: a binding names a role deploy/ lacks"
    return [sa, *roles, *bindings]


def relocated(obj: dict[str, Any], namespaces: dict[str, str], suffix: str) -> dict[str, Any]:
    """``obj`` moved into the test's namespaces, a cluster-scoped name suffixed."""
    obj = yaml.safe_load(yaml.safe_dump(obj))  # a deep copy
    meta = obj["metadata"]
    if obj["kind"] in CLUSTER_SCOPED:
        meta["name"] += f"-{suffix}"
    else:
        meta["namespace"] = namespaces[meta["namespace"]]
    if obj["kind"] in BINDINGS:
        if obj["roleRef"]["kind"] == "ClusterRole":
            obj["roleRef"]["name"] += f"-{suffix}"
        for subject in obj["subjects"]:
            subject["namespace"] = namespaces[subject["namespace"]]
    return obj


def without(role: dict[str, Any], drop: Rule) -> dict[str, Any]:
    """``role`` with the verb of ``drop`` taken out of every rule it is in."""
    group, resource, verb = drop
    rules = []
    for rule in role["rules"]:
        if group in rule["apiGroups"] and resource in rule["resources"]:
            rule = {**rule, "verbs": [v for v in rule["verbs"] if v != verb]}
        if rule["verbs"]:
            rules.append(rule)
    return {**role, "rules": rules}


def service_account_token(plane: ControlPlane, namespace: str, name: str) -> str:
    """A token for the ServiceAccount, from the TokenRequest API."""
    answer = plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    return str(answer["status"]["token"])


def token_kubeconfig(plane: ControlPlane, token: str, path: Path) -> Path:
    """A kubeconfig at ``path`` whose only credential is ``token``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {"server": plane.host, "certificate-authority": str(plane.ca_file)},
            }
        ],
        "users": [{"name": "account", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "account"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def collection(obj: dict[str, Any]) -> str:
    plural = {"ServiceAccount": "serviceaccounts"}.get(obj["kind"]) or obj["kind"].lower() + "s"
    if obj["kind"] == "ServiceAccount":
        return f"/api/v1/namespaces/{obj['metadata']['namespace']}/{plural}"
    base = "/apis/rbac.authorization.k8s.io/v1"
    if obj["kind"] in CLUSTER_SCOPED:
        return f"{base}/{plural}"
    return f"{base}/namespaces/{obj['metadata']['namespace']}/{plural}"


def as_shipped(
    plane: ControlPlane,
    account: str,
    namespaces: dict[str, str],
    directory: Path,
    drop: Rule | None = None,
    docs: list[dict[str, Any]] | None = None,
) -> KubeAccess:
    """API access as deploy/'s ``account``, its objects created in ``namespaces``.

    ``docs``: the objects to take them from (default: ``kustomize build deploy/base``);
    ``drop``: one (group, resource, verb) taken out of its roles' rules.
    """
    suffix = secrets.token_hex(3)
    for obj in identity_objects(docs if docs is not None else render("base"), account):
        obj = relocated(obj, namespaces, suffix)
        if drop is not None and obj["kind"] in ("Role", "ClusterRole"):
            obj = without(obj, drop)
        plane.ensure(collection(obj), obj)
    token = service_account_token(plane, namespaces["unitscale"], account)
    return KubeAccess(token_kubeconfig(plane, token, directory / f"{account}-{suffix}.kubeconfig"))


@pytest.fixture
def served(control_plane: ControlPlane, namespace: str) -> str:
    """A second namespace for the models deploy/ calls `serving`."""
    name = f"{namespace[:50]}-srv"
    control_plane.create_namespace(name)
    return name


REFUSED = re.compile(r"\b403\b|Forbidden")
"""A refusal in a log line: 403 as a word, not inside a test namespace's random suffix
(``...-403c55-srv`` once matched a line about replicas)."""


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("foundation") and REFUSED.search(r.getMessage())
    ]


# --- enough --------------------------------------------------------------------------------


def shipped_configmap(component: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    """deploy/'s ConfigMap of ``component`` (same name and key), holding ``data``."""
    configmap = next(
        d
        for d in render("base")
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"unitscale-{component}"
    )
    assert set(data) <= set(configmap["data"])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap["metadata"]["name"], "namespace": namespace},
        "data": data,
    }


def config_flag(component: str, namespace: str) -> str:
    """The Deployment's --config-configmap, $(POD_NAMESPACE) expanded."""
    deployment = next(
        d
        for d in render("base")
        if d["kind"] == "Deployment" and d["metadata"]["name"] == f"unitscale-{component}"
    )
    (flag,) = [
        a
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if a.startswith("--config-configmap=")
    ]
    return flag.partition("=")[2].replace("$(POD_NAMESPACE)", namespace)


def edit(plane: ControlPlane, namespace: str, name: str, key: str, text: str) -> None:
    """Replace ``key`` of the ConfigMap (as the admin: what `kubectl edit` does)."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
    configmap = plane.request("GET", path)
    configmap["data"][key] = text
    plane.request("PUT", path, configmap)


SCALER_CONFIG = "max-signal-age: 30s\nsignal-sources: [{address: '127.0.0.1:1'}]\n"
SCALER_EDITED = "max-signal-age: 12s\nsignal-sources: [{address: '127.0.0.1:2'}]\n"


async def test_the_scaler_on_its_token_reads_and_follows_its_configmap(
    control_plane, namespace, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG, logger="foundation")
    control_plane.ensure(
        f"/api/v1/namespaces/{namespace}/configmaps",
        shipped_configmap("scaler", namespace, {"config.yaml": SCALER_CONFIG}),
    )
    kube = as_shipped(control_plane, "unitscale-scaler", {"unitscale": namespace}, tmp_path)
    source = ConfigSource(configmap=config_flag("scaler", namespace), kube=kube)
    server = ScalerServer(
        parse_scaler(await source.read(), source.origin), "127.0.0.1:0", source=source
    )
    await server.start()
    try:
        edit(control_plane, namespace, "unitscale-scaler", "config.yaml", SCALER_EDITED)
        await eventually(lambda: server.configs.reloads == 1, "the edit reloaded")
        assert server.config.max_signal_age == 12.0
    finally:
        await server.stop()
    assert refusals(caplog) == []


def exporter_config(served: str, interval: str) -> str:
    return yaml.safe_dump(
        {
            "interval": interval,
            "timeout": "100ms",
            "deployments": [
                {
                    "namespace": served,
                    "deployment": "llama",
                    "endpoint-slices": {"service": "llama", "port": "metrics"},
                }
            ],
        }
    )


async def test_the_exporter_on_its_token_follows_its_configmap_and_finds_replicas(
    control_plane, namespace, served, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG, logger="foundation")
    control_plane.ensure(
        f"/api/v1/namespaces/{namespace}/configmaps",
        shipped_configmap(
            "exporter", namespace, {"exporter.yaml": exporter_config(served, "300ms")}
        ),
    )
    control_plane.ensure(
        f"/apis/discovery.k8s.io/v1/namespaces/{served}/endpointslices",
        endpoint_slice("llama-a", "llama", 8000, (1, True)),
    )
    spaces = {"unitscale": namespace, "serving": served}
    kube = as_shipped(control_plane, "unitscale-exporter", spaces, tmp_path)
    source = ConfigSource(configmap=config_flag("exporter", namespace), kube=kube)
    config = parse_exporter(await source.read(), source.origin)
    server = ExporterServer(config, source=source, kube=kube)
    await server.start()
    try:
        state = server.exporter.deployments[0]
        await eventually(lambda: state.targets == ["http://192.0.2.1:8000/metrics"], "discovery")
        edit(
            control_plane,
            namespace,
            "unitscale-exporter",
            "exporter.yaml",
            exporter_config(served, "400ms"),
        )
        await eventually(lambda: server.configs.reloads == 1, "the edit reloaded")
        state = server.exporter.deployments[0]
        await eventually(lambda: state.targets == ["http://192.0.2.1:8000/metrics"], "again")
    finally:
        await server.stop()
    assert refusals(caplog) == []


def gateway_config(served: str, buffer_size: int) -> str:
    return yaml.safe_dump(
        {
            "namespace": served,
            "deployment": "llama",
            "health-interval": "100ms",
            "buffer-size": buffer_size,
            "endpoint-slices": {"service": "llama", "port": "metrics", "path": "/"},
        }
    )


async def test_the_gateway_on_its_token_follows_its_configmap_and_finds_replicas(
    control_plane, namespace, served, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG, logger="foundation")
    control_plane.ensure(
        f"/api/v1/namespaces/{namespace}/configmaps",
        shipped_configmap("gateway", namespace, {"gateway.yaml": gateway_config(served, 10)}),
    )
    control_plane.ensure(
        f"/apis/discovery.k8s.io/v1/namespaces/{served}/endpointslices",
        endpoint_slice("llama-a", "llama", 8000, (1, True)),
    )
    spaces = {"unitscale": namespace, "serving": served}
    kube = as_shipped(control_plane, "unitscale-gateway", spaces, tmp_path)
    source = ConfigSource(configmap=config_flag("gateway", namespace), kube=kube)
    config = parse_gateway(await source.read(), source.origin)
    server = GatewayServer(
        config.replicas, config.settings(), "127.0.0.1:0", "127.0.0.1:0",
        config=config, source=source, parse=parse_gateway, kube=kube,
    )  # fmt: skip
    await server.start()
    try:
        gateway = server.gateway
        await eventually(
            lambda: [r.url for r in gateway.replicas] == ["http://192.0.2.1:8000"], "discovery"
        )
        edit(
            control_plane,
            namespace,
            "unitscale-gateway",
            "gateway.yaml",
            gateway_config(served, 20),
        )
        configs = server.configs
        assert configs is not None  # given a source, the server keeps a store
        await eventually(lambda: configs.reloads == 1, "the edit reloaded")
    finally:
        await server.stop()
    assert refusals(caplog) == []


# --- needed --------------------------------------------------------------------------------


async def refused_while(
    run: Coroutine[Any, Any, object], caplog: pytest.LogCaptureFixture
) -> list[str]:
    """Run a forever-watch until it logs a refusal; the refusals logged."""
    task = asyncio.create_task(run)
    try:
        await eventually(lambda: refusals(caplog) or task.done(), "a 403 logged")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return refusals(caplog)


def the_call_needing(
    rule: Rule, kube: KubeAccess, configmap: str, namespace: str, served: str
) -> Coroutine[Any, Any, object]:
    """The component's own call that sends ``rule``'s request (--config-configmap's
    startup read, its watch, or the EndpointSlice watch of ``endpoint-slices``)."""
    _, resource, verb = rule
    if resource == "configmaps" and verb == "get":
        return read_configmap(kube, namespace, configmap, "k")
    if resource == "configmaps":
        store: ConfigStore[str] = ConfigStore("", lambda text, origin: text)
        return watch_configmap(store, kube, namespace, configmap, "k")
    watch = EndpointSliceWatch(served, EndpointSlicesConfig(service="llama", port="metrics"))
    return watch.run(kube)


def each_rule() -> list[Any]:
    return [
        pytest.param(
            component, (group, resource, verb), id=f"{component} without {verb} {resource}"
        )
        for component, used in sorted(USED.items())
        for group, resource, verb, _ in sorted(used)
        if resource != "scaledobjects"  # test_the_scalers_scaled_object_watch_on_its_token
    ]


@pytest.mark.parametrize(("component", "rule"), each_rule())
async def test_without_any_one_rule_the_call_needing_it_is_refused(
    control_plane, namespace, served, tmp_path, caplog, component, rule
):
    caplog.set_level(logging.DEBUG, logger="foundation")
    name = f"unitscale-{component}"
    control_plane.ensure(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": ""}},
    )
    spaces = {"unitscale": namespace, "serving": served}
    kube = as_shipped(control_plane, name, spaces, tmp_path, drop=rule)
    call = the_call_needing(rule, kube, name, namespace, served)
    if rule[2] == "get":
        with pytest.raises(ConfigError, match="403"):
            await call
    else:
        (refusal, *_) = await refused_while(call, caplog)
        assert rule[1] in refusal


# --- Fluid prewarm (components/scaler-prewarm) ----------------------------------------------

FLUID = "/apis/data.fluid.io/v1alpha1"


@pytest.fixture(scope="module")
def fluid(control_plane: ControlPlane) -> list[str]:
    files = [shared("crds", "fluid", f"data.fluid.io_{k}.yaml") for k in ("datasets", "dataloads")]
    return control_plane.apply_crds(files)


def dataload(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "data.fluid.io/v1alpha1",
        "kind": "DataLoad",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"dataset": {"name": "weights", "namespace": namespace}},
    }


def delete_as(kube: KubeAccess, path: str, uid: str) -> int:
    """DELETE ``path`` under a UID precondition with ``kube``'s token: the status."""
    assert kube.kubeconfig is not None
    config = yaml.safe_load(kube.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
    body["propagationPolicy"] = "Background"
    body["preconditions"] = {"uid": uid}
    request = urllib.request.Request(
        f"{cluster['server']}{path}", data=json.dumps(body).encode(), method="DELETE"
    )
    request.add_header("Authorization", f"Bearer {user['token']}")
    request.add_header("Content-Type", "application/json")
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        with err:
            return err.code


@dataclass
class PrewarmOutcome:
    created: str | int = 0
    """The DataLoad's UID, or the status that refused it."""
    watched: bool = False
    """The DataLoad came through the watch."""
    statuses: list[int | None] = field(default_factory=list)
    """Of every failed list or watch."""


async def prewarm_requests(kube: KubeAccess, served: str, name: str) -> PrewarmOutcome:
    """The prewarm's requests as scaler.prewarm.shell sends them, and what came of them.

    Watches (list + watch) of every namespace's Datasets and DataLoads through
    ``foundation.kube.watch_objects``, and a DataLoad created through
    ``foundation.kube.create`` (its delete: ``delete_as``).
    """
    seen: dict[str, dict[str, Any]] = {}
    outcome = PrewarmOutcome()

    def remember(kind: str) -> Callable[[dict[str, Any]], None]:
        return lambda objects: seen.__setitem__(kind, objects)

    def failed(err: Exception) -> None:
        outcome.statuses.append(getattr(err, "status", None))

    watches = [
        asyncio.create_task(
            watch_objects(kube, Selection(resource), remember(kind), on_error=failed)
        )
        for kind, resource in (("datasets", DATASETS), ("dataloads", DATALOADS))
    ]
    try:
        # A CRD's watch cache may answer 429 for a moment after it is created: retried.
        await eventually(lambda: len(seen) == 2 or 403 in outcome.statuses, "both listed", CAP)
        async with await kube.client() as api:
            try:
                made = await create(api, DATALOADS, dataload(served, name))
                outcome.created = str(made["metadata"]["uid"])
            except client.ApiException as err:
                outcome.created = int(err.status)
        key = f"{served}/{name}"
        if isinstance(outcome.created, str):
            await eventually(
                lambda: key in seen.get("dataloads", {}) or 403 in outcome.statuses,
                "the watch",
                CAP,
            )
            outcome.watched = key in seen.get("dataloads", {})
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
    return outcome


async def test_the_scalers_prewarm_on_its_token_loads_and_reloads_an_evicted_cache(
    control_plane, fluid, namespace, served, tmp_path, monkeypatch
):
    """scaler.prewarm.Prewarmer itself: its watches, a DataLoad created, and after an
    eviction deleted under its UID and created again, all on the scaler's token."""
    prewarm.short_status_lag(monkeypatch)
    spaces = {"unitscale": namespace, "serving": served}
    docs = render("overlays/production")
    kube = as_shipped(control_plane, "unitscale-scaler", spaces, tmp_path, docs=docs)
    cluster = prewarm.Cluster(control_plane, served)
    cluster.create_dataset("0.0%")
    scaler = prewarm.Scaler(kube, served)
    async with prewarm.running(scaler):
        await prewarm.eventually("Fluid's objects listed", scaler.listed, CAP)
        scaler.arrive()
        (first,) = await prewarm.eventually("one DataLoad", cluster.dataloads, CAP)
        cluster.complete(first["metadata"]["name"])
        cluster.set_cached("100.0%")
        await prewarm.eventually("warm", lambda: scaler.state() == "warm", CAP)
        cluster.set_cached("12.0%")  # evicted: ours is deleted, then created again
        uid = first["metadata"]["uid"]
        await prewarm.eventually(
            "a new DataLoad",
            lambda: [d for d in cluster.dataloads() if d["metadata"]["uid"] != uid],
            CAP,
        )
        await prewarm.eventually("following the new load", scaler.following, CAP)
        status = scaler.status()
    assert (status.created, status.write_errors) == (2, 0)
    assert scaler.prewarm.listed


@pytest.mark.parametrize(
    "rule",
    [pytest.param((g, r, v), id=f"prewarm without {v} {r}") for g, r, v, _ in sorted(PREWARM)],
)
async def test_without_any_one_prewarm_rule_its_request_is_refused(
    control_plane, fluid, namespace, served, tmp_path, rule
):
    spaces = {"unitscale": namespace, "serving": served}
    docs = render("overlays/production")
    kube = as_shipped(control_plane, "unitscale-scaler", spaces, tmp_path, drop=rule, docs=docs)
    verb = rule[2]
    if verb == "delete":
        made = control_plane.request(
            "POST", f"{FLUID}/namespaces/{served}/dataloads", dataload(served, "warm")
        )
        path = f"{FLUID}/namespaces/{served}/dataloads/warm"
        assert delete_as(kube, path, made["metadata"]["uid"]) == 403
        return
    outcome = await prewarm_requests(kube, served, "warm")
    if verb == "create":
        assert outcome.created == 403
    else:
        assert 403 in outcome.statuses  # the list or the watch of that resource


# --- the scaler's ScaledObject watch (a pool's demand checks KEDA's calls against it) -------

SCALED_OBJECT_RULES = sorted((g, r, v) for g, r, v, _ in USED["scaler"] if r == "scaledobjects")


@pytest.mark.parametrize(
    "drop",
    [
        pytest.param(None, id="the shipped rules list and watch ScaledObjects"),
        *(
            pytest.param(rule, id=f"without {rule[2]} scaledobjects")
            for rule in SCALED_OBJECT_RULES
        ),
    ],
)
async def test_the_scalers_scaled_object_watch_on_its_token(
    control_plane, keda_crds, namespace, served, tmp_path, drop
):
    """scaler.scaled_objects.ScaledObjectWatch itself on the scaler's token: it starts
    with a ScaledObject declaring a pool and lists every namespace's; 403 without a verb."""
    spaces = {"unitscale": namespace, "serving": served}
    kube = as_shipped(control_plane, "unitscale-scaler", spaces, tmp_path, drop=drop)
    metadata = {"scalerAddress": "s:1", "deployment": "llama", "pool": "h200"}
    metadata["acceleratorsPerReplica"] = "1"
    body = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "llama", "namespace": served},
        "spec": {
            "scaleTargetRef": {"name": "llama"},
            "triggers": [{"type": "external", "metadata": metadata}],
        },
    }
    control_plane.request("POST", f"/apis/keda.sh/v1alpha1/namespaces/{served}/scaledobjects", body)
    registry = ScaledObjectRegistry(SignalStore(), 30.0)
    registry.resolve("llama", served, metadata)
    watch = ScaledObjectWatch(kube, registry, check_every=0.05)
    running = asyncio.create_task(watch.run())
    try:
        if drop is None:
            key = f"{served}/llama"
            await eventually(lambda: key in (watch.listed or {}), "the ScaledObject listed", CAP)
            assert watch.problem == ""
            assert "spec" not in (watch.listed or {})[key]  # only what the check reads
        else:
            # A CRD's watch cache may answer 429 for a moment after it is created: retried.
            await eventually(lambda: "(403)" in watch.problem, "refused with 403", CAP)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


# --- the admission controller: each of its rules needed ------------------------------------

VERSIONS = {"": "v1", "kueue.x-k8s.io": "v1beta2", "unitscale.io": "v1alpha1"}
VERSIONS["data.fluid.io"] = "v1alpha1"
CLUSTER_RESOURCES = {"admissionchecks", "capacitycheckparameters", "nodes"}


def admission_request(rule: Rule, namespace: str) -> tuple[str, str, dict[str, Any] | None, str]:
    """(method, path, body, content type) of the controller's request that ``rule`` allows.

    Lists and watches span every namespace, as the controller's watches do; a status
    write is a server-side apply of the status subresource; creates go into ``namespace``.
    RBAC is checked before the object is looked up, so no object need exist.
    """
    group, resource, verb = rule
    plural, _, subresource = resource.partition("/")
    base = f"/apis/{group}/{VERSIONS[group]}" if group else "/api/v1"
    scope = "" if plural in CLUSTER_RESOURCES else f"/namespaces/{namespace}"
    if verb in ("list", "watch"):
        return (
            "GET",
            f"{base}/{plural}" + ("?watch=1&timeoutSeconds=1" if verb == "watch" else ""),
            None,
            "",
        )
    if verb == "create":
        body = {
            "apiVersion": f"{group}/{VERSIONS[group]}".lstrip("/"),
            "metadata": {"generateName": "x-"},
        }
        return "POST", f"{base}{scope}/{plural}?dryRun=All", body, "application/json"
    assert verb == "patch" and subresource == "status", rule
    body = {"apiVersion": f"{group}/{VERSIONS[group]}", "kind": "X", "metadata": {"name": "x"}}
    path = f"{base}{scope}/{plural}/x/status?fieldManager=unitscale.io/capacity&dryRun=All"
    return "PATCH", path, body, "application/apply-patch+yaml"


def status_as(kube: KubeAccess, method: str, path: str, body: Any, content_type: str) -> int:
    """The status code of one request sent with ``kube``'s token."""
    assert kube.kubeconfig is not None
    config = yaml.safe_load(kube.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{cluster['server']}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {user['token']}")
    if content_type:
        request.add_header("Content-Type", content_type)
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as err:
        with err:
            return err.code


def admission_rules() -> list[Any]:
    from tests.test_admission_deploy import used_by_the_controller

    return [
        pytest.param((g, r, v), id=f"admission without {v} {r}")
        for g, r, v in sorted(used_by_the_controller())
    ]


@pytest.mark.parametrize("rule", admission_rules())
def test_without_any_one_admission_rule_its_request_is_refused(
    control_plane, kueue_crds, admission_crd, fluid, namespace, served, tmp_path, rule
):
    """Two identities (each ServiceAccount in a namespace of its own: bindings add up):
    the shipped role, which the request passes, and the role less ``rule``, which gets 403."""
    method, path, body, content_type = admission_request(rule, namespace)
    full = as_shipped(control_plane, "unitscale-admission", {"unitscale": namespace}, tmp_path)
    assert status_as(full, method, path, body, content_type) != 403, "the shipped role allows it"
    spaces = {"unitscale": served}
    dropped = as_shipped(control_plane, "unitscale-admission", spaces, tmp_path, drop=rule)
    assert status_as(dropped, method, path, body, content_type) == 403
