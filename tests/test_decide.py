"""The placeholder decision: concurrency over target, clamped, never a guess."""

from __future__ import annotations

import pytest

from scaler.core import DecisionState, Observation, Policy, decide
from unitscale.errors import NoDataError

NOW = 1_800_000_000.0


def obs(**values):
    return Observation(now=NOW, signal_time=NOW, **values)


@pytest.mark.parametrize(
    ("observation", "policy", "replicas", "active"),
    [
        pytest.param(
            obs(queue_depth=8, requests_running=32),
            Policy(target_concurrency=16),
            3,
            True,
            id="forty-in-flight-at-sixteen-per-replica-needs-three",
        ),
        pytest.param(
            obs(queue_depth=0, requests_running=32),
            Policy(target_concurrency=16),
            2,
            True,
            id="exactly-full-replicas-need-no-extra",
        ),
        pytest.param(
            obs(queue_depth=0, requests_running=0),
            Policy(),
            0,
            False,
            id="no-load-and-no-arrivals-is-inactive",
        ),
        pytest.param(
            obs(queue_depth=0, requests_running=0, gateway_arrival_rate=0.2),
            Policy(),
            1,
            True,
            id="arrivals-alone-activate-one-replica",
        ),
        pytest.param(
            obs(gateway_buffered=3, gateway_in_flight=0),
            Policy(),
            1,
            True,
            id="requests-buffered-at-zero-replicas-activate",
        ),
        pytest.param(
            obs(queue_depth=1, requests_running=2, gateway_buffered=40, gateway_in_flight=3),
            Policy(target_concurrency=10),
            5,
            True,
            id="the-larger-of-engine-and-gateway-demand-counts",
        ),
        pytest.param(
            obs(queue_depth=500, requests_running=500),
            Policy(max_replicas=10),
            10,
            True,
            id="held-at-max-replicas",
        ),
        pytest.param(
            obs(queue_depth=0, requests_running=0),
            Policy(min_replicas=2),
            2,
            True,
            id="held-at-min-replicas-which-keeps-it-active",
        ),
        pytest.param(
            obs(requests_running=5),
            Policy(target_concurrency=4),
            2,
            True,
            id="a-missing-queue-uses-the-running-count-alone",
        ),
    ],
)
def test_decide(observation, policy, replicas, active):
    decision = decide(observation, policy, DecisionState())
    assert (decision.desired_replicas, decision.active) == (replicas, active)
    assert str(replicas) in decision.reason
    assert decision.state.decisions == 1


def test_reason_says_when_a_bound_holds():
    decision = decide(
        obs(queue_depth=500, requests_running=0), Policy(max_replicas=10), DecisionState()
    )
    assert decision.reason == "500 in flight / 16 per replica -> 32, held at max 10"


def test_no_concurrency_signal_is_an_error_not_zero():
    with pytest.raises(NoDataError):
        decide(obs(request_rate=3.0, kv_cache_usage=0.5), Policy(), DecisionState())
