"""The metric value that makes the HPA land on the replicas ``decide`` wants.

The HPA (AverageValue, target 1) scales to ``ceil(value)``, but only when
``value / current`` is more than its tolerance (10%) away from 1. So:

================================  ===========================  ==========================
case                              value                        HPA result
================================  ===========================  ==========================
change beyond the tolerance       desired                      desired
up, within it (20 -> 21)          current x 1.1 + 0.002        ceil(22.002) = 23: up by
                                                               the least the HPA allows
down, within it, reachable        current x 0.9 - 0.002        10 -> ceil(8.998) = 9
(10 -> 9)
down, within it, not reachable    current                      no change: never below
(20 -> 19: 20 x 0.9 = 18)                                      what decide wants
no current count known            desired                      ceil(desired)
================================  ===========================  ==========================

0.002 clears KEDA's milli-precision rounding of the value.
"""

from __future__ import annotations

import math

MARGIN = 0.002


def within_tolerance(ratio: float, tolerance: float = 0.1) -> bool:
    """Whether the HPA leaves the count alone at ``ratio`` (value over current x target).

    The HPA's own comparison (``Tolerances.isWithin``, Kubernetes 1.33+): the bounds are
    inclusive as floats, so 11 / 10 (1.1 == 1.0 + 0.1) is within, where
    ``abs(1 - 1.1) <= 0.1`` would say beyond (it is 0.10000000000000009).
    """
    return 1.0 - tolerance <= ratio <= 1.0 + tolerance


def metric_for(desired: int, current: int | None, tolerance: float = 0.1) -> float:
    """The GetMetrics value for ``desired`` replicas when the HPA has ``current``."""
    if not current or desired == current or desired == 0:
        return float(desired)
    if not within_tolerance(desired / current, tolerance):
        return float(desired)
    if desired > current:
        return current * (1.0 + tolerance) + MARGIN
    lower = current * (1.0 - tolerance) - MARGIN
    return lower if math.ceil(lower) >= desired else float(current)
