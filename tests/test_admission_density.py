"""Adaptive LoRA density (admission.density): the signals read, the step, the interval.

What each base model's instances load (memory HAMi gave out on their cards, the step
time their pods report), how the controller's per-model density moves (one step a pass
at most, none within LORA_INTERVAL of the last change, never above the ceiling), and
how ``decide_all`` uses it as the tenant limit.
"""

from __future__ import annotations

from typing import Any

import pytest

from admission import annotations as names
from admission import hami
from admission.cluster import Cluster, Pending
from admission.decide import decide_all
from admission.density import (
    LORA_INTERVAL,
    STEP_SECONDS,
    Density,
    instance_models,
    model_loads,
    step_density,
)
from admission.lora import InstanceLoad
from admission.parameters import LoraParameters, Parameters
from tests.test_admission_decide import CHECK, MIB, NOW, node, running, workload

MODEL = "llama-3-8b"
INSTANCE = "llama-3-8b-1"


def tenant_pod(
    name: str, memory: int, step: str | None = None, owner: str = "serving"
) -> dict[str, Any]:
    """A pod of instance llama-3-8b-1 on gpu-1 card 0 holding ``memory`` MiB, of ``owner``."""
    pod = running(name, "gpu-1", range(0), owner=owner)
    meta = pod["metadata"]
    meta["labels"] = {names.LORA_INSTANCE: INSTANCE}
    meta["annotations"][names.HAMI_DEVICES_ALLOCATED] = f"GPU-gpu-1-0,NVIDIA,{memory},10:;"
    if step is not None:
        meta["annotations"][STEP_SECONDS] = step
    return pod


@pytest.mark.parametrize(
    ("pods", "slo", "load"),
    [
        pytest.param(
            [tenant_pod("a", MIB // 2, "1.5"), tenant_pod("b", MIB // 4, "2.5")],
            3.0,
            (0.75, 2.5, 3.0),
            id="memory on the instance's card adds up and the slowest step counts",
        ),
        pytest.param(
            [tenant_pod("a", MIB // 2)],
            3.0,
            (0.5, None, 3.0),
            id="a pod reporting no step time leaves it unknown, not zero",
        ),
        pytest.param(
            [tenant_pod("a", MIB // 2, "fast")],
            None,
            (0.5, None, None),
            id="an unreadable step time is unknown",
        ),
        pytest.param(
            [],
            3.0,
            (None, None, 3.0),
            id="an instance with no pod running has no memory reading",
        ),
    ],
)
def test_each_models_load_is_read_from_its_instances_pods(pods, slo, load):
    pool = hami.inventory([node("gpu-1")], pods, now=NOW)
    (got,) = model_loads(pods, pool, {INSTANCE: MODEL}, slo).values()
    memory, step, objective = load
    assert got.memory_used == (None if memory is None else pytest.approx(memory, abs=1e-4))
    assert (got.step_seconds, got.step_slo_seconds) == (step, objective)


def test_instances_are_named_by_their_tenants():
    w = workload("t", template_annotations={names.LORA_BASE_MODEL: MODEL}, state="Ready")
    w["status"]["admissionChecks"][0]["podSetUpdates"] = [
        {"name": "workers", "labels": {names.LORA_INSTANCE: INSTANCE}}
    ]
    assert instance_models([w, workload("plain")]) == {INSTANCE: MODEL}


PRESSED = InstanceLoad(0.95, 1.0, 3.0)
ROOMY = InstanceLoad(0.5, 1.0, 3.0)


@pytest.mark.parametrize(
    ("held", "load", "now", "tenants", "changed_at"),
    [
        pytest.param({}, ROOMY, NOW, 5, -float("inf"), id="a new model starts at the ceiling"),
        pytest.param({}, PRESSED, NOW, 4, NOW, id="memory pressure lowers it by one"),
        pytest.param(
            {MODEL: Density(4, NOW - 10)},
            PRESSED,
            NOW,
            4,
            NOW - 10,
            id="not again within the interval of the last change",
        ),
        pytest.param(
            {MODEL: Density(4, NOW - LORA_INTERVAL)},
            PRESSED,
            NOW,
            3,
            NOW,
            id="again once the interval has passed",
        ),
        pytest.param(
            {MODEL: Density(3, NOW - LORA_INTERVAL)},
            ROOMY,
            NOW,
            4,
            NOW,
            id="room raises it by one",
        ),
        pytest.param(
            {MODEL: Density(3, NOW - LORA_INTERVAL)},
            InstanceLoad(0.5, None, 3.0),
            NOW,
            3,
            NOW - LORA_INTERVAL,
            id="a step time unknown holds it",
        ),
        pytest.param(
            {MODEL: Density(7, NOW - 1)},
            ROOMY,
            NOW,
            5,
            NOW,
            id="a lowered ceiling applies at once",
        ),
    ],
)
def test_the_density_moves_one_step_at_most_per_interval(held, load, now, tenants, changed_at):
    after = step_density(held, {MODEL: load}, 5, now)[MODEL]
    assert (after.tenants, after.changed_at) == (tenants, changed_at)


@pytest.mark.parametrize(
    ("seated", "tenants"),
    [
        pytest.param(
            5, 4, id="below the crowd seated before the last lowering, pressure holds it there"
        ),
        pytest.param(4, 3, id="with the crowd at the density, pressure lowers it again"),
        pytest.param(
            1, 3, id="one tenant filling its instance lowers it on, towards one an instance"
        ),
    ],
)
def test_pressure_from_tenants_seated_before_a_lowering_does_not_lower_it_again(seated, tenants):
    # Lowering the density seats no tenant fewer: the instance that pressed it down to 4
    # with 5 tenants still reads the same, which says nothing about 4.
    held = {MODEL: Density(4, NOW - LORA_INTERVAL)}
    after = step_density(held, {MODEL: PRESSED}, 5, NOW, seated={MODEL: seated})[MODEL]
    assert after.tenants == tenants, after.reason


def finished(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["phase"] = "Succeeded"
    return pod


@pytest.mark.parametrize(
    ("pods", "seated"),
    [
        pytest.param(
            [tenant_pod("a-0", 1, owner="a"), tenant_pod("a-1", 1, owner="a")],
            1,
            id="two pods of one Job are one tenant",
        ),
        pytest.param(
            [tenant_pod("a", 1, owner="a"), tenant_pod("b", 1, owner="b")],
            2,
            id="pods of two Jobs are two tenants",
        ),
        pytest.param(
            [tenant_pod("a", 1, owner="a"), finished(tenant_pod("b", 1, owner="b"))],
            1,
            id="a tenant whose pods finished has left",
        ),
    ],
)
def test_the_tenants_seated_are_counted_by_job(pods, seated):
    from admission.density import model_seated

    assert model_seated(pods, {INSTANCE: MODEL}) == {MODEL: seated}


def test_decide_uses_the_models_density_as_its_tenant_limit():
    # One tenant already on instance -1; with density 1 the next starts instance -2.
    lora = {names.LORA_BASE_MODEL: MODEL}
    seated = workload("seated", gpus=1, template_annotations=lora, state="Ready")
    seated["status"]["admissionChecks"][0]["podSetUpdates"] = [
        {"name": "workers", "labels": {names.LORA_INSTANCE: INSTANCE}}
    ]
    pending = workload("next", gpus=1, template_annotations=lora)
    adaptive = Parameters(lora=LoraParameters(tenants_per_instance=5, adaptive=True))

    def decided(density: dict[str, int], params: Parameters) -> str:
        cluster = Cluster(
            nodes=[node("gpu-1")],
            pods=[],
            workloads=[seated, pending],
            datasets=[],
            dataloads=[],
            demand={},
            lora_density=density,
        )
        (d,) = decide_all([Pending(pending, CHECK, params, NOW - 10)], cluster, NOW)
        assert d.state == "Ready"
        return d.message

    assert "starts LoRA instance llama-3-8b-2" in decided({MODEL: 1}, adaptive)
    assert "joins LoRA instance llama-3-8b-1 of llama-3-8b (2 of 5" in decided({}, adaptive)
    fixed = Parameters(lora=LoraParameters(tenants_per_instance=5))
    assert "joins LoRA instance llama-3-8b-1" in decided({MODEL: 1}, fixed)


def test_the_controller_steps_each_models_density_once_per_interval_and_exports_it():
    from admission.config import AdmissionConfig
    from admission.controller import Controller, Snapshot
    from foundation.kube import KubeAccess

    controller = Controller(KubeAccess(), AdmissionConfig())
    seated = workload("seated", template_annotations={names.LORA_BASE_MODEL: MODEL})
    seated["spec"]["podSets"][0]["template"]["metadata"]["labels"] = {names.LORA_INSTANCE: INSTANCE}
    pressed = [tenant_pod("a", int(MIB * 0.95), "1.0")]
    view = Snapshot({}, {}, {"train/seated": seated}, [node("gpu-1")], pressed, [], [])
    adaptive = {
        CHECK: Parameters(
            lora=LoraParameters(tenants_per_instance=5, adaptive=True, step_time_slo_seconds=3.0)
        )
    }
    sample = controller.metrics.registry.get_sample_value
    density = "unitscale_admission_lora_tenants_per_instance"
    assert controller._step_density(view, adaptive, NOW) == {MODEL: 4}
    assert sample(density, {"base_model": MODEL}) == 4
    assert controller._step_density(view, adaptive, NOW + 10) == {MODEL: 4}  # within 60 s
    assert controller._step_density(view, adaptive, NOW + LORA_INTERVAL) == {MODEL: 3}
    # Five tenants pressing one instance: one step down, then held while they stay.
    crowd = [tenant_pod(f"t{i}", int(MIB * 0.19), "1.0", owner=f"t{i}") for i in range(5)]
    crowded = Snapshot({}, {}, {"train/seated": seated}, [node("gpu-1")], crowd, [], [])
    fresh = Controller(KubeAccess(), AdmissionConfig())
    assert fresh._step_density(crowded, adaptive, NOW) == {MODEL: 4}
    assert fresh._step_density(crowded, adaptive, NOW + 2 * LORA_INTERVAL) == {MODEL: 4}
    # Not adaptive any more: no density held, none exported.
    assert controller._step_density(view, {CHECK: Parameters()}, NOW + 200) == {}
    assert sample(density, {"base_model": MODEL}) is None
