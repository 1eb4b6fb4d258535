"""The decision core, behaviour by behaviour, plus properties over random inputs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from foundation.errors import NoDataError
from scaler.core import DecisionState, Observation, Policy, decide
from scaler.core.window import Recent

NOW = 1_800_000_000.0
POLICY = Policy()  # 16 in flight per replica, planned 70% full, 30k prefill / 6k decode tok/s


def obs(**values):
    return Observation(now=NOW, signal_time=NOW, **values)


def state(**values):
    return DecisionState(**values)


BREACH = {
    "queue_depth": 8,
    "requests_running": 8,
    "replicas_known": 4,
    "ttft_p95_seconds": 4.0,
    "inter_token_p95_seconds": 0.05,
    "prompt_token_rate": 90_000,
    "generation_token_rate": 0,
}
"""Four replicas with a queue, three replicas' worth of prompts, TTFT p95 twice the SLO."""

CASES = [
    pytest.param(
        obs(queue_depth=8, requests_running=32),
        POLICY,
        state(),
        4,
        id="forty-in-flight-at-sixteen-per-replica-planned-seventy-percent-full-needs-four",
    ),
    pytest.param(
        obs(
            queue_depth=0, requests_running=1, prompt_token_rate=30_000, generation_token_rate=3_000
        ),
        POLICY,
        state(),
        3,
        id="token-throughput-sets-the-capacity-need-one-and-a-half-replicas-at-seventy-percent",
    ),
    pytest.param(
        obs(queue_depth=0, requests_running=0, gateway_arrival_rate=0.0),
        POLICY,
        state(desired=1, last_activity=NOW - 200),
        0,
        id="idle-past-the-grace-period-scales-to-zero",
    ),
    pytest.param(
        obs(
            queue_depth=0,
            requests_running=0,
            replicas_known=3,
            replicas_up=3,
            prompt_token_rate=0,
            generation_token_rate=0,
            request_rate=0,
            engine_partial=True,
        ),
        POLICY,
        state(desired=1, last_activity=NOW - 900),
        1,
        id="quiet-with-a-replicas-throughput-estimated-is-no-idle-never-zero",
    ),
    pytest.param(
        obs(queue_depth=0, requests_running=0, gateway_arrival_rate=0.0),
        POLICY,
        state(desired=1, last_activity=NOW - 60),
        1,
        id="idle-within-the-grace-period-keeps-one-replica",
    ),
    pytest.param(
        obs(gateway_buffered=1, gateway_in_flight=0, gateway_arrival_rate=0.1),
        POLICY,
        state(desired=0, last_activity=NOW - 900),
        1,
        id="the-first-arrival-at-zero-activates-one-replica",
    ),
    pytest.param(
        obs(
            queue_depth=0,
            requests_running=8,
            replicas_known=2,
            prompt_token_rate=30_000,
            generation_token_rate=0,
            prompt_token_rate_panic=150_000,
            generation_token_rate_panic=0,
        ),
        POLICY,
        state(desired=2, last_activity=NOW),
        8,
        id="a-burst-five-times-the-stable-load-plans-the-short-window-at-once-the-hpa-paces-it",
    ),
    pytest.param(
        obs(queue_depth=0, requests_running=20, replicas_known=8),
        POLICY,
        state(desired=8, last_activity=NOW),
        2,
        id="with-no-higher-need-in-the-window-scale-down-to-the-need",
    ),
    pytest.param(
        obs(
            queue_depth=0, requests_running=20, replicas_known=8, replicas_up=8, engine_partial=True
        ),
        POLICY,
        state(desired=8, last_activity=NOW),
        8,
        id="in-flight-on-replicas-whose-throughput-is-partly-unknown-is-a-floor-never-lowering",
    ),
    pytest.param(
        obs(queue_depth=0, requests_running=20, replicas_known=8),
        POLICY,
        state(desired=8, last_activity=NOW, need_history=Recent(((NOW - 100, 8),))),
        8,
        id="a-higher-need-within-the-scale-down-window-holds-the-replicas",
    ),
    pytest.param(
        obs(**BREACH),
        POLICY,
        state(desired=4, last_activity=NOW),
        9,
        id="without-a-gateway-a-ttft-p95-twice-the-slo-with-a-queue-doubles-the-need",
    ),
    pytest.param(
        obs(**BREACH, slo_within_rate=10.0, slo_outside_rate=0.0),
        POLICY,
        state(desired=4, last_activity=NOW),
        5,
        id="with-the-gateways-judgement-the-engine-p95-does-not-stand-in",
    ),
    pytest.param(
        obs(
            queue_depth=0,
            requests_running=8,
            replicas_known=4,
            ttft_p95_seconds=4.0,
            inter_token_p95_seconds=0.05,
            prompt_token_rate=90_000,
            generation_token_rate=0,
        ),
        POLICY,
        state(desired=4, last_activity=NOW),
        5,
        id="a-ttft-breach-without-a-queue-is-not-a-capacity-problem",
    ),
    pytest.param(
        obs(queue_depth=0, requests_running=8, prompt_token_rate=120_000, generation_token_rate=0),
        POLICY,
        state(desired=6, last_activity=NOW),
        6,
        id="four-replicas-of-load-at-seventy-percent-keep-six-no-trend-is-extrapolated",
    ),
    pytest.param(
        obs(queue_depth=500, requests_running=500),
        replace(POLICY, max_replicas=10),
        state(),
        10,
        id="held-at-max-replicas",
    ),
    pytest.param(
        obs(queue_depth=0, requests_running=0),
        replace(POLICY, min_replicas=2),
        state(),
        2,
        id="held-at-min-replicas-which-keeps-it-active",
    ),
    pytest.param(
        obs(gateway_arrival_rate=1.0),
        POLICY,
        state(desired=5, last_activity=NOW),
        5,
        id="unknown-engine-load-never-lowers-the-count",
    ),
]


@pytest.mark.parametrize(("observation", "policy", "previous", "replicas"), CASES)
def test_decide(observation, policy, previous, replicas):
    decision = decide(observation, policy, previous)
    assert decision.desired_replicas == replicas, decision.reason
    assert decision.active is (replicas > 0)
    assert decision.state.decisions == previous.decisions + 1
    assert f"-> {replicas}" in decision.reason or "scale to zero" in decision.reason


def test_nothing_known_is_an_error_not_zero():
    with pytest.raises(NoDataError):
        decide(obs(kv_cache_usage=0.5), POLICY, DecisionState())


def test_capacity_is_learned_from_saturated_replicas():
    # 4 saturated replicas deliver 72k prompt tok/s: 0.6 of the 30k prior each.
    saturated = obs(
        queue_depth=40,
        requests_running=32,
        replicas_known=4,
        ttft_p95_panic_seconds=5.0,
        prompt_token_rate_panic=72_000,
        generation_token_rate_panic=0,
    )
    learned = DecisionState(desired=4, last_activity=NOW)
    for _ in range(60):
        learned = replace(decide(saturated, POLICY, learned).state, desired=4)
    assert learned.capacity_scale == pytest.approx(0.6, abs=0.01)


def healthy_delivering(prompt_rate: float) -> Observation:
    """4 healthy replicas (no queue, p95s well within) delivering ``prompt_rate``."""
    return obs(
        queue_depth=0,
        requests_running=8,
        replicas_known=4,
        replicas_up=4,
        ttft_p95_seconds=0.5,
        inter_token_p95_seconds=0.02,
        ttft_p95_panic_seconds=0.5,
        prompt_token_rate=prompt_rate,
        generation_token_rate=0,
        prompt_token_rate_panic=prompt_rate,
        generation_token_rate_panic=0,
    )


def test_one_counters_jump_moves_the_learned_capacity_two_percent_at_most():
    """A jump of 5e7 tokens read as delivered took the scale from 1 to 2 in one
    decision, and the fleet to 7 replicas where 10 carried the load (hostile pass 65)."""
    state = DecisionState(desired=4, last_activity=NOW)
    jumped = decide(healthy_delivering(5e7 / 10), POLICY, state).state
    assert 1.0 < jumped.capacity_scale <= 1.02


def test_healthy_replicas_carrying_more_than_the_priors_teach_it_step_by_step():
    # 4 replicas carry 180k prompt tokens/s: 1.5x the 30k prior each, healthy.
    state = DecisionState(desired=4, last_activity=NOW)
    for _ in range(60):
        state = replace(decide(healthy_delivering(180_000), POLICY, state).state, desired=4)
    assert state.capacity_scale == pytest.approx(1.5, abs=0.05)


def test_capacity_is_not_judged_while_the_fleet_changes_size():
    saturated = obs(
        queue_depth=40,
        requests_running=32,
        replicas_known=4,
        ttft_p95_panic_seconds=5.0,
        prompt_token_rate_panic=72_000,
        generation_token_rate_panic=0,
    )
    decision = decide(saturated, POLICY, DecisionState(desired=8, last_activity=NOW))
    assert decision.state.capacity_scale == 1.0


loads = st.floats(min_value=0, max_value=5_000, allow_nan=False)
policies = st.builds(
    Policy,
    min_replicas=st.integers(0, 3),
    max_replicas=st.integers(3, 200),
    target_concurrency=st.floats(1, 256),
    target_utilization=st.floats(0.3, 1.0),
)
previous_states = st.builds(
    DecisionState,
    desired=st.one_of(st.none(), st.integers(0, 200)),
    last_activity=st.floats(NOW - 1_000, NOW),
)


@settings(max_examples=300, deadline=None)
@given(policies, previous_states, loads, loads, st.one_of(st.none(), st.floats(0, 50)))
def test_never_below_min_or_above_max(policy, previous, running, queued, arrivals):
    decision = decide(
        obs(requests_running=running, queue_depth=queued, gateway_arrival_rate=arrivals),
        policy,
        previous,
    )
    assert policy.min_replicas <= decision.desired_replicas <= policy.max_replicas


@settings(max_examples=300, deadline=None)
@given(policies, previous_states, loads, loads)
def test_more_load_never_asks_for_fewer_replicas(policy, previous, low, extra):
    a = decide(obs(requests_running=low, queue_depth=0.0), policy, previous)
    b = decide(obs(requests_running=low + extra, queue_depth=0.0), policy, previous)
    assert b.desired_replicas >= a.desired_replicas


@settings(max_examples=300, deadline=None)
@given(policies, st.integers(1, 100), st.floats(0, 50))
def test_missing_engine_signals_never_scale_down_or_to_zero(policy, desired, arrivals):
    previous = DecisionState(desired=desired, last_activity=NOW - 10_000)
    decision = decide(obs(gateway_arrival_rate=arrivals), policy, previous)
    assert decision.desired_replicas >= min(desired, policy.max_replicas)
    assert not math.isnan(decision.inputs["need"])


QUIET = {
    "queue_depth": 0.0,
    "requests_running": 0.0,
    "replicas_known": 4,
    "replicas_up": 4,
    "request_rate": 0.0,
    "prompt_token_rate": 0.0,
    "generation_token_rate": 0.0,
    "gateway_buffered": 0,
    "gateway_in_flight": 0,
    "gateway_arrival_rate": 0.0,
}
"""Four replicas, every part of the load measured, and nothing happening."""
LONG_QUIET = state(desired=4, last_activity=NOW - 10_000)


@pytest.mark.parametrize(
    ("changes", "zero"),
    [
        pytest.param({}, True, id="every part measured and quiet past the grace scales to zero"),
        pytest.param(
            {"requests_running": None},
            False,
            id="running unmeasured beside a queue of 0 is not nothing in flight",
        ),
        pytest.param(
            {"queue_depth": None},
            False,
            id="a queue unmeasured beside 0 running is not nothing in flight",
        ),
        pytest.param(
            {"requests_running": None, "gateway_buffered": None, "gateway_in_flight": None},
            False,
            id="the prometheus path without its running family is not idle",
        ),
        pytest.param(
            {"generation_token_rate": 800.0},
            False,
            id="800 tokens a second with no request finished in the window is activity",
        ),
        pytest.param(
            {"prompt_token_rate_panic": 50.0},
            False,
            id="prompt tokens in the short window are activity",
        ),
        pytest.param(
            {"requests_running_mean": 3.0},
            False,
            id="requests running on average over the window are activity",
        ),
        pytest.param(
            {"replicas_up": 3},
            False,
            id="a replica that did not answer its scrape hides its load: no scale to zero",
        ),
        pytest.param(
            {"gateway_arrival_rate": None},
            False,
            id="a gateway that does not know its arrivals is not quiet",
        ),
        pytest.param(
            {"gateway_in_flight": None},
            False,
            id="a gateway in-flight count unmeasured is not quiet",
        ),
    ],
)
def test_quiet_is_idle_only_when_every_part_of_the_load_is_measured(changes, zero):
    observation = obs(**{**QUIET, **changes})
    decision = decide(observation, POLICY, LONG_QUIET)
    assert (decision.desired_replicas == 0) is zero, decision.reason
    later = decide(replace(observation, now=NOW + 10_000), POLICY, decision.state)
    assert (later.desired_replicas == 0) is zero, later.reason  # nor after the grace


@pytest.mark.parametrize(
    ("replicas_known", "first", "within_grace", "after_grace"),
    [
        pytest.param(
            4, 4, 4, 0, id="a restarted scaler holds four quiet replicas for the grace, then zero"
        ),
        pytest.param(
            None,
            1,
            1,
            0,
            id="a restarted scaler that sees no replica count keeps one for the grace",
        ),
        pytest.param(0, 0, 0, 0, id="a deployment at zero already stays at zero after a restart"),
    ],
)
def test_the_first_decision_after_a_restart_never_goes_to_zero(
    replicas_known, first, within_grace, after_grace
):
    quiet = {**QUIET, "replicas_known": replicas_known, "replicas_up": replicas_known}
    decision = decide(obs(**quiet), POLICY, DecisionState())
    assert decision.desired_replicas == first, decision.reason
    grace = POLICY.idle_grace_seconds
    for at, expected in ((NOW + grace / 2, within_grace), (NOW + grace + 1, after_grace)):
        decision = decide(replace(obs(**quiet), now=at), POLICY, decision.state)
        assert decision.desired_replicas == expected, decision.reason


LOAD_PARTS = ("queue_depth", "requests_running", "gateway_in_flight", "gateway_arrival_rate")
"""Parts of the load each source present reports (the gateway's buffered count stays, so
the gateway is there with a part unknown, not absent)."""


@settings(max_examples=300, deadline=None)
@given(
    policies,
    st.integers(1, 100),
    st.floats(NOW - 100_000, NOW),
    st.sets(st.sampled_from(LOAD_PARTS), max_size=4),
    st.integers(0, 3),
)
def test_no_quiet_with_an_unmeasured_part_or_a_missing_replica_reaches_zero(
    policy, desired, last_activity, unmeasured, missing_replicas
):
    """Any part of the load unknown, or replicas missing, and the count never reaches 0."""
    assume(unmeasured or missing_replicas)  # all measured: zero is allowed (the table above)
    changes: dict[str, object] = dict.fromkeys(unmeasured)
    changes["replicas_up"] = 4 - missing_replicas
    previous = DecisionState(desired=desired, last_activity=last_activity)
    decision = decide(obs(**{**QUIET, **changes}), policy, previous)
    assert decision.desired_replicas >= min(1, policy.max_replicas), decision.reason


@pytest.mark.parametrize(
    ("previous", "expected"),
    [
        pytest.param(
            state(desired=1, last_activity=NOW),
            2,
            id="32 running with the queue unknown raise 1 to 2",
        ),
        pytest.param(
            state(desired=8, last_activity=NOW),
            8,
            id="32 running with the queue unknown never lower 8: the queue may hold more",
        ),
    ],
)
def test_a_known_part_of_what_is_in_flight_only_raises_the_count(previous, expected):
    observation = obs(requests_running=32.0, replicas_known=8, replicas_up=8)
    decision = decide(observation, replace(POLICY, target_utilization=1.0), previous)
    assert decision.desired_replicas == expected, decision.reason
