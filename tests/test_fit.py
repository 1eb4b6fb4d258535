"""The profile's step-time fit (scaler.core.fit): tables, then properties."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scaler.core.capacity import launched
from scaler.core.fit import BOUNDS, MIN_EVIDENCE_SECONDS, StepFit, corrected, fit_step
from scaler.core.model import Observation

PROFILE = launched("llama3-8b-h200", 0.1)
T0 = 1_000_000.0
EVERY = 15.0


def window(
    true_scale: float,
    now: float,
    *,
    replicas: int = 8,
    batch: float = 40.0,
    prompt: float = 1155.0,
    output: float = 211.0,
    requests_per_replica: float = 3.0,
    noise: float = 1.0,
    **overrides: object,
) -> Observation:
    """What the exporter reports for replicas ``true_scale`` times slower than PROFILE.

    By the fit's own model (Little's law: seconds per token per sequence), so the table
    tests what the fit makes of it; ``noise`` multiplies the token rate.
    """
    real = corrected(PROFILE, true_scale)
    decode = real.decode_step_seconds(batch, batch * (prompt + output / 2))
    chunk = min(real.max_num_batched_tokens - batch, prompt)
    prefill = requests_per_replica * prompt * real.prefill_marginal_seconds(chunk) / chunk
    per_token = decode / (1.0 - prefill)
    values: dict[str, object] = {
        "now": now,
        "signal_time": now,
        "queue_depth": 0.0,
        "requests_running": batch * replicas,
        "requests_running_mean": batch * replicas,
        "generation_token_rate": batch * replicas / per_token * noise,
        "generation_token_rate_panic": batch * replicas / per_token * noise,
        "prompt_token_rate": requests_per_replica * prompt * replicas,
        "mean_prompt_tokens": prompt,
        "mean_output_tokens": output,
        "kv_cache_usage": 0.3,
        "replicas_up": replicas,
        "replicas_known": replicas,
    }
    values.update(overrides)
    return Observation(**values)  # type: ignore[arg-type]


def run(observations: list[Observation], fit: StepFit | None = None) -> StepFit:
    fit = fit or StepFit()
    for o in observations:
        fit = fit_step(fit, o, PROFILE, o.now)
    return fit


def windows(true_scale: float, seconds: float, start: float = T0, **kw: Any) -> list[Observation]:
    return [window(true_scale, start + i * EVERY, **kw) for i in range(int(seconds / EVERY) + 1)]


LONG_PROMPTS = {"prompt": 12_000.0, "output": 150.0, "requests_per_replica": 0.4}


@pytest.mark.parametrize(
    ("true_scale", "seconds", "expected", "mix"),
    [
        pytest.param(1.3, 240, 1.3, {}, id="a profile 30% optimistic is corrected within 4 min"),
        pytest.param(0.7, 240, 0.7, {}, id="replicas 30% faster than their profile are credited"),
        pytest.param(1.0, 600, 1.0, {}, id="a profile that holds is left as it is"),
        pytest.param(1.07, 600, 1.0, {}, id="within 10% (the profile's accuracy): no correction"),
        pytest.param(3.0, 600, 2.0, {}, id="three times slower stops at the 2x bound"),
        pytest.param(0.3, 600, 0.5, {}, id="three times faster stops at the 0.5x bound"),
        pytest.param(1.5, 60, 1.0, {}, id="one minute of windows is too little evidence"),
        pytest.param(1.5, 240, 1.5, LONG_PROMPTS, id="long prompts (12k tokens) are fitted too"),
    ],
)
def test_fit_recovers_the_step_scale(true_scale, seconds, expected, mix):
    fit = run(windows(true_scale, seconds, **mix))
    assert fit.scale() == pytest.approx(expected, rel=0.05)


def test_a_bound_says_why_and_what_to_do():
    fit = run(windows(3.0, 600))
    note = fit.note()
    assert note is not None
    assert "x2.00" in note and "measured x3.00" in note and "make one" in note


def test_noise_moves_the_fit_little():
    # Replayed windows scatter about 8% around their mean (Azure conversation x25).
    rng = random.Random(7)
    stream = [window(1.3, T0 + i * EVERY, noise=math.exp(rng.gauss(0.0, 0.1))) for i in range(80)]
    assert run(stream).scale() == pytest.approx(1.3, rel=0.05)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"queue_depth": 50.0}, id="a backlog's windows are left out"),
        pytest.param({"kv_cache_usage": 0.95}, id="a nearly full KV cache's are left out"),
        pytest.param({"replicas_known": 9}, id="a replica that did not answer: left out"),
        pytest.param({"requests_running_mean": None}, id="no mean running: left out"),
        pytest.param({"generation_token_rate": None}, id="no token rate: left out"),
        pytest.param({"mean_prompt_tokens": None}, id="no mix: left out"),
        pytest.param({"batch": 2.0}, id="two sequences per replica are too few to measure"),
        pytest.param({"requests_running": 1000.0}, id="a burst running now: left out"),
        pytest.param({"generation_token_rate_panic": 1.0}, id="a short window far off: left out"),
    ],
)
def test_windows_that_do_not_measure_a_step_never_move_the_fit(overrides):
    settled = run(windows(1.3, 300))
    kw = {k: v for k, v in overrides.items() if k == "batch"}
    others = {k: v for k, v in overrides.items() if k != "batch"}
    later = [window(3.0, T0 + 315 + i * EVERY, **kw, **others) for i in range(40)]
    after = run(later, settled)
    assert (after.sxy, after.sxx, after.evidence) == (settled.sxy, settled.sxx, settled.evidence)
    assert run(later).scale() == 1.0


def test_a_fleet_that_changes_size_is_judged_only_a_window_later():
    fit = run(windows(1.3, 300))
    resized = [window(3.0, T0 + 315 + i * EVERY, replicas=12) for i in range(4)]  # 45 s
    assert run(resized, fit).evidence == fit.evidence


def test_the_fit_follows_a_fleet_that_changes_speed():
    fit = run(windows(1.0, 600))
    fit = run(windows(1.6, 40 * 60, start=T0 + 615), fit)
    assert fit.scale() == pytest.approx(1.6, rel=0.05)


@st.composite
def observations(draw):
    known = st.none() | st.floats(0, 1e6, allow_nan=False)
    return Observation(
        now=0.0,
        signal_time=0.0,
        queue_depth=draw(known),
        requests_running_mean=draw(known),
        generation_token_rate=draw(known),
        prompt_token_rate=draw(known),
        mean_prompt_tokens=draw(known),
        mean_output_tokens=draw(known),
        kv_cache_usage=draw(st.none() | st.floats(0, 1)),
        replicas_up=draw(st.none() | st.integers(0, 64)),
        replicas_known=draw(st.none() | st.integers(0, 64)),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 120), observations()), max_size=40))
def test_any_signals_keep_the_scale_within_its_bounds(steps):
    fit, now = StepFit(), T0
    for gap, o in steps:
        now += gap
        fit = fit_step(fit, dataclasses.replace(o, now=now, signal_time=now), PROFILE, now)
        assert BOUNDS[0] <= fit.scale() <= BOUNDS[1]
        assert fit.evidence >= 0 and fit.sxx >= 0
        assert math.isfinite(fit.sxy)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.5, 2.0), st.integers(1, 64), st.floats(4, 200))
def test_any_true_scale_is_found_at_any_operating_point(true_scale, replicas, batch):
    assume(not 0.09 < abs(true_scale - 1.0) < 0.11)  # at the dead band's edge, either
    fit = run(windows(true_scale, MIN_EVIDENCE_SECONDS * 2, replicas=replicas, batch=batch))
    expected = 1.0 if abs(true_scale - 1.0) < 0.1 else true_scale
    assert fit.scale() == pytest.approx(expected, rel=0.02, abs=0.1)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(
        [
            "requests_running_mean",
            "generation_token_rate",
            "prompt_token_rate",
            "mean_prompt_tokens",
            "mean_output_tokens",
            "kv_cache_usage",
            "queue_depth",
            "replicas_up",
        ]
    ),
    st.floats(0.5, 2.0),
    st.integers(1, 40),
)
def test_a_missing_signal_never_moves_the_fit(missing, true_scale, windows_later):
    settled = run(windows(1.3, 300))
    unknown: dict[str, Any] = {missing: None}
    later = [
        dataclasses.replace(window(true_scale, T0 + 315 + i * EVERY), **unknown)
        for i in range(windows_later)
    ]
    after = run(later, settled)
    assert (after.sxy, after.sxx, after.evidence) == (settled.sxy, settled.sxx, settled.evidence)
