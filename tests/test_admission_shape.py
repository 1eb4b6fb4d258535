"""One object of the wrong JSON shape is left out alone (``admission.shape``; issue 27, H4).

A small cluster: a pending 1-GPU ``victim`` that fits, a held Ready gang whose pods are
not matched (``ghost``), an admitted preemptible gang and its pod (``held``, ``pod``), a
serving pod, a node and a Dataset. Putting a value of the wrong type anywhere in one of
them once raised in a sort, an index or the pool's inventory, so no workload, or no
workload of the pool, was decided. Now the bad object is left out (or, deeper in a held
gang, holds nothing) and the victim is Ready.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission.cluster import Cluster, Pending
from admission.decide import decide_all
from admission.manager import reclaim_all
from admission.shape import malformed
from foundation.timestamps import format_time
from tests.test_admission_controller import Counting
from tests.test_admission_decide import CHECK, NOW, dataset, node, running, workload
from tests.test_admission_reclaim import RECLAIM, admitted, h200, pod_of


def base() -> dict[str, Any]:
    ghost = workload("ghost", gpus=2, state="Ready")
    entry = ghost["status"]["admissionChecks"][0]
    entry["lastTransitionTime"] = format_time(NOW - 60)
    entry["podSetUpdates"] = [
        {
            "name": "workers",
            "nodeSelector": {names.HOSTNAME: "gpu-1"},
            "labels": {},
            "annotations": {},
        }
    ]
    return {
        "ghost": ghost,
        "held": admitted("held", ago=7200, gpus=2),
        "other": workload("other", gpus=1),
        "pod": pod_of("held", range(2)),
        "node": node("gpu-1"),
        "serve": running("serve", "gpu-2", range(6, 8)),
        "ds": dataset("ds"),
    }


def with_value(objects: dict[str, Any], name: str, path: tuple[Any, ...], value: Any) -> None:
    if not path:
        objects[name] = value
        return
    target = objects[name]
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value


def victim_after(name: str, path: tuple[Any, ...], value: Any) -> Any:
    """The victim's decision with one object's field at ``path`` set to ``value``."""
    objects = copy.deepcopy(base())
    with_value(objects, name, path, value)
    # A LoRA tenant: its instance is chosen from every Workload's podSetUpdates labels.
    victim = workload(
        "victim", gpus=1, annotations={names.LORA_BASE_MODEL: "meta-llama/Llama-3.1-8B"}
    )
    cluster = Cluster(
        nodes=[objects["node"], node("gpu-2")],
        pods=[objects["pod"], objects["serve"]],
        workloads=[victim, objects["ghost"], objects["held"], objects["other"]],
        datasets=[objects["ds"]],
        dataloads=[],
        demand=h200(2, 2),
        our_checks=frozenset({CHECK}),
        check_parameters={CHECK: RECLAIM},
    )
    pending = [
        Pending(victim, CHECK, RECLAIM, NOW - 10),
        Pending(objects["other"], CHECK, RECLAIM, NOW - 10),
    ]
    decided = decide_all(pending, cluster, NOW)
    reclaim_all(cluster, NOW)
    return next(d for d in decided if d.workload == "victim")


def test_the_untouched_cluster_admits_the_victim():
    assert victim_after("other", ("metadata", "name"), "other").state == "Ready"


@pytest.mark.parametrize(
    ("name", "path", "value"),
    [
        pytest.param("other", (), None, id="a pending Workload that is not an object fails alone"),
        pytest.param("serve", ("metadata",), "x", id="a pod whose metadata is a string"),
        pytest.param(
            "pod",
            ("metadata", "ownerReferences"),
            -1,
            id="a pod whose ownerReferences are a number",
        ),
        pytest.param("node", (), None, id="a node that is not an object"),
        pytest.param("node", ("metadata",), ["a"], id="a node whose metadata is a list"),
        pytest.param("node", ("metadata", "labels"), ["a"], id="a node whose labels are a list"),
        pytest.param("held", ("status",), "x", id="an admitted gang whose status is a string"),
        pytest.param(
            "held",
            ("status", "conditions"),
            -1,
            id="an admitted gang whose conditions are a number",
        ),
        pytest.param("pod", ("status", "phase"), [], id="an admitted pod whose phase is a list"),
        pytest.param(
            "pod",
            ("metadata", "annotations"),
            ["a"],
            id="an admitted pod whose annotations are a list",
        ),
        pytest.param(
            "held",
            ("spec", "podSets", 0, "template"),
            ["a"],
            id="a held gang whose template is a list",
        ),
        pytest.param(
            "ghost",
            ("status", "admissionChecks", 0, "podSetUpdates", 0, "nodeSelector"),
            "abc",
            id="a Ready entry whose nodeSelector is a string",
        ),
        pytest.param(
            "ghost",
            ("status", "admissionChecks", 0, "podSetUpdates", 0, "labels"),
            "abc",
            id="a Ready entry whose labels are a string leaves a LoRA tenant decided",
        ),
        pytest.param(
            "ghost",
            ("status", "admissionChecks", 0, "podSetUpdates", 0, "labels"),
            ["a"],
            id="a Ready entry whose labels are a list leaves a LoRA tenant decided",
        ),
        pytest.param(
            "ghost",
            ("spec", "podSets", 0, "template", "spec", "containers", 0, "resources"),
            "x",
            id="a held gang whose container resources are a string holds nothing",
        ),
        pytest.param(
            "held", ("status", "admissionChecks", 0, "name"), [], id="an entry named by a list"
        ),
    ],
)
def test_one_object_of_the_wrong_shape_leaves_the_others_decided(name, path, value):
    decision = victim_after(name, path, value)
    assert (decision.state, decision.failed) == ("Ready", "")


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for step, child in items:
        found.extend(_paths(child, (*prefix, step)))
    return found


PLACES = [(name, path) for name, obj in base().items() for path in _paths(obj)]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PLACES), JSON)
def test_any_value_anywhere_in_one_object_never_stops_the_victim(place, value):
    name, path = place
    decision = victim_after(name, path, value)
    assert decision.failed == "" and decision.state == "Ready"


@pytest.mark.parametrize(
    ("kind", "obj", "why"),
    [
        pytest.param(
            "node", {"metadata": {"name": 7}}, "metadata.name is int", id="a name that is a number"
        ),
        pytest.param(
            "pod",
            {"metadata": {"labels": {"a": 1}}},
            "metadata.labels holds",
            id="a label that is a number",
        ),
        pytest.param(
            "workload",
            {"spec": {"podSets": "x"}},
            "spec.podSets is not a list",
            id="podSets that are a string",
        ),
        pytest.param("dataset", [], "not a JSON object but list", id="a Dataset that is a list"),
    ],
)
def test_the_shape_names_the_field(kind, obj, why):
    assert why in (malformed(kind, obj) or "")


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        pytest.param("node", node("gpu-1"), id="a node as the API server sends it"),
        pytest.param("pod", running("p", "gpu-1", range(1)), id="a running pod"),
        pytest.param("workload", base()["ghost"], id="a held Ready gang"),
        pytest.param("workload", {"metadata": None, "spec": None}, id="absent or null parts"),
    ],
)
def test_objects_of_their_shape_are_kept(kind, obj):
    assert malformed(kind, obj) is None


def test_the_controller_leaves_a_malformed_object_out_and_warns_once_per_problem(caplog):
    controller = Counting()
    bad = {"metadata": {"name": "n1", "labels": ["a"]}}
    controller._changed("nodes", {"n1": bad, "gpu-1": node("gpu-1")})
    caplog.set_level(logging.WARNING, "admission.controller")
    for _ in range(3):
        view = controller.snapshot()
        controller._check_objects(view)
    assert [n["metadata"]["name"] for n in view.nodes] == ["gpu-1"]
    assert view.malformed == (("node", "node/n1", "metadata.labels is list, not an object"),)
    warned = [r.getMessage() for r in caplog.records if "wrong shape" in r.getMessage()]
    assert warned == [
        "node/n1: left out, of the wrong shape: metadata.labels is list, not an object"
    ]
    counted = controller.metrics.registry.get_sample_value(
        "unitscale_admission_unreadable_objects_total", {"kind": "node"}
    )
    assert counted == 1
