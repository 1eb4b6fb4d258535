"""The admission controller against a real API server and a real Kueue.

Each test has its own controller name, AdmissionCheck, ClusterQueue and namespace, so
the controllers of different tests never act on each other's objects. The controller
runs in the test's event loop; waits poll the API with a cap (the fixture's REST
helper), yielding to the loop in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from admission.cluster import Decision
from admission.config import AdmissionConfig
from admission.controller import Controller
from foundation.kube import KubeAccess
from tests.k8s.control_plane import ApiError, ControlPlane
from tests.shared_data import shared

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
PARAMS = "/apis/unitscale.io/v1alpha1/capacitycheckparameters"
V1BETA2 = "kueue.x-k8s.io/v1beta2"


# --- fixtures and helpers --------------------------------------------------------------


@pytest.fixture(scope="module")
def admission_crd(control_plane):
    control_plane.apply_crds([ROOT / "deploy" / "admission" / "crd.yaml"])


async def eventually(
    what: str, get: Callable[[], Any], limit: float = 60.0, show: Callable[[], Any] | None = None
) -> Any:
    """Poll ``get()`` until it returns something truthy, yielding to the loop between.

    On a timeout the error carries ``show()``, what the test was waiting on.
    """
    deadline = asyncio.get_running_loop().time() + limit
    while True:
        try:
            value = get()
        except ApiError as err:
            if err.code not in (429, 503):  # an API server (re)starting answers these
                raise
            value = None
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            seen = f"; last seen: {show()}" if show is not None else ""
            raise AssertionError(f"{what}: not after {limit:.0f}s{seen}")
        await asyncio.sleep(0.2)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return None


def is_true(obj: dict[str, Any], kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found["status"] == "True"


class Scripted:
    """A stand-in for ``decide_all``: every pending check gets the scripted state."""

    def __init__(self, state: Any = "Pending", message: str = "waiting", **more: Any) -> None:
        self.state, self.message, self.more = state, message, more
        self.calls = 0

    def __call__(self, pending, cluster, now):
        self.calls += 1
        return [
            Decision(
                namespace=p.workload["metadata"]["namespace"],
                workload=p.workload["metadata"]["name"],
                check=p.check,
                state=self.state,
                message=self.message,
                **self.more,
            )
            for p in pending
        ]


@dataclasses.dataclass
class Setup:
    """One test's Kueue objects, named after it."""

    plane: Any
    namespace: str
    suffix: str = dataclasses.field(default_factory=lambda: secrets.token_hex(3))

    @property
    def controller_name(self) -> str:
        return f"test.unitscale.io/{self.suffix}"

    @property
    def check(self) -> str:
        return f"capacity-{self.suffix}"

    @property
    def parameters(self) -> str:
        return f"pool-{self.suffix}"

    def create_parameters(self, spec: dict[str, Any] | None = None) -> None:
        self.plane.ensure(
            PARAMS,
            {
                "apiVersion": "unitscale.io/v1alpha1",
                "kind": "CapacityCheckParameters",
                "metadata": {"name": self.parameters},
                "spec": spec or {},
            },
        )

    def create_check(self) -> None:
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
                        "name": self.parameters,
                    },
                },
            },
        )

    def get_check(self) -> dict[str, Any]:
        return dict(self.plane.request("GET", f"{KUEUE}/admissionchecks/{self.check}"))

    def create_queues(self) -> None:
        flavor, cluster_queue = f"flavor-{self.suffix}", f"cq-{self.suffix}"
        self.plane.ensure(
            f"{KUEUE}/resourceflavors",
            {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        )
        self.plane.ensure(
            f"{KUEUE}/clusterqueues",
            {
                "apiVersion": V1BETA2,
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
                                        {"name": "cpu", "nominalQuota": "8"},
                                        {"name": "memory", "nominalQuota": "8Gi"},
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
                "spec": {"clusterQueue": cluster_queue},
            },
        )

    def create_job(self, name: str = "train") -> None:
        self.plane.ensure(
            f"/apis/batch/v1/namespaces/{self.namespace}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "team"}},
                "spec": {
                    # Created suspended, as Kueue's (unregistered) mutating webhook would.
                    "suspend": True,
                    "template": {
                        "metadata": {"annotations": {"example.com/user-set": "kept"}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.invalid/train:1",
                                    "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
                                }
                            ],
                        },
                    },
                },
            },
        )

    def job(self, name: str = "train") -> dict[str, Any]:
        return dict(
            self.plane.request("GET", f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{name}")
        )

    def workload_of(self, job: str = "train") -> dict[str, Any] | None:
        items = self.plane.request("GET", f"{KUEUE}/namespaces/{self.namespace}/workloads")
        for item in items["items"]:
            owners = item["metadata"].get("ownerReferences") or []
            if any(o["name"] == job for o in owners):
                return dict(item)
        return None

    def entry(self, job: str = "train") -> dict[str, Any] | None:
        workload = self.workload_of(job) or {}
        for item in (workload.get("status") or {}).get("admissionChecks") or []:
            if item["name"] == self.check:
                return dict(item)
        return None

    def controller(self, decide: Callable[..., Any]) -> Controller:
        config = AdmissionConfig(controller_name=self.controller_name, resync=30, debounce=0.05)
        return Controller(KubeAccess(self.plane.kubeconfig), config, decide=decide)


@contextlib.asynccontextmanager
async def running(controller: Controller) -> AsyncIterator[Controller]:
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def ours(obj: dict[str, Any], manager: str) -> list[dict[str, Any]]:
    """The managedFields entries of ``manager``."""
    return [m for m in obj["metadata"].get("managedFields") or [] if m["manager"] == manager]


# --- the AdmissionCheck's Active condition --------------------------------------------


async def test_our_admission_check_becomes_active(control_plane, kueue, admission_crd, namespace):
    setup = Setup(control_plane, namespace)
    setup.create_parameters({"retryAfterSeconds": 30})
    setup.create_check()
    async with running(setup.controller(Scripted())):
        check = await eventually(
            "Active=True", lambda: is_true(setup.get_check(), "Active") and setup.get_check()
        )
    active = condition(check, "Active")
    assert active is not None
    assert (active["reason"], active["message"]) == ("Active", "The admission check is active")
    (managed,) = ours(check, setup.controller_name)
    assert (managed["operation"], managed["subresource"]) == ("Apply", "status")


async def test_a_missing_then_invalid_then_good_parameters_object(
    control_plane, kueue, admission_crd, namespace
):
    setup = Setup(control_plane, namespace)
    setup.create_check()  # names a parameters object that does not exist yet

    def inactive_with(text: str) -> Callable[[], bool]:
        def probe() -> bool:
            found = condition(setup.get_check(), "Active")
            return bool(
                found
                and found["status"] == "False"
                and found["reason"] == "BadParametersRef"
                and text in found["message"]
            )

        return probe

    async with running(setup.controller(Scripted())):
        await eventually("Active=False naming the missing object", inactive_with("not found"))
        # A port the schema lets through (five digits) but no socket has.
        setup.create_parameters({"inferenceHeadroom": {"scaler": "scaler:99999", "pool": "h200"}})
        await eventually(
            "Active=False naming the bad field",
            inactive_with("spec.inferenceHeadroom.scaler='scaler:99999'"),
        )
        control_plane.request("DELETE", f"{PARAMS}/{setup.parameters}")
        setup.create_parameters({"retryAfterSeconds": 10})
        await eventually("Active=True again", lambda: is_true(setup.get_check(), "Active"))


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"gpuSchedulerPolicy": "round-robin"}, id="an-unknown-policy"),
        pytest.param({"lora": {"tenantsPerInstance": 9}}, id="too-many-tenants"),
        pytest.param({"poolNodeSelector": {"-bad key": "x"}}, id="a-bad-label-key"),
        pytest.param({"inferenceHeadroom": {"pool": "h200"}}, id="a-headroom-without-scaler"),
    ],
)
def test_the_api_server_refuses_what_the_schema_can_say(control_plane, admission_crd, spec):
    body = {
        "apiVersion": "unitscale.io/v1alpha1",
        "kind": "CapacityCheckParameters",
        "metadata": {"name": f"bad-{secrets.token_hex(3)}"},
        "spec": spec,
    }
    with pytest.raises(ApiError) as refused:
        control_plane.request("POST", PARAMS, body)
    assert refused.value.code == 422


def test_the_api_server_fills_in_the_defaults(control_plane, admission_crd):
    name = f"defaults-{secrets.token_hex(3)}"
    control_plane.ensure(
        PARAMS,
        {
            "apiVersion": "unitscale.io/v1alpha1",
            "kind": "CapacityCheckParameters",
            "metadata": {"name": name},
        },
    )
    spec = control_plane.request("GET", f"{PARAMS}/{name}")["spec"]
    assert spec == {
        "gpuSchedulerPolicy": "binpack",
        "retryAfterSeconds": 60,
        "handshakeTimeoutSeconds": 60,
        "data": {"cachedPercentage": 95, "timeoutSeconds": 1800, "createDataLoad": True},
        "lora": {"tenantsPerInstance": 5, "adaptive": False},
        "reclaim": {
            "enabled": False,
            "minRunSeconds": 600,
            "maxPriority": 0,
            "headroomFraction": 0,
            "headroomCards": 0,
        },
    }


# --- the write path, with scripted decisions -----------------------------------------

HINTS = (
    {
        "name": "main",
        "annotations": {"hami.io/gpu-scheduler-policy": "binpack"},
        "nodeSelector": {"accelerator-pool": "h200"},
    },
)


async def test_a_job_flows_pending_ready_admitted_unsuspended_with_the_hints(
    control_plane, kueue, admission_crd, namespace
):
    setup = Setup(control_plane, namespace)
    setup.create_parameters()
    setup.create_check()
    setup.create_queues()
    decide = Scripted("Pending", "waiting for the cache (40%)")
    async with running(setup.controller(decide)) as controller:
        setup.create_job()
        pending = await eventually(
            "our Pending message",
            lambda: (e := setup.entry()) and e["message"] == "waiting for the cache (40%)" and e,
        )
        assert pending["state"] == "Pending"
        workload = setup.workload_of()
        assert workload is not None and not is_true(workload, "Admitted")
        decide.state, decide.message, decide.more = "Ready", "fits", {"pod_set_updates": HINTS}
        controller.notify()
        admitted = await eventually(
            "Admitted", lambda: (w := setup.workload_of()) and is_true(w, "Admitted") and w
        )
        job = await eventually(
            "unsuspended", lambda: (j := setup.job())["spec"]["suspend"] is False and j
        )
    (entry,) = [e for e in admitted["status"]["admissionChecks"] if e["name"] == setup.check]
    assert entry["state"] == "Ready" and entry["podSetUpdates"] == list(HINTS)
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] == "binpack"
    assert template["metadata"]["annotations"]["example.com/user-set"] == "kept"
    assert template["spec"]["nodeSelector"] == {"accelerator-pool": "h200"}
    (managed,) = ours(admitted, setup.controller_name)
    assert (managed["operation"], managed["subresource"]) == ("Apply", "status")


async def test_a_restarted_controller_makes_no_duplicate_writes(
    control_plane, kueue, admission_crd, namespace
):
    setup = Setup(control_plane, namespace)
    setup.create_parameters()
    setup.create_check()
    setup.create_queues()
    decide = Scripted("Pending", "waiting for the cache (10%)")
    async with running(setup.controller(decide)) as first:
        setup.create_job()
        await eventually("our message", lambda: (e := setup.entry()) and "10%" in e["message"])
        await eventually("another pass", lambda: first.passes >= 2)
    # The first controller is gone mid-flight (cancelled: its connections just drop).
    settled = setup.workload_of()
    assert settled is not None
    decide = Scripted("Pending", "waiting for the cache (10%)")
    second = setup.controller(decide)
    async with running(second):
        await eventually("the second controller decided", lambda: decide.calls >= 2)
        unchanged = setup.workload_of()
        assert unchanged is not None
        # Same decision: no write at all, not even a no-op apply.
        assert unchanged["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"]
        assert ours(unchanged, setup.controller_name) == ours(settled, setup.controller_name)
        decide.state, decide.message = "Ready", "fits"
        second.notify()
        await eventually("Admitted", lambda: (w := setup.workload_of()) and is_true(w, "Admitted"))
        calls = decide.calls
        second.notify()
        await eventually("a pass after admission", lambda: second.passes > calls + 1)
    applied = second.metrics.writes.labels("applied")._value.get()
    assert applied == 1  # the one Ready; the Active condition was already right


async def test_an_evicted_workload_gets_no_retry(control_plane, kueue, admission_crd, namespace):
    setup = Setup(control_plane, namespace)
    setup.create_parameters()
    setup.create_check()
    setup.create_queues()
    decide = Scripted("Pending", "judging")
    async with running(setup.controller(decide)) as controller:
        setup.create_job()
        await eventually("our message", lambda: (e := setup.entry()) and e["message"] == "judging")
        workload = setup.workload_of()
        assert workload is not None
        name = workload["metadata"]["name"]
        stale = controller.snapshot()
        # Kueue evicts it (deactivation: Evicted=True first, quota released after).
        _merge_patch(
            control_plane,
            f"{KUEUE}/namespaces/{namespace}/workloads/{name}",
            {"spec": {"active": False}},
        )
        await eventually("Evicted", lambda: is_true(setup.workload_of() or {}, "Evicted"))
        decide.state, decide.message, decide.more = (
            "Retry",
            "no room",
            {"requeue_after_seconds": 60},
        )
        controller.notify()
        calls = decide.calls
        await eventually("a pass after the eviction", lambda: controller.passes > calls + 2)
        # The race itself: a write judged on the view from before the eviction.
        retry = Decision(namespace, name, setup.check, "Retry", "no room", 60)
        before = controller.metrics.writes.labels("conflict")._value.get()
        async with await controller.access.client() as api:
            await controller._write(api, retry, stale, {}, controller._clock())
        after = controller.metrics.writes.labels("conflict")._value.get()
    entry = setup.entry()
    assert entry is not None and entry["state"] != "Retry"
    # Refused by the resourceVersion precondition. At least ours: a pass of the running
    # controller may race the same eviction and conflict too (CI saw 2).
    assert after >= before + 1


_merge_patch = ControlPlane.merge_patch


async def test_the_controller_survives_an_api_server_restart(
    control_plane, kueue, admission_crd, namespace
):
    setup = Setup(control_plane, namespace)
    setup.create_parameters()
    setup.create_check()
    setup.create_queues()
    decide = Scripted("Ready", "fits")
    async with running(setup.controller(decide)):
        setup.create_job("before")
        await eventually(
            "the first job admitted", lambda: (e := setup.entry("before")) and e["state"] == "Ready"
        )
        control_plane.restart_apiserver()

        def create_after() -> bool:
            setup.create_job("after")
            return True

        await eventually("the job created after the restart", create_after)
        await eventually(
            "the job created after the restart admitted",
            lambda: (e := setup.entry("after")) and e["state"] == "Ready",
            limit=90,
        )


# --- the command, as Kubernetes runs it ------------------------------------------------


async def test_the_command_serves_health_and_metrics_and_stops_on_sigterm(
    control_plane, kueue, admission_crd, namespace
):
    setup = Setup(control_plane, namespace)
    setup.create_parameters()
    setup.create_check()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "unitscale.cli", "admission"),
        *("--kubeconfig", str(control_plane.kubeconfig)),
        *("--controller-name", setup.controller_name, "--metrics-listen", "127.0.0.1:0"),
        stderr=asyncio.subprocess.PIPE,
    )
    stderr = process.stderr
    assert stderr is not None
    try:
        port = None
        async with asyncio.timeout(30):
            while port is None:
                line = (await stderr.readline()).decode()
                assert line, "the controller exited before serving"
                if match := re.search(r"serving /metrics on port (\d+)", line):
                    port = int(match.group(1))
        await eventually("Active=True", lambda: is_true(setup.get_check(), "Active"))
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                health = await response.json()
                assert response.status == 200
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                metrics = await response.text()
        assert health["healthy"] is True and health["synced"] is True
        assert f'unitscale_admission_check_active{{check="{setup.check}"}} 1.0' in metrics
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# --- the full flows, decided by admission.decide --------------------------------------

H200 = "NVIDIA-NVIDIA H200"


def register(node: str, cards: int) -> str:
    """``hami.io/node-nvidia-register`` as HAMi 2.8+ writes it (JSON)."""
    return json.dumps(
        [
            {
                "id": f"GPU-{node}-{i}",
                "index": i,
                "count": 10,
                "devmem": 143771,
                "devcore": 100,
                "type": H200,
                "mode": "hami-core",
                "health": True,
            }
            for i in range(cards)
        ]
    )


@dataclasses.dataclass
class GpuSetup(Setup):
    """A pool of HAMi nodes of its own (labelled with the suffix) and GPU quota."""

    def __post_init__(self) -> None:
        self.pool = {"unitscale-test-pool": self.suffix}

    def create_gpu_parameters(self, **spec: Any) -> None:
        self.create_parameters({"poolNodeSelector": self.pool, "retryAfterSeconds": 1, **spec})

    def create_node(self, name: str, cards: int, labels: dict[str, str] | None = None) -> str:
        node = f"{name}-{self.suffix}"
        self.plane.ensure(
            "/api/v1/nodes",
            {
                "metadata": {
                    "name": node,
                    "labels": {**self.pool, **(labels or {})},
                    "annotations": {"hami.io/node-nvidia-register": register(node, cards)},
                }
            },
        )
        return node

    def create_holder(self, node: str, cards: list[int]) -> str:
        """A pod HAMi placed on ``node``, holding whole ``cards``."""
        name = f"holder-{secrets.token_hex(2)}"
        allocated = "".join(f"GPU-{node}-{i},NVIDIA,143771,100:" for i in cards) + ";"
        self.plane.ensure(
            f"/api/v1/namespaces/{self.namespace}/pods",
            {
                "metadata": {
                    "name": name,
                    "annotations": {
                        "hami.io/vgpu-devices-allocated": allocated,
                        "hami.io/vgpu-node": node,
                    },
                },
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": "registry.invalid/serve:1"}],
                },
            },
        )
        return name

    def delete_pod(self, name: str) -> None:
        # No kubelet confirms a graceful deletion here: remove it at once.
        self.plane.request(
            "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}?gracePeriodSeconds=0"
        )

    def create_gpu_queues(self, gpus: int = 64) -> None:
        flavor, cluster_queue = f"flavor-{self.suffix}", f"cq-{self.suffix}"
        self.plane.ensure(
            f"{KUEUE}/resourceflavors",
            {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        )
        quota = [
            {"name": "cpu", "nominalQuota": "64"},
            {"name": "memory", "nominalQuota": "64Gi"},
            {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
        ]
        self.plane.ensure(
            f"{KUEUE}/clusterqueues",
            {
                "apiVersion": V1BETA2,
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [{"name": flavor, "resources": quota}],
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
                "spec": {"clusterQueue": cluster_queue},
            },
        )

    def create_gpu_job(
        self, name: str, pods: int, gpus: int, annotations: dict[str, str] | None = None
    ) -> None:
        self.plane.ensure(
            f"/apis/batch/v1/namespaces/{self.namespace}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "team"}},
                "spec": {
                    "suspend": True,
                    "parallelism": pods,
                    "completions": pods,
                    "template": {
                        "metadata": {"annotations": annotations or {}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.invalid/train:1",
                                    "resources": {
                                        "requests": {"cpu": "1", "memory": "256Mi"},
                                        "limits": {"nvidia.com/gpu": str(gpus)},
                                    },
                                }
                            ],
                        },
                    },
                },
            },
        )

    def state(self, job: str) -> str | None:
        entry = self.entry(job)
        return None if entry is None else str(entry["state"])

    def controller_deciding(self) -> Controller:
        config = AdmissionConfig(controller_name=self.controller_name, resync=30, debounce=0.05)
        return Controller(KubeAccess(self.plane.kubeconfig), config)


async def test_a_gang_that_fits_is_ready_with_hami_hints_and_admitted(
    control_plane, kueue, admission_crd, namespace
):
    setup = GpuSetup(control_plane, namespace)
    setup.create_gpu_parameters(gpuSchedulerPolicy="spread")
    setup.create_check()
    setup.create_gpu_queues()
    setup.create_node("gpu-a", 4)
    setup.create_node("gpu-b", 4)
    async with running(setup.controller_deciding()):
        setup.create_gpu_job("train", pods=2, gpus=4)
        admitted = await eventually(
            "Admitted", lambda: (w := setup.workload_of("train")) and is_true(w, "Admitted") and w
        )
        job = await eventually(
            "unsuspended", lambda: (j := setup.job("train"))["spec"]["suspend"] is False and j
        )
    (entry,) = [e for e in admitted["status"]["admissionChecks"] if e["name"] == setup.check]
    assert entry["state"] == "Ready"
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["hami.io/gpu-scheduler-policy"] == "spread"
    assert annotations["nvidia.com/use-gputype"] == H200
    assert "requeueAfterSeconds" not in entry


async def test_a_gang_that_does_not_fit_now_retries_until_a_pod_frees_its_gpus(
    control_plane, kueue, admission_crd, namespace
):
    setup = GpuSetup(control_plane, namespace)
    setup.create_gpu_parameters()
    setup.create_check()
    setup.create_gpu_queues()
    node = setup.create_node("gpu", 4)
    holder = setup.create_holder(node, [0, 1, 2])  # inference holds three of the four cards
    async with running(setup.controller_deciding()) as controller:
        setup.create_gpu_job("train", pods=2, gpus=1)
        await eventually(
            "a Retry (Kueue resets it to Pending with a retry count)",
            lambda: (e := setup.entry("train")) and (e["state"] == "Retry" or e.get("retryCount")),
        )
        workload = setup.workload_of("train")
        assert workload is not None and not is_true(workload, "Admitted")
        assert setup.job("train")["spec"]["suspend"] is True
        setup.delete_pod(holder)
        await eventually(
            "Admitted once the pod is gone",
            lambda: (w := setup.workload_of("train")) and is_true(w, "Admitted"),
        )
    assert controller.metrics.decisions.labels(setup.check, "Retry")._value.get() >= 1
    assert controller.metrics.decisions.labels(setup.check, "Ready")._value.get() == 1


async def test_a_gang_that_can_never_fit_the_pool_is_rejected_and_deactivated(
    control_plane, kueue, admission_crd, namespace
):
    setup = GpuSetup(control_plane, namespace)
    setup.create_gpu_parameters()
    setup.create_check()
    setup.create_gpu_queues()
    setup.create_node("gpu", 4)
    async with running(setup.controller_deciding()) as controller:
        setup.create_gpu_job("huge", pods=3, gpus=4)  # 12 GPUs on a 4-GPU pool
        # Kueue deactivates at once and resets the check, saying what it was.
        workload = await eventually(
            "deactivated by Kueue after our Rejected",
            lambda: (
                (w := setup.workload_of("huge"))
                and w["spec"].get("active") is False
                and is_true(w, "Evicted")
                and w
            ),
            show=lambda: (setup.workload_of("huge") or {}).get("status"),
        )
        passes = controller.passes
        controller.notify()
        await eventually("a pass after the deactivation", lambda: controller.passes > passes)
    evicted = condition(workload, "Evicted")
    assert evicted is not None and evicted["reason"] == "DeactivatedDueToAdmissionCheck"
    assert setup.check in evicted["message"]
    entry = setup.entry("huge")
    assert entry is not None
    assert entry["state"] == "Rejected" or entry["message"].endswith("Previously: Rejected")
    # Kueue's reset took our message off the entry; the Event keeps it.
    events = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    (told,) = [
        e
        for e in events
        if e["involvedObject"]["name"] == workload["metadata"]["name"]
        and e["reason"] == "AdmissionCheckUpdated"
    ]
    assert told["type"] == "Warning"
    assert told["message"].startswith(f"{setup.check}: Rejected: ")
    assert told["source"]["component"] == setup.controller_name
    # Rejected once, and nothing written to the deactivated Workload after.
    assert controller.metrics.decisions.labels(setup.check, "Rejected")._value.get() == 1
    assert controller.metrics.writes.labels("applied")._value.get() == 2  # Active, Rejected
    assert setup.job("huge")["spec"]["suspend"] is True


@pytest.fixture(scope="module")
def fluid_crds(control_plane):
    control_plane.apply_crds(
        [
            shared("crds", "fluid", f"data.fluid.io_{kind}.yaml")
            for kind in ("datasets", "dataloads")
        ]
    )


async def start_command(setup: Setup, *more: str) -> tuple[asyncio.subprocess.Process, int]:
    """``unitscale admission`` for ``setup``, and its metrics port once it serves."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "unitscale.cli", "admission"),
        *("--kubeconfig", str(setup.plane.kubeconfig), "--controller-name", setup.controller_name),
        *("--metrics-listen", "127.0.0.1:0", *more),
        stderr=asyncio.subprocess.PIPE,
    )
    stderr = process.stderr
    assert stderr is not None
    async with asyncio.timeout(30):
        while True:
            line = (await stderr.readline()).decode()
            assert line, "the controller exited before serving"
            if match := re.search(r"serving /metrics on port (\d+)", line):
                break
    # Keep reading its log, so that a full pipe never blocks it.
    DRAINS.add(asyncio.create_task(_drain(stderr)))
    return process, int(match.group(1))


DRAINS: set[asyncio.Task[None]] = set()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def scrape(port: int) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            return await response.text()


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, flags=re.M)
    return float(match.group(1)) if match else 0.0


async def test_uncached_data_holds_the_gang_and_a_killed_controller_repeats_no_write(
    control_plane, kueue, admission_crd, fluid_crds, namespace
):
    from admission.fluid import cache_node_label

    setup = GpuSetup(control_plane, namespace)
    setup.create_gpu_parameters(data={"cachedPercentage": 90})
    setup.create_check()
    setup.create_gpu_queues()
    datasets = f"/apis/data.fluid.io/v1alpha1/namespaces/{namespace}/datasets"
    control_plane.ensure(
        datasets,
        {"apiVersion": "data.fluid.io/v1alpha1", "kind": "Dataset", "metadata": {"name": "corpus"}},
    )
    _merge_patch(
        control_plane,
        f"{datasets}/corpus/status",
        {
            "status": {
                "phase": "Bound",
                "conditions": [{"type": "Ready", "status": "True", "reason": "DatasetReady"}],
                "cacheStates": {"cachedPercentage": "10.0%"},
            }
        },
    )
    dataset = control_plane.request("GET", f"{datasets}/corpus")
    label = cache_node_label(namespace, dataset)
    setup.create_node("far", 4)  # no cache of the Dataset here
    setup.create_node("near", 4, {label: "true"})

    first, port = await start_command(setup)
    try:
        setup.create_gpu_job(
            "train", pods=1, gpus=2, annotations={"unitscale.io/dataset": "corpus"}
        )
        # Settled: the DataLoad created, and the message saying it waits on it (the
        # first message says it is being created).
        waiting = await eventually(
            "Pending, waiting for the cache",
            lambda: (
                (e := setup.entry("train"))
                and "holds 10.0% cached" in e["message"]
                and "creating DataLoad" not in e["message"]
                and e
            ),
        )
        assert waiting["state"] == "Pending"
        loads = control_plane.request(
            "GET", f"/apis/data.fluid.io/v1alpha1/namespaces/{namespace}/dataloads"
        )["items"]
        assert [d["spec"]["dataset"]["name"] for d in loads] == ["corpus"]
        assert loads[0]["metadata"]["ownerReferences"][0]["kind"] == "Workload"
    finally:
        first.kill()  # SIGKILL, mid-flight: the check is Pending, a DataLoad running
        await first.wait()
    settled = setup.workload_of("train")
    assert settled is not None

    second, port = await start_command(setup)
    try:

        async def passes() -> float:
            return sample(await scrape(port), "unitscale_admission_passes_total")

        # Its first pass judges every Workload (it runs once every watch has listed).
        deadline = asyncio.get_running_loop().time() + 30
        while await passes() < 1:
            assert asyncio.get_running_loop().time() < deadline, "no passes"
            await asyncio.sleep(0.2)
        unchanged = setup.workload_of("train")
        assert unchanged is not None
        assert unchanged["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"]
        text = await scrape(port)
        assert sample(text, 'unitscale_admission_writes_total{result="applied"}') == 0
        _merge_patch(
            control_plane,
            f"{datasets}/corpus/status",
            {"status": {"cacheStates": {"cachedPercentage": "100.0%"}}},
        )
        admitted = await eventually(
            "Admitted once cached",
            lambda: (w := setup.workload_of("train")) and is_true(w, "Admitted") and w,
        )
        job = await eventually(
            "unsuspended", lambda: (j := setup.job("train"))["spec"]["suspend"] is False and j
        )
        text = await scrape(port)
    finally:
        second.send_signal(signal.SIGTERM)
        await second.wait()
    (entry,) = [e for e in admitted["status"]["admissionChecks"] if e["name"] == setup.check]
    assert entry["state"] == "Ready"
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {label: "true"}
    # One status write by the second controller: the Ready; the DataLoad existed already.
    assert sample(text, 'unitscale_admission_writes_total{result="applied"}') == 1
