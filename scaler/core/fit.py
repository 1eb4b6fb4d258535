"""Correct a replica profile's step times from what the replicas are seen to do.

A profile (``foundation.replica_model.Profile``) predicts a decode step from the batch
and the tokens it holds, and what prefill chunks add. Real replicas may be slower or
faster (another driver, a noisy neighbour, a kernel the calibration did not see); the
capacity is only as good as those step times. Each observation gives one
(throughput, latency) pair per window: the stable window's generation tokens per
second and the requests running on average, whose ratio is, by Little's law, the
seconds between two tokens of one sequence, ``y = running / generation_rate``. The
profile predicts it at the same operating point: per replica, the decode step ``d`` of
the mean batch ``B = running / replicas`` holding ``B * (prompt + output / 2)`` tokens,
stretched by the prefill the steps interleave (``f``: seconds of prefill per second,
from the prompt token rate). If every step takes ``k`` times the profile's,
``y = k * (d + y * f)``; ``k`` is the least-squares slope through the origin of ``y``
over ``x = d + y * f``, with exponential forgetting over measured time. The capacity
then plans with the profile's step times times ``k`` (``Profile.overhead * k``).

Little's law and not the ITL histogram: vLLM's ``inter_token_latency`` buckets are
10, 25, 50 ms wide where an 8B model steps, so the p50 interpolated inside one bucket
moves little when the step does (in the replay, a 30% slower fleet moved it 16%).

Only windows that measure the step are used (``_unmeasurable`` says why one is not):
every signal known, a fleet that has kept its size for a whole stable window, at
least ``MIN_BATCH`` sequences per replica, no backlog (prompts being prefilled are not
yet in the token counters, and a queue's steps are not the steady state the profile
predicts), a steady load (``_steady``), the KV cache below ``MAX_KV_USAGE`` (vLLM
preempts when it fills).

Bounds, and why:

- No correction until ``MIN_EVIDENCE_SECONDS`` of such windows: one window is noise.
- Within ``DEADBAND`` of 1 the profile holds: its fits are within 6-10% of the kernels
  (``foundation.replica_model``), and this estimate reads about 7% slow in the replay
  on a fleet that runs exactly the profile (sequences being prefilled count as running
  but make no token). Smaller corrections are not evidence.
- ``BOUNDS`` (0.5-2x): a fleet stepping more than twice as slow (or fast) as its
  profile runs another model, accelerator or engine configuration than the profile
  describes; the fit stops there and the reason says to make a profile for it
  (docs/capacity.md), rather than plan on a physics the profile does not describe.
- One window's ratio counts at most ``POINT_CLIP`` times the profile, either way.

Pure: the previous fit, the observation, the profile and ``now`` in; the new fit out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from foundation.replica_model import Profile

if TYPE_CHECKING:  # model.py carries a StepFit in its DecisionState
    from scaler.core.model import Observation

MIN_BATCH = 4.0
"""Sequences per replica below which a step is mostly the weights' read, too few tokens
to measure in a window."""
MAX_KV_USAGE = 0.9
"""KV cache share above which vLLM may preempt (and recompute): not the profile's step."""
SETTLED_SECONDS = 60.0
"""The fleet must have kept its size this long: the exporter's stable window, so every
rate in it is over the same replicas."""
POINT_SECONDS = 60.0
"""A window counts for the seconds since the previous observation, at most this (one
stable window): the weight is measured time, whatever the decision rate."""
HALF_LIFE_SECONDS = 600.0
"""Evidence halves with every 10 minutes of newer measured windows: a changed fleet (a
new driver, another node type) is followed within about a quarter of an hour."""
MIN_EVIDENCE_SECONDS = 120.0
"""Measured seconds (two stable windows) before the fit corrects anything."""
DEADBAND = 0.1
"""Corrections within 10% of the profile are left out (the profile's own accuracy)."""
BOUNDS = (0.5, 2.0)
"""The step-time scale never leaves these: beyond, the profile is the wrong one."""
POINT_CLIP = 4.0
STEADY_BAND = 0.25
"""The window is steady when the running requests now and the short window's token rate
are within 25% of the stable window's means."""
"""One window's ratio is clipped to 1/4..4 times the profile before it enters the fit."""


@dataclass(frozen=True, slots=True)
class StepFit:
    """Forgetting-weighted sums of the least-squares fit, and the fleet it is judging."""

    sxy: float = 0.0
    sxx: float = 0.0
    evidence: float = 0.0
    """Measured seconds, decayed as the sums are."""
    seen: float | None = None
    """When the previous observation came (a window's weight is the time since)."""
    replicas: int | None = None
    """Replicas answering at the previous observation."""
    replicas_since: float | None = None
    """Since when the fleet has had that size."""

    @property
    def raw(self) -> float | None:
        """The least-squares step-time scale, unbounded; None before any evidence."""
        return self.sxy / self.sxx if self.sxx > 0 else None

    def scale(self) -> float:
        """The step-time scale to plan with: 1 until known, within ``BOUNDS``."""
        raw = self.raw
        if raw is None or self.evidence < MIN_EVIDENCE_SECONDS or abs(raw - 1.0) < DEADBAND:
            return 1.0
        return min(max(raw, BOUNDS[0]), BOUNDS[1])

    def note(self) -> str | None:
        """For the decision's reason: the correction in force and its evidence, if any."""
        scale, raw = self.scale(), self.raw
        if scale == 1.0 or raw is None:
            return None
        note = f"profile steps x{scale:.2f} (fit over {self.evidence:.0f}s)"
        if scale != raw:
            note += (
                f"; measured x{raw:.2f}, beyond {BOUNDS[0]:g}-{BOUNDS[1]:g}x: the profile"
                " describes another model or accelerator, make one for these replicas"
            )
        return note


def corrected(profile: Profile, scale: float) -> Profile:
    """``profile`` whose every step takes ``scale`` times as long (same launch flags)."""
    return profile if scale == 1.0 else replace(profile, overhead=profile.overhead * scale)


def fit_step(previous: StepFit, o: Observation, profile: Profile, now: float) -> StepFit:
    """The fit after observation ``o`` of replicas launched as ``profile`` describes.

    A window that does not measure the step (``unmeasurable``) leaves the sums as they
    were; the fleet's size and the time are always tracked.
    """
    replicas = o.replicas_up
    since = previous.replicas_since
    if replicas != previous.replicas or since is None:
        since = now
    seen = previous.seen
    state = replace(previous, seen=now, replicas=replicas, replicas_since=since)
    pair = None if unmeasurable(o, now - since) else _pair(o, profile)
    if pair is None or seen is None:
        return state
    x, y = pair
    y = min(max(y, x / POINT_CLIP), x * POINT_CLIP)
    weight = min(max(now - seen, 0.0), POINT_SECONDS)
    keep = 0.5 ** (weight / HALF_LIFE_SECONDS)
    return replace(
        state,
        sxy=previous.sxy * keep + weight * x * y,
        sxx=previous.sxx * keep + weight * x * x,
        evidence=previous.evidence * keep + weight,
    )


def unmeasurable(o: Observation, settled_for: float) -> str | None:
    """Why this window does not measure a step (None: it does)."""
    values = (
        o.requests_running_mean,
        o.generation_token_rate,
        o.prompt_token_rate,
        o.mean_prompt_tokens,
        o.mean_output_tokens,
        o.kv_cache_usage,
        o.queue_depth,
    )
    if any(v is None or not math.isfinite(v) for v in values) or not o.replicas_up:
        return "a signal is missing"
    if o.replicas_known is not None and o.replicas_known != o.replicas_up:
        return "a replica did not answer"
    if settled_for < SETTLED_SECONDS:
        return "the fleet changed size within the window"
    assert o.requests_running_mean is not None and o.queue_depth is not None  # known above
    if o.requests_running_mean / o.replicas_up < MIN_BATCH or not o.generation_token_rate:
        return "too few sequences to measure"
    if o.queue_depth > o.replicas_up:
        return "a backlog"
    if not _steady(o):
        return "the load moved within the window"
    if (o.kv_cache_usage or 0.0) >= MAX_KV_USAGE:
        return "the KV cache is nearly full"
    return None


def _steady(o: Observation) -> bool:
    """Running now and the short window's token rate near the stable window's means.

    Little's law holds for any window, but the profile's prediction is at the mean batch:
    in a window that holds a burst, the batch is high exactly while the steps are long
    (prefill-heavy), and the mean of their product is not the product of their means (on
    Azure's on/off code trace that read a fleet 1.5x slow as 2.9x).
    """
    mean, tokens = o.requests_running_mean, o.generation_token_rate
    if mean is None or tokens is None or mean <= 0 or tokens <= 0:
        return False
    now, short = o.requests_running, o.generation_token_rate_panic
    if now is None or short is None:
        return False
    return abs(now / mean - 1.0) <= STEADY_BAND and abs(short / tokens - 1.0) <= STEADY_BAND


def _pair(o: Observation, profile: Profile) -> tuple[float, float] | None:
    """(predicted, observed) seconds between two tokens of a sequence, per the docstring."""
    running, tokens = o.requests_running_mean, o.generation_token_rate
    prompt, output, replicas = o.mean_prompt_tokens, o.mean_output_tokens, o.replicas_up
    if running is None or tokens is None or prompt is None or output is None or not replicas:
        return None
    if o.prompt_token_rate is None or tokens <= 0 or prompt < 1 or output < 1:
        return None
    batch = running / replicas
    decode = profile.decode_step_seconds(batch, batch * (prompt + output / 2))
    chunk = min(max(profile.max_num_batched_tokens - batch, 1.0), prompt)
    prefill = o.prompt_token_rate / replicas * profile.prefill_marginal_seconds(chunk) / chunk
    observed = running / tokens
    return decode + observed * prefill, observed
