"""The decision with a fitted profile, and the priors named explicitly."""

from __future__ import annotations

import dataclasses
import math

import pytest

from replay.policies import Unitscale
from replay.run import ReplayOptions, make_policy
from replay.simulate import SimConfig
from scaler.config import PolicyConfig
from scaler.core import DecisionState, Policy, decide
from scaler.core.capacity import PRIORS, check_profile, profile_of
from scaler.metadata import TriggerMetadata
from tests.test_fit import EVERY, PROFILE, T0, window

PROFILED = Policy(profile="llama3-8b-h200", max_replicas=64)


def decide_over(policy: Policy, true_scale: float, minutes: float, arrivals: float = 120.0):
    """Decisions every 15 s on a steady fleet of 8 that is ``true_scale`` x the profile."""
    state, decision = DecisionState(), None
    for i in range(int(minutes * 60 / EVERY)):
        o = window(true_scale, T0 + i * EVERY, gateway_arrival_rate=arrivals)
        decision = decide(o, policy, state)
        state = decision.state
    assert decision is not None
    return decision


def test_a_slow_fleet_is_planned_with_the_fitted_steps():
    fitted = decide_over(PROFILED, 1.5, 5)
    plain = decide_over(dataclasses.replace(PROFILED, profile_fit=False), 1.5, 5)
    assert "profile steps x1.5" in fitted.reason, fitted.reason
    assert fitted.inputs["step_scale"] == pytest.approx(1.5, rel=0.05)
    assert plain.inputs["step_scale"] == 1.0 and "profile steps" not in plain.reason
    # Slower steps: each replica carries less, so the same demand needs more of them.
    assert fitted.inputs["load"] > 1.3 * plain.inputs["load"]
    assert fitted.desired_replicas > plain.desired_replicas
    # The fit was kept with the fit off too: turning it on needs no new evidence.
    assert plain.state.step_fit.scale() == pytest.approx(1.5, rel=0.05)


def test_a_fleet_that_runs_its_profile_gets_no_note_and_scale_one():
    decision = decide_over(PROFILED, 1.0, 5)
    assert decision.inputs["step_scale"] == 1.0
    assert "profile steps" not in decision.reason


def test_the_fit_survives_scale_to_zero():
    fitted = decide_over(PROFILED, 1.5, 5).state
    idle = window(1.5, T0 + 3600, gateway_arrival_rate=0.0, requests_running=0.0, queue_depth=0)
    # Idle is every rate at 0: a token served, in either window, is activity.
    quiet = dict.fromkeys(
        (
            "generation_token_rate",
            "generation_token_rate_panic",
            "prompt_token_rate",
            "prompt_token_rate_panic",
            "requests_running_mean",
            "request_rate",
        ),
        0.0,
    )
    idle = dataclasses.replace(idle, **quiet)  # type: ignore[arg-type]
    later = dataclasses.replace(fitted, last_activity=T0)
    decision = decide(idle, PROFILED, later)
    assert decision.desired_replicas == 0
    assert decision.state.step_fit == fitted.step_fit


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(Policy(), id="no profile is the priors"),
        pytest.param(Policy(profile=PRIORS), id="profile priors is the priors"),
        pytest.param(
            TriggerMetadata.model_validate(
                {"scalerAddress": "s:9090", "deployment": "d", "profile": "priors"}
            ).policy(PROFILED),
            id="a trigger's profile priors overrides the config's profile",
        ),
        pytest.param(
            PolicyConfig.model_validate({"profile": "priors"}).policy(),
            id="the config's profile priors",
        ),
    ],
)
def test_priors_named_or_not_plan_with_the_priors(policy):
    assert profile_of(policy) is None
    decision = decide(window(1.0, T0, gateway_arrival_rate=50.0), policy, DecisionState())
    assert math.isnan(decision.inputs["step_scale"])
    assert "profile steps" not in decision.reason


def test_an_unknown_profile_names_priors_among_the_choices():
    with pytest.raises(ValueError, match=r"llama3-8b-h200.*, or priors"):
        check_profile("llama-7b")


@pytest.mark.parametrize(
    ("config_profile", "planned"),
    [
        pytest.param(None, "llama3-8b-h200", id="the replay plans with the sim's profile"),
        pytest.param(PRIORS, None, id="scaler config profile priors replays the priors"),
        pytest.param("qwen2.5-32b-h200", "qwen2.5-32b-h200", id="or with the one it names"),
    ],
)
def test_the_replay_plans_with_what_the_scaler_config_says(config_profile, planned):
    options = ReplayOptions("t", 1.0, 1.0, 0, policy=Policy(profile=config_profile))
    policy = make_policy("unitscale", SimConfig(PROFILE), options)
    assert isinstance(policy, Unitscale)
    effective = TriggerMetadata.model_validate(policy.metadata).policy(policy.defaults)
    assert profile_of(effective) == planned
