"""Reading a Kueue Workload and the minimal server-side-apply body for our check entry."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from admission.workload import (
    MESSAGE_LIMIT,
    actionable,
    apply_body,
    check_entries,
    created_at,
    event_for,
    priority,
    write_guard,
)
from foundation.timestamps import format_time, parse_time

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
T0 = "2025-12-31T23:50:00Z"  # ten minutes earlier
T0_SECONDS = NOW - 600


@dataclass(frozen=True)
class Decision:
    """The fields of ``admission.decide.Decision`` that a status write reads."""

    namespace: str
    workload: str
    check: str
    state: str
    message: str
    requeue_after_seconds: int | None = None
    pod_set_updates: tuple[dict[str, Any], ...] = ()
    create: tuple[dict[str, Any], ...] = ()


def entry(name="capacity", state="Pending", message="", since=T0, **more):
    return {"name": name, "state": state, "lastTransitionTime": since, "message": message, **more}


def cond(kind, status="True", reason="Reason"):
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": T0,
    }


def make_workload(checks=None, conditions=None, **spec):
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-train-1a2b3",
            "namespace": "team-a",
            "uid": "6a1f-uid",
            "resourceVersion": "4711",
            "creationTimestamp": "2025-12-31T23:00:00Z",
            "labels": {"kueue.x-k8s.io/job-uid": "x"},
            "annotations": {"unitscale.io/dataset": "imagenet"},
        },
        "spec": {"queueName": "team", "podSets": [{"name": "main", "count": 2}], **spec},
        "status": {
            "conditions": [cond("QuotaReserved")] if conditions is None else conditions,
            "admissionChecks": [entry()] if checks is None else checks,
        },
    }


def decision(state="Ready", message="fits", **more):
    return Decision("team-a", "job-train-1a2b3", "capacity", state, message, **more)


# --- reading ---------------------------------------------------------------------------


def test_check_entries_are_found_by_name():
    workload = make_workload(checks=[entry("other", "Ready"), entry("capacity")])
    assert set(check_entries(workload)) == {"other", "capacity"}
    assert check_entries(workload)["other"]["state"] == "Ready"


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        pytest.param(make_workload(priority=100), 100, id="the-spec-priority"),
        pytest.param(make_workload(), 0, id="no-priority-is-zero"),
        pytest.param(make_workload(priority=-5), -5, id="a-negative-priority-is-kept"),
    ],
)
def test_priority(workload, expected):
    assert priority(workload) == expected


def test_creation_time_is_unix_seconds():
    assert created_at(make_workload()) == NOW - 3600


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("2026-01-01T00:00:00Z", NOW, id="rfc3339-utc"),
        pytest.param("2026-01-01T00:00:00.250000Z", NOW + 0.25, id="with-microseconds"),
        pytest.param("2026-01-01T01:00:00+01:00", NOW, id="with-an-offset"),
        pytest.param("yesterday", None, id="not-a-time"),
        pytest.param(None, None, id="absent"),
        pytest.param(17, None, id="a-number-is-not-a-time"),
        pytest.param(
            "9999-12-31T23:59:59-23:59", None, id="a-time-past-year-9999-in-utc-is-not-a-time"
        ),
        pytest.param(
            "0001-01-01T00:00:00+23:59", None, id="a-time-before-year-1-in-utc-is-not-a-time"
        ),
        pytest.param("9999-12-31T23:59:59Z", 253_402_300_799.0, id="the-last-second-of-9999-is"),
    ],
)
def test_parse_time(text, seconds):
    assert parse_time(text) == seconds
    if seconds is not None:
        assert parse_time(format_time(seconds)) == int(seconds)  # each time read can be written


def test_format_time_is_what_kubernetes_writes():
    assert format_time(NOW + 0.9) == "2026-01-01T00:00:00Z"
    assert parse_time(format_time(NOW)) == NOW


# --- the guard and what is actionable --------------------------------------------------


@pytest.mark.parametrize(
    ("workload", "reason"),
    [
        pytest.param(make_workload(), None, id="quota-reserved-and-nothing-else-may-be-written"),
        pytest.param(
            make_workload(conditions=[]), "no-quota-reserved", id="without-quota-nothing-is-written"
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved", "False")]),
            "no-quota-reserved",
            id="quota-reserved-false-is-no-reservation",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved"), cond("Evicted")]),
            "evicted",
            id="an-evicted-workload-gets-no-write-kueue-3543",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved"), cond("Evicted", "False")]),
            None,
            id="evicted-false-is-not-evicted",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved"), cond("Finished")]),
            "finished",
            id="a-finished-workload-gets-no-write",
        ),
        pytest.param(
            make_workload(active=False), "deactivated", id="a-deactivated-workload-gets-no-write"
        ),
        pytest.param(make_workload(active=True), None, id="spec-active-true-is-active"),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved"), cond("DeactivationTarget")]),
            "deactivation-target",
            id="a-workload-about-to-be-deactivated-gets-no-write",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved"), cond("Admitted")]),
            "admitted",
            id="an-admitted-workload-is-not-re-evaluated",
        ),
    ],
)
def test_write_guard(workload, reason):
    assert write_guard(workload) == reason


@pytest.mark.parametrize(
    ("workload", "ours", "expected"),
    [
        pytest.param(
            make_workload(), {"capacity"}, [("capacity", T0_SECONDS)], id="our-pending-check"
        ),
        pytest.param(make_workload(), {"else"}, [], id="a-check-of-another-controller"),
        pytest.param(
            make_workload(checks=[entry(state="Ready")]), {"capacity"}, [], id="already-ready"
        ),
        pytest.param(
            make_workload(checks=[entry(state="Retry")]),
            {"capacity"},
            [],
            id="a-retry-waits-for-kueue-to-reset-it",
        ),
        pytest.param(
            make_workload(checks=[entry(state="Rejected")]), {"capacity"}, [], id="rejected-stays"
        ),
        pytest.param(
            make_workload(checks=[entry("b"), entry("a", since="2025-12-31T23:55:00Z")]),
            {"a", "b"},
            [("a", NOW - 300), ("b", T0_SECONDS)],
            id="two-of-our-checks-sorted-by-name",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved"), cond("Evicted")]),
            {"capacity"},
            [],
            id="the-retry-after-evicted-race-pending-but-evicted-is-not-actionable",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved", "False")]),
            {"capacity"},
            [],
            id="pending-without-quota-waits-for-the-scheduler",
        ),
        pytest.param(
            make_workload(checks=[entry(since="garbage")]),
            {"capacity"},
            [("capacity", NOW - 3600)],
            id="an-unreadable-transition-time-falls-back-to-creation",
        ),
        pytest.param(
            {"metadata": {"name": "w", "namespace": "n"}},
            {"capacity"},
            [],
            id="a-workload-without-status",
        ),
    ],
)
def test_actionable(workload, ours, expected):
    assert actionable(workload, ours) == expected


# --- the apply body --------------------------------------------------------------------

HINTS = ({"name": "main", "annotations": {"hami.io/gpu-scheduler-policy": "binpack"}},)


def body_entry(body):
    (written,) = body["status"]["admissionChecks"]
    return written


def test_a_ready_body_is_minimal_and_carries_every_required_field():
    workload = make_workload()
    body = apply_body(workload, decision(pod_set_updates=HINTS), entry(), NOW)
    assert body == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-train-1a2b3",
            "namespace": "team-a",
            # Preconditions, as Kueue's strict apply: a write against what we judged only.
            "uid": "6a1f-uid",
            "resourceVersion": "4711",
        },
        "status": {
            "admissionChecks": [
                {
                    "name": "capacity",
                    "state": "Ready",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "message": "fits",
                    "podSetUpdates": [dict(HINTS[0])],
                }
            ]
        },
    }


@pytest.mark.parametrize(
    ("previous", "made", "expected"),
    [
        pytest.param(
            entry(),
            decision("Retry", "no room", requeue_after_seconds=60),
            {
                "name": "capacity",
                "state": "Retry",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "message": "no room",
                "requeueAfterSeconds": 60,
            },
            id="a-retry-carries-requeue-after-seconds",
        ),
        pytest.param(
            entry(),
            decision("Rejected", "needs 16 GPUs, the pool has 8"),
            {
                "name": "capacity",
                "state": "Rejected",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "message": "needs 16 GPUs, the pool has 8",
            },
            id="a-rejection-carries-its-message",
        ),
        pytest.param(
            entry(message="waiting for the cache (10%)"),
            decision("Pending", "waiting for the cache (40%)"),
            {
                "name": "capacity",
                "state": "Pending",
                "lastTransitionTime": T0,
                "message": "waiting for the cache (40%)",
            },
            id="pending-with-a-new-message-keeps-the-transition-time",
        ),
        pytest.param(
            entry(message="Reset to Pending after eviction. Previously: Retry"),
            decision("Ready", "fits"),
            {
                "name": "capacity",
                "state": "Ready",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "message": "fits",
            },
            id="ready-after-a-reset-gets-a-new-transition-time",
        ),
    ],
)
def test_apply_body_entry(previous, made, expected):
    workload = make_workload(checks=[previous])
    assert body_entry(apply_body(workload, made, previous, NOW)) == expected


@pytest.mark.parametrize(
    ("workload", "previous", "made"),
    [
        pytest.param(
            make_workload(checks=[entry(message="waiting")]),
            entry(message="waiting"),
            decision("Pending", "waiting"),
            id="the-same-pending-message-is-no-write",
        ),
        pytest.param(
            make_workload(checks=[entry(message="waiting", requeueAfterSeconds=60)]),
            entry(message="waiting", requeueAfterSeconds=60),
            decision("Pending", "waiting"),
            id="a-requeue-kueue-kept-across-a-reset-is-no-reason-to-write",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved"), cond("Evicted")]),
            entry(),
            decision("Retry", "no room", requeue_after_seconds=60),
            id="no-retry-is-written-to-an-evicted-workload-kueue-3543",
        ),
        pytest.param(
            make_workload(conditions=[cond("QuotaReserved", "False")]),
            entry(),
            decision("Ready"),
            id="no-ready-without-quota",
        ),
        pytest.param(
            make_workload(active=False),
            entry(),
            decision("Rejected", "never fits"),
            id="nothing-is-written-to-a-deactivated-workload",
        ),
        pytest.param(
            make_workload(checks=[entry(state="Ready", message="fits")]),
            entry(state="Ready", message="fits"),
            decision("Ready", "fits"),
            id="a-ready-check-is-never-rewritten",
        ),
        pytest.param(
            make_workload(checks=[entry(state="Retry")]),
            entry(state="Retry"),
            decision("Ready", "fits now"),
            id="a-retry-is-not-overwritten-before-kueue-resets-it",
        ),
        pytest.param(
            make_workload(checks=[entry("other")]),
            None,
            decision("Ready"),
            id="a-check-the-workload-does-not-list-is-not-added",
        ),
    ],
)
def test_apply_body_writes_nothing(workload, previous, made):
    assert apply_body(workload, made, previous, NOW) is None


def test_the_same_pending_with_a_changed_requeue_is_a_write():
    previous = entry(message="waiting", requeueAfterSeconds=60)
    made = decision("Pending", "waiting", requeue_after_seconds=30)
    written = body_entry(apply_body(make_workload(checks=[previous]), made, previous, NOW))
    assert written["requeueAfterSeconds"] == 30


def test_a_huge_message_is_cut_to_kueues_limit():
    made = decision("Rejected", "x" * 100_000)
    written = body_entry(apply_body(make_workload(), made, entry(), NOW))
    assert len(written["message"]) <= MESSAGE_LIMIT
    assert written["message"].endswith("…")


def test_apply_body_does_not_share_the_decisions_hint_objects():
    hints: tuple[dict[str, Any], ...] = ({"name": "main", "nodeSelector": {"a": "b"}},)
    body = apply_body(make_workload(), decision(pod_set_updates=hints), entry(), NOW)
    body_entry(body)["podSetUpdates"][0]["nodeSelector"]["a"] = "changed"
    assert hints[0]["nodeSelector"]["a"] == "b"


def test_apply_body_leaves_the_workload_alone():
    workload = make_workload()
    before = copy.deepcopy(workload)
    apply_body(workload, decision(), entry(), NOW)
    assert workload == before


# --- the event telling of a state we wrote -----------------------------------------------


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        pytest.param("Rejected", "Warning", id="a-rejection-is-a-warning"),
        pytest.param("Retry", "Warning", id="a-retry-is-a-warning"),
        pytest.param("Ready", "Normal", id="ready-is-normal"),
    ],
)
def test_an_event_names_the_workload_the_check_and_the_reason(state, kind):
    event = event_for(
        make_workload(), decision(state, "needs 16 GPUs"), "unitscale.io/capacity", NOW
    )
    assert event["metadata"] == {
        "name": f"job-train-1a2b3.{int(NOW * 1e9):x}",
        "namespace": "team-a",
    }
    assert event["involvedObject"] == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "name": "job-train-1a2b3",
        "namespace": "team-a",
        "uid": "6a1f-uid",
        "resourceVersion": "4711",
    }
    assert event["type"] == kind
    assert event["reason"] == "AdmissionCheckUpdated"
    assert event["message"] == f"capacity: {state}: needs 16 GPUs"
    assert event["source"] == {"component": "unitscale.io/capacity"}
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-01-01T00:00:00Z"


def test_an_events_message_is_bounded():
    event = event_for(make_workload(), decision("Rejected", "x" * 100_000), "c", NOW)
    assert len(event["message"]) <= 1024
