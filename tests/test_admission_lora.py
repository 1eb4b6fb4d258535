"""LoRA tenants sharing a base-model instance: at most N per instance, co-located.

A tenant holds a seat on an instance while its Workload carries our
``unitscale.io/lora-instance`` label in a Ready admission-check entry (Kueue drops
podSetUpdates when it resets checks to Pending on eviction) and is not finished,
evicted or deactivated; or, when admitted, carries the label on its pod template.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission.lora import (
    DEFAULT_TENANTS_PER_INSTANCE,
    LoraAssignment,
    assign_instance,
    instance_slug,
    tenants_per_base_model,
    validate_tenants_per_instance,
)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B"
SLUG = "meta-llama-llama-3-1-8b-instruct"


def condition(kind: str, status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": kind, "message": ""}


def tenant(
    name: str,
    model: str | None = LLAMA,
    *,
    instance: str | None = None,
    state: str = "Ready",
    conditions: tuple[str, ...] = ("QuotaReserved", "Admitted"),
    namespace: str = "team-a",
    template_instance: str | None = None,
    active: bool = True,
) -> dict[str, Any]:
    """A Workload; with ``instance``, our check's entry carries the LoRA label."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if model is not None:
        meta["annotations"] = {names.LORA_BASE_MODEL: model}
    template: dict[str, Any] = {"spec": {"containers": [{"name": "t", "image": "i"}]}}
    if template_instance is not None:
        template["metadata"] = {"labels": {names.LORA_INSTANCE: template_instance}}
    wl: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": meta,
        "spec": {"active": active, "podSets": [{"name": "main", "count": 1, "template": template}]},
        "status": {"conditions": [condition(c) for c in conditions]},
    }
    if instance is not None:
        update = {"name": "main", "labels": {names.LORA_INSTANCE: instance}}
        wl["status"]["admissionChecks"] = [
            {"name": "capacity", "state": state, "message": "", "podSetUpdates": [update]}
        ]
    return wl


def pod(
    instance: str, node: str | None, *, phase: str = "Running", name: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "t", "image": "i"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"{instance}-{node}",
            "namespace": "team-a",
            "labels": {names.LORA_INSTANCE: instance},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def holders(
    instance: str, count: int, model: str = LLAMA, prefix: str = "t"
) -> list[dict[str, Any]]:
    return [tenant(f"{prefix}-{instance}-{i}", model, instance=instance) for i in range(count)]


NEW = tenant("new", instance=None, conditions=("QuotaReserved",))


@pytest.mark.parametrize(
    ("workloads", "n", "expected"),
    [
        pytest.param([], 5, (f"{SLUG}-1", 1, True), id="the-first-tenant-starts-instance-1"),
        pytest.param(
            holders(f"{SLUG}-1", 2),
            5,
            (f"{SLUG}-1", 3, False),
            id="a-tenant-joins-an-instance-with-a-seat",
        ),
        pytest.param(
            holders(f"{SLUG}-1", 5),
            5,
            (f"{SLUG}-2", 1, True),
            id="the-n-plus-first-starts-a-new-instance",
        ),
        pytest.param(
            holders(f"{SLUG}-1", 2) + holders(f"{SLUG}-2", 4),
            5,
            (f"{SLUG}-2", 5, False),
            id="the-fullest-instance-with-a-free-seat-is-joined",
        ),
        pytest.param(
            holders(f"{SLUG}-3", 1) + holders(f"{SLUG}-2", 1),
            5,
            (f"{SLUG}-2", 2, False),
            id="a-tie-goes-to-the-lowest-instance-number",
        ),
        pytest.param(
            holders(f"{SLUG}-1", 5) + holders(f"{SLUG}-3", 5),
            5,
            (f"{SLUG}-2", 1, True),
            id="a-new-instance-takes-the-smallest-unused-number",
        ),
        pytest.param(
            holders(f"{SLUG}-1", 1), 1, (f"{SLUG}-2", 1, True), id="one-tenant-per-instance"
        ),
        pytest.param(
            holders(f"{SLUG}-1", 7), 8, (f"{SLUG}-1", 8, False), id="eight-tenants-is-the-maximum"
        ),
        pytest.param(
            holders("qwen-qwen2-5-7b-1", 1, model=QWEN),
            5,
            (f"{SLUG}-1", 1, True),
            id="another-base-models-instance-is-not-joined",
        ),
        pytest.param(
            holders(f"{SLUG}-1", 1, model="meta-llama/llama-3.1-8b-instruct"),
            5,
            (f"{SLUG}-2", 1, True),
            id="a-slug-shared-with-another-model-is-skipped-not-joined",
        ),
        pytest.param(
            [tenant("done", instance=f"{SLUG}-1", conditions=("Admitted", "Finished"))],
            5,
            (f"{SLUG}-1", 1, True),
            id="a-finished-tenant-frees-its-seat",
        ),
        pytest.param(
            [tenant("evicted", instance=f"{SLUG}-1", conditions=("Admitted", "Evicted"))],
            5,
            (f"{SLUG}-1", 1, True),
            id="an-evicted-tenant-frees-its-seat",
        ),
        pytest.param(
            [tenant("off", instance=f"{SLUG}-1", active=False)],
            5,
            (f"{SLUG}-1", 1, True),
            id="a-deactivated-tenant-frees-its-seat",
        ),
        pytest.param(
            [tenant("going", instance=f"{SLUG}-1", conditions=("Admitted", "DeactivationTarget"))],
            5,
            (f"{SLUG}-1", 1, True),
            id="a-tenant-marked-for-deactivation-frees-its-seat",
        ),
        pytest.param(
            [tenant("reset", instance=f"{SLUG}-1", state="Pending")],
            5,
            (f"{SLUG}-1", 1, True),
            id="a-pending-entry-holds-no-seat",
        ),
        pytest.param(
            [tenant("waiting", instance=f"{SLUG}-1", conditions=("QuotaReserved",))],
            5,
            (f"{SLUG}-1", 2, False),
            id="a-ready-tenant-not-yet-admitted-holds-its-seat",
        ),
        pytest.param(
            [tenant("pinned", conditions=("Admitted",), template_instance=f"{SLUG}-1")],
            5,
            (f"{SLUG}-1", 2, False),
            id="an-admitted-tenant-pinned-by-its-template-holds-its-seat",
        ),
        pytest.param(
            [tenant("x", instance=f"{SLUG}-1", namespace="team-b")],
            5,
            (f"{SLUG}-1", 2, False),
            id="instances-are-shared-across-namespaces",
        ),
    ],
)
def test_assign_instance(workloads, n, expected):
    got = assign_instance(NEW, workloads, [], tenants_per_instance=n)
    assert got is not None
    assert (got.instance, got.tenants, got.new_instance) == expected
    assert got.base_model == LLAMA
    assert got.hints().labels == {names.LORA_INSTANCE: expected[0]}
    assert got.instance in got.message


def test_a_workload_without_the_annotation_is_not_a_lora_tenant():
    assert assign_instance(tenant("plain", model=None), [], [], tenants_per_instance=5) is None
    assert assign_instance(tenant("blank", model="  "), [], [], tenants_per_instance=5) is None


def test_the_workload_itself_is_not_counted_and_keeps_a_seat_it_holds():
    me = tenant("me", instance=f"{SLUG}-2")
    others = holders(f"{SLUG}-1", 3)
    got = assign_instance(me, [*others, me], [], tenants_per_instance=5)
    assert got is not None and (got.instance, got.tenants) == (f"{SLUG}-2", 1)


def test_a_template_pin_is_kept_even_when_full_and_says_so():
    me = tenant("me", conditions=("QuotaReserved",), template_instance=f"{SLUG}-1")
    got = assign_instance(me, holders(f"{SLUG}-1", 5), [], tenants_per_instance=5)
    assert got is not None and (got.instance, got.tenants) == (f"{SLUG}-1", 6)
    assert "pod template" in got.message and "over" in got.message


def test_assignments_taken_earlier_in_the_same_pass_count():
    first = assign_instance(NEW, holders(f"{SLUG}-1", 4), [], tenants_per_instance=5)
    assert first is not None and first.tenants == 5
    second = assign_instance(
        tenant("second", conditions=()),
        holders(f"{SLUG}-1", 4),
        [],
        tenants_per_instance=5,
        taken=[first],
    )
    assert second is not None and (second.instance, second.new_instance) == (f"{SLUG}-2", True)


# --- co-location ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "node", "word"),
    [
        pytest.param([], None, "no running pods", id="no-pods-yet-means-no-node-pin"),
        pytest.param([pod(f"{SLUG}-1", "gpu-3")], "gpu-3", "gpu-3", id="one-node-is-pinned"),
        pytest.param(
            [pod(f"{SLUG}-1", None, phase="Pending")],
            None,
            "no running pods",
            id="an-unscheduled-pod-has-no-node",
        ),
        pytest.param(
            [pod(f"{SLUG}-1", "gpu-3", phase="Succeeded")],
            None,
            "no running pods",
            id="a-finished-pod-does-not-count",
        ),
        pytest.param(
            [
                pod(f"{SLUG}-1", "gpu-2", name="a"),
                pod(f"{SLUG}-1", "gpu-5", name="b"),
                pod(f"{SLUG}-1", "gpu-5", name="c"),
            ],
            "gpu-5",
            "2 of its 3 pods",
            id="on-several-nodes-the-node-with-most-of-its-pods",
        ),
        pytest.param(
            [pod(f"{SLUG}-1", "gpu-7", name="a"), pod(f"{SLUG}-1", "gpu-2", name="b")],
            "gpu-2",
            "gpu-2",
            id="a-tie-between-nodes-goes-to-the-first-name",
        ),
        pytest.param(
            [pod(f"{SLUG}-2", "gpu-9")], None, "no running pods", id="another-instances-pods"
        ),
    ],
)
def test_a_joined_instance_pins_its_node(pods, node, word):
    got = assign_instance(NEW, holders(f"{SLUG}-1", 1), pods, tenants_per_instance=5)
    assert got is not None and got.instance == f"{SLUG}-1"
    assert got.node == node
    assert got.hints().node_selector == ({names.HOSTNAME: node} if node else {})
    assert word in got.message


def test_a_new_instance_avoids_an_id_whose_pods_still_run():
    got = assign_instance(NEW, [], [pod(f"{SLUG}-1", "gpu-1")], tenants_per_instance=5)
    assert got is not None and (got.instance, got.node) == (f"{SLUG}-2", None)


# --- validation, slugs, the metric -----------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(0, id="zero"),
        pytest.param(9, id="nine-above-the-maximum-of-8"),
        pytest.param(-1, id="negative"),
        pytest.param(2.5, id="a-fraction"),
        pytest.param(True, id="a-boolean"),
        pytest.param("5", id="a-string"),
    ],
)
def test_tenants_per_instance_is_an_integer_from_1_to_8(value):
    with pytest.raises(ValueError, match=r"tenants_per_instance must be an integer from 1 to 8"):
        validate_tenants_per_instance(value)
    with pytest.raises(ValueError, match=repr(value)):
        assign_instance(NEW, [], [], tenants_per_instance=value)


def test_the_default_is_5():
    assert DEFAULT_TENANTS_PER_INSTANCE == 5
    assert validate_tenants_per_instance(8) == 8
    got = assign_instance(NEW, holders(f"{SLUG}-1", 4), [])
    assert got is not None and got.capacity == 5 and got.tenants == 5


@pytest.mark.parametrize(
    ("model", "slug"),
    [
        pytest.param(LLAMA, SLUG, id="a-hugging-face-id"),
        pytest.param("///", "model", id="nothing-usable-falls-back"),
        pytest.param("A" * 80, "a" * 50, id="a-long-name-is-cut-to-leave-room-for-the-number"),
        pytest.param("x--y__z", "x-y-z", id="runs-of-separators-collapse"),
    ],
)
def test_instance_slug(model, slug):
    assert instance_slug(model) == slug
    assert len(f"{slug}-999") <= 63


def test_tenants_per_base_model_counts_seat_holders():
    workloads = [
        *holders(f"{SLUG}-1", 3),
        *holders(f"{SLUG}-2", 1),
        *holders("qwen-qwen2-5-7b-1", 2, model=QWEN),
        tenant("done", instance=f"{SLUG}-1", conditions=("Finished",)),
        tenant("queued", conditions=("QuotaReserved",)),
        tenant("plain", model=None, instance="whatever-1"),
    ]
    assert tenants_per_base_model(workloads) == {LLAMA: 4, QWEN: 2}


# --- the property: never more than N on one instance ------------------------------------

EVENTS = st.lists(
    st.tuples(st.sampled_from(["arrive", "finish"]), st.sampled_from([LLAMA, QWEN])),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(events=EVENTS, n=st.integers(min_value=1, max_value=8))
def test_no_instance_ever_holds_more_than_n_tenants(events, n):
    workloads: list[dict[str, Any]] = []
    for i, (event, model) in enumerate(events):
        if event == "finish":
            running = [w for w in workloads if "Finished" not in str(w["status"])]
            if running:
                running[i % len(running)]["status"]["conditions"].append(condition("Finished"))
            continue
        got = assign_instance(
            tenant(f"w{i}", model, conditions=()), workloads, [], tenants_per_instance=n
        )
        assert isinstance(got, LoraAssignment)
        workloads.append(tenant(f"w{i}", model, instance=got.instance))
        counts: dict[str, int] = {}
        for w in workloads:
            if "Finished" not in str(w["status"]):
                label = w["status"]["admissionChecks"][0]["podSetUpdates"][0]["labels"]
                counts[label[names.LORA_INSTANCE]] = counts.get(label[names.LORA_INSTANCE], 0) + 1
        assert max(counts.values()) <= n
        assert got.tenants == counts[got.instance]
