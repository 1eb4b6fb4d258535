"""Kueue (built from its Go module, CRDs from its module) admits a Job through its queues."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.k8s

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


def wait_for(what, get, limit=60.0):
    """Poll ``get()`` until it returns something truthy; a cap against hangs."""
    deadline = time.monotonic() + limit
    while not (value := get()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {limit:.0f}s")
        time.sleep(0.2)
    return value


def condition(obj, kind):
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == kind:
            return cond["status"] == "True"
    return False


def test_kueue_admits_a_suspended_job_and_unsuspends_it(control_plane, kueue, namespace):
    plane = control_plane
    flavor, cluster_queue = f"flavor-{namespace}", f"cq-{namespace}"
    plane.ensure(
        f"{KUEUE}/resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
        },
    )
    plane.ensure(
        f"{KUEUE}/clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "4"},
                                    {"name": "memory", "nominalQuota": "4Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    plane.ensure(
        f"{KUEUE}/namespaces/{namespace}/localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "team"},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    wait_for(
        "ClusterQueue active",
        lambda: condition(plane.request("GET", f"{KUEUE}/clusterqueues/{cluster_queue}"), "Active"),
    )
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    plane.ensure(
        jobs,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "labels": {"kueue.x-k8s.io/queue-name": "team"}},
            "spec": {
                # Created suspended, as Kueue's (unregistered) mutating webhook would do.
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.invalid/train:1",
                                "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
                            }
                        ],
                    }
                },
            },
        },
    )

    workloads = f"{KUEUE}/namespaces/{namespace}/workloads"
    workload = wait_for(
        "an admitted Workload for the Job",
        lambda: next(
            (w for w in plane.request("GET", workloads)["items"] if condition(w, "Admitted")),
            None,
        ),
    )
    assert workload["metadata"]["ownerReferences"][0]["name"] == "train"
    assert workload["spec"]["queueName"] == "team"
    admission = workload["status"]["admission"]
    assert admission["clusterQueue"] == cluster_queue
    assert admission["podSetAssignments"][0]["flavors"] == {"cpu": flavor, "memory": flavor}
    wait_for(
        "the Job unsuspended",
        lambda: plane.request("GET", f"{jobs}/train")["spec"]["suspend"] is False,
    )
