"""Burst headroom sized from risk: how much demand rose within one horizon, lately.

``headroom`` looks at the demand samples of the lookback and, for each one, at the
largest rise above it within ``horizon`` seconds after it (about one cold start: what
can arrive before a replica started now could serve). A high quantile of those rises is
the standing headroom: smooth traffic keeps little, bursty traffic keeps what its
bursts needed. Worked numbers: demand 4, 4, 10, 4 replicas one every 30 s, horizon
60 s: the rises are 6, 6, 0, 0; their 95th percentile (the highest of four) is 6.
"""

from __future__ import annotations

from scaler.core.window import Recent


def rises(history: Recent[float], horizon: float) -> list[float]:
    """For each sample, the largest rise above it within ``horizon`` after it (>= 0)."""
    samples = history.samples
    out = []
    for i, (t, value) in enumerate(samples):
        peak = value
        for later, other in samples[i + 1 :]:
            if later - t > horizon:
                break
            peak = max(peak, other)
        out.append(peak - value)
    return out


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank, upper) of ``values``; 0 with none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def headroom(history: Recent[float], horizon: float, q: float) -> float:
    """The ``q`` quantile of the rises within ``horizon`` in ``history``."""
    return quantile(rises(history, horizon), q)
