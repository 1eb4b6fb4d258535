"""The decision with a replica profile: demand, backlog drain.

Rows use the Azure conversation mix (1,155 prompt and 211 output tokens a request), at
which one llama3-8b-h200 replica sustains about 22.3 requests/s within 2 s TTFT p95 and
100 ms ITL p95 (docs/capacity.md); the plan is all of that (the attainment loop,
tests/test_attainment.py, adds the headroom the SLO needs).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.capacity import replica_capacity
from foundation.replica_model import LLAMA3_8B_H200
from scaler.core import DecisionState, Observation, Policy, decide
from scaler.core.window import Recent

NOW = 1_800_000_000.0
PROMPT, OUTPUT = 1155.0, 211.0
POLICY = Policy(profile="llama3-8b-h200")
RPS = replica_capacity(
    LLAMA3_8B_H200.for_itl_slo(0.1), PROMPT, OUTPUT, 2.0, 0.1
).requests_per_second


def served(replicas: float, **values):
    """An observation whose engines served ``replicas`` replicas' worth of the mix."""
    rate = replicas * RPS
    values.setdefault("requests_running", 50.0)
    values.setdefault("queue_depth", 0.0)
    return Observation(
        now=NOW,
        signal_time=NOW,
        request_rate=rate,
        prompt_token_rate=rate * PROMPT,
        generation_token_rate=rate * OUTPUT,
        prompt_token_rate_panic=rate * PROMPT,
        generation_token_rate_panic=rate * OUTPUT,
        **values,
    )


def demand(*levels: tuple[float, float]) -> Recent[float]:
    """Demand samples (seconds before NOW, replicas)."""
    return Recent(tuple((NOW - ago, level) for ago, level in levels))


STEADY = demand(*((ago, 2.0) for ago in range(900, 0, -30)))
BURSTY = demand(*((ago, 6.0 if ago == 570 else 2.0) for ago in range(900, 0, -30)))


CASES = [
    pytest.param(
        served(3, replicas_known=3, gateway_arrival_rate=5 * RPS),
        DecisionState(),
        5,
        id="five-replicas-of-arrivals-planned-full-need-five",
    ),
    pytest.param(
        served(8, replicas_known=8, gateway_arrival_rate=2 * RPS),
        DecisionState(desired=8, demand_history=STEADY),
        2,
        id="a-backlog-drained-fast-is-not-load-the-arrivals-are",
    ),
    pytest.param(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS),
        DecisionState(desired=3, demand_history=STEADY),
        2,
        id="smooth-demand-of-two-needs-two-no-headroom",
    ),
    pytest.param(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS),
        DecisionState(desired=3, demand_history=BURSTY),
        2,
        id="a-rise-of-four-lately-buys-no-standing-headroom-by-default",
    ),
    pytest.param(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS, queue_depth=300.0),
        DecisionState(desired=3, demand_history=STEADY, mix=(PROMPT, OUTPUT)),
        2,
        id="a-backlog-the-spare-replica-drains-in-time-asks-for-nothing",
    ),
    pytest.param(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS, queue_depth=1000.0),
        DecisionState(desired=3, demand_history=STEADY, mix=(PROMPT, OUTPUT)),
        2,
        id="a-backlog-the-spare-replica-drains-before-a-cold-start-asks-for-nothing",
    ),
    pytest.param(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS, queue_depth=2400.0),
        DecisionState(desired=3, demand_history=STEADY, mix=(PROMPT, OUTPUT)),
        4,
        id="a-backlog-that-outlasts-a-cold-start-asks-for-one-more",
    ),
    pytest.param(
        served(2, replicas_known=3),
        DecisionState(desired=3),
        2,
        id="without-a-gateway-served-throughput-is-the-load",
    ),
    pytest.param(
        Observation(
            now=NOW,
            signal_time=NOW,
            replicas_known=1,
            replicas_up=1,
            queue_depth=40.0,
            requests_running=44.0,
            prompt_token_rate=3 * POLICY.prefill_tokens_per_second,
            generation_token_rate=0.0,
            prompt_token_rate_panic=9 * POLICY.prefill_tokens_per_second,
            generation_token_rate_panic=0.0,
            gateway_arrival_rate=0.2 * RPS,
            gateway_buffered=0,
        ),
        DecisionState(desired=1),
        1,
        id="the-first-replica-up-drains-what-waited-for-it-before-any-mix-the-count-holds",
    ),
]


@pytest.mark.parametrize(("observation", "previous", "replicas"), CASES)
def test_decide_with_a_profile(observation, previous, replicas):
    decision = decide(observation, POLICY, previous)
    assert decision.desired_replicas == replicas, decision.reason


def test_the_mix_is_remembered_when_a_window_has_no_finished_request():
    first = decide(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS), POLICY, DecisionState()
    )
    assert first.state.mix == pytest.approx((PROMPT, OUTPUT))
    quiet = Observation(
        now=NOW + 15,
        signal_time=NOW + 15,
        queue_depth=0.0,
        requests_running=40.0,
        request_rate=0.0,
        prompt_token_rate=0.0,
        generation_token_rate=0.0,
        gateway_arrival_rate=2 * RPS,
    )
    later = decide(quiet, POLICY, first.state)
    assert later.state.mix == first.state.mix
    assert later.desired_replicas == 2  # the remembered mix plans the arrivals


def test_a_draining_backlog_s_mix_is_read_as_the_traffic_s():
    """The last known mix does not stand in: a backlog that outgrows the replicas would
    keep a stale one (or none at the first, and no demand) for as long as it lasts."""
    first = decide(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS), POLICY, DecisionState()
    )
    draining = served(
        2, replicas_known=3, gateway_arrival_rate=2 * RPS, queue_depth=40.0,
        mean_prompt_tokens=2 * PROMPT, mean_output_tokens=OUTPUT,
    )  # fmt: skip
    later = decide(draining, POLICY, first.state)
    assert later.state.mix == (2 * PROMPT, OUTPUT)
    assert later.desired_replicas > first.desired_replicas  # longer prompts: fewer req/s each
    at_start = decide(draining, POLICY, DecisionState(desired=3))
    assert at_start.state.mix == (2 * PROMPT, OUTPUT) and "load unknown" not in at_start.reason


def test_the_demand_history_is_kept_for_the_demand_window_only():
    old = demand((POLICY.demand_window_seconds + 60, 9.0), (30, 2.0))
    decision = decide(
        served(2, replicas_known=3, gateway_arrival_rate=2 * RPS),
        POLICY,
        DecisionState(desired=3, demand_history=old),
    )
    assert min(t for t, _ in decision.state.demand_history) >= NOW - POLICY.demand_window_seconds


profiles = st.builds(
    Policy,
    profile=st.sampled_from(["llama3-8b-h200", "qwen2.5-32b-h200"]),
    max_replicas=st.integers(3, 200),
    profile_utilization=st.floats(0.3, 1.0),
)
histories = st.lists(st.floats(0, 50), max_size=40).map(
    lambda levels: demand(*((30 * (len(levels) - i), v) for i, v in enumerate(levels)))
)


@settings(max_examples=200, deadline=None)
@given(profiles, histories, st.floats(0, 50), st.floats(0, 50), st.integers(1, 100))
def test_more_arrivals_never_ask_for_fewer_replicas(policy, history, low, extra, desired):
    previous = DecisionState(desired=desired, demand_history=history)
    a = decide(served(2, replicas_known=desired, gateway_arrival_rate=low * RPS), policy, previous)
    b = decide(
        served(2, replicas_known=desired, gateway_arrival_rate=(low + extra) * RPS),
        policy,
        previous,
    )
    assert b.desired_replicas >= a.desired_replicas


@settings(max_examples=200, deadline=None)
@given(profiles, st.integers(1, 100), st.floats(0, 50))
def test_missing_engine_signals_never_lower_the_count(policy, desired, arrivals):
    previous = DecisionState(desired=desired, last_activity=NOW - 10_000)
    observation = Observation(now=NOW, signal_time=NOW, gateway_arrival_rate=arrivals)
    decision = decide(observation, policy, previous)
    assert decision.desired_replicas >= min(desired, policy.max_replicas)
    assert not math.isnan(decision.inputs["need"])


@settings(max_examples=200, deadline=None)
@given(profiles, histories, st.floats(0, 500), st.floats(0, 2_000))
def test_bounds_hold(policy, history, arrivals, queued):
    policy = replace(policy, min_replicas=1)
    decision = decide(
        served(2, replicas_known=3, gateway_arrival_rate=arrivals, queue_depth=queued),
        policy,
        DecisionState(desired=3, demand_history=history),
    )
    assert policy.min_replicas <= decision.desired_replicas <= policy.max_replicas
