"""The demo's own workload: a seeded, documented request trace with an idle stretch.

One shape, stretched to any length ``L`` (seconds of trace time), so that a short CI
run and the default three-minute demo see the same story:

===============  ===========================================  =============================
share of ``L``   arrival rate (requests/s, Poisson)             what it exercises
===============  ===========================================  =============================
0.00 - 0.05      0.3 x base                                     activation from zero
0.05 - 0.25      ramps 0.3 x base -> base                       forecast-led scale-up
0.25 - 0.32      base                                           steady state
0.32 - 0.40      burst (``burst_rate``)                         panic mode
0.40 - 0.50      ramps base -> 0                                scale-down, its delays
0.50 - 0.72      none                                           idle grace, scale to zero
0.72 - 1.00      0.8 x base at once                             buffering at zero, push
===============  ===========================================  =============================

Prompt and output lengths are log-normal (medians 1,500 and 250 tokens, sigma 0.7,
clipped to 32-8,000 and 16-1,500), about the Azure conversation trace's medians.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.trace import Trace
from replay.workloads import lognormal_lengths, thinned_arrivals

# (start, end, rate at start, rate at end) as shares of the length and of the base rate;
# None stands for the burst rate.
_PHASES: tuple[tuple[float, float, float | None, float | None], ...] = (
    (0.00, 0.05, 0.3, 0.3),
    (0.05, 0.25, 0.3, 1.0),
    (0.25, 0.32, 1.0, 1.0),
    (0.32, 0.40, None, None),
    (0.40, 0.50, 1.0, 0.0),
    (0.50, 0.72, 0.0, 0.0),
    (0.72, 1.00, 0.8, 0.8),
)
IDLE = (0.50, 0.72)
"""The idle stretch, as shares of the length."""


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """The generator's knobs; the defaults are the demo's."""

    length: float = 3600.0
    """Seconds of trace time."""
    base_rate: float = 1.5
    """Requests per second (trace time) in the steady phase."""
    burst_rate: float = 4.0
    prompt_median: float = 1500.0
    output_median: float = 250.0
    sigma: float = 0.7
    prompt_range: tuple[int, int] = (32, 8000)
    output_range: tuple[int, int] = (16, 1500)


def rate_at(t: float, shape: WorkloadShape) -> float:
    """Arrival rate (requests/s) at ``t`` seconds of trace time."""
    share = t / shape.length
    for start, end, first, last in _PHASES:
        if start <= share < end:
            if first is None or last is None:
                return shape.burst_rate
            progress = (share - start) / (end - start)
            return shape.base_rate * (first + (last - first) * progress)
    return 0.0


def generate(shape: WorkloadShape, seed: int = 0) -> Trace:
    """A Poisson trace with ``rate_at``'s shape (thinning), reproducible for a seed."""
    rng = np.random.default_rng(seed)
    peak = max(shape.base_rate, shape.burst_rate)
    arrival = thinned_arrivals(
        rng, lambda times: np.array([rate_at(t, shape) for t in times]), peak, shape.length
    )
    n = len(arrival)
    prompt = lognormal_lengths(rng, shape.prompt_median, shape.sigma, shape.prompt_range, n)
    output = lognormal_lengths(rng, shape.output_median, shape.sigma, shape.output_range, n)
    return Trace("unitscale-demo", arrival, prompt, output)


def lead_in(trace: Trace, seconds: float) -> Trace:
    """``trace`` ``seconds`` later, after one request of its first one's size at 0.

    A Deployment that served before: the lead-in request starts the first replica and,
    with standby, the sleepers the plan holds; by the time the workload begins the
    replica has idled back to zero and the sleepers are still held (``seconds`` longer
    than a start, the idle grace, KEDA's cooldown and the HPA's stabilization). The
    workload's activation from zero then wakes a sleeper, as in production, instead of
    waiting out a first start that no long-running service pays. Example: arrivals
    (0, 5) with 300 s of lead-in are (0, 300, 305).

    Raises:
        ValueError: an empty trace, or ``seconds`` not positive and finite.
    """
    if not len(trace) or not 0 < seconds < float("inf"):
        raise ValueError(f"a lead-in needs requests and 0 < seconds < inf, got {seconds!r}")
    return Trace(
        trace.name,
        np.r_[0.0, trace.arrival + seconds],
        np.r_[trace.prompt[:1], trace.prompt],
        np.r_[trace.output[:1], trace.output],
    )
