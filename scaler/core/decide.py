"""Turn an observation into a replica count: one pipeline of named stages, steered by the SLO.

Load is measured in *replicas' worth of work*: demand (arrivals x the work per request)
over what one replica carries within the SLOs. Each stage is a small pure function:

1. **Activity** (``_activity``). Any arrival, buffered or in-flight request, finished
   request or token served means active; after ``idle_grace_seconds`` of none at all,
   every part of it measured, 0 replicas and inactive, unless the seasonal forecast
   expects traffic back within one horizon (``scaler.core.predictive``). Quiet that is
   not all measured (a gauge unknown, a replica not answering) and a restarted scaler's
   first look count as activity: neither starts the idle grace.
2. **Capacity** (``_capacity``): what one replica carries for the observed mix. With a
   profile, the request rate at which it keeps the SLOs (``scaler.core.capacity``, its
   step times fitted online, ``scaler.core.fit``); without, the priors' token rates,
   scaled by what saturated replicas were seen to deliver (``_learn_capacity``).
3. **Demand** (``_demand``): the gateway's arrivals over that capacity, the larger of
   the ``demand_window_seconds`` mean and the short window, so a burst asks for its
   replicas at once and a fall waits for the stable window; served token throughput
   without a gateway; requests in flight over ``target_concurrency`` when no rate is
   known.
4. **Plan** (``_plan``): demand over the utilization planned for (``profile_utilization``
   with a profile, else ``target_utilization``); a backlog
   the ready replicas would not drain in time asks for more. Without the gateway's
   judgement, an engine p95 over the SLO with a queue stands in for it.
5. **Headroom** (``scaler.core.attainment``): the need times ``1 + headroom``, the
   headroom steered by the share of requests the gateway saw within the SLO; misses
   while replicas start, or soon after the load outran the count asked, move nothing.
6. **Hold**: no lower than the most needed within ``scale_down_window_seconds``; an
   unknown load or an unanswered scrape never lowers the count.
7. **First look** (``_first_look``): a scaler with no history never scales down; the
   pace of each step is the HPA's (the ScaledObject's ``behavior``), not the scaler's.
8. **Bounds** (``_bounded``): ``min_replicas`` .. ``max_replicas``; at least 1 while
   recently active.

Missing signals never lower the count: a part of the load that is unknown keeps the
previous decision as the floor. What each stage buys, trace by trace, is
``bench/ablation.py``'s table; a linear trend forecast, a panic mode, a scale-down delay,
the scaler's own step limits and a cost guard were removed when it showed they cost more
than they bought, or nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from foundation.errors import NoDataError
from foundation.replica_model import Profile
from scaler.core import attainment, predictive
from scaler.core.capacity import (
    Mix,
    Rates,
    launched,
    observed_mix,
    profile_for,
    profile_of,
    replica_rates,
)
from scaler.core.fit import MIN_EVIDENCE_SECONDS, StepFit, corrected, fit_step
from scaler.core.model import Decision, DecisionState, Observation, Policy
from scaler.core.window import Recent

BREACH_MAX = 2.0
"""Without a gateway, an engine p95 over the SLO asks for at most this many times the
load's replicas: the stand-in is coarse."""
STARTING_SECONDS = 900.0
"""Ready replicas short of the count asked for are starting (the attainment loop waits
for them) while no fewer are ready than the least count asked within this long: a new
node and a 70B model's weights take about 9 minutes. A pod never ready (a crash loop on
one node) had held the headroom at 0 for good (hostile pass 36); timed from the start of
the shortfall instead, a ramp's cold starts bought headroom to its maximum (pass 38)."""

SHORTFALL_WINDOWS = 2
"""With a burst tier (``Policy.burst_tier``), the gateway's windows after the load outran
the count asked for in which its misses are the shortfall's: a request judged as it
finishes, one that waited through the burst is counted up to a window after it. Read as
the profile's, the business day's 10:00 spike (twice the load for 15 s, 487 misses) took
the headroom to 82%: a load of 5 replicas held 10 until the lunch peak, whose 16 then
asked 23 (default knobs, day 3). Without a tier, headroom is all that absorbs a burst and
the loop rises as ever (Azure code x10 left that way: 87.8% against 90.6%, for 11% less)."""


@dataclass(frozen=True, slots=True)
class _Activity:
    """Whether anything is happening, and since when."""

    concurrency: float | None
    """Requests in flight (engines or gateway, the larger), None when neither is known
    whole: a queue known beside running unknown is no count of what is in flight."""
    busy: bool
    last_activity: float
    at_least: float | None = None
    """The known parts of what is in flight: a lower bound where ``concurrency`` is None."""
    measured: bool = True
    """Every part of the load is measured (each source's in-flight counts, the gateway's
    arrivals, every replica answering): only then may a quiet observation be idle."""


@dataclass(frozen=True, slots=True)
class _Capacity:
    """What one replica carries, and the state its estimate carries on."""

    rates: Rates
    step_fit: StepFit
    step_scale: float
    """With a profile: its fitted step scale planned with; NaN without one."""
    scale: float
    """Without a profile: the learned capacity over the priors; 1.0 with one."""
    verifying: bool = False
    """The profile fit is measuring the replicas but has too little evidence yet to say
    whether the profile holds: a scale-down on it waits (``_held``)."""


@dataclass(frozen=True, slots=True)
class _Demand:
    """Replicas' worth of demand in both windows, and the samples behind it."""

    load: float | None
    """The larger of the stable window's and the short window's; None when unknown."""
    short: float | None
    history: Recent[float]
    """Demand samples (arrivals x work per request) over ``demand_window_seconds``."""
    lower_bound: str | None = None
    """Why ``load`` is only a lower bound (the known parts of what is in flight, or
    what engines with a queue serve): it may raise the count, never lower it."""
    in_flight: bool = False
    """``load`` is what is in flight, the backlog with it: no backlog term on top."""
    start: bool = False
    """``load`` is requests buffered while no replica serves and no mix is known: it
    starts replicas, but no window keeps it (the buffer grows with the cold start, not
    the load: 1,000 buffered at 60 a second held 90 replicas for 20 minutes where 12
    carried the load, hostile pass 40)."""


@dataclass(frozen=True, slots=True)
class _Need:
    """The replicas the demand asks for before headroom, hold, steps and bounds."""

    demand: _Demand
    utilization: float
    need: float


def decide(observation: Observation, policy: Policy, previous: DecisionState) -> Decision:
    """Return the replicas ``policy`` wants for ``observation``.

    Raises:
        NoDataError: neither engine nor gateway load was measured, or a restarted
            scaler's first look has the engines without a replica count (it could not
            tell a scale-down); the caller must not treat that as zero load.
    """
    o, p, now = observation, policy, observation.now
    activity = _activity(o, previous)
    if previous.desired is None and (
        o.replicas_uncounted or (not _counted(o) and (o.gateway_in_flight or 0) > 0)
    ):
        # The count standing in (the replicas up) is a lower bound, not the fleet; with
        # the gateway's signals alone (the exporter's not in yet, or stale), requests in
        # flight show replicas no one counted: read as none, a restarted scaler cut ten
        # to four (hostile pass 35). Nothing in flight is an activation, and decides.
        raise NoDataError("the engines' replica count is unknown on a first look")
    # A sleeping replica is a pod, not capacity: it serves nothing until woken.
    ready = max(_replica_count(o) - (o.replicas_sleeping or 0), 0)

    # 1. Activity and scale to zero: only on a known-zero load, never on missing data.
    idle = not activity.busy and activity.measured
    if idle and p.min_replicas == 0 and now - activity.last_activity >= p.idle_grace_seconds:
        zero = _scale_to_zero(previous, activity.last_activity, now, o.replicas_known)
        return predictive.at_zero(zero, p, previous.season, now)

    notes: list[str] = []
    # The mix the finishing requests show stands even while a backlog drains, though
    # the short ones get through first: holding the last one known instead kept a
    # stale mix through every backlog of Azure conversation x25 (SLO 92.5%, 98.1% with
    # this; the business day 89.3% against 87.6%), and at the first there is none.
    mix = observed_mix(o) or (Mix(*previous.mix) if previous.mix else None)
    capacity = _capacity(o, p, previous, mix, ready, notes)
    demand = _demand(o, p, previous, activity, capacity.rates, ready)
    need = _plan(o, p, demand, capacity.rates, ready, notes)

    # 5. Headroom, steered by attainment.
    asked = previous.asked.within(now, STARTING_SECONDS)
    # A first look knows no count asked for: misses then (a restart mid cold start) are
    # no capacity's, and the replicas ready are the count that stood (pass 40: 15 to 30).
    starting = previous.desired is None or (
        _counted(o) and min([*asked.values(), previous.desired]) <= ready < previous.desired
    )
    # The load outran the count asked for (a burst, before the fleet or its sleepers
    # caught up): the gateway's windows that follow hold that shortfall's misses, which
    # the burst tier's wakes are there for. The count asked, not the replicas ready: a
    # pod never ready kept every load past the ready ones, and the loop never rose.
    outran = (
        now
        if previous.desired is not None
        and demand.load is not None
        and demand.load / need.utilization > previous.desired
        else previous.outran
    )
    steering = _steering(p)
    short = p.burst_tier and now - outran < SHORTFALL_WINDOWS * steering.rise_interval_seconds
    move = attainment.steer(
        previous.headroom, o.slo_within_rate, o.slo_outside_rate, now, steering, starting or short
    )
    if move.reason is not None:
        notes.append(move.reason)
    elif move.headroom.value >= 0.05:
        notes.append(f"headroom {move.headroom.value:.0%}")
    recently_active = activity.busy or now - activity.last_activity < p.idle_grace_seconds
    floor = 1 if recently_active else 0  # within the idle grace one replica stays
    wanted = max(math.ceil(need.need * (1.0 + move.headroom.value) - 1e-9), floor)

    # 6. Hold.
    wanted, needs = _held(o, p, previous, need, capacity, wanted, notes)
    # 7-8. First look and bounds.
    wanted = _first_look(previous, wanted, ready, notes)
    desired = _bounded(p, wanted, recently_active, notes)
    seen = predictive.demand_seen(activity.busy, activity.concurrency is not None, need.need)
    state = replace(
        previous,
        decisions=previous.decisions + 1,
        desired=desired,
        last_activity=activity.last_activity,
        capacity_scale=capacity.scale,
        need_history=needs,
        demand_history=demand.history,
        mix=(mix.prompt_tokens, mix.output_tokens) if mix else previous.mix,
        step_fit=capacity.step_fit,
        season=predictive.learn(previous.season, now, seen, p),
        headroom=move.headroom,
        outran=outran,
        # Kept as it changes: a window of every decision would hold thousands.
        asked=replace(
            previous, asked=asked, desired=ready if previous.desired is None else previous.desired
        ).changed_to(now, desired),
    )
    inputs = {**_inputs(need, capacity, activity), **_steered(move)}
    return Decision(
        desired, desired > 0, state, _reason(need, desired, notes), inputs, o.replicas_known
    )


def _capacity(
    o: Observation,
    p: Policy,
    previous: DecisionState,
    mix: Mix | None,
    ready: int,
    notes: list[str],
) -> _Capacity:
    """2. One replica's capacity: the fitted profile's, or the priors' as learned."""
    profile = profile_for(p)
    if profile is not None:
        step_fit, step_scale = _fit_profile(o, p, profile, previous.step_fit, notes)
        measured = step_fit.evidence > previous.step_fit.evidence
        verifying = p.profile_fit and measured and step_fit.evidence < MIN_EVIDENCE_SECONDS
        rates = replica_rates(p, mix, step_scale)
        return _Capacity(rates, step_fit, step_scale, 1.0, verifying)
    stable_fleet = previous.desired == ready
    scale = _learn_capacity(o, p, previous.capacity_scale, ready, stable_fleet)
    if abs(scale - 1.0) > 0.05:
        notes.append(f"learned capacity x{scale:.2f}")
    # A learned scale is replicas that carry ``scale`` times the priors' work.
    rates = replica_rates(p, mix).sped_up(scale)
    return _Capacity(rates, previous.step_fit, math.nan, scale)


def _demand(
    o: Observation,
    p: Policy,
    previous: DecisionState,
    activity: _Activity,
    rates: Rates,
    ready: int,
) -> _Demand:
    """3. Demand in replicas: the gateway's arrivals, else served throughput, else in flight.

    Arrivals, not served throughput: that reads a draining backlog, or replicas coming
    up, as load. With a gateway but no mix yet (no request has finished on the ready
    replicas since they came up), demand is unknown and the count holds: what they serve
    then is the backlog that waited for them, at full batch (the demo's first replica
    read 2.9 replicas' worth and bought 4).
    """
    now = o.now
    demands = previous.demand_history.within(now, p.demand_window_seconds)
    if o.gateway_arrival_rate is not None and rates.requests_per_second:
        short = o.gateway_arrival_rate / rates.requests_per_second
        demands = demands.add(now, short)
        mean = sum(demands.values()) / len(demands)
        return _Demand(max(mean, short), short, demands)
    if o.gateway_arrival_rate is not None and ready > 0:
        return _Demand(None, None, demands)
    served = _served(o, rates, panic=False)
    if served == 0.0 and (_sum_known(o.queue_depth, o.requests_running) or 0.0) > 0:
        # Requests at the engines and no token served the whole window: they stall, or
        # count tokens only as requests finish (SGLang), so what they served is no
        # measure of the demand and what is in flight is. Read as the demand, the 0
        # took four replicas to one with 56 requests waiting (hostile pass 33). Only
        # the engines': requests buffered at zero replicas are the activation's.
        served = None
    if served is not None:
        quick = _served(o, rates, panic=True)
        # Engines with requests waiting serve what they can, not what is asked: a trickle
        # (SGLang counts a request's tokens as it finishes; three replicas of four hung)
        # took a fleet to 1 with 428 requests in flight (hostile pass 35).
        waiting = "requests waiting at the engines" if _saturated(o, p, ready) else None
        load = served if quick is None else max(served, quick)
        return _Demand(load, quick, demands, lower_bound=waiting)
    if activity.concurrency is not None:
        start = ready == 0 and o.gateway_arrival_rate is not None
        load = activity.concurrency / p.target_concurrency
        # Throughput unknown because some replica's part is (a counter NaN, missing, or
        # fallen twice in the window): what is in flight is a floor, not the load. Read
        # as the load, one replica's unknown counter took ten busy replicas of short
        # requests to one (hostile pass 65).
        partly = "throughput partly unknown" if o.engine_partial and ready > 0 else None
        return _Demand(load, None, demands, lower_bound=partly, in_flight=True, start=start)
    if activity.at_least is not None:  # running known, queue not: at least that much
        at_least = activity.at_least / p.target_concurrency
        partly = "load partly unknown"
        return _Demand(at_least, None, demands, lower_bound=partly, in_flight=True)
    return _Demand(None, None, demands)


def _plan(
    o: Observation, p: Policy, demand: _Demand, rates: Rates, ready: int, notes: list[str]
) -> _Need:
    """4. The replicas the demand needs: utilization, backlog, stand-in."""
    load = demand.load
    utilization = p.profile_utilization if profile_of(p) is not None else p.target_utilization
    need = (load or 0.0) / utilization
    # In-flight demand holds the backlog already: counted again, 428 requests of
    # 5,500 tokens in flight asked for 50 replicas where 39 carry them at the target.
    extra = 0.0 if demand.in_flight else _backlog_extra(o, p, rates, ready, load)
    if extra > 0 and load is not None:
        need = max(need, (load + extra) / utilization)
        notes.append(f"backlog needs +{extra:.1f}")
    # Without the gateway's judgement the engines' p95s stand in for attainment. Only a
    # breach with queued requests says capacity is short; one without (a slow cold
    # start, long prompts) is not cured by more replicas.
    if o.slo_within_rate is None and load is not None and ready > 0:
        breach = max(
            (o.ttft_p95_seconds or 0.0) / p.slo_ttft_seconds,
            (o.inter_token_p95_seconds or 0.0) / p.slo_itl_seconds,
        )
        if breach > 1.0 and _long_queue(o, ready):
            need = max(need, load / utilization * min(breach, BREACH_MAX))
            notes.append(f"engine p95 over the SLO x{breach:.2f} with a queue (no gateway)")
    return _Need(demand, utilization, need)


def _held(
    o: Observation,
    p: Policy,
    previous: DecisionState,
    need: _Need,
    capacity: _Capacity,
    wanted: int,
    notes: list[str],
) -> tuple[int, Recent[int]]:
    """6. No lower than the window's peak, nor on unknown load; with the window's needs.

    Bursts recur, and a replica removed now costs a cold start when the next one comes.
    Unknown load (missing families) never lowers the count, nor does a replica that did
    not answer the last scrape: its share of the load is unknown, not zero, nor a
    capacity the profile fit is still checking against the replicas (a fleet 1.9x slower
    than its profile, scaled down on the profile before the fit knew, missed 10% of its
    requests for two minutes: ``tests/test_replay_fit.py``).
    """
    needs = previous.need_history.within(o.now, p.scale_down_window_seconds, closed=False)
    if not need.demand.start:
        needs = needs.add(o.now, wanted)
    peak = max(needs.values(), default=wanted)
    if peak > wanted:
        notes.append(f"window peak {peak}")
        wanted = peak
    if need.demand.load is None and previous.desired is not None:
        wanted = max(wanted, previous.desired)
        notes.append("load unknown: holding")
    elif need.demand.lower_bound and previous.desired is not None:
        # Held as a need each round it binds: a round the bound lapses in (a gauge unread
        # once) falls to the window's peak, not to what the engines serve (4 to 1, pass 38).
        if wanted < previous.desired:
            wanted = previous.desired
            notes.append(f"{need.demand.lower_bound}: holding")
        needs = needs.add(o.now, wanted)
    elif _replicas_missing(o) and previous.desired is not None and wanted < previous.desired:
        wanted = previous.desired
        notes.append("a replica did not answer its scrape: holding")
    elif capacity.verifying and previous.desired is not None and wanted < previous.desired:
        wanted = previous.desired
        evidence = capacity.step_fit.evidence
        notes.append(f"profile fit at {evidence:.0f}s of {MIN_EVIDENCE_SECONDS:.0f}s: holding")
    return wanted, needs


def _steered(move: attainment.Move) -> dict[str, float]:
    """The attainment loop's numbers for logs and metrics (NaN where unknown)."""
    return {
        "headroom": move.headroom.value,
        "attainment": math.nan if move.attainment is None else move.attainment,
        "attainment_long": math.nan if move.long_run is None else move.long_run,
    }


def _steering(p: Policy) -> attainment.Steering:
    return attainment.Steering(
        p.slo_attainment,
        p.headroom_step,
        p.headroom_max,
        p.headroom_half_life_seconds,
    )


def _activity(o: Observation, previous: DecisionState) -> _Activity:
    """In-flight requests, whether any request arrives, runs, waits or is served, and since when.

    Quiet counts as activity (``last_activity`` is now) when some part of the load is
    unmeasured, and on a restarted scaler's first look, unless the deployment is at zero
    already: an unknown gauge beside a known 0 (running NaN, queue 0) is not "nothing in
    flight", and a scaler without history does not know how long it has been quiet.

    Raises:
        NoDataError: no load signal at all.
    """
    engine = _whole(o.queue_depth, o.requests_running)
    gateway = _whole(o.gateway_buffered, o.gateway_in_flight)
    concurrency = _larger(engine, gateway)
    seen = _larger(
        _sum_known(o.queue_depth, o.requests_running),
        _sum_known(o.gateway_buffered, o.gateway_in_flight),
    )
    if seen is None and o.gateway_arrival_rate is None and o.prompt_token_rate is None:
        raise NoDataError("neither engine nor gateway load is known")
    # Served tokens and running means are activity too: long generations finish no
    # request within the window while 800 tokens/s flow.
    flowing = (
        o.gateway_arrival_rate,
        o.request_rate,
        o.prompt_token_rate,
        o.generation_token_rate,
        o.prompt_token_rate_panic,
        o.generation_token_rate_panic,
        o.requests_running_mean,
    )
    busy = (seen or 0.0) > 0 or any(v is not None and v > 0 for v in flowing)
    measured = _all_measured(o, engine, gateway)
    at_zero = previous.desired == 0 or o.replicas_known == 0
    unsure = not measured or previous.desired is None
    last = o.now if busy or (unsure and not at_zero) else previous.last_activity
    return _Activity(concurrency, busy, last, seen, measured)


def _all_measured(o: Observation, engine: float | None, gateway: float | None) -> bool:
    """Whether quiet may be read as idle: every part of the load is measured.

    Some in-flight count is known whole, each source present reports its whole load,
    every replica known answered its scrape, and none's throughput is estimated: a
    replica's counters unknown, the others' idle, read 0 requests a second where 0.3
    arrived, and the fleet went to zero (hostile pass 68).
    """
    engine_present = o.replicas_known is not None or (
        o.queue_depth is not None or o.requests_running is not None
    )
    gateway_present = o.gateway_buffered is not None or o.gateway_in_flight is not None
    engine_ok = not engine_present or engine is not None
    gateway_ok = not gateway_present or (gateway is not None and o.gateway_arrival_rate is not None)
    known = engine is not None or gateway is not None
    measured = not _replicas_missing(o) and not o.engine_partial
    return known and engine_ok and gateway_ok and measured


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
    state = replace(
        previous,
        decisions=previous.decisions + 1,
        desired=0,
        last_activity=last_activity,
        need_history=Recent(),
        # An activation starts from 0.
        asked=replace(previous, asked=previous.asked.within(now, STARTING_SECONDS)).changed_to(
            now, 0
        ),
    )
    since = "ever" if math.isinf(last_activity) else f"{now - last_activity:.0f}s"
    reason = f"idle for {since}: scale to zero"
    return Decision(0, False, state, reason, {"concurrency": 0.0}, current_replicas=current)


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


def _first_look(previous: DecisionState, wanted: int, ready: int, notes: list[str]) -> int:
    """7. A restarted scaler has no history: it never scales down on its first look."""
    if previous.desired is None and wanted < ready:
        notes.append("first decision: not scaling down")
        return ready
    return wanted


def _bounded(p: Policy, wanted: int, recently_active: bool, notes: list[str]) -> int:
    """8. ``min_replicas`` .. ``max_replicas``; at least 1 while recently active."""
    desired = min(max(wanted, p.min_replicas), p.max_replicas)
    if recently_active and desired == 0:
        desired = min(1, p.max_replicas)
    if desired != wanted:
        notes.append(f"held at {'min' if desired > wanted else 'max'} {desired}")
    return desired


def _reason(need: _Need, desired: int, notes: list[str]) -> str:
    load = need.demand.load
    reason = f"load {load:.2f} replicas" if load is not None else "load unknown"
    reason += f", need {need.need:.2f} at {need.utilization:.0%} -> {desired}"
    return reason + (" (" + "; ".join(notes) + ")" if notes else "")


def _inputs(need: _Need, capacity: _Capacity, activity: _Activity) -> dict[str, float]:
    """The numbers the reason refers to (NaN where unknown), for logs and metrics."""

    def known(value: float | None) -> float:
        return value if value is not None else math.nan

    return {
        "load": known(need.demand.load),
        "load_panic": known(need.demand.short),
        "capacity_scale": capacity.scale,
        "step_scale": capacity.step_scale,
        "need": need.need,
        "concurrency": known(activity.concurrency),
    }


def _learn_capacity(
    o: Observation, p: Policy, scale: float, ready: int, stable_fleet: bool
) -> float:
    """Nudge the capacity scale toward what saturated replicas actually deliver.

    Only a fleet that has kept its size can be judged (window rates over a changing
    replica count would divide old throughput by new replicas). Saturated (more than
    one queued request per replica and a short-window TTFT over the SLO): short-window
    token throughput per replica is the capacity, and the scale moves 10% of the way
    to it. Healthy while carrying more than the priors say: capacity is at least that.
    Bounded to 0.5-2x the priors, each step toward at most a fifth past the scale, and
    never from sums partly unknown.
    """
    if ready <= 0 or not stable_fleet or o.engine_partial:
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
        # One replica's counter jumping by 5e7 tokens, read as delivered, took the scale
        # from 1 to 2 in one decision, and the fleet to 7 replicas where 10 carried the
        # load, for good (hostile pass 65): 2% a decision at most.
        scale += 0.1 * (min(delivered, 1.2 * scale) - scale)
    return min(max(scale, 0.5), 2.0)


def _slo_margin(o: Observation, p: Policy) -> float:
    """1 - the worse of TTFT and ITL p95 over their targets (unknown counts as 0 margin)."""
    if o.ttft_p95_seconds is None or o.inter_token_p95_seconds is None:
        return 0.0
    return 1.0 - max(
        o.ttft_p95_seconds / p.slo_ttft_seconds, o.inter_token_p95_seconds / p.slo_itl_seconds
    )


def _replicas_missing(o: Observation) -> bool:
    """Some replica the engines' source knows of did not answer, or it could not count.

    An unknown count is as good as a replica missing: the sums are over the replicas
    that answered, and how many did not is not known (Prometheus's count unreadable).
    """
    known, up = o.replicas_known, o.replicas_up
    return o.replicas_uncounted or (known is not None and up is not None and up < known)


def _long_queue(o: Observation, ready: int) -> bool:
    """Whether the engines' queue is a request waiting per two replicas or more.

    One replica's gauge stuck at 1 is not: it had held an idle fleet of 20 (hostile pass
    36), and with long prompts made a busy one swing between 15 and 29 (pass 38).
    """
    return (o.queue_depth or 0.0) > 0.5 * ready


def _saturated(o: Observation, p: Policy, ready: int) -> bool:
    """Whether what the engines serve is what they can rather than what is asked.

    A long queue, or any request waiting while they run half their target concurrency:
    8 waiting beside 200 running on 20 replicas are a busy fleet's (hostile pass 37).
    """
    busy = (o.requests_running or 0.0) >= 0.5 * p.target_concurrency * ready
    return _long_queue(o, ready) or ((o.queue_depth or 0.0) > 0 and busy)


def _counted(o: Observation) -> bool:
    """Whether the engines counted the replicas: a fleet to compare a decision with."""
    return not o.replicas_uncounted and (o.replicas_known is not None or o.replicas_up is not None)


def _replica_count(o: Observation) -> int:
    """The replicas known, else up (a lower bound where uncounted), else 0."""
    count = o.replicas_known if o.replicas_known is not None else o.replicas_up
    return count or 0


def _whole(*values: float | None) -> float | None:
    """The sum, or None unless every part is known (an unknown part is not a 0)."""
    return None if any(v is None for v in values) else float(sum(v or 0.0 for v in values))


def _sum_known(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return float(sum(known)) if known else None


def _larger(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
