"""What one replica carries, in the decision's units: from a profile and the mix, or priors.

With a named profile (``Policy.profile``, one of ``foundation.replica_model.PROFILES`` or
of the SRE's own in ``Policy.profiles``, the scaler config's ``profiles``, launched with
the chunk budget for the ITL SLO as ``serving.vllm_profile.for_itl_slo`` launches vLLM),
a replica's capacity is ``foundation.capacity.replica_capacity`` for the
observed mix
(mean prompt and output tokens per request): the request rate, and the prompt and
output token rates, at which one replica keeps TTFT p95 and inter-token p95 within the
policy's SLOs. Without one, the priors (``prefill_tokens_per_second``,
``decode_tokens_per_second``) stand in, as raw throughput.

The mix is quantised to 2.5% steps (in log space) so that a drifting mix reuses cached
answers: a capacity costs a few milliseconds, a cache hit nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

from foundation.capacity import P95_TAIL, replica_capacity
from foundation.replica_model import PROFILES, Profile
from scaler.core.fit import corrected
from scaler.core.model import Observation, Policy

CAPACITY_TAIL = P95_TAIL
"""A replica's capacity keeps the p95s within the SLOs. Sizing it for the attainment
target's quantile instead (0.01 at 99%) bought nothing on the bench's traces, whose misses
come from bursts and cold starts, not from a steady fleet's tail (``bench/ablation.py``):
the attainment loop (``scaler.core.attainment``) holds the SLO instead."""
MIN_REQUEST_RATE = 0.05
"""Finished requests per second below which a window's mix is too thin to read."""
_STEP = 0.025


@dataclass(frozen=True, slots=True)
class Mix:
    """Mean prompt and output tokens per request."""

    prompt_tokens: float
    output_tokens: float


@dataclass(frozen=True, slots=True)
class Rates:
    """One replica's capacity: token rates, and requests per second for a known mix."""

    prefill_tokens_per_second: float
    decode_tokens_per_second: float
    requests_per_second: float | None
    """None while the mix is unknown."""
    source: str
    """``profile <name>`` or ``priors``, for the decision's reason."""

    def sped_up(self, factor: float) -> Rates:
        """These rates for replicas that step ``factor`` times faster."""
        rps = self.requests_per_second
        return Rates(
            self.prefill_tokens_per_second * factor,
            self.decode_tokens_per_second * factor,
            None if rps is None else rps * factor,
            f"{self.source} at {factor:g}x speed",
        )

    def replicas(self, prompt_rate: float, output_rate: float) -> float:
        """Replicas' worth of work in these token rates."""
        return (
            prompt_rate / self.prefill_tokens_per_second
            + output_rate / self.decode_tokens_per_second
        )


PRIORS = "priors"
"""The profile name that means none: the flat priors (to override a config's profile,
or to replay the priors, whose ``unitscale replay`` otherwise plans with the sim's)."""


def check_profile(name: str, custom: Collection[str] = ()) -> str:
    """``name`` when it is a known profile (built in or in ``custom``), or ``priors``.

    Raises:
        ValueError: naming the known ones.
    """
    if name not in PROFILES and name not in custom and name != PRIORS:
        known = sorted({*PROFILES, *custom})
        raise ValueError(f"expected a replica profile, one of {', '.join(known)}, or {PRIORS}")
    return name


def profile_of(p: Policy) -> str | None:
    """The profile ``p`` plans with; None for the priors (no profile, or ``priors``)."""
    return None if p.profile in (None, PRIORS) else p.profile


def profile_for(p: Policy) -> Profile | None:
    """The profile ``p`` plans with, its own (``Policy.profiles``) before the built-in ones.

    Raises:
        ValueError: ``p`` names a profile it does not carry, naming the known ones.
    """
    name = profile_of(p)
    if name is None:
        return None
    for own in p.profiles:
        if own.name == name:
            return own
    check_profile(name, [own.name for own in p.profiles])
    return PROFILES[name]


def observed_mix(o: Observation) -> Mix | None:
    """The mix over the stable window: the heavier of two readings, token by token.

    The engines' per-request histograms (``mean_prompt_tokens``, ``mean_output_tokens``)
    count finished requests only, so while load rises they read light (the short
    requests finish first); token rates over the finished-request rate read heavy then
    (vLLM counts prompts at prefill and tokens as generated) and light while load falls.
    Planning for the heavier reading keeps a start from being sized for its short
    requests (``bench/ablation.py``'s business day: 93.8% with the per-request means
    alone, 99.6% with the heavier, for 1% more cost).
    """
    prompt, output = o.mean_prompt_tokens, o.mean_output_tokens
    finished = (
        Mix(prompt, output)
        if prompt is not None and output is not None and prompt >= 1 and output >= 1
        else None
    )
    if o.request_rate is None or o.request_rate < MIN_REQUEST_RATE:
        return finished
    if o.prompt_token_rate is None or o.generation_token_rate is None:
        return finished
    rated = Mix(o.prompt_token_rate / o.request_rate, o.generation_token_rate / o.request_rate)
    if rated.prompt_tokens < 1 or rated.output_tokens < 1:
        # Under a token a request is no mix (a request rate too high, or prompts all
        # prefilled before the window): clamped up to 1, it was the lightest mix there
        # is and scaled a loaded deployment down. Unread, the last mix holds.
        return finished
    if finished is None:
        return rated
    return Mix(
        max(finished.prompt_tokens, rated.prompt_tokens),
        max(finished.output_tokens, rated.output_tokens),
    )


def replica_rates(p: Policy, mix: Mix | None, step_scale: float = 1.0) -> Rates:
    """What one replica carries under ``p`` for ``mix`` (priors without profile or mix).

    ``step_scale``: the profile's steps take this many times as long on these replicas
    (``scaler.core.fit``); quantised like the mix.
    """
    profile = profile_for(p)
    if profile is None or mix is None:
        rps = None
        if mix is not None:
            per_request = (
                mix.prompt_tokens / p.prefill_tokens_per_second
                + mix.output_tokens / p.decode_tokens_per_second
            )
            rps = 1.0 / per_request
        return Rates(p.prefill_tokens_per_second, p.decode_tokens_per_second, rps, "priors")
    # Replicas ``s`` times faster keep SLOs ``s`` times tighter at ``s`` times the rates:
    # the capacity on the profile's own time scale, sped up (``Policy.profile_speedup``).
    s = p.profile_speedup
    rates = _profile_rates(
        profile,
        _quantised(mix.prompt_tokens),
        _quantised(mix.output_tokens),
        p.slo_ttft_seconds * s,
        p.slo_itl_seconds * s,
        1.0 if step_scale == 1.0 else _quantised(step_scale * 1000.0) / 1000.0,
        CAPACITY_TAIL,
    )
    return rates if s == 1.0 else rates.sped_up(s)


def launched(profile: Profile | str, slo_itl_seconds: float) -> Profile:
    """``profile`` (or the built-in one so named) as vLLM is launched for the ITL SLO.

    As ``serving.vllm_profile.for_itl_slo`` launches its replicas.
    """
    if isinstance(profile, str):
        profile = PROFILES[profile]
    return profile.for_itl_slo(slo_itl_seconds)


# Keyed by the Profile's value (a frozen dataclass), not its name: a reloaded config
# that changes an SRE profile's numbers under the same name plans with the new ones.
@lru_cache(maxsize=4096)
def _profile_rates(
    given: Profile,
    prompt: float,
    output: float,
    ttft: float,
    itl: float,
    step_scale: float = 1.0,
    tail: float = 0.05,
) -> Rates:
    # Replicas run as ``serving.vllm_profile.for_itl_slo`` launches them: the chunked-
    # prefill budget whose steps keep the ITL SLO (the replay's fleet runs the same);
    # a fitted step scale slows its steps, not its launch flags.
    name = given.name
    profile = corrected(launched(given, itl), step_scale)
    capacity = replica_capacity(profile, prompt, output, ttft, itl, tail=tail)
    rates = capacity.scaler_rates()
    if capacity.requests_per_second <= 0:
        # Even an idle replica misses the SLO for this mix: plan as if one replica
        # carries its idle rate, never divide by zero (the reason says so).
        return Rates(1.0, 1.0, None, f"profile {name} (the SLO is out of reach for this mix)")
    return Rates(
        rates.prefill_tokens_per_second,
        rates.decode_tokens_per_second,
        capacity.requests_per_second,
        f"profile {name}",
    )


def _quantised(tokens: float) -> float:
    return round(math.exp(round(math.log(max(tokens, 1.0)) / _STEP) * _STEP), 1)
