"""The replica model reproduces the H200 calibration and small hand-computed cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.replica_model import LLAMA3_8B_H200, PROFILES, QWEN25_32B_H200

CALIBRATION = (
    Path(__file__).resolve().parents[2] / "shared" / "calibration" / "h200-step-times.json"
)
MODELS = {"llama3-8b-h200": "llama3-8b", "qwen2.5-32b-h200": "qwen2.5-32b"}


@pytest.fixture(scope="module")
def calibration():
    if not CALIBRATION.exists():
        pytest.skip("shared/calibration is not beside this checkout")
    return json.loads(CALIBRATION.read_text())["models"]


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
