"""The ClusterRole of ``deploy/admission/rbac.yaml`` is enough for the controller, and no more.

The ServiceAccount, ClusterRole and ClusterRoleBinding are applied as ``kustomize build
deploy/base`` renders them (``tests/k8s/test_rbac_components.py``'s helpers), but in the
test's namespace and with the cluster-scoped names suffixed (so the dry run of the same
objects, which expects nothing stored under their names, still holds). A token
for the ServiceAccount comes from the TokenRequest API (the fixture's API server signs
service-account tokens), and the controller runs with a kubeconfig holding only that
token: with RBAC on, any request the role misses answers 403.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from admission import annotations as names
from admission.config import AdmissionConfig
from admission.controller import Controller
from foundation.kube import KubeAccess
from tests.k8s.control_plane import ControlPlane
from tests.k8s.test_rbac_components import (
    collection,
    identity_objects,
    relocated,
    service_account_token,
    token_kubeconfig,
)
from tests.shared_data import shared
from tests.test_admission_deploy import used_by_the_controller
from tests.test_deploy import render

pytestmark = pytest.mark.k8s

ACCOUNT = "unitscale-admission"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
V1BETA2 = "kueue.x-k8s.io/v1beta2"


# --- the identity ----------------------------------------------------------------------


def apply_rbac(plane: ControlPlane, namespace: str, suffix: str) -> str:
    """Create the controller's identity as ``kustomize build deploy/base`` renders it
    (namespaced into ``namespace``, cluster-scoped names suffixed); the SA's user name."""
    for obj in identity_objects(render("base"), ACCOUNT):
        obj = relocated(obj, {"unitscale": namespace}, suffix)
        plane.ensure(collection(obj), obj)
    return f"system:serviceaccount:{namespace}:{ACCOUNT}"


def get_as(plane: ControlPlane, token: str, path: str) -> int:
    """The status code of a GET sent with ``token``."""
    request = urllib.request.Request(f"{plane.host}{path}")
    request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        with err:
            return err.code


def allowed(plane: ControlPlane, user: str, verb: str, group: str, resource: str) -> bool:
    """The API server's SubjectAccessReview verdict for ``user`` (any namespace)."""
    plural, _, subresource = resource.partition("/")
    review = plane.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": plural,
                    "subresource": subresource,
                },
            },
        },
    )
    return bool(review["status"].get("allowed"))


# Requests the controller never sends: the role must refuse them.
NOT_NEEDED = [
    pytest.param("get", "kueue.x-k8s.io", "workloads", id="getting-a-workload"),
    pytest.param("patch", "kueue.x-k8s.io", "workloads", id="patching-a-workloads-spec"),
    pytest.param("update", "kueue.x-k8s.io", "workloads/status", id="replacing-a-status"),
    pytest.param("patch", "kueue.x-k8s.io", "admissionchecks", id="patching-a-checks-spec"),
    pytest.param("create", "kueue.x-k8s.io", "admissionchecks", id="creating-a-check"),
    pytest.param("delete", "data.fluid.io", "dataloads", id="deleting-a-dataload"),
    pytest.param("patch", "data.fluid.io", "datasets", id="patching-a-dataset"),
    pytest.param("patch", "unitscale.io", "capacitycheckparameters", id="changing-parameters"),
    pytest.param("patch", "", "nodes", id="patching-a-node"),
    pytest.param("create", "", "pods", id="creating-a-pod"),
    pytest.param("list", "", "secrets", id="listing-secrets"),
    pytest.param("get", "", "configmaps", id="reading-a-configmap"),
    pytest.param("patch", "", "events", id="changing-an-event"),
]


def test_the_role_allows_every_request_the_controller_sends(control_plane, namespace):
    user = apply_rbac(control_plane, namespace, secrets.token_hex(3))
    refused = sorted(
        (verb, group, resource)
        for group, resource, verb in used_by_the_controller()
        if not allowed(control_plane, user, verb, group, resource)
    )
    assert refused == []


@pytest.mark.parametrize(("verb", "group", "resource"), NOT_NEEDED)
def test_the_role_refuses_what_the_controller_never_asks(
    control_plane, namespace, verb, group, resource
):
    user = apply_rbac(control_plane, namespace, secrets.token_hex(3))
    assert not allowed(control_plane, user, verb, group, resource)


# --- the controller on that token ----------------------------------------------------


async def eventually(what: str, get: Callable[[], Any], limit: float = 60.0) -> Any:
    """Poll ``get()`` until it returns something truthy, yielding to the loop between."""
    deadline = asyncio.get_running_loop().time() + limit
    while not (value := get()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not after {limit:.0f}s")
        await asyncio.sleep(0.2)
    return value


def is_true(obj: dict[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


class Cluster:
    """One test's check, queues, HAMi node and Jobs, all named after its suffix."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.suffix = secrets.token_hex(3)
        self.controller_name = f"test.unitscale.io/rbac-{self.suffix}"
        self.check = f"rbac-{self.suffix}"

    def create(self) -> None:
        pool = {"test.unitscale.io/pool": self.suffix}
        self.plane.ensure(
            "/apis/unitscale.io/v1alpha1/capacitycheckparameters",
            {
                "apiVersion": "unitscale.io/v1alpha1",
                "kind": "CapacityCheckParameters",
                "metadata": {"name": self.check},
                "spec": {"poolNodeSelector": pool, "handshakeTimeoutSeconds": 3600},
            },
        )
        self.plane.ensure(
            f"{KUEUE}/admissionchecks",
            {
                "apiVersion": V1BETA2,
                "kind": "AdmissionCheck",
                "metadata": {"name": self.check},
                "spec": {
                    "controllerName": self.controller_name,
                    "parameters": {
                        "apiGroup": "unitscale.io",
                        "kind": "CapacityCheckParameters",
                        "name": self.check,
                    },
                },
            },
        )
        self._queues()
        register = [
            {
                "id": f"GPU-{self.suffix}-0",
                "index": 0,
                "count": 10,
                "devmem": 143771,
                "devcore": 100,
                "type": "NVIDIA-NVIDIA H200",
                "mode": "hami-core",
                "health": True,
            }
        ]
        self.plane.ensure(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"gpu-{self.suffix}",
                    "labels": pool,
                    "annotations": {
                        names.HAMI_NODE_REGISTER: json.dumps(register),
                        names.HAMI_NODE_HANDSHAKE: "Reported 2026-01-01 00:00:00",
                    },
                },
            },
        )

    def _queues(self) -> None:
        resources = {"cpu": "8", "memory": "8Gi", names.GPU: "8"}
        self.plane.ensure(
            f"{KUEUE}/resourceflavors",
            {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": self.check}},
        )
        self.plane.ensure(
            f"{KUEUE}/clusterqueues",
            {
                "apiVersion": V1BETA2,
                "kind": "ClusterQueue",
                "metadata": {"name": self.check},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": list(resources),
                            "flavors": [
                                {
                                    "name": self.check,
                                    "resources": [
                                        {"name": k, "nominalQuota": v} for k, v in resources.items()
                                    ],
                                }
                            ],
                        }
                    ],
                    "admissionChecksStrategy": {"admissionChecks": [{"name": self.check}]},
                },
            },
        )
        self.plane.ensure(
            f"{KUEUE}/namespaces/{self.namespace}/localqueues",
            {
                "apiVersion": V1BETA2,
                "kind": "LocalQueue",
                "metadata": {"name": "team"},
                "spec": {"clusterQueue": self.check},
            },
        )

    def create_job(self, name: str, annotations: dict[str, str] | None = None) -> None:
        one_gpu = {"cpu": "1", "memory": "256Mi", names.GPU: "1"}
        self.plane.ensure(
            f"/apis/batch/v1/namespaces/{self.namespace}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "team"}},
                "spec": {
                    "suspend": True,  # as Kueue's (unregistered) mutating webhook would
                    "template": {
                        "metadata": {"annotations": annotations or {}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.invalid/train:1",
                                    "resources": {"requests": one_gpu, "limits": {names.GPU: "1"}},
                                }
                            ],
                        },
                    },
                },
            },
        )

    def workload_of(self, job: str) -> dict[str, Any] | None:
        items = self.plane.request("GET", f"{KUEUE}/namespaces/{self.namespace}/workloads")
        for item in items["items"]:
            if any(o["name"] == job for o in item["metadata"].get("ownerReferences") or []):
                return dict(item)
        return None

    def entry(self, job: str) -> dict[str, Any] | None:
        workload = self.workload_of(job) or {}
        for item in (workload.get("status") or {}).get("admissionChecks") or []:
            if item["name"] == self.check:
                return dict(item)
        return None

    def events_on(self, job: str) -> list[dict[str, Any]]:
        """Our controller's Events on the Workload of ``job`` (Kueue records its own too)."""
        name = ((self.workload_of(job) or {}).get("metadata") or {}).get("name")
        events = self.plane.request("GET", f"/api/v1/namespaces/{self.namespace}/events")
        return [
            e
            for e in events["items"]
            if name
            and e["involvedObject"]["name"] == name
            and (e.get("source") or {}).get("component") == self.controller_name
        ]

    def active(self) -> bool:
        return is_true(self.plane.request("GET", f"{KUEUE}/admissionchecks/{self.check}"), "Active")


@asynccontextmanager
async def on_its_token(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[Controller]:
    """The controller running with only the ServiceAccount's token."""
    apply_rbac(cluster.plane, cluster.namespace, cluster.suffix)
    token = service_account_token(cluster.plane, cluster.namespace, ACCOUNT)
    kubeconfig = token_kubeconfig(cluster.plane, token, tmp_path / "admission-kubeconfig")
    config = AdmissionConfig(controller_name=cluster.controller_name, resync=30, debounce=0.05)
    controller = Controller(KubeAccess(kubeconfig), config)
    caplog.set_level(logging.DEBUG, logger="admission")
    caplog.set_level(logging.DEBUG, logger="foundation")
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


REFUSED = re.compile(r"\b403\b|Forbidden")


def assert_never_refused(controller: Controller, caplog: pytest.LogCaptureFixture) -> None:
    # A 403 as a word: a generated Job name (job-second-52403) once read as a refusal.
    refusals = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(("admission", "foundation")) and REFUSED.search(r.getMessage())
    ]
    assert refusals == []
    assert {n: w.error for n, w in controller.watched.items() if w.error and not w.absent} == {}
    assert all(w.synced for w in controller.watched.values())
    assert controller.metrics.writes.labels("error")._value.get() == 0


async def test_the_controller_on_its_service_accounts_token_admits_a_job_and_retries_one(
    control_plane, kueue, admission_crd, namespace, tmp_path, caplog
):
    cluster = Cluster(control_plane, namespace)
    cluster.create()
    async with on_its_token(cluster, tmp_path, caplog) as controller:
        await eventually("our AdmissionCheck Active", cluster.active)
        cluster.create_job("train")
        entry = await eventually(
            "our check decided",
            lambda: (e := cluster.entry("train")) and e["state"] != "Pending" and e,
        )
        assert entry["state"] == "Ready", entry["message"]
        await eventually(
            "Admitted", lambda: (w := cluster.workload_of("train")) and is_true(w, "Admitted")
        )
        # The node's one card is the first Job's now: the second gets a Retry, and an Event.
        cluster.create_job("second")
        event, *_ = await eventually(
            "an Event on the second Workload", lambda: cluster.events_on("second")
        )
        await eventually("a pass after the write", lambda: controller.passes >= 3)
    annotations = entry["podSetUpdates"][0]["annotations"]
    assert annotations[names.HAMI_USE_GPUTYPE] == "NVIDIA-NVIDIA H200"
    assert (event["type"], event["reason"]) == ("Warning", "AdmissionCheckUpdated")
    assert "Retry" in event["message"]
    assert_never_refused(controller, caplog)


@pytest.fixture(scope="module")
def fluid_crds(control_plane):
    files = [shared("crds", "fluid", f"data.fluid.io_{k}.yaml") for k in ("datasets", "dataloads")]
    return control_plane.apply_crds(files)


def bound_dataset(plane: ControlPlane, namespace: str, name: str) -> None:
    """A Dataset Fluid would call Bound with nothing cached yet."""
    path = f"/apis/data.fluid.io/v1alpha1/namespaces/{namespace}/datasets"
    plane.ensure(
        path,
        {
            "apiVersion": "data.fluid.io/v1alpha1",
            "kind": "Dataset",
            "metadata": {"name": name},
            "spec": {"mounts": [{"mountPoint": "s3://bucket/corpus", "name": "corpus"}]},
        },
    )
    dataset = plane.request("GET", f"{path}/{name}")
    dataset["status"] = {
        "phase": "Bound",
        "conditions": [],
        "cacheStates": {"cachedPercentage": "0.0%"},
    }
    plane.request("PUT", f"{path}/{name}/status", dataset)


async def test_the_controller_on_its_service_accounts_token_creates_a_dataload(
    control_plane, kueue, admission_crd, fluid_crds, namespace, tmp_path, caplog
):
    cluster = Cluster(control_plane, namespace)
    cluster.create()
    bound_dataset(control_plane, namespace, "corpus")
    loads = f"/apis/data.fluid.io/v1alpha1/namespaces/{namespace}/dataloads"
    async with on_its_token(cluster, tmp_path, caplog) as controller:
        await eventually("our AdmissionCheck Active", cluster.active)
        cluster.create_job("warm", {names.DATASET: "corpus"})
        created = await eventually(
            "our DataLoad", lambda: control_plane.request("GET", loads)["items"]
        )
        entry = await eventually(
            "our Pending message", lambda: (e := cluster.entry("warm")) and e["message"] and e
        )
        await eventually("a pass after the write", lambda: controller.passes >= 3)
    workload = cluster.workload_of("warm")
    assert workload is not None
    (load,) = created
    assert [o["uid"] for o in load["metadata"]["ownerReferences"]] == [workload["metadata"]["uid"]]
    assert entry["state"] == "Pending" and "DataLoad" in entry["message"]
    assert_never_refused(controller, caplog)


def test_the_api_server_checks_these_tokens_against_rbac(control_plane, namespace):
    """A token of a ServiceAccount no role is bound to gets 403 (else the above prove little)."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}}
    control_plane.ensure(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
    token = service_account_token(control_plane, namespace, "nobody")
    assert get_as(control_plane, token, f"{KUEUE}/workloads") == 403
    assert get_as(control_plane, "not-a-token", f"{KUEUE}/workloads") == 401
    apply_rbac(control_plane, namespace, secrets.token_hex(3))
    bound = service_account_token(control_plane, namespace, ACCOUNT)
    assert get_as(control_plane, bound, f"{KUEUE}/workloads") == 200
