"""vLLM launch flags: the chunk budget and batch cap the replica model assumes."""

from __future__ import annotations

import dataclasses

import pytest

from foundation.replica_model import LLAMA3_8B_H200, QWEN25_32B_H200
from serving.vllm_profile import CPU_TEST, LaunchProfile, for_itl_slo, launch_args

LLAMA = LaunchProfile(model="meta-llama/Meta-Llama-3-8B", served_model_name="llama")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize(
    ("launch", "profile", "slo", "seqs", "budget"),
    [
        # 256 decodes at 2k tokens plus 2,560 prompt tokens step in 89.7 ms.
        pytest.param(LLAMA, LLAMA3_8B_H200, 0.1, "256", "2816", id="llama-8b-at-100ms"),
        pytest.param(LLAMA, QWEN25_32B_H200, 0.2, "256", "1280", id="qwen-32b-at-200ms"),
        # A launch's own batch cap is kept, and the budget is sized for it: 64 decodes
        # step in 11.6 ms, leaving 78 ms for 3,155 prompt tokens: 3,219 -> 3,072.
        pytest.param(
            dataclasses.replace(LLAMA, max_num_seqs=64),
            LLAMA3_8B_H200,
            0.1,
            "64",
            "3072",
            id="a-launchs-own-max-num-seqs-is-kept-and-sized-for",
        ),
    ],
)
def test_for_itl_slo_passes_the_budget_and_the_batch_cap_the_model_assumes(
    launch, profile, slo, seqs, budget
):
    args = launch_args(for_itl_slo(launch, profile, slo))
    assert flag(args, "--max-num-seqs") == seqs
    assert flag(args, "--max-num-batched-tokens") == budget


def test_for_itl_slo_launches_what_the_replay_models():
    launch = for_itl_slo(LLAMA, LLAMA3_8B_H200, 0.1)
    assert launch.max_num_batched_tokens == LLAMA3_8B_H200.for_itl_slo(0.1).max_num_batched_tokens


def test_without_a_budget_vllm_keeps_its_own_default():
    args = launch_args(CPU_TEST)
    assert "--max-num-batched-tokens" not in args
    assert flag(args, "--max-num-seqs") == "8"


def test_a_replica_told_to_stop_lets_the_requests_it_carries_finish():
    """vLLM's default aborts them on SIGTERM, and the scaler lowers a count once arrivals
    no longer need the replicas, whatever they still carry (issue 27, hostile pass 39)."""
    assert flag(launch_args(LLAMA), "--shutdown-timeout") == "900"
    assert flag(launch_args(CPU_TEST), "--shutdown-timeout") == "5"
