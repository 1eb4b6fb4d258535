"""Predictive prewarm: the seasonal forecast (``scaler.core.seasonal``) in the decision.

Every decision teaches the forecast what it saw: the replicas needed while requests
arrive, run or wait, 0 while none do, nothing when the load is not known (a missing
signal is never an idle slot). Only the decision at zero asks it, for a confident
*return* of traffic (a slot busy on most days after one that is not):

- **prewarm** from ``seasonal_prewarm_lead_seconds`` before the expected return: the
  decision carries ``prewarm_forecast`` (the replicas expected), on which the
  Fluid prewarm (``scaler.prewarm.plan``) warms the cache while still at zero;
- **first replica** (``seasonal_floor``) from ``forecast_horizon_seconds`` (about one cold
  start) before it: the decision holds the replicas the forecast expects (at least 1),
  active, its reason ``forecast: traffic expected at HH:MM (confidence x, ...)``.

Both last until ``idle_grace_seconds`` after the expected time; traffic that has not
come by then releases them (the forecast was wrong today, and learns so). Pure.
"""

from __future__ import annotations

import math
from dataclasses import replace

from scaler.core.model import Decision, Policy
from scaler.core.seasonal import SeasonalPolicy, SeasonalState, expected_return, observe


def seasonal_policy(p: Policy) -> SeasonalPolicy:
    """The forecast's settings from the decision policy's."""
    return SeasonalPolicy(
        day_seconds=p.seasonal_day_seconds,
        utc_offset_seconds=p.seasonal_utc_offset_hours * 3600.0,
    )


def demand_seen(busy: bool, load_known: bool, need: float) -> float | None:
    """What a decision tells the forecast: ``need`` while busy, 0 idle, None unknown.

    A busy moment needs a replica, whatever its load says yet: the first request after
    idle comes before any rate has been measured (need 0), and is the return itself.
    """
    if busy:
        return max(need, 1.0)
    return 0.0 if load_known else None


def learn(season: SeasonalState, now: float, demand: float | None, p: Policy) -> SeasonalState:
    """``season`` with one more decision's ``demand_seen``."""
    return observe(season, now, demand, seasonal_policy(p))


def at_zero(decision: Decision, p: Policy, season: SeasonalState, now: float) -> Decision:
    """A scale-to-zero ``decision`` after the forecast has seen it: prewarm, first replica.

    ``season`` is the previous decision's; the idle moment is folded in (a known 0).
    """
    sp = seasonal_policy(p)
    learned = observe(season, now, 0.0, sp)
    decision = replace(decision, state=replace(decision.state, season=learned))
    floor_lead = p.forecast_horizon_seconds if p.seasonal_floor else 0.0
    lead = max(p.seasonal_prewarm_lead_seconds, floor_lead)
    if lead <= 0:
        return decision
    forecast = expected_return(learned, now, lead, p.idle_grace_seconds, sp)
    if not forecast.confident or forecast.expected_at is None or not forecast.peak:
        return decision
    until = forecast.expected_at - now
    prewarm = 0 < p.seasonal_prewarm_lead_seconds and until <= p.seasonal_prewarm_lead_seconds
    expected = forecast.peak if prewarm else None
    if p.seasonal_floor and until <= floor_lead:
        wanted = min(max(1, math.ceil(forecast.peak - 1e-9), p.min_replicas), p.max_replicas)
        return Decision(
            wanted,
            True,
            replace(decision.state, desired=wanted, asked=decision.state.changed_to(now, wanted)),
            f"forecast: {forecast.reason}: {wanted} started ahead of it",
            decision.inputs,
            current_replicas=decision.current_replicas,
            prewarm_forecast=expected,
        )
    if not prewarm:
        return decision
    reason = f"{decision.reason} (forecast: {forecast.reason}: prewarm)"
    return replace(decision, reason=reason, prewarm_forecast=expected)
