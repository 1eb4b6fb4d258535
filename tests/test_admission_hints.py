"""podSetUpdates from the hints we would like, never against what is already set.

Kueue merges every check's podSetUpdates into the pod template at admission and fails
admission when a key meets a different value (``pkg/podset/podset.go`` ``Merge``); the
same value is fine. So a key the user set on the template, or another check set, wins:
ours is dropped and reported, or silently omitted when it says the same.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission.hints import (
    MAX_POD_SET_UPDATES,
    Hints,
    PodSetUpdate,
    combine,
    merge_hints,
    workload_annotation,
)


def pod_set(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {"containers": [{"name": "train", "image": "trainer:1"}]}
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    return {"name": name, "count": 1, "template": {"metadata": metadata, "spec": spec}}


def workload(
    *pod_sets: dict[str, Any], checks: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "job-train-1a2b3", "namespace": "team-a", "uid": "u-1"},
        "spec": {"queueName": "gpu", "podSets": list(pod_sets) or [pod_set("main")]},
    }
    if checks is not None:
        wl["status"] = {"admissionChecks": checks}
    return wl


POLICY = Hints(annotations={names.HAMI_GPU_POLICY: "binpack", names.HAMI_USE_GPUTYPE: "H200"})
CACHE = Hints(node_selector={"fluid.io/s-team-a-corpus": "true"})


def test_a_pod_set_update_omits_empty_maps_in_kueues_json():
    update = PodSetUpdate(name="main", annotations={"b": "2", "a": "1"})
    assert update.to_api() == {"name": "main", "annotations": {"a": "1", "b": "2"}}
    full = PodSetUpdate(
        name="w", labels={"l": "v"}, annotations={"a": "1"}, node_selector={"n": "x"}
    )
    assert full.to_api() == {
        "name": "w",
        "labels": {"l": "v"},
        "annotations": {"a": "1"},
        "nodeSelector": {"n": "x"},
    }


@pytest.mark.parametrize(
    ("template", "wanted", "expected", "kept"),
    [
        pytest.param(
            pod_set("main"),
            POLICY,
            {"annotations": {names.HAMI_GPU_POLICY: "binpack", names.HAMI_USE_GPUTYPE: "H200"}},
            [],
            id="a-bare-template-takes-every-hint",
        ),
        pytest.param(
            pod_set("main", annotations={names.HAMI_GPU_POLICY: "spread"}),
            POLICY,
            {"annotations": {names.HAMI_USE_GPUTYPE: "H200"}},
            [("annotations", names.HAMI_GPU_POLICY, "spread", "binpack")],
            id="the-users-gpu-policy-wins-and-is-reported",
        ),
        pytest.param(
            pod_set("main", annotations={names.HAMI_GPU_POLICY: "binpack"}),
            POLICY,
            {"annotations": {names.HAMI_USE_GPUTYPE: "H200"}},
            [],
            id="a-key-the-user-set-to-the-same-value-is-omitted-without-a-report",
        ),
        pytest.param(
            pod_set("main", node_selector={"fluid.io/s-team-a-corpus": "false"}),
            CACHE,
            {},
            [("nodeSelector", "fluid.io/s-team-a-corpus", "false", "true")],
            id="a-node-selector-the-user-set-differently-wins",
        ),
        pytest.param(
            pod_set("main", labels={names.LORA_INSTANCE: "mine-7"}),
            Hints(labels={names.LORA_INSTANCE: "llama-1"}),
            {},
            [("labels", names.LORA_INSTANCE, "mine-7", "llama-1")],
            id="a-lora-instance-label-the-user-pinned-wins",
        ),
        pytest.param(
            pod_set("main", labels={names.HAMI_GPU_POLICY: "spread"}),
            POLICY,
            {"annotations": {names.HAMI_GPU_POLICY: "binpack", names.HAMI_USE_GPUTYPE: "H200"}},
            [],
            id="a-label-does-not-block-an-annotation-of-the-same-key",
        ),
    ],
)
def test_hints_never_override_the_template(template, wanted, expected, kept):
    result = merge_hints(workload(template), {"main": wanted})
    got = [u.to_api() for u in result.updates]
    assert got == ([{"name": "main", **expected}] if expected else [])
    assert [(k.field, k.key, k.theirs, k.ours) for k in result.kept_user] == kept
    assert all(k.owner == "the pod template" for k in result.kept_user)


def test_a_key_another_check_set_differently_wins_and_ours_is_ignored():
    other = {
        "name": "provisioning",
        "state": "Ready",
        "podSetUpdates": [{"name": "main", "nodeSelector": {"fluid.io/s-team-a-corpus": "no"}}],
    }
    ours = {
        "name": "capacity",
        "state": "Pending",
        "podSetUpdates": [{"name": "main", "annotations": {names.HAMI_GPU_POLICY: "spread"}}],
    }
    wl = workload(pod_set("main"), checks=[other, ours])
    result = merge_hints(wl, {"main": combine(POLICY, CACHE)}, check="capacity")
    assert [u.to_api() for u in result.updates] == [
        {
            "name": "main",
            "annotations": {names.HAMI_GPU_POLICY: "binpack", names.HAMI_USE_GPUTYPE: "H200"},
        }
    ]
    (kept,) = result.kept_user
    assert (kept.owner, kept.key, kept.theirs) == (
        "admission check provisioning",
        "fluid.io/s-team-a-corpus",
        "no",
    )
    assert "admission check provisioning" in result.message
    assert "fluid.io/s-team-a-corpus" in result.message


def test_updates_follow_spec_pod_sets_and_unknown_names_are_dropped_with_a_reason():
    wl = workload(pod_set("launcher"), pod_set("worker"))
    result = merge_hints(wl, {"worker": POLICY, "ghost": CACHE, "launcher": CACHE})
    assert [u.name for u in result.updates] == ["launcher", "worker"]
    assert len(result.dropped) == 1
    assert "ghost" in result.dropped[0] and "launcher, worker" in result.dropped[0]


@pytest.mark.parametrize(
    ("hints", "why"),
    [
        pytest.param(
            Hints(labels={names.LORA_INSTANCE: "x" * 64}),
            "63",
            id="a-label-value-over-63-characters",
        ),
        pytest.param(
            Hints(labels={"bad key/with/slashes": "v"}), "key", id="a-label-key-with-two-slashes"
        ),
        pytest.param(
            Hints(node_selector={"zone": "a b"}), "value", id="a-node-selector-value-with-a-space"
        ),
        pytest.param(
            Hints(annotations={"-starts-with-dash": "v"}),
            "key",
            id="an-annotation-key-not-qualified",
        ),
    ],
)
def test_an_invalid_hint_is_dropped_rather_than_failing_the_status_write(hints, why):
    result = merge_hints(workload(pod_set("main")), {"main": hints})
    assert result.updates == ()
    (reason,) = result.dropped
    assert why in reason and "main" in reason


def test_an_annotation_value_may_be_any_string():
    hints = Hints(annotations={names.HAMI_USE_GPUTYPE: "NVIDIA H200, H100 SXM"})
    (update,) = merge_hints(workload(pod_set("main")), {"main": hints}).updates
    assert update.annotations == {names.HAMI_USE_GPUTYPE: "NVIDIA H200, H100 SXM"}


def test_no_more_than_kueues_18_updates_even_for_a_workload_beyond_its_schema():
    many = [pod_set(f"ps-{i}") for i in range(MAX_POD_SET_UPDATES + 2)]
    result = merge_hints(workload(*many), {f"ps-{i}": POLICY for i in range(len(many))})
    assert len(result.updates) == MAX_POD_SET_UPDATES == 18
    assert any("18" in reason for reason in result.dropped)


def test_combine_joins_our_sources_and_refuses_two_values_for_one_key():
    both = combine(POLICY, CACHE, Hints(labels={names.LORA_INSTANCE: "llama-1"}))
    assert both.labels == {names.LORA_INSTANCE: "llama-1"}
    assert both.node_selector == {"fluid.io/s-team-a-corpus": "true"}
    assert combine(POLICY, POLICY) == POLICY
    with pytest.raises(ValueError, match=r"hami.io/gpu-scheduler-policy.*binpack.*spread"):
        combine(POLICY, Hints(annotations={names.HAMI_GPU_POLICY: "spread"}))


@pytest.mark.parametrize(
    ("metadata_annotations", "templates", "expected"),
    [
        pytest.param({names.DATASET: "corpus"}, [{}], "corpus", id="the-workloads-own-annotation"),
        pytest.param(
            {},
            [{}, {names.DATASET: "from-template"}],
            "from-template",
            id="a-pod-template-annotation-since-kueue-copies-no-job-annotations",
        ),
        pytest.param(
            {names.DATASET: "meta"},
            [{names.DATASET: "template"}],
            "meta",
            id="the-workloads-metadata-before-its-templates",
        ),
        pytest.param({}, [{}], None, id="absent-everywhere"),
    ],
)
def test_workload_annotation(metadata_annotations, templates, expected):
    wl = workload(*[pod_set(f"p{i}", annotations=a) for i, a in enumerate(templates)])
    wl["metadata"]["annotations"] = metadata_annotations
    assert workload_annotation(wl, names.DATASET) == expected


# --- properties ---------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "example.com/c", names.HAMI_GPU_POLICY, names.LORA_INSTANCE])
VALUES = st.sampled_from(["", "x", "y", "binpack"])
MAPS = st.dictionaries(KEYS, VALUES, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    labels=MAPS,
    annotations=MAPS,
    selector=MAPS,
    other=MAPS,
    wanted=st.builds(Hints, labels=MAPS, annotations=MAPS, node_selector=MAPS),
)
def test_merge_never_emits_a_key_the_template_or_another_check_holds(
    labels, annotations, selector, other, wanted
):
    template = pod_set("main", labels=labels, annotations=annotations, node_selector=selector)
    check = {
        "name": "other",
        "state": "Ready",
        "podSetUpdates": [{"name": "main", "labels": other}],
    }
    result = merge_hints(workload(template, checks=[check]), {"main": wanted}, check="ours")
    fixed = {"labels": [labels, other], "annotations": [annotations], "nodeSelector": [selector]}
    emitted: dict[str, dict[str, str]] = {}
    for update in result.updates:
        emitted = update.to_api()
        for field in ("labels", "annotations", "nodeSelector"):
            for key in emitted.get(field, {}):
                assert all(key not in source for source in fixed[field]), (field, key)
    asked = {
        "labels": wanted.labels,
        "annotations": wanted.annotations,
        "nodeSelector": wanted.node_selector,
    }
    kept = {(k.field, k.key) for k in result.kept_user}
    for field, pairs in asked.items():
        for key, value in pairs.items():
            held = [source[key] for source in fixed[field] if key in source]
            if held:
                # a different value is reported; the same value is silently omitted
                assert ((field, key) in kept) == any(v != value for v in held)
            else:
                assert emitted.get(field, {}).get(key) == value
