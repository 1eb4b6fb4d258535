"""Data readiness of a Workload's Fluid Dataset, the DataLoad we create, the cache label.

The Dataset and DataLoad objects are golden files shaped as Fluid v1.0.8 writes them
(``tests/golden/fluid``), and each one, like the DataLoad ``dataload_for`` makes, is
checked against the structural schema of the real CRD, read by path from
``shared/crds/fluid`` beside the checkout (``tests.shared_data.shared``: skipped naming
the path when it is absent, failed under ``CI=true``; never copied into the repository), with
the rules the API server applies to these CRDs: known fields, types, enums, required
fields, lengths and patterns.
"""

from __future__ import annotations

import copy
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from admission import annotations as names
from admission.fluid import cache_node_label, dataload_for, dataload_name, readiness
from foundation.fluid import (
    MAX_DATALOAD_NAME,
    STATUS_LAG_SECONDS,
    FluidIndex,
    parse_cached_percentage,
    read_cached_percentage,
)
from tests.shared_data import shared

GOLDEN = Path(__file__).parent / "golden" / "fluid"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def golden(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((GOLDEN / name).read_text())
    return loaded


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).astimezone(UTC).timestamp()


COMPLETED_AT = epoch("2025-06-02T09:05:12Z")
"""When the golden DataLoad's loader Job completed."""
NOW = COMPLETED_AT + 3600.0
TIMEOUT = 1800.0
SINCE = NOW - 100.0


def workload(name: str = "job-train-1a2b3", dataset: str | None = "corpus") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": "wl-uid-1"}
    if dataset is not None:
        meta["annotations"] = {names.DATASET: dataset}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": meta,
        "spec": {"podSets": [{"name": "main", "count": 1, "template": {"spec": {}}}]},
    }


def bound(percentage: object = "78.0%") -> dict[str, Any]:
    dataset = golden("dataset-bound.yaml")
    if percentage is None:
        del dataset["status"]["cacheStates"]["cachedPercentage"]
    else:
        dataset["status"]["cacheStates"]["cachedPercentage"] = percentage
    return dataset


def with_changes(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy with dotted paths set (``metadata.name="x"``: ``metadata__name``)."""
    out = copy.deepcopy(obj)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


OURS = dataload_name(workload())
EXECUTING = golden("dataload-executing.yaml")
COMPLETE = golden("dataload-complete.yaml")
FAILED = golden("dataload-failed.yaml")


def ours(dataload: dict[str, Any]) -> dict[str, Any]:
    return with_changes(dataload, metadata__name=OURS)


def check(
    *,
    wl: dict[str, Any] | None = None,
    datasets: list[dict[str, Any]] | None = None,
    dataloads: list[dict[str, Any]] | None = None,
    threshold: float = 95.0,
    since: float = SINCE,
    now: float = NOW,
    create: bool = True,
    served: bool = True,
):
    return readiness(
        workload() if wl is None else wl,
        FluidIndex([bound()] if datasets is None else datasets, dataloads or []),
        threshold_percent=threshold,
        waiting_since=since,
        now=now,
        timeout_seconds=TIMEOUT,
        create_dataload=create,
        datasets_served=served,
    )


# --- the state table ----------------------------------------------------------------

CASES = [
    pytest.param(
        {"wl": workload(dataset=None)},
        ("not-annotated", "pass", False),
        "",
        id="a-workload-without-the-annotation-needs-no-data",
    ),
    pytest.param(
        {"wl": workload(dataset="")},
        ("bad-annotation", "reject", False),
        "names no Dataset",
        id="an-empty-annotation-names-no-dataset-and-is-rejected",
    ),
    pytest.param(
        {"wl": workload(dataset="team-b/corpus")},
        ("bad-annotation", "reject", False),
        "team-b/corpus",
        id="a-dataset-of-another-namespace-cannot-be-named",
    ),
    pytest.param(
        {"datasets": []},
        ("dataset-missing", "wait", False),
        "Dataset team-a/corpus does not exist",
        id="a-missing-dataset-waits",
    ),
    pytest.param(
        {"datasets": [], "served": False},
        ("fluid-missing", "wait", False),
        "Fluid is not installed: the API server serves no data.fluid.io/v1alpha1 datasets",
        id="without-fluid-installed-the-message-says-so-not-that-the-dataset-is-missing",
    ),
    pytest.param(
        {"datasets": [], "served": False, "since": NOW - TIMEOUT - 1},
        ("timed-out", "retry", False),
        "Fluid is not installed",
        id="waiting-for-fluid-times-out-as-any-wait",
    ),
    pytest.param(
        {"datasets": [with_changes(bound(), metadata__namespace="team-b")]},
        ("dataset-missing", "wait", False),
        "does not exist",
        id="a-dataset-of-the-same-name-in-another-namespace-is-missing",
    ),
    pytest.param(
        {"datasets": [golden("dataset-notbound.yaml")]},
        ("not-bound", "wait", False),
        "NotBound",
        id="a-dataset-not-yet-bound-waits",
    ),
    pytest.param(
        {"datasets": [with_changes(bound(), status={})]},
        ("not-bound", "wait", False),
        "no status.phase",
        id="a-dataset-fluid-has-not-reconciled-waits",
    ),
    pytest.param(
        {"datasets": [with_changes(bound("100.0%"), metadata__deletionTimestamp="x")]},
        ("not-bound", "wait", False),
        "being deleted",
        id="a-dataset-being-deleted-is-not-ready-however-warm",
    ),
    pytest.param(
        {"datasets": [bound("100.0%")]},
        ("ready", "pass", False),
        "100.0%",
        id="a-warm-cache-is-ready-without-any-dataload",
    ),
    pytest.param(
        {"datasets": [bound("95.0%")]},
        ("ready", "pass", False),
        "95.0%",
        id="a-cache-exactly-at-the-threshold-is-ready",
    ),
    pytest.param(
        {"datasets": [bound("garbage")], "threshold": 0.0},
        ("ready", "pass", False),
        "",
        id="a-threshold-of-zero-passes-any-bound-dataset",
    ),
    pytest.param(
        {},
        ("loading", "wait", True),
        f"creating DataLoad team-a/{OURS}",
        id="a-cold-cache-with-no-dataload-creates-ours",
    ),
    pytest.param(
        {"create": False},
        ("no-dataload", "wait", False),
        "createDataLoad is off",
        id="a-cold-cache-with-creation-off-waits-for-someone-to-load-it",
    ),
    pytest.param(
        {"dataloads": [EXECUTING]},
        ("loading", "wait", False),
        "DataLoad team-a/corpus-warmup is Executing",
        id="an-executing-dataload-made-by-anyone-counts-and-none-is-created",
    ),
    pytest.param(
        {"dataloads": [with_changes(EXECUTING, status={"phase": "Pending"})]},
        ("loading", "wait", False),
        "is Pending",
        id="a-pending-dataload-counts-as-loading",
    ),
    pytest.param(
        {"dataloads": [with_changes(EXECUTING, status={})]},
        ("loading", "wait", False),
        "not yet picked up by Fluid",
        id="a-dataload-without-status-counts-as-loading",
    ),
    pytest.param(
        {"dataloads": [with_changes(EXECUTING, spec__dataset={"name": "other"})]},
        ("loading", "wait", True),
        "creating DataLoad",
        id="a-dataload-of-another-dataset-does-not-count",
    ),
    pytest.param(
        {"dataloads": [with_changes(EXECUTING, metadata__namespace="team-b")]},
        ("loading", "wait", True),
        "creating DataLoad",
        id="a-dataload-in-another-namespace-does-not-count",
    ),
    pytest.param(
        {"dataloads": [with_changes(EXECUTING, spec__dataset={"name": "corpus"})]},
        ("loading", "wait", False),
        "is Executing",
        id="a-dataload-naming-no-dataset-namespace-means-its-own",
    ),
    pytest.param(
        {"dataloads": [with_changes(EXECUTING, metadata__deletionTimestamp="x")]},
        ("loading", "wait", True),
        "creating DataLoad",
        id="a-dataload-being-deleted-does-not-count",
    ),
    pytest.param(
        {"dataloads": [ours(FAILED)]},
        ("load-failed", "retry", False),
        "BackoffLimitExceeded: Job has reached the specified backoff limit",
        id="our-failed-dataload-is-a-load-failure-with-its-reason",
    ),
    pytest.param(
        {"dataloads": [FAILED], "create": False},
        ("load-failed", "retry", False),
        "corpus-warmup failed",
        id="with-creation-off-someone-elses-failed-load-is-a-load-failure",
    ),
    pytest.param(
        {"dataloads": [FAILED]},
        ("loading", "wait", True),
        "creating DataLoad",
        id="someone-elses-failed-load-does-not-stop-ours",
    ),
    pytest.param(
        {"dataloads": [ours(COMPLETE)], "now": COMPLETED_AT + STATUS_LAG_SECONDS / 2},
        ("loading", "wait", False),
        "catch up",
        id="our-dataload-that-just-completed-waits-for-fluid-to-report-the-cache",
    ),
    pytest.param(
        {"dataloads": [ours(COMPLETE)]},
        ("below-threshold", "retry", False),
        "78.0%",
        id="our-dataload-completed-long-ago-and-the-cache-fell-below-the-threshold",
    ),
    pytest.param(
        {"dataloads": [COMPLETE]},
        ("loading", "wait", True),
        "creating DataLoad",
        id="someone-elses-complete-load-with-a-cold-cache-gets-ours-created",
    ),
    pytest.param(
        {"dataloads": [COMPLETE], "create": False},
        ("no-dataload", "wait", False),
        "corpus-warmup completed",
        id="with-creation-off-a-complete-load-and-a-cold-cache-waits",
    ),
    pytest.param(
        {"datasets": [bound("N/A")], "dataloads": [EXECUTING]},
        ("loading", "wait", False),
        "'N/A'",
        id="a-garbled-percentage-is-never-ready-and-says-why",
    ),
    pytest.param(
        {"datasets": [bound(None)], "dataloads": [ours(COMPLETE)]},
        ("cache-unknown", "wait", False),
        "no cachedPercentage",
        id="our-complete-load-with-no-percentage-reported-waits",
    ),
    pytest.param(
        {"since": NOW - TIMEOUT},
        ("timed-out", "retry", True),
        "after waiting 1800 s",
        id="waiting-past-the-timeout-gives-up-and-still-starts-the-load",
    ),
    pytest.param(
        {"datasets": [], "since": NOW - TIMEOUT - 1},
        ("timed-out", "retry", False),
        "does not exist",
        id="a-missing-dataset-times-out-too",
    ),
    pytest.param(
        {"dataloads": [ours(FAILED)], "since": NOW - 10 * TIMEOUT},
        ("load-failed", "retry", False),
        "failed",
        id="a-load-failure-is-not-reworded-as-a-timeout",
    ),
    pytest.param(
        {"datasets": [bound("99.0%")], "since": NOW - 10 * TIMEOUT},
        ("ready", "pass", False),
        "",
        id="a-ready-dataset-is-ready-however-long-it-took",
    ),
]


@pytest.mark.parametrize(("given", "expected", "message"), CASES)
def test_readiness(given, expected, message):
    result = check(**given)
    state, outcome, creates = expected
    assert (result.state, result.outcome, result.create is not None) == (state, outcome, creates)
    assert message in result.message
    assert result.passed == (outcome == "pass")
    if state not in ("not-annotated", "bad-annotation"):
        assert "team-a/corpus" in result.message


def test_a_ready_dataset_hints_its_cache_nodes():
    result = check(datasets=[bound("99.5%")])
    assert result.node_selector == {"fluid.io/s-team-a-corpus": "true"}
    assert result.cached_percent == 99.5
    assert check(datasets=[bound("10.0%")], dataloads=[EXECUTING]).node_selector == {}


def test_a_message_shows_the_cache_against_the_threshold():
    result = check(dataloads=[EXECUTING])
    assert "78.0% cached of the 95% needed" in result.message
    assert result.cached_percent == 78.0
    assert result.dataload == "corpus-warmup"


def test_the_created_dataload_is_dataload_for_the_workload():
    result = check()
    assert result.create == dataload_for(workload(), bound())
    assert result.dataload == OURS


# --- cachedPercentage ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("100.0%", 100.0, id="fully-cached-as-fluid-writes-it"),
        pytest.param("78.0%", 78.0, id="partly-cached"),
        pytest.param("0%", 0.0, id="vineyard-with-no-capacity-writes-0-percent"),
        pytest.param("0.0%", 0.0, id="juicefs-with-no-space-writes-0-0-percent"),
        pytest.param(" 42.5 % ", 42.5, id="surrounding-blanks-are-tolerated"),
        pytest.param("95", 95.0, id="a-bare-number-is-a-percentage"),
        pytest.param("120.5%", 120.5, id="over-100-when-blocks-exceed-the-ufs-size-is-kept"),
        pytest.param(80, 80.0, id="a-json-number"),
    ],
)
def test_a_cached_percentage_parses(value, expected):
    assert parse_cached_percentage(value) == expected
    assert read_cached_percentage(value).reason == ""


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(None, "no cachedPercentage", id="missing"),
        pytest.param("", "empty", id="empty-until-fluid-knows-the-ufs-total"),
        pytest.param("N/A", "not a percentage", id="words"),
        pytest.param("NaN%", "not a finite", id="nan-when-the-ufs-total-is-zero"),
        pytest.param("+Inf%", "not a finite", id="infinity"),
        pytest.param("-3.0%", "negative", id="negative"),
        pytest.param(True, "not a percentage", id="a-boolean"),
        pytest.param(["78%"], "not a percentage", id="a-list"),
    ],
)
def test_a_missing_or_garbled_percentage_is_none_with_a_reason_never_zero(value, reason):
    assert parse_cached_percentage(value) is None
    assert reason in read_cached_percentage(value).reason


@given(st.floats(min_value=0, max_value=1000, allow_nan=False))
def test_fluids_format_round_trips(value):
    parsed = parse_cached_percentage(f"{value:.1f}%")
    assert parsed is not None and math.isclose(parsed, float(f"{value:.1f}"))


# --- the DataLoad we create ---------------------------------------------------------


def test_dataload_for_loads_the_whole_dataset_once_owned_by_the_workload():
    made = dataload_for(workload(), bound())
    assert made == {
        "apiVersion": "data.fluid.io/v1alpha1",
        "kind": "DataLoad",
        "metadata": {
            "name": OURS,
            "namespace": "team-a",
            "labels": {names.MANAGED_BY: names.MANAGER},
            "annotations": {names.FOR_WORKLOAD: "job-train-1a2b3"},
            "ownerReferences": [
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "Workload",
                    "name": "job-train-1a2b3",
                    "uid": "wl-uid-1",
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "dataset": {"name": "corpus", "namespace": "team-a"},
            "loadMetadata": True,
            "target": [{"path": "/", "replicas": 1}],
            "policy": "Once",
        },
    }


def test_the_dataload_name_is_the_same_for_a_workload_and_differs_for_another():
    assert dataload_name(workload()) == dataload_name(copy.deepcopy(workload()))
    assert OURS.startswith("job-train-1a2b3-")
    other = with_changes(workload(), metadata__uid="wl-uid-2")
    assert dataload_name(other) != OURS  # a workload recreated under the same name


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("job-" + "a" * 240, id="a-workload-name-of-244-characters"),
        pytest.param("job-" + "a" * 32 + "-" + "b" * 10, id="a-cut-that-would-end-in-a-dash"),
        pytest.param("pytorchjob-x.y" + "z" * 30, id="a-name-with-a-dot"),
    ],
)
def test_a_long_workload_name_is_cut_to_what_fluids_helm_release_allows(name):
    made = dataload_name(workload(name=name))
    assert len(made) <= MAX_DATALOAD_NAME == 46
    assert len(made + "-loader") <= 53  # Helm's release name limit
    assert DNS_SUBDOMAIN.match(made), made
    assert made != dataload_name(workload(name=name + "q"))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param({"metadata__uid": ""}, "uid", id="a-workload-without-a-uid-cannot-own-it"),
    ],
)
def test_dataload_for_refuses_what_the_api_server_would(change, match):
    with pytest.raises(ValueError, match=match):
        dataload_for(with_changes(workload(), **change), bound())


def test_dataload_for_refuses_a_dataset_of_another_namespace():
    with pytest.raises(ValueError, match="team-b"):
        dataload_for(workload(), with_changes(bound(), metadata__namespace="team-b"))


# --- the cache-node label -----------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "name", "expected"),
    [
        pytest.param("team-a", "corpus", "fluid.io/s-team-a-corpus", id="a-short-name"),
        pytest.param(
            "ns", "d" * 48, "fluid.io/s-ns-" + "d" * 48, id="a-key-of-62-characters-is-kept"
        ),
        pytest.param(
            "ns",
            "d" * 49,
            "fluid.io/s-6f1c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f",
            id="a-key-of-63-characters-falls-back-to-the-uid-as-fluid-does",
        ),
    ],
)
def test_cache_node_label_follows_fluids_63_character_rule(namespace, name, expected):
    dataset = with_changes(bound(), metadata__name=name, metadata__namespace=namespace)
    assert cache_node_label(namespace, dataset) == expected


def test_a_long_label_without_a_uid_is_an_error_naming_the_dataset():
    dataset = with_changes(bound(), metadata__name="d" * 60, metadata__uid="")
    with pytest.raises(ValueError, match=r"d{60}"):
        cache_node_label("team-a", dataset)


# --- the objects against the real CRDs ----------------------------------------------


def crd_schema(kind: str) -> dict[str, Any]:
    crd = yaml.safe_load(shared("crds", "fluid", f"data.fluid.io_{kind}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """What the API server's structural-schema validation would refuse (a subset)."""
    if schema.get("x-kubernetes-int-or-string") and (
        isinstance(value, bool) or not isinstance(value, int | str)
    ):
        return [f"{path}: not int-or-string"]
    kind = schema.get("type")
    if kind and (
        not isinstance(value, TYPES[kind]) or (kind != "boolean" and isinstance(value, bool))
    ):
        return [f"{path}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in {schema['enum']}"]
    if isinstance(value, str) and (
        len(value) < schema.get("minLength", 0)
        or len(value) > schema.get("maxLength", len(value))
        or ("pattern" in schema and not re.search(schema["pattern"], value))
    ):
        return [f"{path}: {value!r} breaks its length or pattern"]
    errors = []
    if isinstance(value, dict) and path != ".metadata":
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in props:
                errors += schema_errors(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += schema_errors(item, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
    if isinstance(value, list):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
    return errors


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        pytest.param(dataload_for(workload(), bound()), "dataloads", id="the-dataload-we-create"),
        pytest.param(EXECUTING, "dataloads", id="golden-dataload-executing"),
        pytest.param(COMPLETE, "dataloads", id="golden-dataload-complete"),
        pytest.param(FAILED, "dataloads", id="golden-dataload-failed"),
        pytest.param(golden("dataset-bound.yaml"), "datasets", id="golden-dataset-bound"),
        pytest.param(golden("dataset-notbound.yaml"), "datasets", id="golden-dataset-notbound"),
    ],
)
def test_the_objects_validate_against_fluids_crd_schema(obj, kind):
    assert schema_errors(obj, crd_schema(kind)) == []


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"spec": {"dataset": {"name": "x"}, "policy": "Sometimes"}}, id="an-enum"),
        pytest.param({"spec": {"dataset": {"namespace": "x"}}}, id="a-required-field"),
        pytest.param({"spec": {"dataset": {"name": "x"}, "targets": []}}, id="an-unknown-field"),
        pytest.param({"spec": {"dataset": {"name": "x"}, "loadMetadata": "yes"}}, id="a-type"),
        pytest.param(
            {"spec": {"dataset": {"name": "x"}, "resources": {"limits": {"cpu": "lots"}}}},
            id="a-pattern",
        ),
    ],
)
def test_the_schema_check_can_fail(bad):
    assert schema_errors({"apiVersion": "v", "kind": "DataLoad", **bad}, crd_schema("dataloads"))
