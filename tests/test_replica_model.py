"""The replica model reproduces the H200 calibration and small hand-computed cases, and
sizes the chunked-prefill budget for an ITL SLO."""

from __future__ import annotations

import dataclasses
import json

import pytest

from foundation.replica_model import (
    ITL_MARGIN,
    LLAMA3_8B_H200,
    PROFILES,
    QWEN25_32B_H200,
    chunk_budget_for_itl,
)
from tests.shared_data import shared

MODELS = {"llama3-8b-h200": "llama3-8b", "qwen2.5-32b-h200": "qwen2.5-32b"}


@pytest.fixture(scope="module")
def calibration():
    return json.loads(shared("calibration", "h200-step-times.json").read_text())["models"]


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_decode_fit_is_within_seven_percent_of_every_measured_step(calibration, profile):
    measured = calibration[MODELS[profile.name]]["decode_ms"]
    for key, ms in measured.items():
        batch, context = map(int, key.split("x"))
        model_ms = profile.decode_step_seconds(batch, batch * context) * 1000 / profile.overhead
        assert model_ms == pytest.approx(ms, rel=0.07), key


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_prefill_fit_is_within_twelve_percent_of_every_measured_prompt(calibration, profile):
    for tokens, ms in calibration[MODELS[profile.name]]["prefill_ms"].items():
        model_ms = profile.prefill_seconds(int(tokens)) * 1000 / profile.overhead
        assert model_ms == pytest.approx(ms, rel=0.12), tokens


@pytest.mark.parametrize(
    ("profile", "tokens"),
    [
        # 0.9 x 150.75 GB - 16.06 GB weights - 2 GiB = 117.5 GB at 128 KiB per token
        pytest.param(LLAMA3_8B_H200, 896_616, id="llama-8b-holds-about-900k-tokens-of-kv"),
        # 0.9 x 150.75 GB - 65.53 GB - 2 GiB = 68.1 GB at 256 KiB per token
        pytest.param(QWEN25_32B_H200, 259_575, id="qwen-32b-holds-about-260k-tokens-of-kv"),
    ],
)
def test_kv_capacity(profile, tokens):
    assert profile.kv_capacity_tokens == pytest.approx(tokens, rel=0.001)


@pytest.mark.parametrize(
    ("batch", "context", "prefill", "ms"),
    [
        pytest.param(
            1, 2048, 0, 1.10 * (5.747346 + 0.017222 + 0.000028 * 2048), id="one-sequence-decode"
        ),
        pytest.param(
            64,
            64 * 2048,
            0,
            1.10 * (5.747346 + 0.017222 * 64 + 0.000028 * 64 * 2048),
            id="batch-64",
        ),
        pytest.param(
            0,
            0,
            2048,
            1.10 * (4.835232 + 0.020292325 * 2048 + 7.32367e-07 * 2048**2),
            id="prefill-alone",
        ),
        pytest.param(
            8,
            8 * 1000,
            512,
            1.10
            * (
                5.747346 + 0.017222 * 8 + 0.000028 * 8000 + 0.020292325 * 512 + 7.32367e-07 * 512**2
            ),
            id="a-mixed-step-pays-the-weights-once",
        ),
    ],
)
def test_step_times(batch, context, prefill, ms):
    assert LLAMA3_8B_H200.mixed_step_seconds(batch, context, prefill) * 1000 == pytest.approx(ms)


def test_decode_capacity_is_bounded_by_the_itl_slo_and_the_batch_cap():
    assert LLAMA3_8B_H200.decode_capacity(2300, 0.100) == 256  # max_num_seqs binds
    # 20 ms per step leaves (20/1.1 - 5.75) ms for (0.017 + 0.000028 x 8000) ms per sequence
    assert LLAMA3_8B_H200.decode_capacity(8000, 0.020) == 51


# The chunk budget for an ITL SLO. Worked numbers, llama3-8b-h200 at 2,048-token contexts:
# 256 decodes step in 1.1 x (5.747 + 0.017222 x 256 + 0.000028 x 256 x 2048) = 27.3 ms,
# leaving 0.9 x 100 - 27.3 = 62.7 ms (57.0 ms of kernels) for a chunk c with
# 0.020292 c + 7.32e-7 c^2 = 57.0: c = 2,569, so 256 + 2,569 = 2,825 -> 2,816.
@pytest.mark.parametrize(
    ("profile", "slo", "context", "batch", "budget"),
    [
        pytest.param(
            LLAMA3_8B_H200, 0.100, 2048, 256, 2816, id="llama-8b-100ms-256-decodes-leave-2816"
        ),
        # 12k-token contexts: the KV cache holds 73 of them (the ITL alone would take 238).
        pytest.param(
            LLAMA3_8B_H200, 0.100, 12150, 73, 2304, id="llama-8b-100ms-long-contexts-leave-2304"
        ),
        pytest.param(LLAMA3_8B_H200, 0.050, 2048, 256, 1024, id="llama-8b-50ms-leaves-1024"),
        pytest.param(LLAMA3_8B_H200, 0.200, 2048, 256, 5888, id="llama-8b-200ms-leaves-5888"),
        # 126 decodes of 2k tokens (the KV cache's limit) step in 45.7 ms: 512 is all.
        pytest.param(
            QWEN25_32B_H200, 0.100, 2048, 126, 512, id="qwen-32b-100ms-is-at-the-512-floor"
        ),
        pytest.param(QWEN25_32B_H200, 0.200, 2048, 126, 1280, id="qwen-32b-200ms-leaves-1280"),
    ],
)
def test_the_chunk_budget_is_the_largest_whose_full_step_fits_the_itl_slo(
    profile, slo, context, batch, budget
):
    assert profile.decode_capacity(context, slo) == batch
    got = chunk_budget_for_itl(profile, slo, mean_context_tokens=context)
    assert got == budget
    assert got % 256 == 0 and got >= 512

    def step(tokens: int) -> float:
        return profile.mixed_step_seconds(batch, batch * context, tokens - batch)

    if budget > 512:
        assert step(got) <= ITL_MARGIN * slo < step(got + 256)
    else:
        assert step(768) > ITL_MARGIN * slo


def test_todays_8192_token_steps_break_a_100ms_itl_and_the_sized_budget_does_not():
    full = LLAMA3_8B_H200.mixed_step_seconds(256, 256 * 2048, 8192 - 256)
    assert full == pytest.approx(0.255, abs=0.001)
    sized = LLAMA3_8B_H200.for_itl_slo(0.1)
    assert sized.max_num_batched_tokens == 2816
    assert sized.mixed_step_seconds(256, 256 * 2048, 2816 - 256) == pytest.approx(0.0897, abs=1e-4)
    # Everything else is the same profile.
    assert dataclasses.replace(sized, max_num_batched_tokens=8192) == LLAMA3_8B_H200


@pytest.mark.parametrize(
    ("profile", "slo", "budget"),
    [
        # The decode step alone (B = 8 at 7 ms: 7.0 ms) takes the whole margin.
        pytest.param(LLAMA3_8B_H200, 0.007, 512, id="an-slo-the-decode-alone-fills-gets-512"),
        pytest.param(
            dataclasses.replace(LLAMA3_8B_H200, max_num_seqs=1024),
            0.007,
            1024,
            id="never-below-max-num-seqs-which-vllm-refuses",
        ),
    ],
)
def test_the_chunk_budget_has_floors(profile, slo, budget):
    assert chunk_budget_for_itl(profile, slo) == budget


@pytest.mark.parametrize(
    ("slo", "margin"),
    [
        pytest.param(0.0, 0.9, id="zero-slo"),
        pytest.param(-0.1, 0.9, id="negative-slo"),
        pytest.param(0.1, 0.0, id="zero-margin"),
        pytest.param(0.1, 1.5, id="margin-over-one"),
    ],
)
def test_a_meaningless_itl_slo_or_margin_is_refused_with_its_values(slo, margin):
    with pytest.raises(ValueError, match=f"{slo}, {margin}"):
        chunk_budget_for_itl(LLAMA3_8B_H200, slo, margin=margin)
