"""Reclaim through Kueue, on the real control plane: our Retry on an admitted Workload.

A real kube-apiserver, etcd and Kueue; the real scaler (``scaler.server``) on 127.0.0.1
fed engine signals answers ``GetInferenceDemand``; HAMi's node and pod annotations are
written as the existing admission tests fake them (no kubelet, no device plugin). The
Jobs' pods are created by the test, owned by their Job, holding the cards HAMi would
have given them: no kube-controller-manager runs here.

When inference's forecast rises past what is free, the controller sets our check of the
preemptible Job's admitted Workload to Retry; Kueue evicts it (``Evicted``, reason
``AdmissionCheck``), releases its quota and suspends the Job again, and our reason stays
in the Warning Event. A Job above ``maxPriority``, and any Job while the scaler cannot be
asked, is left running.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from admission.config import AdmissionConfig
from admission.controller import Controller
from foundation.kube import KubeAccess
from scaler.sources import receive
from tests.conftest import engine_signals, ref
from tests.k8s.control_plane import ApiError
from tests.k8s.test_admission import (
    KUEUE,
    PARAMS,
    V1BETA2,
    GpuSetup,
    condition,
    eventually,
    is_true,
    running,
)

pytestmark = pytest.mark.k8s

POOL = "h200"
SHORTFALL = "unitscale_admission_inference_shortfall_accelerators"
ALLOWANCE = "unitscale_admission_training_allowance_accelerators"


@dataclasses.dataclass
class ReclaimSetup(GpuSetup):
    """A 4-card pool, the scaler's address, a Job helper that takes a priority class."""

    def create_reclaim_parameters(self, scaler: str, **reclaim: Any) -> None:
        self.create_parameters(
            {
                "poolNodeSelector": self.pool,
                # A reclaimed Workload waits this long before Kueue requeues it: long
                # enough that the test sees it evicted and suspended, not readmitted.
                "retryAfterSeconds": 600,
                "inferenceHeadroom": {
                    "scaler": scaler,
                    "pool": POOL,
                    "whenUnavailable": "Ignore",
                },
                "reclaim": {"enabled": True, "minRunSeconds": 0, "maxPriority": 0, **reclaim},
            }
        )

    def create_priority_class(self, value: int) -> str:
        name = f"prio-{self.suffix}"
        self.plane.ensure(
            f"{KUEUE}/workloadpriorityclasses",
            {
                "apiVersion": V1BETA2,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
        return name

    def create_training_job(self, name: str, gpus: int, priority_class: str = "") -> None:
        labels = {"kueue.x-k8s.io/queue-name": "team"}
        if priority_class:
            labels["kueue.x-k8s.io/priority-class"] = priority_class
        container = {
            "name": "main",
            "image": "registry.invalid/train:1",
            "resources": {
                "requests": {"cpu": "1", "memory": "256Mi"},
                "limits": {"nvidia.com/gpu": str(gpus)},
            },
        }
        self.plane.ensure(
            f"/apis/batch/v1/namespaces/{self.namespace}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "suspend": True,
                    "template": {
                        "spec": {"restartPolicy": "Never", "containers": [container]},
                    },
                },
            },
        )

    def create_job_pod(self, job: str, node: str, cards: list[int]) -> None:
        """The Job's pod as HAMi placed it: owned by the Job, holding whole ``cards``."""
        owner = self.job(job)["metadata"]
        allocated = "".join(f"GPU-{node}-{i},NVIDIA,143771,100:" for i in cards) + ";"
        self.plane.ensure(
            f"/api/v1/namespaces/{self.namespace}/pods",
            {
                "metadata": {
                    "name": f"{job}-0",
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": job,
                            "uid": owner["uid"],
                            "controller": True,
                        }
                    ],
                    "annotations": {
                        "hami.io/vgpu-devices-allocated": allocated,
                        "hami.io/vgpu-node": node,
                    },
                },
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": "registry.invalid/train:1"}],
                },
            },
        )

    def reclaiming_controller(self) -> Controller:
        config = AdmissionConfig(
            controller_name=self.controller_name, resync=30, debounce=0.05, demand_cache=0
        )
        return Controller(KubeAccess(self.plane.kubeconfig), config)

    def events_of(self, job: str) -> list[dict[str, Any]]:
        workload = self.workload_of(job) or {"metadata": {"name": "?"}}
        items = self.plane.request("GET", f"/api/v1/namespaces/{self.namespace}/events")["items"]
        return [e for e in items if e["involvedObject"]["name"] == workload["metadata"]["name"]]


async def inference(scaler, stub, running_requests: float) -> None:
    """The scaler's view of the pool's one inference Deployment (1 card a replica)."""
    await stub.GetMetricSpec(ref("llama", pool=POOL, acceleratorsPerReplica="1"))
    receive(scaler.store, engine_signals("llama", queue=0.0, running=running_requests))


def nudging(controller: Controller, probe: Callable[[], Any]) -> Callable[[], Any]:
    """``probe`` that first asks for a pass: the scaler's figures change outside the API."""

    def get() -> Any:
        controller.notify()
        return probe()

    return get


def gauge(controller: Controller, name: str) -> float | None:
    """The pool's series (one reclaiming check guards it here, whatever its name)."""
    found = [
        sample.value
        for metric in controller.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == name and sample.labels.get("pool") == POOL
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


async def admitted_and_placed(setup: ReclaimSetup, controller: Controller, node: str) -> None:
    """The Job ``train`` admitted through our check, its pod on cards 0 and 1."""
    setup.create_training_job("train", gpus=2)
    await eventually(
        "train admitted", lambda: (w := setup.workload_of("train")) and is_true(w, "Admitted")
    )
    setup.create_job_pod("train", node, [0, 1])


def prepare(setup: ReclaimSetup, scaler_address: str) -> str:
    setup.create_reclaim_parameters(scaler_address)
    setup.create_check()
    setup.create_gpu_queues()
    node = setup.create_node("gpu", 4)
    setup.create_holder(node, [3])  # inference's one replica: card 3
    return node


async def test_a_rising_forecast_reclaims_the_preemptible_job_through_kueue(
    control_plane, kueue, admission_crd, namespace, scaler, stub
):
    setup = ReclaimSetup(control_plane, namespace)
    node = prepare(setup, f"127.0.0.1:{scaler.port}")
    await inference(scaler, stub, 16.0)  # 1 replica: holds 1 card, needs 1
    controller = setup.reclaiming_controller()
    async with running(controller):
        await admitted_and_placed(setup, controller, node)
        assert setup.job("train")["spec"]["suspend"] is False

        def known(shortfall: float) -> bool:
            controller.notify()
            return gauge(controller, SHORTFALL) == shortfall

        await eventually("the plan known, nothing short", lambda: known(0.0))
        assert gauge(controller, ALLOWANCE) == 3.0  # 4 cards - 1 needed
        assert is_true(setup.workload_of("train") or {}, "Admitted")

        # Three replicas forecast: 2 more cards, 1 free (card 2): one short.
        receive(scaler.store, engine_signals("llama", queue=0.0, running=48.0))
        # Kueue counts the eviction and clears Admitted in two writes: both are awaited.
        workload = await eventually(
            "Kueue evicts the Workload",
            nudging(
                controller,
                lambda: (
                    (w := setup.workload_of("train")) is not None
                    and evictions(w)
                    and not is_true(w, "Admitted")
                    and w
                ),
            ),
            show=lambda: (setup.workload_of("train") or {}).get("status"),
        )
        job = await eventually(
            "the Job suspended again",
            lambda: (j := setup.job("train"))["spec"]["suspend"] is True and j,
        )
    # Evicted for our check, its quota released (it is back in the queue, not admitted).
    # Kueue requeues it at once (requeueAfterSeconds 0) and reserves quota again, so the
    # Evicted condition may already read False, "Previously: ...".
    assert evictions(workload) == [{"reason": "AdmissionCheck", "count": 1}]
    evicted = condition(workload, "Evicted")
    assert evicted is not None
    assert "At least one admission check is false" in evicted["message"]
    assert not is_true(workload, "Admitted")
    assert job["spec"]["suspend"] is True
    told = [e for e in setup.events_of("train") if e["reason"] == "AdmissionCheckUpdated"]
    reclaimed = [e for e in told if ": Retry: reclaimed for inference" in e["message"]]
    assert len(reclaimed) == 1, [e["message"] for e in told]
    assert reclaimed[0]["type"] == "Warning"
    assert reclaimed[0]["message"].startswith(
        f"{setup.check}: Retry: reclaimed for inference on pool {POOL}: "
    )
    assert "frees 2 GPUs" in reclaimed[0]["message"]
    assert controller.metrics.reclaims.labels(POOL)._value.get() == 1
    assert controller.metrics.reclaimed_hours.labels(POOL)._value.get() >= 0


def evictions(workload: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Kueue's record of the Workload's evictions (``status.schedulingStats``)."""
    stats = ((workload or {}).get("status") or {}).get("schedulingStats") or {}
    return [
        {"reason": e.get("reason"), "count": e.get("count")} for e in stats.get("evictions") or []
    ]


async def test_a_job_above_max_priority_is_left_running(
    control_plane, kueue, admission_crd, namespace, scaler, stub
):
    setup = ReclaimSetup(control_plane, namespace)
    node = prepare(setup, f"127.0.0.1:{scaler.port}")
    high = setup.create_priority_class(1000)
    await inference(scaler, stub, 16.0)
    controller = setup.reclaiming_controller()
    async with running(controller):
        setup.create_training_job("train", gpus=2, priority_class=high)
        workload = await eventually(
            "train admitted",
            lambda: (w := setup.workload_of("train")) and is_true(w, "Admitted") and w,
        )
        assert workload["spec"]["priority"] == 1000
        setup.create_job_pod("train", node, [0, 1])
        receive(scaler.store, engine_signals("llama", queue=0.0, running=48.0))

        def short() -> bool:
            controller.notify()
            return gauge(controller, SHORTFALL) == 1.0

        await eventually("the plan one card short", short)
        passes = controller.passes
        await eventually(
            "two passes more", nudging(controller, lambda: controller.passes > passes + 1)
        )
    workload = setup.workload_of("train") or {}
    assert is_true(workload, "Admitted") and not is_true(workload, "Evicted")
    assert setup.job("train")["spec"]["suspend"] is False
    assert controller.metrics.reclaims.labels(POOL)._value.get() == 0


async def test_with_the_scaler_unreachable_nothing_is_evicted(
    control_plane, kueue, admission_crd, namespace, scaler, stub
):
    setup = ReclaimSetup(control_plane, namespace)
    node = prepare(setup, f"127.0.0.1:{scaler.port}")
    await inference(scaler, stub, 16.0)
    controller = setup.reclaiming_controller()
    async with running(controller):
        await admitted_and_placed(setup, controller, node)

        def known() -> bool:
            controller.notify()
            return gauge(controller, ALLOWANCE) is not None

        await eventually("the plan known", known)
        await scaler.stop(grace=0)  # gone: the forecast is unknown, not zero

        def unknown() -> bool:
            controller.notify()
            return gauge(controller, ALLOWANCE) is None and gauge(controller, SHORTFALL) is None

        await eventually("the plan's gauges absent", unknown)
        passes = controller.passes
        await eventually(
            "two passes more", nudging(controller, lambda: controller.passes > passes + 1)
        )
    workload = setup.workload_of("train") or {}
    assert is_true(workload, "Admitted") and not is_true(workload, "Evicted")
    assert setup.job("train")["spec"]["suspend"] is False
    assert controller.metrics.reclaims.labels(POOL)._value.get() == 0


async def test_reclaim_without_the_forecast_turns_the_check_inactive_saying_why(
    control_plane, kueue, admission_crd, namespace
):
    setup = ReclaimSetup(control_plane, namespace)
    setup.create_parameters({"reclaim": {"enabled": True}})
    setup.create_check()

    def inactive() -> dict[str, Any] | None:
        found = condition(setup.get_check(), "Active")
        return found if found and found["status"] == "False" else None

    async with running(setup.reclaiming_controller()):
        active = await eventually("Active=False", inactive)
    assert active["reason"] == "BadParametersRef"
    assert "spec.reclaim.enabled=true needs spec.inferenceHeadroom" in active["message"]


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"reclaim": {"minRunSeconds": 86401}}, id="a minimum run over a day"),
        pytest.param({"reclaim": {"minRunSeconds": -1}}, id="a negative minimum run"),
        pytest.param({"reclaim": {"enabled": "yes"}}, id="enabled not a boolean"),
        pytest.param({"reclaim": {"headroomFraction": 11}}, id="a headroom over ten forecasts"),
        pytest.param({"reclaim": {"headroomCards": -1}}, id="a negative card headroom"),
        pytest.param({"lora": {"stepTimeSloSeconds": 0}}, id="a zero step-time SLO"),
    ],
)
def test_the_api_server_refuses_bad_reclaim_and_lora_fields(control_plane, admission_crd, spec):
    body = {
        "apiVersion": "unitscale.io/v1alpha1",
        "kind": "CapacityCheckParameters",
        "metadata": {"name": f"bad-{secrets.token_hex(3)}"},
        "spec": spec,
    }
    with pytest.raises(ApiError) as refused:
        control_plane.request("POST", PARAMS, body)
    assert refused.value.code == 422
