"""KEDA's and the HPA's arithmetic, table by table."""

from __future__ import annotations

import pytest

from replay.keda import (
    Answer,
    LoopState,
    ScalingSpec,
    hpa_sync,
    keda_poll,
    milli,
    read_scaled_object,
)
from tests.k8s.keda import SCALED_OBJECTS, deploy_manifest

SPEC = ScalingSpec(min_replicas=0, max_replicas=20)


@pytest.mark.parametrize(
    ("replicas", "value", "expected"),
    [
        pytest.param(10, 10.9, 10, id="within-the-10-percent-tolerance-nothing-changes"),
        pytest.param(10, 11.5, 12, id="beyond-the-tolerance-ceil-of-value-over-target"),
        pytest.param(2, 9.0, 6, id="scale-up-is-capped-at-plus-4-or-double"),
        pytest.param(10, 40.0, 20, id="capped-at-max-replicas"),
        pytest.param(0, 5.0, 0, id="the-hpa-does-nothing-at-zero-keda-owns-0-to-1"),
        pytest.param(3, -4.0, 1, id="negative-values-are-clamped-to-zero-then-min-1"),
    ],
)
def test_hpa_average_value(replicas, value, expected):
    desired, _ = hpa_sync(replicas, Answer(value, 1.0, True), LoopState(), 100.0, SPEC)
    assert desired == expected


def test_hpa_scale_down_waits_for_the_stabilization_window():
    state = LoopState()
    replicas, state = hpa_sync(8, Answer(8.0, 1.0, True), state, 0.0, SPEC)
    replicas, state = hpa_sync(replicas, Answer(2.0, 1.0, True), state, 15.0, SPEC)
    assert replicas == 8  # the 8 recommended at t=0 is still in the 300 s window
    replicas, state = hpa_sync(replicas, Answer(2.0, 1.0, True), state, 301.0, SPEC)
    assert replicas == 2


def test_an_unavailable_metric_keeps_the_replicas():
    assert hpa_sync(5, Answer(None, 1.0, None), LoopState(), 0.0, SPEC)[0] == 5


@pytest.mark.parametrize(
    ("replicas", "active", "last_active", "now", "expected"),
    [
        pytest.param(0, True, -1e9, 0.0, 1, id="activity-at-zero-scales-to-one"),
        pytest.param(3, False, 0.0, 299.0, 3, id="inactive-within-the-cooldown-keeps-replicas"),
        pytest.param(
            3, False, 0.0, 300.0, 3, id="inactive-for-exactly-the-cooldown-keeps-replicas"
        ),
        pytest.param(3, False, 0.0, 300.5, 0, id="inactive-past-the-cooldown-scales-to-zero"),
        pytest.param(3, None, -1e9, 1000.0, 3, id="a-scaler-error-never-scales-to-zero"),
    ],
)
def test_keda_activation_and_cooldown(replicas, active, last_active, now, expected):
    answer = Answer(1.0 if active else 0.0, 1.0, active)
    desired, _ = keda_poll(replicas, answer, LoopState(last_active=last_active), now, SPEC)
    assert desired == expected


def test_min_replica_count_is_kept_whatever_the_scaler_says():
    spec = ScalingSpec(min_replicas=2)
    assert keda_poll(0, Answer(0.0, 1.0, False), LoopState(), 0.0, spec)[0] == 2


@pytest.mark.parametrize(
    ("replicas", "value", "expected"),
    [
        pytest.param(2, 2.0004, 2, id="a value rounded to milli-units: 2.0004 reads as 2.000"),
        pytest.param(2, 2.0006, 3, id="2.0006 reads as 2.001: ceil is 3"),
    ],
)
def test_the_hpa_reads_the_value_in_milli_units(replicas, value, expected):
    spec = ScalingSpec(max_replicas=20, tolerance=0.0)
    assert milli(value) == round(value, 3)
    assert hpa_sync(replicas, Answer(value, 1.0, True), LoopState(), 0.0, spec)[0] == expected


@pytest.mark.parametrize(
    ("replicas", "value", "expected"),
    [
        pytest.param(13, 11.7, 13, id="11700m over 13 x 1000m is exactly 0.9: within, kept"),
        pytest.param(21, 18.9, 21, id="18900m over 21 x 1000m is exactly 0.9: within, kept"),
        pytest.param(13, 11.699, 12, id="one milli-unit below the bound: beyond, ceil is 12"),
    ],
)
def test_the_tolerance_is_checked_on_milli_units_as_the_hpa_does(replicas, value, expected):
    """The HPA divides integer milli-values (11700 / 13000 is 0.9); 11.7 / 13 is not."""
    spec = ScalingSpec(max_replicas=40, scale_down_stabilization=0.0)
    assert hpa_sync(replicas, Answer(value, 1.0, True), LoopState(), 0.0, spec)[0] == expected


FALLBACK = ScalingSpec(max_replicas=20, fallback_replicas=2, failure_threshold=3)
FAILED = Answer(None, 1.0, None, "UNAVAILABLE")


def failing_syncs(replicas, count, spec=FALLBACK, state=None):
    state = state or LoopState()
    for second in range(count):
        replicas, state = hpa_sync(replicas, FAILED, state, float(second), spec)
    return replicas, state


@pytest.mark.parametrize(
    ("failures", "expected"),
    [
        pytest.param(3, 4, id="failureThreshold failures keep the replicas"),
        pytest.param(4, 2, id="one more: the HPA is given the fallback replicas"),
        pytest.param(20, 2, id="and holds them, never zero, while the scaler fails"),
    ],
)
def test_fallback_applies_past_the_failure_threshold(failures, expected):
    spec = ScalingSpec(
        max_replicas=20, fallback_replicas=2, failure_threshold=3, scale_down_stabilization=0
    )
    assert failing_syncs(4, failures, spec)[0] == expected


def test_without_fallback_a_failing_scaler_changes_nothing():
    assert failing_syncs(4, 20, ScalingSpec(scale_down_stabilization=0))[0] == 4


def test_one_success_resets_the_failure_count():
    replicas, state = failing_syncs(4, 3)
    replicas, state = hpa_sync(replicas, Answer(4.0, 1.0, True), state, 3.0, FALLBACK)
    assert state.failures == 0
    assert failing_syncs(replicas, 3, state=state)[0] == 4


def test_keda_polls_count_too_and_the_fallback_activates_from_zero():
    state = LoopState()
    replicas = 0
    for second in range(4):
        replicas, state = keda_poll(replicas, FAILED, state, float(second), FALLBACK)
    assert replicas == 1  # KEDA counts the fallback as active: 0 -> 1, then the HPA
    replicas, state = hpa_sync(replicas, FAILED, state, 4.0, FALLBACK)
    assert replicas == 2


@pytest.mark.parametrize(
    ("behavior", "replicas", "expected"),
    [
        pytest.param("static", 6, 2, id="static: the fallback replicas"),
        pytest.param("currentReplicas", 6, 6, id="currentReplicas: hold what runs"),
        pytest.param("currentReplicasIfHigher", 1, 2, id="IfHigher: at least the fallback"),
        pytest.param("currentReplicasIfLower", 6, 2, id="IfLower: at most the fallback"),
    ],
)
def test_fallback_behaviors(behavior, replicas, expected):
    spec = ScalingSpec(
        max_replicas=20,
        fallback_replicas=2,
        failure_threshold=0,
        fallback_behavior=behavior,
        scale_down_stabilization=0,
    )
    assert hpa_sync(replicas, FAILED, LoopState(), 0.0, spec)[0] == expected


@pytest.mark.parametrize("trigger_type", sorted(SCALED_OBJECTS))
def test_the_shipped_scaled_objects_fallback_is_read(trigger_type):
    (doc,) = [
        d for d in deploy_manifest(SCALED_OBJECTS[trigger_type]) if d["kind"] == "ScaledObject"
    ]
    spec = read_scaled_object(doc).spec
    assert (spec.fallback_replicas, spec.failure_threshold) == (2, 3)


def test_a_push_activation_keeps_the_failure_count():
    state = LoopState(failures=3).activated(42.0)
    assert (state.last_active, state.failures) == (42.0, 3)
