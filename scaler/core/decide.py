"""Turn an observation into a replica count: SLO-, burst- and cost-aware, to zero and back.

Load is measured in *replicas' worth of work*: prompt tokens over a replica's prefill
capacity plus output tokens over its decode capacity (priors per model profile, scaled
by what is learned online), or requests in flight over the per-replica concurrency
target, whichever is larger. Then, in order:

1. **Activity.** Any arrival, buffered or in-flight request means active; after
   ``idle_grace_seconds`` of none at all, 0 replicas and inactive, unless the seasonal
   forecast expects traffic back within one horizon (``scaler.core.predictive``).
2. **Stable need** = load over the stable window / ``target_utilization``; with the
   **forecast** (linear trend over the lookback, ``forecast_horizon_seconds`` ahead,
   about one cold start) when it is higher.
3. **SLO feedback.** TTFT or inter-token p95 over target scales the need up by the
   breach ratio.
4. **Panic.** Short-window load needing ``panic_threshold`` x the ready replicas, or a
   panic-window TTFT over the SLO, starts panic: the short-window need wins and nothing
   scales down for ``panic_hold_seconds``.
5. **Cost guard.** Over the unit-cost budget while the SLO holds with margin: plan for
   ``cost_guard_utilization`` instead (fewer, fuller replicas).
6. **Steps.** Up at most ``max_scale_up_rate`` x (at least +1), down at most /
   ``max_scale_down_rate``, and down only after ``scale_down_delay_seconds`` below.
7. **Bounds.** ``min_replicas`` .. ``max_replicas``; at least 1 while active.

Missing signals never lower the count: a part of the load that is unknown keeps the
previous decision as the floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from foundation.errors import NoDataError
from foundation.replica_model import Profile
from scaler.core import predictive, risk
from scaler.core.capacity import Mix, Rates, launched, observed_mix, profile_for, replica_rates
from scaler.core.fit import StepFit, corrected, fit_step
from scaler.core.model import Decision, DecisionState, Observation, Policy
from scaler.core.window import Recent


@dataclass(frozen=True, slots=True)
class _Activity:
    """Whether anything is happening, and since when."""

    concurrency: float | None
    """Requests in flight (engines or gateway, the larger), None when neither is known."""
    busy: bool
    last_activity: float


@dataclass(frozen=True, slots=True)
class _Need:
    """Replicas' worth of work, and the replicas it asks for, before steps and bounds."""

    load: float | None
    load_panic: float | None
    forecast: float | None
    history: Recent[float]
    utilization: float
    need: float
    panic_until: float
    panicking: bool
    demand_history: Recent[float] = field(default_factory=Recent)


def decide(observation: Observation, policy: Policy, previous: DecisionState) -> Decision:
    """Return the replicas ``policy`` wants for ``observation``.

    Raises:
        NoDataError: neither engine nor gateway load was measured; the caller must not
            treat that as zero load.
    """
    o, p, now = observation, policy, observation.now
    activity = _activity(o, previous)
    # A sleeping replica is a pod, not capacity: it serves nothing until woken.
    ready = max((o.replicas_known or o.replicas_up or 0) - (o.replicas_sleeping or 0), 0)
    current = previous.desired if previous.desired is not None else ready

    # 1. Activity and scale to zero: only on a known-zero load, never on missing data.
    idle = not activity.busy and activity.concurrency is not None
    if idle and p.min_replicas == 0 and now - activity.last_activity >= p.idle_grace_seconds:
        zero = _scale_to_zero(previous, activity.last_activity, now, o.replicas_known)
        return predictive.at_zero(zero, p, previous.season, now)

    notes: list[str] = []
    # The mix the finishing requests show stands even while a backlog drains, though
    # the short ones get through first: holding the last one known instead kept a
    # stale mix through every backlog of Azure conversation x25 (SLO 92.5%, 98.1% with
    # this; the business day 89.3% against 87.6%), and at the first there is none.
    shown = observed_mix(o)
    mix = shown or (Mix(*previous.mix) if previous.mix else None)
    profile, step_fit, step_scale = profile_for(p), previous.step_fit, math.nan
    if profile is not None:
        # The profile is the capacity, its step times fitted to the replicas' own.
        scale = 1.0
        step_fit, step_scale = _fit_profile(o, p, profile, step_fit, notes)
        rates = replica_rates(p, mix, step_scale)
        need = _demand_need(o, p, previous, activity, rates, ready, current, notes)
    else:
        scale = _learn_capacity(o, p, previous.capacity_scale, ready, previous.desired == ready)
        need = _need(o, p, previous, activity, scale, ready, current, notes)

    # Within the idle grace period one replica stays, whatever the load says.
    recently_active = activity.busy or now - activity.last_activity < p.idle_grace_seconds
    floor = 1 if recently_active else 0
    wanted = max(math.ceil(need.need - 1e-9), floor)

    # Scale down no lower than the most needed within the window: bursts recur, and a
    # replica removed now costs a cold start when the next one comes.
    needs = previous.need_history.within(now, p.scale_down_window_seconds, closed=False)
    needs = needs.add(now, wanted)
    peak = max(needs.values())
    if peak > wanted:
        notes.append(f"window peak {peak}")
        wanted = peak

    # Unknown load (missing families) never lowers the count, nor does a replica that
    # did not answer the last scrape: its share of the load is unknown, not zero.
    if need.load is None and previous.desired is not None:
        wanted = max(wanted, previous.desired)
        notes.append("load unknown: holding")
    elif _replicas_missing(o) and previous.desired is not None and wanted < previous.desired:
        wanted = previous.desired
        notes.append("a replica did not answer its scrape: holding")

    wanted, low_since = _step(p, previous, wanted, current, floor, need.panicking, now, notes)
    desired = _bounded(p, wanted, recently_active, notes)
    if abs(scale - 1.0) > 0.05:
        notes.append(f"learned capacity x{scale:.2f}")
    seen = predictive.demand_seen(activity.busy, activity.concurrency is not None, need.need)
    season = predictive.learn(previous.season, now, seen, p)
    state = DecisionState(
        previous.decisions + 1,
        desired,
        need.panic_until,
        low_since,
        activity.last_activity,
        scale,
        need.history,
        needs,
        need.demand_history,
        (mix.prompt_tokens, mix.output_tokens) if mix else previous.mix,
        step_fit,
    )
    return Decision(
        desired,
        desired > 0,
        replace(state, season=season),
        _reason(need, desired, notes),
        {**_inputs(need, scale, activity), "step_scale": step_scale},
        need.panicking,
        o.replicas_known,
    )


def _activity(o: Observation, previous: DecisionState) -> _Activity:
    """In-flight requests and whether any request arrives, runs or waits.

    Raises:
        NoDataError: no load signal at all.
    """
    concurrency = _larger(
        _sum_known(o.queue_depth, o.requests_running),
        _sum_known(o.gateway_buffered, o.gateway_in_flight),
    )
    if concurrency is None and o.gateway_arrival_rate is None and o.prompt_token_rate is None:
        raise NoDataError("neither engine nor gateway load is known")
    arrivals = o.gateway_arrival_rate or 0.0
    busy = (concurrency or 0.0) > 0 or arrivals > 0 or (o.request_rate or 0.0) > 0
    return _Activity(concurrency, busy, o.now if busy else previous.last_activity)


def _fit_profile(
    o: Observation, p: Policy, profile: Profile, previous: StepFit, notes: list[str]
) -> tuple[StepFit, float]:
    """The step fit after ``o`` (``scaler.core.fit``) and the step scale to plan with.

    The fit is against the profile as the replicas run it: launched for the ITL SLO, at
    ``profile_speedup``. With ``profile_fit`` off it is still kept, so that turning it on
    needs no new evidence, and the profile plans unchanged.
    """
    speed = p.profile_speedup
    running = corrected(launched(profile, p.slo_itl_seconds * speed), 1.0 / speed)
    fit = fit_step(previous, o, running, o.now)
    if not p.profile_fit:
        return fit, 1.0
    note = fit.note()
    if note is not None:
        notes.append(note)
    return fit, fit.scale()


def _scale_to_zero(
    previous: DecisionState, last_activity: float, now: float, current: int | None
) -> Decision:
    state = DecisionState(
        previous.decisions + 1,
        0,
        previous.panic_until,
        None,
        last_activity,
        previous.capacity_scale,
        Recent(),
        demand_history=previous.demand_history,
        mix=previous.mix,
        step_fit=previous.step_fit,
    )
    since = "ever" if math.isinf(last_activity) else f"{now - last_activity:.0f}s"
    reason = f"idle for {since}: scale to zero"
    return Decision(0, False, state, reason, {"concurrency": 0.0}, current_replicas=current)


def _need(
    o: Observation,
    p: Policy,
    previous: DecisionState,
    activity: _Activity,
    scale: float,
    ready: int,
    current: int,
    notes: list[str],
) -> _Need:
    """Steps 2-5: stable need with the forecast and the short window, SLO, panic, cost."""
    now = o.now
    load = _load(o.prompt_token_rate, o.generation_token_rate, activity.concurrency, p, scale)
    load_panic = _load(
        o.prompt_token_rate_panic, o.generation_token_rate_panic, activity.concurrency, p, scale
    )
    history, forecast = _forecast_load(previous.load_history, load, p, now)
    utilization = _utilization(o, p, notes)

    # 2. Stable need, with the forecast.
    planned = max(v for v in (load, forecast, 0.0) if v is not None)
    need = planned / utilization
    if forecast is not None and load is not None and forecast > load * 1.05:
        notes.append(f"forecast {forecast:.1f} > load {load:.1f}")
    # Plan for the short window too: a burst must be absorbed within the TTFT SLO, long
    # before a cold start could help; the scale-down window then keeps that headroom
    # for as long as such bursts recur.
    if load_panic is not None and load_panic > planned:
        need = max(need, load_panic / utilization)
        notes.append(f"short-window load {load_panic:.1f}")

    # 3. SLO feedback.
    # Only a breach with queued requests at the engines says capacity is short; one
    # without (a slow cold start, long prompts) is not cured by more replicas.
    breach = max(
        (o.ttft_p95_seconds or 0.0) / p.slo_ttft_seconds,
        (o.inter_token_p95_seconds or 0.0) / p.slo_itl_seconds,
    )
    saturated = (o.queue_depth or 0.0) > 0.5 * max(ready, 1)
    if breach > 1.0 and ready > 0 and saturated and load is not None:
        need = max(need, load / utilization * min(breach, p.max_scale_up_rate))
        notes.append(f"SLO breached x{breach:.2f} with a queue")

    # 4. Panic.
    panic_need = (load_panic or 0.0) / p.target_utilization
    ttft_panic = (o.ttft_p95_panic_seconds or 0.0) > p.slo_ttft_seconds
    starts_panic = (ready > 0 and panic_need >= p.panic_threshold * ready) or (
        ttft_panic and saturated
    )
    panic_until = now + p.panic_hold_seconds if starts_panic else previous.panic_until
    panicking = now < panic_until
    if panicking:
        need = max(need, panic_need, float(current))
        notes.append("panic" if starts_panic else "panic hold")
    return _Need(load, load_panic, forecast, history, utilization, need, panic_until, panicking)


def _demand_need(
    o: Observation,
    p: Policy,
    previous: DecisionState,
    activity: _Activity,
    rates: Rates,
    ready: int,
    current: int,
    notes: list[str],
) -> _Need:
    """Steps 2-5 with a profile: demand, risk-sized headroom, backlog drain, panic.

    Load is *demand*: the gateway's arrival rate over the requests per second one
    replica sustains within the SLOs (served throughput when there is no gateway).
    Served throughput would read a draining backlog, or replicas coming up, as load.
    """
    now = o.now
    demand_now = None
    if o.gateway_arrival_rate is not None and rates.requests_per_second:
        demand_now = o.gateway_arrival_rate / rates.requests_per_second
    demands = previous.demand_history.within(now, p.risk_lookback_seconds)
    if demand_now is not None:
        demands = demands.add(now, demand_now)
    load = _demand_load(o, p, rates, activity, demands, demand_now, ready)
    history, forecast = _forecast_load(previous.load_history, load, p, now)
    utilization = _utilization(o, replace(p, target_utilization=p.profile_utilization), notes)
    planned = max(v for v in (load, forecast, 0.0) if v is not None)
    if forecast is not None and load is not None and forecast > load * 1.05:
        notes.append(f"forecast {forecast:.1f} > load {load:.1f}")
    headroom = 0.0
    if demands.age(now) >= p.forecast_horizon_seconds:
        headroom = risk.headroom(demands, p.forecast_horizon_seconds, p.risk_quantile)
        if headroom >= 0.05:
            notes.append(f"headroom {headroom:.1f}")
    need = (planned + headroom) / utilization
    extra = _backlog_extra(o, p, rates, ready, load)
    if extra > 0 and load is not None:
        need = max(need, (load + extra) / utilization)
        notes.append(f"backlog needs +{extra:.1f}")
    load_panic = demand_now
    if load_panic is None and o.gateway_arrival_rate is None:
        load_panic = _served(o, rates, panic=True)
    panic_need = (load_panic or 0.0) / utilization
    starts_panic = ready > 0 and panic_need >= p.panic_threshold * ready
    panic_until = now + p.panic_hold_seconds if starts_panic else previous.panic_until
    panicking = now < panic_until
    if panicking:
        need = max(need, panic_need, float(current))
        notes.append("panic" if starts_panic else "panic hold")
    return _Need(
        load, load_panic, forecast, history, utilization, need, panic_until, panicking, demands
    )


def _demand_load(
    o: Observation,
    p: Policy,
    rates: Rates,
    activity: _Activity,
    demands: Recent[float],
    demand_now: float | None,
    ready: int,
) -> float | None:
    """Demand over the stable window; served load, then concurrency, without a gateway.

    With a gateway but no mix yet (no request has finished on the ready replicas since
    they came up), demand is unknown, and the count holds: what they serve then is the
    backlog that waited for them, at full batch (the demo's first replica read 2.9
    replicas' worth and bought 4).
    """
    if demand_now is not None:
        stable = demands.within(o.now, p.demand_window_seconds)
        return sum(stable.values()) / len(stable)
    if o.gateway_arrival_rate is not None and ready > 0:
        return None
    served = _served(o, rates, panic=False)
    if served is not None:
        return served
    if activity.concurrency is not None:
        return activity.concurrency / p.target_concurrency
    return None


def _served(o: Observation, rates: Rates, *, panic: bool) -> float | None:
    """Replicas' worth of the token throughput served (stable or short window)."""
    prompt = o.prompt_token_rate_panic if panic else o.prompt_token_rate
    output = o.generation_token_rate_panic if panic else o.generation_token_rate
    if prompt is None or output is None:
        return None
    return rates.replicas(prompt, output)


def _backlog_extra(
    o: Observation, p: Policy, rates: Rates, ready: int, load: float | None
) -> float:
    """Replicas beyond the load a backlog needs: only what the ready ones cannot drain.

    The backlog (queued at the engines and buffered at the gateway) is work, in
    replica-seconds; the ready replicas' spare capacity drains it. Replicas started now
    serve only after a cold start (``forecast_horizon_seconds``), so what the spare
    drains by then asks for none: more cold replicas cannot drain it sooner (the
    demo's return from zero bought 7 replicas for a backlog its first two drained in
    well under a cold start). What is left then asks for the replicas that drain it
    within ``backlog_drain_seconds``: that work over the drain time, less the spare (the
    replay's startup backlog on the Azure conversation trace: 97.6% SLO with a 60 s
    drain, 98.1% with 20 s, same cost).
    """
    backlog = (o.queue_depth or 0.0) + (o.gateway_buffered or 0.0)
    if backlog <= 0 or not rates.requests_per_second or load is None:
        return 0.0
    spare = max(ready - load, 0.0)
    left = backlog / rates.requests_per_second - spare * p.forecast_horizon_seconds
    if left <= 0:
        return 0.0
    return max(left / max(p.backlog_drain_seconds, 1.0) - spare, 0.0)


def _forecast_load(
    previous: Recent[float], load: float | None, p: Policy, now: float
) -> tuple[Recent[float], float | None]:
    """The load history over the lookback, and the trend one horizon ahead."""
    history = previous.within(now, p.forecast_lookback_seconds)
    if load is not None:
        history = history.add(now, load)
    if load is None or not history or history.age(now) < p.forecast_lookback_seconds / 2:
        return history, None
    trend = _forecast(history.samples, now + p.forecast_horizon_seconds)
    # a short, noisy history must not multiply the load: at most double it
    return history, None if trend is None else min(trend, 2 * load + 1)


def _utilization(o: Observation, p: Policy, notes: list[str]) -> float:
    """5. The share of a replica to plan for: fuller when over the cost budget."""
    cost_guard = (
        p.cost_budget_per_million_tokens is not None
        and o.cost_per_million_tokens is not None
        and o.cost_per_million_tokens > p.cost_budget_per_million_tokens
        and _slo_margin(o, p) >= 0.3
    )
    if not cost_guard:
        return p.target_utilization
    utilization = max(p.target_utilization, p.cost_guard_utilization)
    notes.append(
        f"cost ${o.cost_per_million_tokens:.3f}/1M over budget: plan {utilization:.0%} full"
    )
    return utilization


def _step(
    p: Policy,
    previous: DecisionState,
    wanted: int,
    current: int,
    floor: int,
    panicking: bool,
    now: float,
    notes: list[str],
) -> tuple[int, float | None]:
    """6. Bounded steps and the scale-down delay; returns replicas and ``low_since``."""
    low_since = previous.low_since
    first = previous.desired is None
    if first and wanted < current:
        # A restarted scaler has no history: it never scales down on its first look.
        notes.append("first decision: not scaling down")
        return current, now
    if first:
        return wanted, low_since  # nor does it hold back a scale-up the load asks for
    if current > 0 and wanted > current:
        return min(wanted, max(current + 1, math.ceil(current * p.max_scale_up_rate))), None
    if wanted < current:
        low_since = now if low_since is None else low_since
        if panicking or now - low_since < p.scale_down_delay_seconds:
            notes.append(f"holding {current} (below for {now - low_since:.0f}s)")
            return current, low_since
        return max(wanted, math.floor(current / p.max_scale_down_rate), floor), low_since
    return wanted, None


def _bounded(p: Policy, wanted: int, recently_active: bool, notes: list[str]) -> int:
    """7. ``min_replicas`` .. ``max_replicas``; at least 1 while recently active."""
    desired = min(max(wanted, p.min_replicas), p.max_replicas)
    if recently_active and desired == 0:
        desired = min(1, p.max_replicas)
    if desired != wanted:
        notes.append(f"held at {'min' if desired > wanted else 'max'} {desired}")
    return desired


def _reason(need: _Need, desired: int, notes: list[str]) -> str:
    reason = f"load {need.load:.2f} replicas" if need.load is not None else "load unknown"
    reason += f", need {need.need:.2f} at {need.utilization:.0%} -> {desired}"
    return reason + (" (" + "; ".join(notes) + ")" if notes else "")


def _inputs(need: _Need, scale: float, activity: _Activity) -> dict[str, float]:
    """The numbers the reason refers to (NaN where unknown), for logs and metrics."""

    def known(value: float | None) -> float:
        return value if value is not None else math.nan

    return {
        "load": known(need.load),
        "load_panic": known(need.load_panic),
        "forecast": known(need.forecast),
        "capacity_scale": scale,
        "need": need.need,
        "concurrency": known(activity.concurrency),
    }


def _load(
    prompt_rate: float | None,
    generation_rate: float | None,
    concurrency: float | None,
    p: Policy,
    scale: float,
) -> float | None:
    """Replicas' worth of work: token throughput over capacity.

    In-flight requests over the per-replica target stand in when token rates are not
    known yet (at zero, right after a restart). A queue that forms while replicas start
    is backlog, not steady load: counting it as load would buy a replica per queued
    request, so once token rates are known it only drives panic (see ``decide``).
    """
    if prompt_rate is not None and generation_rate is not None:
        return (
            prompt_rate / p.prefill_tokens_per_second + generation_rate / p.decode_tokens_per_second
        ) / scale
    if concurrency is not None:
        return concurrency / p.target_concurrency
    return None


def _learn_capacity(
    o: Observation, p: Policy, scale: float, ready: int, stable_fleet: bool
) -> float:
    """Nudge the capacity scale toward what saturated replicas actually deliver.

    Only a fleet that has kept its size can be judged (window rates over a changing
    replica count would divide old throughput by new replicas). Saturated (more than
    one queued request per replica and a short-window TTFT over the SLO): short-window
    token throughput per replica is the capacity, and the scale moves 10% of the way
    to it. Healthy while carrying more than the priors say: capacity is at least that.
    Bounded to 0.5-2x the priors.
    """
    if ready <= 0 or not stable_fleet:
        return scale
    prompt, output = o.prompt_token_rate_panic, o.generation_token_rate_panic
    if prompt is None or output is None:
        return scale
    delivered = (prompt / p.prefill_tokens_per_second + output / p.decode_tokens_per_second) / ready
    if delivered <= 0.05:
        return scale
    saturated = (o.queue_depth or 0.0) > ready and (
        o.ttft_p95_panic_seconds or 0.0
    ) > p.slo_ttft_seconds
    healthy = _slo_margin(o, p) > 0 and (o.queue_depth or 0.0) <= 0.1 * ready
    if saturated or (healthy and delivered > scale):
        scale += 0.1 * (delivered - scale)
    return min(max(scale, 0.5), 2.0)


def _slo_margin(o: Observation, p: Policy) -> float:
    """1 - the worse of TTFT and ITL p95 over their targets (unknown counts as 0 margin)."""
    if o.ttft_p95_seconds is None or o.inter_token_p95_seconds is None:
        return 0.0
    return 1.0 - max(
        o.ttft_p95_seconds / p.slo_ttft_seconds, o.inter_token_p95_seconds / p.slo_itl_seconds
    )


def _forecast(history: tuple[tuple[float, float], ...], at: float) -> float | None:
    """Least-squares line through the load history, evaluated at ``at`` (never below 0)."""
    if len(history) < 4:
        return None
    n = len(history)
    mean_t = sum(t for t, _ in history) / n
    mean_v = sum(v for _, v in history) / n
    var = sum((t - mean_t) ** 2 for t, _ in history)
    if var <= 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in history) / var
    return max(0.0, mean_v + slope * (at - mean_t))


def _replicas_missing(o: Observation) -> bool:
    """Some replica the exporter knows of did not answer its last scrape."""
    known, up = o.replicas_known, o.replicas_up
    return known is not None and up is not None and up < known


def _sum_known(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return float(sum(known)) if known else None


def _larger(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
