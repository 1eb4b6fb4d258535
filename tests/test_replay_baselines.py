"""The baselines as their operators would run them, and every policy's knob for sweeps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from foundation.replica_model import LLAMA3_8B_H200
from replay.policies import AibrixKv, Kpa, ProductionStack, StaticPeak, Unitscale
from replay.run import ReplayOptions, make_policy
from replay.simulate import SimConfig, simulate
from replay.trace import Trace

CONFIG = SimConfig(LLAMA3_8B_H200, max_replicas=8, tail=300.0)
OPTIONS = ReplayOptions("test", 1.0, 1.0, 0, target_concurrency=16.0)


def on_off(periods, on, off, rate, prompt=2048, output=64):
    """``periods`` of ``on`` seconds at ``rate`` then ``off`` seconds of nothing."""
    arrival = np.concatenate(
        [p * (on + off) + np.arange(int(rate * on)) / rate for p in range(periods)]
    )
    n = len(arrival)
    return Trace("on-off", arrival, np.full(n, prompt), np.full(n, output))


def test_kpa_scale_down_delay_keeps_replicas_through_gaps_shorter_than_it():
    # Two minutes on, two off: Knative's default (no delay) scales to zero in every gap
    # and pays a cold start for every return; the 300 s delay holds through them.
    trace = on_off(periods=4, on=60.0, off=120.0, rate=10.0)
    delayed = simulate(trace, make_policy("kpa", CONFIG, OPTIONS), CONFIG, initial_replicas=1)
    eager = simulate(
        trace, make_policy("kpa", CONFIG, OPTIONS, scale_down_delay=0.0), CONFIG, initial_replicas=1
    )
    assert eager.metrics["cold_starts"] >= 3
    assert delayed.metrics["cold_starts"] == 0
    assert delayed.metrics["slo_attainment"] > eager.metrics["slo_attainment"]


def test_kpa_min_scale_keeps_a_floor():
    trace = on_off(periods=2, on=30.0, off=400.0, rate=4.0)
    policy = make_policy("kpa", CONFIG, OPTIONS, min_scale=2)
    result = simulate(trace, policy, CONFIG, initial_replicas=0)
    assert min(result.series["replicas"]) >= 2


def test_kpa_has_a_target_concurrency_of_its_own():
    loose = make_policy("kpa", CONFIG, dataclasses.replace(OPTIONS, target_concurrency=8.0))
    tight = make_policy("kpa", CONFIG, dataclasses.replace(OPTIONS, target_concurrency=64.0))
    assert isinstance(loose, Kpa) and isinstance(tight, Kpa)
    assert loose.target == tight.target == Kpa().target
    # Knative's target-utilization-percentage (70%) applies on top of the target.
    assert loose.target_concurrency == pytest.approx(Kpa().target * 0.7)


def test_aibrix_default_kv_target_is_below_what_a_saturated_replica_holds():
    # Conversation-like requests: 256 seats hold 256 x 1,200 tokens, 0.34 of the KV
    # cache. AIBrix's sample target (0.5) is never reached: the fleet stays at one
    # replica while the queue grows. The default scales out.
    trace = on_off(periods=1, on=300.0, off=0.0, rate=20.0, prompt=200, output=1000)
    held = 256 * 1200 / LLAMA3_8B_H200.kv_capacity_tokens
    assert AibrixKv().target < held
    sample = make_policy("aibrix-kv", CONFIG, OPTIONS, target=0.5)
    stuck = simulate(trace, sample, CONFIG, initial_replicas=1).metrics
    assert stuck["max_replicas"] == 1 and stuck["slo_attainment"] < 0.1
    result = simulate(trace, make_policy("aibrix-kv", CONFIG, OPTIONS), CONFIG, initial_replicas=1)
    assert result.metrics["max_replicas"] >= 3
    assert result.metrics["slo_attainment"] >= 0.8


@pytest.mark.parametrize("name", ["production-stack", "kpa", "aibrix-kv"])
def test_a_baseline_keeps_its_warm_start_through_its_first_evaluation(name):
    # Three replicas' load on three warm replicas: the HPA's stabilization window (and
    # Knative's scale-down delay) remember the earlier traffic that sized the fleet, so
    # the first evaluation, on one scrape of a just-started trace, does not drop it.
    trace = on_off(periods=1, on=150.0, off=0.0, rate=30.0)
    result = simulate(trace, make_policy(name, CONFIG, OPTIONS), CONFIG, initial_replicas=3)
    early = [n for t, n, _ in result.decisions if t < 60.0]
    assert min(early) >= 3, result.decisions[:4]


@pytest.mark.parametrize(
    ("name", "knobs", "check"),
    [
        pytest.param(
            "static-peak",
            {"replicas": 3},
            lambda p: isinstance(p, StaticPeak) and p.replicas == 3,
            id="static-peak-is-sized-by-replicas",
        ),
        pytest.param(
            "production-stack",
            {"threshold": 2.0},
            lambda p: isinstance(p, ProductionStack) and p.threshold == 2.0,
            id="production-stack-by-its-queue-threshold",
        ),
        pytest.param(
            "kpa",
            {"target": 12.0, "scale_down_delay": 60.0},
            lambda p: isinstance(p, Kpa) and (p.target, p.scale_down_delay) == (12.0, 60.0),
            id="kpa-by-its-target-and-scale-down-delay",
        ),
        pytest.param(
            "aibrix-kv",
            {"target": 0.3},
            lambda p: isinstance(p, AibrixKv) and p.target == 0.3,
            id="aibrix-by-its-kv-target",
        ),
        pytest.param(
            "unitscale",
            {"metadata": {"targetConcurrency": "12"}},
            lambda p: isinstance(p, Unitscale) and p.metadata["targetConcurrency"] == "12",
            id="unitscale-by-its-trigger-metadata",
        ),
    ],
)
def test_each_policy_takes_its_knob(name, knobs, check):
    assert check(make_policy(name, CONFIG, OPTIONS, **knobs))


@pytest.mark.parametrize(
    ("name", "knobs", "message"),
    [
        pytest.param("kpa", {"window": 3.0}, "kpa has no knob 'window'", id="an-unknown-knob"),
        pytest.param(
            "static-peak", {}, "static-peak needs its size: replicas=", id="static-without-a-size"
        ),
        pytest.param("static-peak", {"replicas": 9}, "replicas=9", id="static-beyond-max-replicas"),
        pytest.param(
            "kpa", {"scale_down_delay": -1.0}, "scale_down_delay=-1", id="a-negative-delay"
        ),
        pytest.param("aibrix-kv", {"target": 0.0}, "target=0", id="a-zero-target"),
        pytest.param(
            "production-stack", {"threshold": float("nan")}, "threshold=nan", id="a-nan-threshold"
        ),
        pytest.param("hpa-cpu", {}, "unknown policy 'hpa-cpu'", id="an-unknown-policy"),
    ],
)
def test_a_bad_knob_is_refused_by_name(name, knobs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("?", r"\?")):
        make_policy(name, CONFIG, OPTIONS, **knobs)
