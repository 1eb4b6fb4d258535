"""Values the decision core works on. All frozen; time is a number passed in."""

from __future__ import annotations

from dataclasses import dataclass, field

from foundation.replica_model import Profile
from scaler.core.attainment import Headroom
from scaler.core.fit import StepFit
from scaler.core.seasonal import SeasonalState
from scaler.core.window import Recent


@dataclass(frozen=True, slots=True)
class Observation:
    """What is known about one target at time ``now``; ``None`` means not measured.

    Engine fields are sums over the deployment's replicas (from the exporter); stable
    rates and latencies are over the exporter's stable window, ``*_panic`` ones over its
    short window; gateway fields come from the gateway and are known at zero replicas.
    """

    now: float
    """Seconds since the epoch at which the decision is made."""
    signal_time: float
    """When the newest signal used here was measured (seconds since the epoch)."""
    queue_depth: float | None = None
    requests_running: float | None = None
    requests_running_mean: float | None = None
    """Requests running, averaged over the stable window (the token rates' window)."""
    request_rate: float | None = None
    """Finished requests per second over the stable window."""
    prompt_token_rate: float | None = None
    generation_token_rate: float | None = None
    mean_prompt_tokens: float | None = None
    """Prompt tokens per request finished in the stable window (the request mix)."""
    mean_output_tokens: float | None = None
    """Output tokens per request finished in the stable window."""
    prompt_token_rate_panic: float | None = None
    generation_token_rate_panic: float | None = None
    kv_cache_usage: float | None = None
    ttft_p95_seconds: float | None = None
    inter_token_p95_seconds: float | None = None
    ttft_p95_panic_seconds: float | None = None
    cost_per_million_tokens: float | None = None
    replicas_up: int | None = None
    """Replicas the exporter scraped successfully."""
    replicas_known: int | None = None
    """Replicas the exporter knows of (the HPA's current count, roughly)."""
    replicas_uncounted: bool = False
    """The engines' source answered without one of the counts (Prometheus's query
    unreadable): how many replicas its sums leave out is unknown, as if one were."""
    replicas_sleeping: int | None = None
    """Replicas answering that are asleep (vLLM sleep mode): pods, not capacity."""
    engine_partial: bool = False
    """Some replica's part of the engines' sums is unknown (a family missing or not a
    measurement, a counter fallen twice in the window, a replica not answering)."""
    gateway_arrival_rate: float | None = None
    gateway_buffered: int | None = None
    gateway_in_flight: int | None = None
    slo_within_rate: float | None = None
    """Requests per second the gateway saw meet the SLO (TTFT and mean ITL)."""
    slo_outside_rate: float | None = None
    """Requests per second the gateway saw miss it (late, failed or dropped)."""


@dataclass(frozen=True, slots=True)
class Policy:
    """Every knob of the decision, per ScaledObject (config defaults, metadata overrides)."""

    min_replicas: int = 0
    max_replicas: int = 100
    target_concurrency: float = 16.0
    """Requests in flight (running plus queued) one replica should hold."""
    prefill_tokens_per_second: float = 30_000.0
    """Prior: prompt tokens one replica prefills per second (Llama-3-8B on H200 ~36k)."""
    decode_tokens_per_second: float = 6_000.0
    """Prior: output tokens one replica decodes per second within the inter-token SLO."""
    target_utilization: float = 0.7
    """Share of a replica's capacity to plan for; the rest absorbs bursts."""
    slo_ttft_seconds: float = 2.0
    slo_itl_seconds: float = 0.1
    slo_attainment: float = 0.99
    """The share of requests to keep within both targets: the SLO the planner holds."""
    headroom_step: float = 0.1
    """Attainment below the target adds this to the headroom for each allowance of misses
    the gateway's window shows (at most 10), once a window (``scaler.core.attainment``)."""
    headroom_max: float = 1.0
    """The headroom's bound (a share of the need); 0 turns the attainment loop off."""
    headroom_half_life_seconds: float = 300.0
    """While attainment has margin the headroom halves this often."""
    scale_down_window_seconds: float = 360.0
    """Scale down only to the most replicas needed within this window (bursts recur)."""
    forecast_horizon_seconds: float = 60.0
    """About one cold start: scale-up starts this far ahead of the load."""
    idle_grace_seconds: float = 120.0
    """No request at all for this long before scaling to zero."""
    burst_tier: bool = False
    """Sleepers the gateway wakes under pressure stand beside the running replicas (the
    trigger's ``standby`` with sleepers and ``standbyBurstSleepers`` above 0; the gateway's
    ``wake-at-outstanding`` wakes them): misses soon after the load outran the count asked
    are that tier's to prevent, and move no headroom (``decide.SHORTFALL_WINDOWS``). Not a
    config key: the trigger's standby says it."""
    seasonal_floor: bool = True
    """At zero, start the replicas a confident seasonal forecast (``scaler.core.predictive``)
    expects one ``forecast_horizon_seconds`` before the traffic's expected return. Not a
    config key: always on where served; off only in bench/predictive_prewarm.py's rows."""
    seasonal_prewarm_lead_seconds: float = 300.0
    """At zero, ask for a Fluid prewarm this far ahead of a confident return (about one
    cache load); 0: never."""
    seasonal_utc_offset_hours: float = 0.0
    """The forecast's local time (business hours) is UTC plus this many hours (fixed: no
    DST)."""
    seasonal_day_seconds: float = 86_400.0
    """The forecast's day (shorter in a replay of compressed days)."""
    profile: str | None = None
    """A replica model (``foundation.replica_model.PROFILES``): a replica's capacity is
    what it sustains within the SLOs for the observed mix, and the load is planned from
    demand (arrivals x work per request). None: the priors."""
    profiles: tuple[Profile, ...] = ()
    """The SRE's own replica profiles (the scaler config's ``profiles``), which ``profile``
    may name beside the built-in ones: plain values, so a reload that changes one is a new
    policy, and the capacity cache (keyed by the profile's value) follows it."""
    profile_utilization: float = 1.0
    """With a profile: the share of a replica's SLO capacity to plan for."""
    backlog_drain_seconds: float = 20.0
    """With a profile: a backlog the ready replicas' spare capacity would not drain
    within this long asks for the replicas that would."""
    profile_fit: bool = True
    """With a profile: correct its step times from the replicas' observed throughput
    and latency (``scaler.core.fit``: bounded 0.5-2x, the reason says so). Not a config
    key: always on where served; off only in the ablation and the fit's own tests."""
    demand_window_seconds: float = 60.0
    """With a profile: demand is averaged over this long, as the exporter's stable window
    averages rates."""
    profile_speedup: float = 1.0
    """With a profile: the replicas step this many times faster than it says (a simulated
    replica's ``--speedup``, the demo's time compression; 1 for real engines). Capacity is
    the profile's at the SLOs x speedup, times the speedup: exactly what the profile
    sustains on its own time scale, in the faster world's units."""


@dataclass(frozen=True, slots=True)
class DecisionState:
    """Soft state carried from one decision to the next for one ScaledObject."""

    decisions: int = 0
    desired: int | None = None
    last_activity: float = float("-inf")
    capacity_scale: float = 1.0
    """Learned: observed capacity over the priors (1.0 = the priors hold)."""
    need_history: Recent[int] = field(default_factory=Recent)
    """Replicas needed over the scale-down window: scale down to their maximum."""
    demand_history: Recent[float] = field(default_factory=Recent)
    """With a profile: demand in replicas (arrivals x work per request) over the demand
    window."""
    mix: tuple[float, float] | None = None
    """The last known mean prompt and output tokens per request."""
    step_fit: StepFit = field(default_factory=StepFit)
    """With a profile: the fit of its step times to the replicas' (``scaler.core.fit``)."""
    season: SeasonalState = field(default_factory=SeasonalState)
    """Learned: demand per slot of the day and day kind (``scaler.core.seasonal``), bounded."""
    headroom: Headroom = field(default_factory=Headroom)
    """Steered by attainment (``scaler.core.attainment``): the share added to the need."""
    asked: Recent[int] = field(default_factory=Recent)
    """The counts decided over the last ``decide.STARTING_SECONDS``, each as it changed
    (``changed_to``): ready replicas short of the count asked for, and not of the least
    of these (or the count now), are replicas starting."""
    outran: float = float("-inf")
    """When the load last needed more replicas than the count asked for before it: with
    a burst tier, the gateway's misses soon after are the burst's, not the profile's."""

    def changed_to(self, now: float, desired: int) -> Recent[int]:
        """``asked`` once the count is ``desired``: on a change, the old count and the new.

        The count that stood until now is recorded beside the new one: one that stood
        longer than the window is still the least asked within it (10 for half an hour,
        then 15: 5 starting). Example: asked ``((0.0, 10),)`` and the count 10; 15 at
        2,000 s gives ``((0.0, 10), (2000.0, 10), (2000.0, 15))``; 15 again, no change.
        """
        if desired == self.desired:
            return self.asked
        if self.desired is None:
            return self.asked.add(now, desired)
        return self.asked.add(now, self.desired).add(now, desired)


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of ``decide``: replicas, activity, the new state and why."""

    desired_replicas: int
    active: bool
    state: DecisionState
    reason: str
    inputs: dict[str, float] = field(default_factory=dict)
    """The numbers the reason refers to, for logs and metrics."""
    current_replicas: int | None = None
    """Replicas the exporter saw (the HPA's count), for ``hpa.metric_for``."""
    sleeping_replicas: int = 0
    """Replicas to hold asleep beside ``desired_replicas`` (the standby plan,
    ``scaler.core.standby``): KEDA is asked for both, the gateway puts these to sleep."""
    prewarm_forecast: float | None = None
    """At zero: the replicas a confident seasonal forecast expects within
    ``seasonal_prewarm_lead_seconds`` (``scaler.core.predictive``), on which the Fluid
    prewarm warms the cache and the standby plan holds sleepers; None without one."""
