"""``replay.sweep``: each policy's knob over a few points, and its cost at an SLO target."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from foundation.replica_model import LLAMA3_8B_H200
from replay.policies import AibrixKv, Kpa, ProductionStack
from replay.run import ReplayOptions
from replay.simulate import SimConfig
from replay.sweep import (
    Point,
    cost_at_slo,
    frontier,
    run_sweep,
    sweep_knobs,
    unitscale_utilization,
)
from replay.trace import Trace
from scaler.core.model import Policy as CorePolicy

CONFIG = SimConfig(LLAMA3_8B_H200, max_replicas=8, tail=300.0)
OPTIONS = ReplayOptions("test", 1.0, 1.0, 0)


def point(cost: float, slo: float, knob: float = 0.0, default: bool = False) -> Point:
    return Point("kpa", {"target": knob}, cost, cost * 10, slo, default)


@pytest.mark.parametrize(
    ("points", "reached", "chosen"),
    [
        pytest.param(
            [point(3.0, 0.999, 1), point(2.0, 0.995, 2), point(1.0, 0.90, 3, default=True)],
            True,
            2,
            id="the-cheapest-point-reaching-the-target-not-the-cheapest-point",
        ),
        pytest.param(
            [point(2.0, 0.99, 1), point(2.5, 0.999, 2)],
            True,
            1,
            id="exactly-the-target-counts-as-reached",
        ),
        pytest.param(
            [point(2.0, 0.991, 1), point(2.0, 0.997, 2)],
            True,
            2,
            id="of-two-equally-cheap-points-the-better-slo",
        ),
        pytest.param(
            [point(1.0, 0.95, 1), point(3.0, 0.98, 2), point(2.0, 0.98, 3)],
            False,
            3,
            id="none-reaching-reports-the-best-slo-and-of-equals-the-cheaper",
        ),
        pytest.param(
            [point(1.0, math.nan, 1), point(2.0, 0.5, 2)],
            False,
            2,
            id="a-point-with-no-slo-reaches-nothing",
        ),
    ],
)
def test_cost_at_slo_picks_the_cheapest_point_reaching_the_target(points, reached, chosen):
    found = cost_at_slo(points, 0.99)
    assert found.reached is reached
    assert found.point.knobs == {"target": chosen}
    assert found.policy == "kpa" and found.target == 0.99


def test_cost_at_slo_describes_a_reached_and_an_unreached_target():
    reached = cost_at_slo([point(0.1234, 0.995, 16)], 0.99)
    missed = cost_at_slo([point(0.1234, 0.9612, 8)], 0.99)
    assert reached.describe() == "0.1234 (target=16)"
    assert missed.describe() == "not reached (best SLO 0.9612 at target=8)"
    assert point(1.0, 1.0, default=True).label == "default"


def test_the_frontier_keeps_the_points_no_other_point_beats_on_both_cost_and_slo():
    cheap, mid, dominated, dear = (
        point(1.0, 0.90, 1),
        point(2.0, 0.99, 2),
        point(2.5, 0.95, 3),
        point(4.0, 0.999, 4),
    )
    tie = point(2.0, 0.98, 5)
    assert frontier([dear, dominated, tie, mid, cheap]) == [cheap, mid, dear]


@pytest.mark.parametrize(
    ("points", "target", "message"),
    [
        pytest.param([], 0.99, "no points", id="no-points"),
        pytest.param([point(1.0, 1.0)], 0.0, "target=0", id="a-target-of-zero"),
        pytest.param([point(1.0, 1.0)], 1.5, "target=1.5", id="a-target-above-one"),
        pytest.param(
            [point(1.0, 1.0), Point("aibrix-kv", {}, 1.0, 1.0, 1.0)],
            0.99,
            "aibrix-kv, kpa",
            id="points-of-two-policies",
        ),
    ],
)
def test_cost_at_slo_refuses_what_it_cannot_answer(points, target, message):
    with pytest.raises(ValueError, match=message):
        cost_at_slo(points, target)


@pytest.mark.parametrize(
    ("name", "static", "top", "utilization", "expected"),
    [
        pytest.param(
            "unitscale",
            10,
            16,
            ("targetUtilization", 0.7),
            [{"metadata": {"targetUtilization": v}} for v in ("0.35", "0.49", "0.84")],
            id="unitscale-sweeps-its-target-utilization-around-the-default",
        ),
        pytest.param(
            "unitscale",
            10,
            16,
            ("profileUtilization", 0.9),
            [{"metadata": {"profileUtilization": v}} for v in ("0.45", "0.63", "1")],
            id="unitscale-with-a-profile-sweeps-its-profile-utilization-up-to-one",
        ),
        pytest.param(
            "kpa",
            10,
            16,
            ("targetUtilization", 0.7),
            [
                {"target": Kpa().target / 4},
                {"target": Kpa().target / 2},
                {"target": Kpa().target * 2},
                {"scale_down_delay": 0.0},
                {"scale_down_delay": 900.0},
            ],
            id="kpa-sweeps-its-target-and-its-scale-down-delay-each-through-the-default",
        ),
        pytest.param(
            "production-stack",
            10,
            16,
            ("targetUtilization", 0.7),
            [{"threshold": ProductionStack.threshold * f} for f in (0.2, 0.4, 2.0)],
            id="production-stack-sweeps-its-waiting-threshold",
        ),
        pytest.param(
            "aibrix-kv",
            10,
            16,
            ("targetUtilization", 0.7),
            [{"target": round(AibrixKv.target * f, 4)} for f in (1 / 3, 2 / 3, 2.0)],
            id="aibrix-sweeps-its-kv-target",
        ),
        pytest.param(
            "static-peak",
            10,
            16,
            ("targetUtilization", 0.7),
            [{"replicas": n} for n in (8, 9, 13)],
            id="a-static-fleet-sweeps-sizes-around-the-smallest-meeting-the-target",
        ),
        pytest.param(
            "static-peak",
            1,
            16,
            ("targetUtilization", 0.7),
            [{"replicas": 2}],
            id="a-static-fleet-of-one-sweeps-only-upward",
        ),
        pytest.param(
            "static-peak",
            8,
            8,
            ("targetUtilization", 0.7),
            [{"replicas": n} for n in (6, 7)],
            id="a-static-fleet-at-max-replicas-sweeps-only-downward",
        ),
    ],
)
def test_each_policy_sweeps_a_few_points_around_its_default(
    name, static, top, utilization, expected
):
    knobs = sweep_knobs(name, utilization=utilization, static_replicas=static, max_replicas=top)
    assert knobs == expected
    assert 1 <= len(knobs) <= 5


@pytest.mark.parametrize(
    ("metadata", "defaults", "expected"),
    [
        pytest.param(
            {}, CorePolicy(), ("targetUtilization", 0.7), id="without-a-profile-target-utilization"
        ),
        pytest.param(
            {"profile": "llama3-8b-h200"},
            CorePolicy(),
            ("profileUtilization", CorePolicy().profile_utilization),
            id="a-profile-in-the-metadata-plans-with-the-profile-utilization",
        ),
        pytest.param(
            {},
            CorePolicy(profile="llama3-8b-h200", profile_utilization=0.8),
            ("profileUtilization", 0.8),
            id="a-profile-in-the-scaler-config-too",
        ),
        pytest.param(
            {"profile": "llama3-8b-h200", "profileUtilization": "0.75"},
            CorePolicy(),
            ("profileUtilization", 0.75),
            id="the-metadata-value-is-the-default-it-sweeps-around",
        ),
        pytest.param(
            {"targetUtilization": "0.6"},
            CorePolicy(),
            ("targetUtilization", 0.6),
            id="a-target-utilization-in-the-metadata",
        ),
    ],
)
def test_unitscale_sweeps_the_utilization_it_plans_with(metadata, defaults, expected):
    assert unitscale_utilization(metadata, defaults) == expected


def test_the_bounds_have_no_knobs_to_sweep():
    with pytest.raises(ValueError, match="oracle"):
        sweep_knobs("oracle", static_replicas=1, max_replicas=8)


def burst(seconds: float = 6.0, rate: float = 50.0) -> Trace:
    """``rate`` prompts of 2,048 tokens a second: about three replicas' prefill."""
    n = int(seconds * rate)
    return Trace("burst", np.arange(n) / rate, np.full(n, 2048), np.full(n, 32))


def test_a_sweep_of_fleet_sizes_on_a_tiny_trace_finds_the_smallest_meeting_the_target():
    points = run_sweep(
        burst(), "static-peak", [{"replicas": n} for n in (1, 2, 4, 8)], CONFIG, OPTIONS
    )
    assert [p.knobs["replicas"] for p in points] == [1, 2, 4, 8]
    assert all(
        a.cost_per_million_tokens < b.cost_per_million_tokens for a, b in itertools.pairwise(points)
    )
    assert points[0].slo_attainment < 0.99 <= points[-1].slo_attainment
    found = cost_at_slo(points, 0.99)
    meeting = [p for p in points if p.slo_attainment >= 0.99]
    assert found.reached and found.point == meeting[0]
    assert all(
        p.slo_attainment < 0.99
        for p in points
        if p.knobs["replicas"] < found.point.knobs["replicas"]
    )


def test_a_sweep_that_never_meets_the_target_reports_not_reached_with_its_best_slo():
    points = run_sweep(burst(), "static-peak", [{"replicas": 1}], CONFIG, OPTIONS)
    found = cost_at_slo(points, 0.99)
    assert not found.reached
    assert found.point.slo_attainment == points[0].slo_attainment < 0.99
    assert found.describe().startswith("not reached (best SLO ")


def test_a_sweep_runs_the_default_when_given_no_knobs():
    points = run_sweep(burst(), "kpa", [{}, {"target": 8.0}], CONFIG, OPTIONS, initial_replicas=1)
    assert [p.default for p in points] == [True, False]
    assert points[0].label == "default" and points[1].label == "target=8"
