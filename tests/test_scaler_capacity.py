"""A replica's capacity in the decision's units (scaler.core.capacity): worked numbers,
and the mix read from what the engines report."""

from __future__ import annotations

import pytest

from foundation.capacity import replica_capacity
from foundation.replica_model import LLAMA3_8B_H200, QWEN25_32B_H200
from scaler.core import Observation, Policy
from scaler.core.capacity import Mix, check_profile, observed_mix, replica_rates

NOW = 1_800_000_000.0


def obs(**values):
    return Observation(now=NOW, signal_time=NOW, **values)


@pytest.mark.parametrize(
    ("observation", "mix"),
    [
        pytest.param(
            obs(request_rate=10.0, prompt_token_rate=11_550.0, generation_token_rate=2_110.0),
            Mix(1155.0, 211.0),
            id="token-rates-over-the-request-rate-give-the-mix",
        ),
        pytest.param(
            obs(
                request_rate=10.0,
                prompt_token_rate=30_000.0,
                generation_token_rate=2_110.0,
                mean_prompt_tokens=1155.0,
                mean_output_tokens=211.0,
            ),
            Mix(3000.0, 211.0),
            id="prompts-in-flight-make-the-rates-heavier-and-the-heavier-reading-is-planned-for",
        ),
        pytest.param(
            obs(
                request_rate=10.0,
                prompt_token_rate=11_550.0,
                generation_token_rate=4_000.0,
                mean_prompt_tokens=1155.0,
                mean_output_tokens=128.0,
            ),
            Mix(1155.0, 400.0),
            id="after-a-start-the-short-requests-finish-first-and-the-tokens-generated-say-more",
        ),
        pytest.param(
            obs(
                request_rate=10.0,
                prompt_token_rate=5_000.0,
                generation_token_rate=1_000.0,
                mean_prompt_tokens=1155.0,
                mean_output_tokens=211.0,
            ),
            Mix(1155.0, 211.0),
            id="while-the-load-falls-the-finished-requests-are-the-heavier-reading",
        ),
        pytest.param(
            obs(mean_prompt_tokens=1155.0, mean_output_tokens=211.0),
            Mix(1155.0, 211.0),
            id="the-per-request-means-alone-give-the-mix",
        ),
        pytest.param(
            obs(request_rate=0.01, prompt_token_rate=500.0, generation_token_rate=50.0),
            None,
            id="a-window-with-almost-no-finished-request-says-nothing",
        ),
        pytest.param(
            obs(prompt_token_rate=500.0, generation_token_rate=50.0),
            None,
            id="no-request-rate-no-mix-never-a-zero",
        ),
        pytest.param(
            obs(request_rate=1.0, prompt_token_rate=0.0, generation_token_rate=0.0),
            None,
            id="under-a-token-a-request-is-no-mix-not-the-lightest-one",
        ),
        pytest.param(
            obs(request_rate=1e6, prompt_token_rate=80_000.0, generation_token_rate=12_000.0),
            None,
            id="a-request-rate-above-the-token-rates-is-no-mix-not-a-one-token-mix",
        ),
        pytest.param(
            obs(request_rate=20.0, prompt_token_rate=80_000.0, generation_token_rate=12.0),
            None,
            id="under-one-output-token-a-request-is-no-mix",
        ),
        pytest.param(
            obs(
                request_rate=1e6,
                prompt_token_rate=80_000.0,
                generation_token_rate=12_000.0,
                mean_prompt_tokens=2000.0,
                mean_output_tokens=300.0,
            ),
            Mix(2000.0, 300.0),
            id="an-impossible-rated-mix-leaves-the-per-request-means-alone",
        ),
    ],
)
def test_observed_mix(observation, mix):
    assert observed_mix(observation) == mix


@pytest.mark.parametrize(
    ("profile", "prompt", "output"),
    [
        pytest.param(LLAMA3_8B_H200, 1155.0, 211.0, id="llama3-8b-at-the-azure-conversation-mix"),
        pytest.param(LLAMA3_8B_H200, 2048.0, 28.0, id="llama3-8b-at-the-azure-code-mix"),
        pytest.param(QWEN25_32B_H200, 1000.0, 200.0, id="qwen-32b-at-a-chat-mix"),
    ],
)
def test_profile_rates_are_the_capacity_model_s_within_the_quantisation(profile, prompt, output):
    policy = Policy(profile=profile.name)
    rates = replica_rates(policy, Mix(prompt, output))
    # The replicas run with the chunk budget for the ITL SLO, as the launch profile starts them.
    capacity = replica_capacity(profile.for_itl_slo(0.1), prompt, output, 2.0, 0.1)
    assert rates.requests_per_second == pytest.approx(capacity.requests_per_second, rel=0.03)
    # One replica at its capacity is one replica of load, in the rates' own units.
    at_capacity = rates.replicas(
        rates.requests_per_second * prompt, rates.requests_per_second * output
    )
    assert at_capacity == pytest.approx(1.0, rel=0.03)
    assert rates.source == f"profile {profile.name}"


def test_without_a_profile_the_priors_stand_and_give_a_request_rate():
    rates = replica_rates(Policy(), Mix(1000.0, 200.0))
    # 1000 / 30000 + 200 / 6000 = 1/15 of a replica per request: 15 requests/s.
    assert rates.requests_per_second == pytest.approx(15.0)
    assert (rates.prefill_tokens_per_second, rates.source) == (30_000.0, "priors")


def test_without_a_mix_there_is_no_request_rate():
    assert replica_rates(Policy(profile="llama3-8b-h200"), None).requests_per_second is None


def test_an_unknown_profile_names_the_known_ones():
    with pytest.raises(ValueError, match=r"llama3-8b-h200, qwen2\.5-32b-h200"):
        check_profile("gpt-5-on-a-toaster")
