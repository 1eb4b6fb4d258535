"""deploy/components/hami-annotation-guard on a real API server: only HAMi writes the pod
annotations that say which cards a pod holds.

A tenant's own pod carrying ``hami.io/vgpu-node`` and ``hami.io/vgpu-devices-allocated``
took every card of a node out of the admission check's inventory (and HAMi's), Pending
or not (issue 27, hostile pass 24). The shipped policy, bound to this test's namespace
only (the control plane is shared) and removed after: a pod created with them, or a
change to them, is refused to anyone but HAMi's ServiceAccounts.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.control_plane import ApiError, ControlPlane
from tests.k8s.keda import eventually
from tests.k8s.test_rbac_components import service_account_token

pytestmark = pytest.mark.k8s

POLICY = Path(__file__).parents[2] / "deploy/components/hami-annotation-guard/policy.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
NODE = {"hami.io/vgpu-node": "gpu-node-1"}
ALLOCATED = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,81920,100:;"}


def pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/train:1"}]},
    }


@pytest.fixture
def guarded(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    """The shipped policy, its binding narrowed to ``namespace``; enforced when yielded."""
    suffix = secrets.token_hex(3)
    policy, binding = (d for d in yaml.safe_load_all(POLICY.read_text()) if d)
    policy["metadata"]["name"] += f"-{suffix}"
    binding["metadata"]["name"] += f"-{suffix}"
    binding["spec"]["policyName"] = policy["metadata"]["name"]
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    binding["spec"]["matchResources"] = {"namespaceSelector": selector}
    control_plane.request("POST", f"{ADMISSION}/validatingadmissionpolicies", policy)
    control_plane.request("POST", f"{ADMISSION}/validatingadmissionpolicybindings", binding)
    try:
        probe = iter(range(1000))

        def enforced() -> bool:
            try:
                made = pod(f"probe-{next(probe)}", NODE)
                control_plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", made)
            except ApiError as err:
                return err.code in (403, 422) and "only HAMi writes" in err.body
            return False

        eventually(enforced, "the policy enforced", timeout=60)
        yield namespace
    finally:
        for plural, doc in (
            ("validatingadmissionpolicybindings", binding),
            ("validatingadmissionpolicies", policy),
        ):
            control_plane.request("DELETE", f"{ADMISSION}/{plural}/{doc['metadata']['name']}")


def hami_scheduler(plane: ControlPlane) -> ControlPlane:
    """The API as HAMi's scheduler (kube-system/hami-scheduler), allowed to patch pods."""
    name = "hami-scheduler"
    plane.ensure("/api/v1/namespaces/kube-system/serviceaccounts", {"metadata": {"name": name}})
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    role: dict[str, Any] = {"metadata": {"name": f"test-{name}"}, "rules": rules}
    plane.ensure("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    binding: dict[str, Any] = {
        "metadata": {"name": f"test-{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}],
    }
    binding["roleRef"]["name"] = f"test-{name}"
    plane.ensure("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    return dataclasses.replace(plane, token=service_account_token(plane, "kube-system", name))


def annotate(plane: ControlPlane, namespace: str, name: str, annotations: dict[str, str]) -> Any:
    return plane.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        {"metadata": {"annotations": annotations}},
        "application/merge-patch+json",
    )


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param(NODE, id="a tenant's pod created naming a node HAMi chose is refused"),
        pytest.param(ALLOCATED, id="one created claiming cards allocated is refused"),
        pytest.param(
            {"hami.io/Ascend910B-devices-allocated": "x"},
            id="another vendor's allocation is refused alike",
        ),
    ],
)
def test_a_pod_created_with_hamis_allocation_annotations_is_refused(
    control_plane, guarded, annotations
):
    with pytest.raises(ApiError) as refused:
        control_plane.request("POST", f"/api/v1/namespaces/{guarded}/pods", pod("x", annotations))
    assert "only HAMi writes" in refused.value.body


def test_hami_writes_them_and_others_may_change_everything_else(control_plane, guarded):
    path = f"/api/v1/namespaces/{guarded}/pods"
    control_plane.request("POST", path, pod("train-0", {"team": "a"}))
    annotate(hami_scheduler(control_plane), guarded, "train-0", {**NODE, **ALLOCATED})
    annotate(control_plane, guarded, "train-0", {"team": "b"})  # HAMi's left as they are
    with pytest.raises(ApiError) as refused:
        annotate(control_plane, guarded, "train-0", {"hami.io/vgpu-node": "gpu-node-2"})
    assert "only HAMi writes" in refused.value.body
    kept = control_plane.request("GET", f"{path}/train-0")["metadata"]["annotations"]
    assert kept == {"team": "b", **NODE, **ALLOCATED}
