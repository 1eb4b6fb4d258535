"""Turn an observation into a replica count.

This is the placeholder the decision-core issue replaces: concurrency-based, like
Knative's KPA without windows. Its signature is the contract every caller uses
(the gRPC service, replay, the demo), so the replacement changes no caller.
"""

from __future__ import annotations

import math

from scaler.core.model import Decision, DecisionState, Observation, Policy
from unitscale.errors import NoDataError


def decide(observation: Observation, policy: Policy, previous: DecisionState) -> Decision:
    """Return the replicas ``policy`` wants for ``observation``.

    Demand is requests in flight: the engine's running plus queued requests, or the
    gateway's buffered plus in-flight requests, whichever is larger (the gateway sees
    requests the engines have not yet accepted). Each replica should hold
    ``policy.target_concurrency`` of them: 40 in flight at 16 per replica -> 3.

    Raises:
        NoDataError: neither engine nor gateway concurrency was measured; the caller
            must not treat that as zero load.
    """
    engine = _sum_known(observation.queue_depth, observation.requests_running)
    gateway = _sum_known(observation.gateway_buffered, observation.gateway_in_flight)
    if engine is None and gateway is None:
        raise NoDataError("neither engine nor gateway concurrency is known")
    demand = max(v for v in (engine, gateway) if v is not None)
    arrivals = observation.gateway_arrival_rate or 0.0

    wanted = math.ceil(demand / policy.target_concurrency - 1e-9)
    if wanted == 0 and arrivals > 0:
        wanted = 1  # requests are arriving: one replica, even before any is in flight
    desired = min(max(wanted, policy.min_replicas), policy.max_replicas)

    if desired == wanted:
        reason = f"{demand:g} in flight / {policy.target_concurrency:g} per replica -> {desired}"
    else:
        bound = "min" if desired > wanted else "max"
        reason = (
            f"{demand:g} in flight / {policy.target_concurrency:g} per replica"
            f" -> {wanted}, held at {bound} {desired}"
        )
    return Decision(
        desired_replicas=desired,
        active=desired > 0,
        state=DecisionState(decisions=previous.decisions + 1),
        reason=reason,
        inputs={"demand": demand, "arrival_rate": arrivals},
    )


def _sum_known(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return float(sum(known)) if known else None
