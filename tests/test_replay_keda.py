"""KEDA's and the HPA's arithmetic, table by table."""

from __future__ import annotations

import pytest

from replay.keda import Answer, LoopState, ScalingSpec, hpa_sync, keda_poll

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
        pytest.param(3, False, 0.0, 300.0, 0, id="inactive-for-the-cooldown-scales-to-zero"),
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
