"""The metric the scaler returns lands the HPA where decide() wants, as near as it can."""

from __future__ import annotations

import math

import pytest

from replay.keda import Answer, LoopState, ScalingSpec, hpa_sync
from scaler.core.hpa import metric_for, within_tolerance

SPEC = ScalingSpec(max_replicas=1000, scale_up_pods=1000, scale_down_stabilization=0)


def hpa(current, value):
    return hpa_sync(current, Answer(value, 1.0, True), LoopState(), 0.0, SPEC)[0]


@pytest.mark.parametrize(
    ("current", "desired", "lands"),
    [
        pytest.param(4, 8, 8, id="a-big-step-up-lands-exactly"),
        pytest.param(10, 5, 5, id="a-big-step-down-lands-exactly"),
        pytest.param(20, 21, 23, id="a-small-step-up-overshoots-by-the-least-the-hpa-allows"),
        pytest.param(10, 11, 12, id="exactly 10% up (1.1, within as the HPA compares) overshoots"),
        pytest.param(20, 22, 23, id="exactly 10% up from 20 overshoots by one"),
        pytest.param(20, 18, 18, id="exactly 10% down is within: the lowered value reaches it"),
        pytest.param(10, 9, 9, id="a-small-step-down-lands-exactly-when-reachable"),
        pytest.param(20, 19, 20, id="an-unreachable-small-step-down-stays-never-below-desired"),
        pytest.param(7, 7, 7, id="no-change"),
        pytest.param(1, 0, 1, id="zero-is-keda-business-the-hpa-keeps-one"),
    ],
)
def test_the_hpa_lands_where_decide_wants(current, desired, lands):
    assert hpa(current, metric_for(desired, current)) == lands


@pytest.mark.parametrize(
    ("usage", "target", "replicas", "within"),
    [
        pytest.param(11000, 1000, 10, True, id="11 at 10 is within: the upper bound is inclusive"),
        pytest.param(9000, 1000, 10, True, id="9 at 10 is within: the lower bound is inclusive"),
        pytest.param(11700, 1000, 13, True, id="11.7 at 13 is exactly 0.9 in milli-units"),
        pytest.param(11002, 1000, 10, False, id="11.002 at 10 is beyond"),
        pytest.param(8998, 1000, 10, False, id="8.998 at 10 is beyond"),
    ],
)
def test_the_tolerance_is_kube_controller_managers(usage, target, replicas, within):
    """``Tolerances.isWithin`` (1.33+): ``1 - down <= ratio <= 1 + up``, the ratio of
    milli-values ``float64(usage) / (float64(target) * float64(replicas))``; not the
    ``abs(1 - ratio) <= 0.1`` of earlier releases, which puts 1.1 beyond. This anchors
    the tests above, whose HPA (``replay.keda``) shares ``within_tolerance``."""
    assert within_tolerance(usage / (target * replicas)) is within


@pytest.mark.parametrize("current", range(1, 60))
@pytest.mark.parametrize("desired", range(1, 60))
def test_the_hpa_never_lands_below_desired_when_scaling_up_nor_below_it_when_down(current, desired):
    lands = hpa(current, metric_for(desired, current))
    if desired >= current:
        assert desired <= lands <= max(desired, math.ceil(current * 1.1 + 0.01))
    else:
        assert desired <= lands <= current
