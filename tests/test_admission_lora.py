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
    MAX_TENANTS_PER_INSTANCE,
    InstanceLoad,
    LoraAssignment,
    assign_instance,
    instance_slug,
    model_instance,
    tenants_for,
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


@pytest.mark.parametrize(
    "squatter",
    [
        pytest.param(
            tenant("plain", model=None, namespace="other-team", template_instance=f"{SLUG}-1"),
            id="a workload that is no tenant, its template labelled with the instance",
        ),
        pytest.param(
            tenant("qwen", model=QWEN, namespace="other-team", template_instance=f"{SLUG}-1"),
            id="another model's tenant labelled with the instance",
        ),
        pytest.param(
            tenant("qwen", model=QWEN, namespace="other-team", instance=f"{SLUG}-1"),
            id="another model's tenant whose Ready entry names the instance",
        ),
        pytest.param(
            tenant("base", model="meta-llama/Llama-3.1-8B", template_instance=f"{SLUG}-1"),
            id="the base model's tenant, whose slug begins the Instruct model's",
        ),
    ],
)
def test_a_label_that_is_no_instance_of_the_workloads_own_model_holds_no_seat(squatter):
    """Read raw, it made the instance unjoinable: the next tenant started a second copy
    of the base model away from the running one (hostile pass 47)."""
    pods = [pod(f"{SLUG}-1", "gpu-7")]
    got = assign_instance(NEW, [*holders(f"{SLUG}-1", 1), squatter], pods)
    assert got is not None and (got.instance, got.node) == (f"{SLUG}-1", "gpu-7")
    assert got.tenants == 2
    assert tenants_per_base_model([squatter]) == {}


def test_a_pin_to_another_models_instance_counts_alike_in_its_pass_and_the_next():
    """Taken in its pass, it counted on the instance; admitted, it did not: the next
    tenant started a new instance, and one a pass later joined as the sixth (pass 49)."""
    pods = [pod(f"{SLUG}-1", "gpu-7")]
    held = holders(f"{SLUG}-1", 4)
    pinned = tenant("qwen", QWEN, template_instance=f"{SLUG}-1", conditions=("QuotaReserved",))
    taken = assign_instance(pinned, [*held, pinned], pods)
    assert taken is not None and taken.instance == f"{SLUG}-1"  # the template asks it
    same_pass = assign_instance(NEW, [*held, pinned, NEW], pods, taken=[taken])
    admitted = tenant("qwen", QWEN, instance=f"{SLUG}-1", template_instance=f"{SLUG}-1")
    next_pass = assign_instance(NEW, [*held, admitted, NEW], pods)
    assert same_pass is not None and next_pass is not None
    assert (same_pass.instance, same_pass.tenants) == (next_pass.instance, next_pass.tenants)
    assert (next_pass.instance, next_pass.tenants) == (f"{SLUG}-1", 5)


@pytest.mark.parametrize(
    ("label", "instance"),
    [
        pytest.param(f"{SLUG}-1", f"{SLUG}-1", id="the slug and a number"),
        pytest.param(f"{SLUG}-12", f"{SLUG}-12", id="a larger number"),
        pytest.param(f"{SLUG}-one", None, id="a name after the slug is no number"),
        pytest.param(f"{SLUG}-1234567890", None, id="more than nine digits"),
        pytest.param(f"{SLUG}1", None, id="no dash after the slug"),
        pytest.param("7", None, id="a number without the slug"),
        pytest.param(5, None, id="not a string"),
    ],
)
def test_an_instance_of_a_model_is_its_slug_and_a_number(label, instance):
    assert model_instance(LLAMA, label) == instance


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


# --- density: how many tenants an instance takes, from its load ----------------------------


@pytest.mark.parametrize(
    ("current", "load", "ceiling", "want", "said"),
    [
        pytest.param(
            5,
            InstanceLoad(0.5, 0.10, 0.25),
            8,
            6,
            "one more",
            id="memory and steps with room raise by one",
        ),
        pytest.param(
            5,
            InstanceLoad(0.70, 0.20, 0.25),
            8,
            6,
            "one more",
            id="exactly 70% memory and 80% of the objective still raise",
        ),
        pytest.param(
            8,
            InstanceLoad(0.3, 0.05, 0.25),
            8,
            8,
            "ceiling of 8",
            id="room at the ceiling holds there",
        ),
        pytest.param(
            3, InstanceLoad(0.3, 0.05, 0.25), 3, 3, "ceiling of 3", id="a lower ceiling is honoured"
        ),
        pytest.param(
            5, InstanceLoad(0.90, 0.10, 0.25), 8, 4, "90% used", id="memory at 90% lowers by one"
        ),
        pytest.param(
            5,
            InstanceLoad(0.5, 0.26, 0.25),
            8,
            4,
            "over it",
            id="steps slower than their objective lower by one",
        ),
        pytest.param(
            5,
            InstanceLoad(0.95, 0.30, 0.25),
            8,
            4,
            "and step",
            id="both bad lower by one only, naming both",
        ),
        pytest.param(
            1, InstanceLoad(0.99, 0.5, 0.25), 8, 1, "the fewest", id="never below one tenant"
        ),
        pytest.param(
            5,
            InstanceLoad(0.80, 0.10, 0.25),
            8,
            5,
            "holding at 5",
            id="memory between the marks holds",
        ),
        pytest.param(
            5,
            InstanceLoad(0.5, 0.22, 0.25),
            8,
            5,
            "holding at 5",
            id="steps near their objective hold",
        ),
        pytest.param(
            5,
            InstanceLoad(0.90, 0.25, 0.25),
            8,
            4,
            "90% used",
            id="a step right at its objective is not over it, memory still lowers",
        ),
        pytest.param(
            5,
            InstanceLoad(None, 0.05, 0.25),
            8,
            5,
            "memory use unknown",
            id="memory unknown never raises, however fast the steps",
        ),
        pytest.param(
            5,
            InstanceLoad(0.1, None, 0.25),
            8,
            5,
            "step time unknown",
            id="step time unknown never raises, however empty the memory",
        ),
        pytest.param(
            5,
            InstanceLoad(0.1, 0.05, None),
            8,
            5,
            "step objective unknown",
            id="no objective never raises",
        ),
        pytest.param(
            5,
            InstanceLoad(None, 0.40, 0.25),
            8,
            4,
            "over it",
            id="memory unknown still lowers on steps that are known and slow",
        ),
        pytest.param(
            5,
            InstanceLoad(0.93, None, None),
            8,
            4,
            "93% used",
            id="step unknown still lowers on memory known and full",
        ),
        pytest.param(
            5, InstanceLoad(None, None, None), 8, 5, "holding at 5", id="nothing known holds"
        ),
        pytest.param(
            7,
            InstanceLoad(0.5, 0.1, 0.25),
            5,
            5,
            "above the ceiling of 5",
            id="above a lowered ceiling comes down to it",
        ),
    ],
)
def test_tenants_follow_the_instance_load(current, load, ceiling, want, said):
    got, reason = tenants_for(current, load, ceiling)
    assert got == want
    assert said in reason


@pytest.mark.parametrize(
    ("current", "load", "ceiling", "match"),
    [
        pytest.param(
            0, InstanceLoad(0.5, 0.1, 0.2), 8, "current tenants", id="zero tenants is refused"
        ),
        pytest.param(
            True, InstanceLoad(0.5, 0.1, 0.2), 8, "current tenants", id="a bool is no tenant count"
        ),
        pytest.param(
            3, InstanceLoad(1.5, 0.1, 0.2), 8, "memory_used", id="memory above 1 is refused"
        ),
        pytest.param(
            3,
            InstanceLoad(float("nan"), 0.1, 0.2),
            8,
            "memory_used",
            id="memory NaN is refused, not read as a number",
        ),
        pytest.param(
            3, InstanceLoad(0.5, -1.0, 0.2), 8, "step_seconds", id="a negative step is refused"
        ),
        pytest.param(
            3, InstanceLoad(0.5, 0.1, 0.0), 8, "step_slo_seconds", id="a zero objective is refused"
        ),
        pytest.param(
            3,
            InstanceLoad(0.5, 0.1, 0.2),
            9,
            "tenants_per_instance",
            id="a ceiling above 8 is refused",
        ),
    ],
)
def test_bad_load_figures_are_refused_with_the_field_named(current, load, ceiling, match):
    with pytest.raises(ValueError, match=match):
        tenants_for(current, load, ceiling)


def test_the_default_ceiling_is_the_hard_limit_of_8():
    roomy = InstanceLoad(0.1, 0.01, 1.0)
    assert tenants_for(7, roomy)[0] == MAX_TENANTS_PER_INSTANCE == 8
    assert tenants_for(8, roomy)[0] == 8


FRACTIONS = st.none() | st.floats(min_value=0, max_value=1)
SECONDS = st.none() | st.floats(min_value=0, max_value=100)
OBJECTIVES = st.none() | st.floats(min_value=1e-3, max_value=100)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    ceiling=st.integers(min_value=1, max_value=8),
    load=st.builds(InstanceLoad, FRACTIONS, SECONDS, OBJECTIVES),
)
def test_density_moves_one_step_within_bounds(data, ceiling, load):
    current = data.draw(st.integers(min_value=1, max_value=ceiling), label="current")
    got, reason = tenants_for(current, load, ceiling)
    assert 1 <= got <= ceiling
    assert abs(got - current) <= 1
    assert reason
    unknown = None in (load.memory_used, load.step_seconds, load.step_slo_seconds)
    if unknown:
        assert got <= current, "a missing signal raised the density"
