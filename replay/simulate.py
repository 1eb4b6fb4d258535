"""The replay loop: arrivals, gateway, fleet, exporter, and the policy's controller.

Time advances in ticks of ``dt``; everything happens at tick boundaries in a fixed
order (replicas become ready, arrivals are routed, the fleet runs, the exporter
scrapes, controllers act), so a run is a pure function of trace, policy and config.

``Simulation`` is one replay advanced in steps (``advance(until)``), so that several
replays can step in lock-step with a shared pool's simulation; ``simulate`` is one run
to the end. A shared pool bounds a replay's accelerators with
``set_accelerator_limit(L)`` (None, the default, is unlimited; ``simulate`` never sets
one). With a limit, a scale-up beyond ``L`` leaves the extra replicas **pending** (a
pod the scheduler cannot place): they count in the Deployment's replica count
(``running()``, what KEDA and the HPA see, so the HPA does not ask again) but hold no
accelerator and cost nothing; each tick (``start_ready``) the oldest pending begin
their cold start (or a sleeper's wake) as the limit allows. A scale-down removes
pending replicas first, then starting ones, then drains ready ones. Lowering the limit
below what is held stops nothing (the pool reclaims training, never inference); it
only blocks new starts. Starting, ready, draining and loading replicas hold an
accelerator; sleepers (vLLM sleep level 1 frees it) do not, and a wake needs one. Only
a run that was ever given a limit reports the ``pending`` series and the
``pending_replica_seconds`` and ``max_pending`` metrics, so every other result is as
before.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from exporter.engines import EngineStats, Histogram
from exporter.signals import Accelerator, ReplicaHistory, derive, history_horizon
from foundation.replica_model import COLD_START_TIERS as COLD_START_TIERS
from foundation.replica_model import (
    HOST_MEMORY_PRICE_PER_GB_HOUR,
    Profile,
    WarmTiers,
    warm_tiers,
)
from foundation.replica_model import cold_start_seconds as cold_start_seconds
from foundation.signals import EngineSignals
from replay.anatomy import MET, Targets, anatomy, classify, idle_itl, met_count
from replay.controllers import StandbyController
from replay.fleet import DONE, DROPPED, WAITING, Fleet, Requests
from replay.policies import GatewayView, Policy, View
from replay.trace import Trace
from scaler.core.seasonal import SeasonalPolicy
from scaler.core.tiers import StandbyPolicy
from serving import vllm_buckets
from serving.routing import WakePressure, sleepers_to_wake

OFF, STARTING, READY, DRAINING, SLEEPING, LOADING, PENDING, WAKING, WOKEN = range(9)
"""WAKING and WOKEN: a sleeper the gateway woke (at zero, or under ``wake_pressure``); it
serves beside the Deployment's running count until the scaler counts it or it falls idle
and sleeps again."""
_COUNTED = np.isin(np.arange(9), (STARTING, READY, PENDING))
"""By slot state: the Deployment counts it (``running``); ``_COUNTED[slot]`` is one
gather where three comparisons were, on every tick."""
_HOLDING = np.isin(np.arange(9), (STARTING, READY, DRAINING, LOADING, WAKING, WOKEN))
"""By slot state: it holds an accelerator (``held``)."""
_SERVING = np.isin(np.arange(9), (READY, WOKEN))
"""By slot state: the gateway routes to it."""
_STANDBY = np.isin(np.arange(9), (SLEEPING, LOADING, WAKING, WOKEN))
"""By slot state: it is one of the standby plan's sleepers (asleep, loading or woken)."""
_LOADED = np.isin(np.arange(9), (STARTING, LOADING, WAKING))
"""By slot state: it becomes another at its ``ready_at``."""
_LOADED_TO = np.arange(9)
_LOADED_TO[[STARTING, LOADING, WAKING]] = (READY, SLEEPING, WOKEN)
"""By slot state: the state it has once loaded (itself for any other)."""
_IS = tuple(np.arange(9) == state for state in range(9))
"""By slot state: it is that one state (``_IS[DRAINING]``)."""

# vLLM's bucket bounds, so that the exporter's own quantile math runs on what a real
# engine would expose (+Inf closes each histogram).
TTFT_BUCKETS = (*vllm_buckets.TTFT, math.inf)
ITL_BUCKETS = (*vllm_buckets.ITL, math.inf)
E2E_BUCKETS = (*vllm_buckets.E2E, math.inf)


def cold_start_of(config: SimConfig) -> float:
    """Seconds from a replica's start to ready under ``config`` (override, prewarm, tier)."""
    if config.cold_start_override is not None:
        return config.cold_start_override
    tier = "cached" if config.prewarm else config.cold_start_tier
    return cold_start_seconds(config.profile, tier)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Run settings; every default documented in docs/replay.md."""

    profile: Profile
    dt: float = 0.2
    slo_ttft: float = 2.0
    slo_itl: float = 0.1
    scrape_interval: float = 5.0
    panic_window: float = 10.0
    stable_window: float = 60.0
    cold_start_tier: str = "local-disk"
    prewarm: bool = False
    """Fluid prewarm: every start is in the ``cached`` tier."""
    cold_start_override: float | None = None
    """Seconds from start to ready, replacing the tier's (a start measured elsewhere)."""
    gateway_buffer: int = 5000
    gateway_timeout: float = 120.0
    max_replicas: int = 64
    tail: float = 900.0
    """Seconds after the last arrival before unfinished requests count as dropped."""
    slo_prefill_multiple: float = 1.5
    """A request's TTFT target is the larger of ``slo_ttft`` and this multiple of its own
    prefill on an idle replica (``ttft_target``)."""
    standby: StandbyPolicy | None = None
    """Warm tiers: the standby plan (``scaler.core.tiers``) holds sleeping replicas and a
    warm Fluid cache besides the running ones; None holds neither (every start cold)."""
    seasonal: SeasonalPolicy | None = None
    """Predictive prewarm (with ``standby``): a confident seasonal forecast of a return
    holds sleepers and the cache for it, starting sleepers if there are too few."""
    memory_price_per_gb_hour: float = HOST_MEMORY_PRICE_PER_GB_HOUR
    """What a sleeper's weights in host memory, and the cache's copy, cost."""
    cache_fill_gbps: float = 0.5
    """A DataLoad fills the cache from the model store at this rate (the remote tier's)."""
    wake_pressure: WakePressure | None = None
    """The gateway's ``wake-at-outstanding`` (``serving.routing.WakePressure``): it wakes
    sleepers when every ready replica holds the threshold (None: only at zero)."""
    served_before: bool = True
    """Whether the fleet served traffic before the trace, so that the standby plan holds
    its sleepers from t=0 (a warm start's history); False: a Deployment that never served
    holds none until its first request, which waits for a start (the demo's live run)."""
    sleep_after_idle: float = 10.0
    """The gateway's ``sleep-after-idle``: a replica it woke sleeps again once idle this long."""
    idle_gap: float = 120.0
    """A request arriving this long after the one before is a *first request after idle*
    (``after_idle_*`` metrics), whatever the policy did in the gap."""


TTFT_PREFILL_MULTIPLE = 1.5
"""The default multiple of a request's idle prefill its TTFT target allows (docs/replay.md)."""


def ttft_target(
    prefill_seconds: npt.NDArray[np.float64],
    slo_ttft: float,
    multiple: float = TTFT_PREFILL_MULTIPLE,
) -> npt.NDArray[np.float64]:
    """Each request's attainable TTFT target: ``max(slo_ttft, multiple * prefill)``.

    ``prefill_seconds`` is the request's own prefill on an idle replica (for the replay,
    ``Profile.prefill_seconds(prompt)``). No replica can answer a long prompt faster than
    its prefill, so a fixed TTFT target would judge the prompt's length, not the fleet;
    short prompts keep the configured target. Pure: numbers in, numbers out, nothing of
    the replay's (the scaler's SLO feedback can use the same rule).

    Args:
        prefill_seconds: per request, seconds to prefill its prompt alone.
        slo_ttft: the configured TTFT target, seconds.
        multiple: how much of its own prefill a request may take again in queueing and
            sharing steps with other requests.
    """
    return np.maximum(slo_ttft, multiple * np.asarray(prefill_seconds, dtype=np.float64))


def slo_targets(requests: Requests, config: SimConfig) -> Targets:
    """What each of ``requests`` is judged against under ``config`` (``replay.anatomy``)."""
    prefill = config.profile.prefill_seconds(requests.prompt.astype(np.float64))
    return Targets(
        ttft=ttft_target(prefill, config.slo_ttft, config.slo_prefill_multiple),
        itl=config.slo_itl,
        idle_prefill=prefill,
        idle_itl=idle_itl(config.profile, requests.prompt, requests.output),
        tick=config.dt,
    )


@dataclass(slots=True)
class Result:
    """One policy's run."""

    policy: str
    metrics: dict[str, float | int]
    series: dict[str, list[float]]
    ttft: npt.NDArray[np.float64]
    e2e: npt.NDArray[np.float64]
    decisions: list[tuple[float, int, str]] = field(default_factory=list)
    met: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Per request, in the trace's order: served within its TTFT target and the ITL SLO."""
    slo_ratio: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    """Per request, in the trace's order: the larger of TTFT / its target and mean ITL /
    the ITL SLO (at most 1 meets the SLO; infinite when dropped)."""
    miss_cause: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Per request, in the trace's order: why it missed, as an index into
    ``replay.anatomy.CAUSES`` (-1, ``anatomy.MET``, when it met the SLO)."""


def simulate(
    trace: Trace,
    policy: Policy,
    config: SimConfig,
    progress: Callable[[float], None] | None = None,
    initial_replicas: int = 0,
) -> Result:
    """Replay ``trace`` under ``policy``'s controller.

    ``initial_replicas`` start ready (a warm start, as if earlier traffic had sized the
    fleet); 0 starts cold, every replica paying its cold start.
    """
    simulation = Simulation(trace, policy, config, progress, initial_replicas)
    simulation.advance(math.inf)
    return simulation.result()


class Simulation:
    """One replay, advanced in steps; ``simulate`` is this run to the end.

    The controller sizes the fleet (its warm start) on the first ``advance``, so a limit
    set before it bounds the warm start too. ``result`` ends the run: call it once
    ``finished`` (a request still unfinished then counts as dropped).

    ``run_tail`` keeps ticking once every request is done, to the end of the tail: a
    pool stepping this replay goes on after the trace, and the fleet must scale down
    (and free its accelerators) as the scaler has it, not stay frozen at its last size.
    ``simulate`` stops at the last request, as before.
    """

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        config: SimConfig,
        progress: Callable[[float], None] | None = None,
        initial_replicas: int = 0,
        *,
        run_tail: bool = False,
    ) -> None:
        self.policy = policy
        self._run = _Replay(trace, config)
        self._run_tail = run_tail
        controller = policy.controller()
        if config.standby is not None:
            controller = StandbyController(
                controller,
                self._run.tiers,
                config.standby,
                config.slo_ttft,
                config.seasonal,
                max_pods=config.max_replicas,
                served_before=config.served_before,
            )
        self._controller = controller
        self._progress = progress
        self._initial_replicas = initial_replicas
        self._started = self._done = False

    @property
    def now(self) -> float:
        """The trace time of the next tick (of the last one, once finished early)."""
        return self._run.now

    @property
    def finished(self) -> bool:
        """Past the end (trace plus tail), or every request done (unless ``run_tail``)."""
        return self._done or self._run.now > self._run.end

    def advance(self, until: float) -> None:
        """Run ticks while not finished and ``now <= until``."""
        if math.isnan(until):
            raise ValueError("advance(until): until is NaN, not a time")
        run = self._run
        if not self._started:
            self._started = True
            self._controller.start(run, self._initial_replicas)
        while not self._done and run.now <= run.end and run.now <= until:
            self._tick()
            if not self._run_tail and run.finished():
                self._done = True
                break
            run.now += run.config.dt

    def _tick(self) -> None:
        run = self._run
        run.start_ready()
        run.admit_arrivals()
        gateway = run.advance_fleet()
        if run.now >= run.next_scrape:
            run.scrape()
        view = View(run.now, run.signals, gateway, run.running(), run.ready())
        self._controller.tick(view, run)
        if run.now >= run.next_series:
            run.record_series(self._progress)

    def result(self) -> Result:
        """The run's metrics; it ends the run (later ``advance`` calls do nothing)."""
        self._done = True
        return self._run.result(self.policy.name)

    # --- what is settled so far --------------------------------------------------------

    @property
    def missed(self) -> int:
        """Requests already outside the SLO (dropped, or finished late).

        Final: the run's attainment is at most ``1 - missed / requests``.
        """
        return self._run.judged.outside_total

    @property
    def cost(self) -> float:
        """US$ spent so far (replicas held and the warm tiers): the run's cost is at least it."""
        return self._run.cost()

    @property
    def replica_seconds(self) -> float:
        """Accelerator-seconds held so far."""
        return self._run.replica_seconds

    @property
    def series(self) -> dict[str, list[float]]:
        """The plotted series sampled so far (``Result.series`` once finished)."""
        return self._run.series

    # --- a shared pool's limit ---------------------------------------------------------

    def set_accelerator_limit(self, replicas: int | None) -> None:
        """Bound the accelerators this replay's replicas may hold (None: unlimited)."""
        self._run.set_accelerator_limit(replicas)

    def accelerators_held(self) -> int:
        """Replicas holding an accelerator now: starting, ready, draining, loading."""
        return self._run.held()

    def replicas_wanted(self) -> int:
        """The Deployment's replica count: starting, ready and pending (``running()``)."""
        return self._run.running()

    def pending(self) -> int:
        """Replicas the Deployment wants that wait for an accelerator."""
        return self._run.pending()


def _as_now(history: ReplicaHistory) -> ReplicaHistory:
    """The history as it is now: later scrapes add to (and trim) the one they share."""
    return ReplicaHistory(
        history.horizon,
        history.layout,
        history.times[:],
        history.vectors[:],
        history.gauges[:],
        history.falls[:],
    )


class _Replay:
    """One replay's state: the trace's requests, the fleet's slots, the exporter's view.

    It is also the ``Actuator`` the controller scales. Each tick runs, in this order:
    replicas whose cold start is over become ready; arrivals are routed or buffered
    (the gateway); the fleet runs one tick; the exporter scrapes when due; the
    controller acts; the series are sampled every 10 s. A shared pool's accelerator
    limit (``set_accelerator_limit``) leaves replicas beyond it pending (module doc).
    """

    def __init__(self, trace: Trace, config: SimConfig) -> None:
        profile, slots = config.profile, config.max_replicas
        self.trace, self.config, self.slots = trace, config, slots
        self.requests = Requests(trace.arrival.copy(), trace.prompt.copy(), trace.output.copy())
        self.fleet = Fleet(profile, self.requests, slots)
        self.slot = np.full(slots, OFF, dtype=np.int64)
        self._slot_key = b""
        self._slot_sets: dict[bytes, npt.NDArray[np.int64]] = {}
        self.ready_at = np.zeros(slots)
        self.created = np.zeros(slots)
        self.used_at = np.zeros(slots)
        """A woken replica's last tick with a request outstanding (or its wake)."""
        self.baseline: float | None = None
        """The gateway's mean load, requests outstanding on the ready replicas in all
        (``WakePressure.baseline``)."""
        self.shared = 1
        """The running replicas that last shared the baseline (kept with none ready)."""
        self.surplus_above = math.inf
        """The gateway's pressure threshold: the woken surplus is routed to above it."""
        self.cold = cold_start_of(config)
        self.tiers = warm_tiers(
            profile, self.cold, memory_price_per_gb_hour=config.memory_price_per_gb_hour
        )
        self.standby = _Standby.at_start(config, self.tiers)
        self.counters = np.zeros((slots, 3))  # prompt tokens, output tokens, finished requests
        # vLLM's per-request token buckets, with the KV capacity as its max_model_len.
        tokens = (*vllm_buckets.request_tokens(profile.kv_capacity_tokens), math.inf)
        self.hist = {
            "ttft": (TTFT_BUCKETS, np.zeros((slots, len(TTFT_BUCKETS))), np.zeros(slots)),
            "itl": (ITL_BUCKETS, np.zeros((slots, len(ITL_BUCKETS))), np.zeros(slots)),
            "e2e": (E2E_BUCKETS, np.zeros((slots, len(E2E_BUCKETS))), np.zeros(slots)),
            "prompt_length": (tokens, np.zeros((slots, len(tokens))), np.zeros(slots)),
            "output_length": (tokens, np.zeros((slots, len(tokens))), np.zeros(slots)),
        }
        self.unrecorded: tuple[list[npt.NDArray[np.int64]], list[npt.NDArray[np.int64]]] = (
            [],
            [],
        )
        """Requests that got their first token, and that finished, since the last scrape:
        their histogram observations are made when a scrape reads them, in one call per
        histogram (the order of observation, and so every sum, as if made each tick)."""
        self.histories: dict[int, ReplicaHistory] = {}
        self.horizon = history_horizon(config.stable_window, config.scrape_interval)
        self.accelerator = Accelerator(profile.price_per_hour, 1.0)
        self.buffer: deque[int] = deque()
        self.arrivals_seen: deque[float] = deque()
        self.signals: Callable[[], EngineSignals] | None = None
        """The last scrape's signals (None before the first)."""
        self.decisions: list[tuple[float, int, str]] = []
        self.series: dict[str, list[float]] = {
            k: [] for k in ("t", "arrivals", "replicas", "ready", "awake", "queue")
        }
        self.replica_seconds = self.busy_seconds = 0.0
        self.cold_starts = 0
        self.next_arrival = 0
        self.too_big = (self.requests.prompt + self.requests.output) > float(
            profile.kv_capacity_tokens
        )
        """Per request: more tokens than a replica's KV cache holds (dropped on arrival)."""
        # The gateway judges each request against the SLO as it ends (served or dropped),
        # as serving.gateway does: the within/outside rates the scaler steers by.
        self.targets = slo_targets(self.requests, config)
        self.judged = _Judged(config.stable_window)
        self.end = trace.duration + config.tail
        self.next_scrape = self.next_series = 0.0
        self.arrivals_in_series = 0
        self.now = 0.0
        self.limit: int | None = None
        self.limited = False
        """A limit was ever set: the result reports the pending replicas."""
        self.pending_since = np.zeros(slots)
        self.pending_seconds = 0.0
        self.max_pending = 0
        self.pending_series: list[float] = []

    # --- the Deployment, as controllers see it ---------------------------------------

    def in_states(self, states: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
        """The slots (ascending, read-only) whose state ``states`` selects (``_SERVING``).

        Kept until a slot changes: a tick reads these a dozen times, and slots change a
        few times an hour, so one comparison of the slots' bytes stands in for a pass
        over them each read (most of a light day's tick outside the fleet).
        """
        key = self.slot.tobytes()
        if key != self._slot_key:
            self._slot_key, self._slot_sets = key, {}
        selects = states.tobytes()  # by value: any mask, not only the module's
        found = self._slot_sets.get(selects)
        if found is None:
            found = np.flatnonzero(states[self.slot])
            found.flags.writeable = False
            self._slot_sets[selects] = found
        return found

    def running(self) -> int:
        """Replicas starting, ready or pending: the Deployment's replica count."""
        return len(self.in_states(_COUNTED))

    def ready(self) -> int:
        """Replicas ready to serve (those the gateway woke among them)."""
        return len(self.in_states(_SERVING))

    def held(self) -> int:
        """Replicas holding an accelerator: starting, ready, draining, loading."""
        return len(self.in_states(_HOLDING))

    def pending(self) -> int:
        """Replicas the Deployment wants that wait for an accelerator."""
        return len(self.in_states(_IS[PENDING]))

    def set_accelerator_limit(self, replicas: int | None) -> None:
        """Bound the accelerators held (None: unlimited); held ones above it keep running."""
        integral = isinstance(replicas, numbers.Integral) and not isinstance(replicas, bool)
        if replicas is not None and (not integral or replicas < 0):
            # int() would quietly truncate 2.5 to 2, and NaN fails with no word of the limit
            raise ValueError(f"an accelerator limit is a count >= 0 or None, not {replicas!r}")
        self.limit = None if replicas is None else int(replicas)
        self.limited = self.limited or replicas is not None

    def _room(self) -> int:
        """Accelerators a new start or wake may take now (every slot when unlimited)."""
        if self.limit is None:
            return self.slots
        return max(0, self.limit - self.held())

    def _pending_oldest_first(self) -> npt.NDArray[np.int64]:
        waiting = np.flatnonzero(self.slot == PENDING)
        return waiting[np.argsort(self.pending_since[waiting], kind="stable")]

    def scale_to(self, replicas: int, reason: str, instant: bool = False) -> None:
        """Start replicas (cold unless ``instant``); stop pending, then starting, then drain."""
        n = max(0, min(replicas, self.slots))
        current = self.running()
        if n == current:
            return
        slot, now = self.slot, self.now
        self.decisions.append((now, n, reason))
        if n > current:
            self._start(n - current, instant)
            return
        surplus = current - n
        pending = self._pending_oldest_first()[::-1][:surplus]
        slot[pending] = OFF
        surplus -= len(pending)
        starting = np.flatnonzero(slot == STARTING)[::-1][:surplus]
        slot[starting] = OFF
        surplus -= len(starting)
        if surplus:
            ready = np.flatnonzero(slot == READY)
            drain = ready[np.argsort(self.fleet.outstanding[ready], kind="stable")][:surplus]
            slot[drain] = DRAINING

    def _start(self, count: int, instant: bool) -> None:
        """Ready ``count`` more replicas: sleepers wake first, then cache-warm or cold starts.

        Under a limit, wakes and starts take the accelerators free (a loading replica
        already holds one); the rest wait pending.
        """
        slot, now, standby = self.slot, self.now, self.standby
        room = self._room()
        if instant:
            free = np.flatnonzero(slot == OFF)[: min(count, room)]
            slot[free] = READY
            self.ready_at[free] = now
            self.created[free] = now
            self._pend(count - len(free))
            return
        # the gateway's woken replicas join the count as they are (they hold an accelerator)
        woken = np.flatnonzero(slot == WOKEN)[:count]
        slot[woken] = READY
        waking = np.flatnonzero(slot == WAKING)[: count - len(woken)]
        slot[waking] = STARTING
        count -= len(woken) + len(waking)
        sleepers = np.flatnonzero(slot == SLEEPING)[: min(count, room)]
        slot[sleepers] = STARTING
        self.ready_at[sleepers] = now + self.tiers.sleeping_wake_seconds
        standby.wakes += len(sleepers)
        # a replica loading to sleep serves once loaded instead
        loading = np.flatnonzero(slot == LOADING)[: count - len(sleepers)]
        slot[loading] = STARTING
        left = count - len(sleepers) - len(loading)
        cold = np.flatnonzero(slot == OFF)[: min(left, room - len(sleepers))]
        self._cold_or_cached(cold)
        self._pend(left - len(cold))

    def _pend(self, count: int) -> None:
        """``count`` replicas wait for an accelerator (as free slots allow: max_replicas)."""
        if count <= 0:
            return
        waiting = np.flatnonzero(self.slot == OFF)[:count]
        self.slot[waiting] = PENDING
        self.pending_since[waiting] = self.now

    def _start_pending(self) -> None:
        """The oldest pending replicas start (or wake a sleeper) as the limit allows."""
        waiting = self._pending_oldest_first()
        if len(waiting) == 0:
            return
        loading = int(np.count_nonzero(self.slot == LOADING))
        startable = waiting[: self._room() + loading]
        if len(startable) == 0:
            return
        self.slot[startable] = OFF
        self._start(len(startable), instant=False)

    def _cold_or_cached(self, free: npt.NDArray[np.int64], state: int = STARTING) -> None:
        """Start ``free`` slots from the warm cache if it is, else cold."""
        now, standby = self.now, self.standby
        self.slot[free] = state
        self.created[free] = now
        if standby.cache_warm(now):
            self.ready_at[free] = now + self.tiers.cache_warm_wake_seconds
            standby.cache_starts += len(free)
        else:
            self.ready_at[free] = now + self.cold
            self.cold_starts += len(free)

    def hold_standby(
        self, sleeping: int, cache_warm: bool, reason: str, load: bool = False
    ) -> None:
        """Hold up to ``sleeping`` sleepers (fewer: the surplus stops) and the cache or not.

        Sleepers come from replicas the fleet scales down (vLLM's ``POST /sleep`` on a
        drained replica), or with ``load`` (a forecast return) from new replicas that
        start, then sleep; a cache not yet warm is filled by a DataLoad first. Pending
        replicas keep the sleepers they will wake, besides ``sleeping``.
        """
        standby, slot = self.standby, self.slot
        standby.target = sleeping
        held = np.r_[
            np.flatnonzero(slot == LOADING),
            np.flatnonzero(slot == SLEEPING),
            np.flatnonzero(slot == WAKING),
            np.flatnonzero(slot == WOKEN),
        ]
        # the sleepers pending replicas will wake once the pool allows are not surplus
        keep = sleeping + self.pending()
        if len(held) > keep:
            slot[held[: len(held) - keep]] = OFF
        elif len(held) + (draining := int(np.count_nonzero(slot == DRAINING))) < sleeping:
            # KEDA is asked for running + sleeping: the sleepers that draining replicas
            # will not be start, then sleep
            short = sleeping - len(held) - draining
            free = np.flatnonzero(slot == OFF)[: min(short, self._room())]
            if self.now <= 0:
                slot[free] = SLEEPING  # the warm start's, sized by earlier traffic as its fleet
            else:
                self._cold_or_cached(free, LOADING)
                standby.loads += len(free)
        profile = self.config.profile
        standby.hold_cache(cache_warm, self.now, profile.weights_gb, self.config.cache_fill_gbps)
        standby.reason = reason

    # --- one tick, stage by stage ----------------------------------------------------

    def start_ready(self) -> None:
        """Replicas whose cold start is over become ready; pending ones start if they may.

        Starting ones become ready, loading ones sleep, waking ones are woken.
        """
        loaded = self.in_states(_LOADED)
        due = loaded[self.ready_at[loaded] <= self.now]
        if len(due):
            woke = due[self.slot[due] == WAKING]
            self.slot[due] = _LOADED_TO[self.slot[due]]
            self.used_at[woke] = self.now
        if self.limited:
            self._start_pending()

    def admit_arrivals(self) -> None:
        """The gateway: route arrivals, buffer them while no replica is ready, time out."""
        trace, requests, buffer, config = self.trace, self.requests, self.buffer, self.config
        ready = self.in_states(_SERVING)  # no replica changes state in here
        # Arrivals up to half a tick ahead join this tick: no bias on average.
        while (
            self.next_arrival < len(trace)
            and trace.arrival[self.next_arrival] <= self.now + config.dt / 2
        ):
            i = self.next_arrival
            self.next_arrival += 1
            self.arrivals_seen.append(self.now)
            self.arrivals_in_series += 1
            if self.too_big[i]:
                requests.state[i] = DROPPED
                self.judged.add(self.now, 0, 1)
            elif buffer or not self._route(i, ready):
                if len(buffer) >= config.gateway_buffer:
                    requests.state[i] = DROPPED
                    self.judged.add(self.now, 0, 1)
                else:
                    buffer.append(i)
        while buffer and requests.arrival[buffer[0]] + config.gateway_timeout < self.now:
            requests.state[buffer.popleft()] = DROPPED
            self.judged.add(self.now, 0, 1)
        while buffer and self._route(buffer[0], ready):
            buffer.popleft()
        while self.arrivals_seen and self.now - self.arrivals_seen[0] > config.panic_window:
            self.arrivals_seen.popleft()
        self._gateway_wake(ready)

    def _gateway_wake(self, ready: npt.NDArray[np.int64]) -> None:
        """The gateway wakes sleepers for requests waiting at zero, or under pressure.

        ``serving.routing.sleepers_to_wake`` over the ready replicas' outstanding, with the
        threshold of ``config.wake_pressure`` over its baseline.
        """
        slot, config = self.slot, self.config
        if config.standby is None:
            return
        pressure, outstanding = config.wake_pressure, self.fleet.outstanding[ready]
        threshold = fill = None
        if pressure is not None:
            if len(ready):
                total = float(outstanding.sum())
                self.baseline = pressure.baseline(self.baseline, total, config.dt)
                self.shared = int(np.count_nonzero(slot[ready] == READY)) or len(ready)
            threshold = pressure.threshold(self.baseline, self.shared)
            fill = pressure.fill(self.baseline, self.shared)
            self.surplus_above = threshold
        wake = sleepers_to_wake(
            len(ready),
            int(outstanding.min()) if len(ready) else 0,
            int(outstanding.sum()),
            len(self.in_states(_IS[WAKING])),
            len(self.buffer),
            threshold,
            fill,
        )
        sleepers = self.in_states(_IS[SLEEPING])[: min(wake, self._room())]
        slot[sleepers] = WAKING
        self.ready_at[sleepers] = self.now + self.tiers.sleeping_wake_seconds
        self.standby.wakes += len(sleepers)
        self.standby.gateway_wakes += len(sleepers)

    def _route(self, index: int, ready: npt.NDArray[np.int64]) -> bool:
        """Send request ``index`` to a ``ready`` replica as ``serving.routing.choose`` does.

        The fewest outstanding among the Deployment's running replicas; among all, the
        woken surplus too, once each running one holds ``surplus_above`` (vectorised here:
        the replay routes every request of a trace).
        """
        if len(ready) <= 1:
            if len(ready) == 0:
                return False
            self.fleet.assign(index, int(ready[0]), self.now)  # the only choice
            return True
        outstanding = self.fleet.outstanding[ready]
        counted = self.slot[ready] == READY
        if counted.all() or not counted.any():
            target = ready[np.argmin(outstanding)]
        else:
            best = int(np.argmin(np.where(counted, outstanding, np.inf)))
            if outstanding[best] >= self.surplus_above:
                spare = int(np.argmin(np.where(counted, np.inf, outstanding)))
                best = spare if outstanding[spare] < outstanding[best] else best
            target = ready[best]
        self.fleet.assign(index, int(target), self.now)
        return True

    def advance_fleet(self) -> GatewayView:
        """The fleet runs one tick; drained replicas stop; returns the gateway's view."""
        slot, fleet, dt = self.slot, self.fleet, self.config.dt
        tick = fleet.advance(self.now, dt)
        self.counters[:, 1] += tick.generated
        if len(tick.first_tokens):
            self.unrecorded[0].append(tick.first_tokens)
        if len(tick.finished):
            self.unrecorded[1].append(tick.finished)
        if len(tick.finished):
            judged_in = met_count(self.requests, self.targets, tick.finished)
            self.judged.add(self.now, judged_in, len(tick.finished) - judged_in)
        holding = self.in_states(_HOLDING)
        self.replica_seconds += dt * len(holding)
        self.busy_seconds += float(tick.busy[holding].sum())
        if self.limited:
            pending = self.pending()
            self.pending_seconds += dt * pending
            self.max_pending = max(self.max_pending, pending)
        drained = self.in_states(_IS[DRAINING])
        if len(drained):
            drained = drained[fleet.outstanding[drained] == 0]
            slot[drained] = OFF
        if self.config.standby is not None:
            self._sleep_idle_woken()
            # Drained replicas sleep (vLLM's POST /sleep) while the plan wants more sleepers.
            sleepers = len(self.in_states(_IS[SLEEPING]))
            self.standby.accrue(sleepers, dt)
            held = len(self.in_states(_STANDBY))
            slot[drained[: max(0, self.standby.target - held)]] = SLEEPING
        for s in drained.tolist():
            self.histories.pop(s, None)
        within, outside = self.judged.rates(self.now)
        return GatewayView(
            len(self.arrivals_seen) / self.config.panic_window,
            len(self.buffer),
            fleet.total_outstanding,
            within,
            outside,
        )

    def _sleep_idle_woken(self) -> None:
        """Replicas the gateway woke sleep again once idle for ``sleep_after_idle``."""
        woken = self.in_states(_IS[WOKEN])
        if len(woken) == 0:
            return
        busy = woken[self.fleet.outstanding[woken] > 0]
        self.used_at[busy] = self.now
        idle = woken[self.now - self.used_at[woken] >= self.config.sleep_after_idle]
        self.slot[idle] = SLEEPING

    def scrape(self) -> None:
        """The exporter scrapes every replica with endpoints and derives the signals."""
        config = self.config
        self.next_scrape += config.scrape_interval
        first, finished = self.unrecorded
        if first or finished:
            _record(self.requests, _joined(first), _joined(finished), self.counters, self.hist)
            first.clear()
            finished.clear()
        serving = np.flatnonzero(_SERVING[self.slot] | (self.slot == DRAINING))
        latest = []
        queues = self.fleet.scheduler_queues()
        for s in serving:
            stats = _engine_stats(
                int(s), self.fleet, queues, self.counters, self.hist, self.created[s]
            )
            self.histories.setdefault(int(s), ReplicaHistory(self.horizon)).add(self.now, stats)
            latest.append(stats)
        # Derived when a policy first reads them (a poll every 15 s reads one scrape in
        # three, KPA none), from the histories as this scrape left them (``_as_now``): a
        # view read after later scrapes says what it said at its time.
        self.signals = functools.cache(
            functools.partial(
                derive,
                self.now,
                len(serving),
                latest,
                [_as_now(self.histories[int(s)]) for s in serving],
                config.panic_window,
                config.stable_window,
                self.accelerator,
            )
        )

    def record_series(self, progress: Callable[[float], None] | None) -> None:
        """Sample the plotted series (every 10 s of trace) and report progress."""
        self.next_series += 10.0
        series = self.series
        series["t"].append(self.now)
        series["arrivals"].append(self.arrivals_in_series / 10.0)
        series["replicas"].append(float(self.running()))
        series["ready"].append(float(self.ready()))
        series["awake"].append(float(self.held()))
        series["queue"].append(float(len(self.buffer) + self.fleet.queue_depth().sum()))
        self.pending_series.append(float(self.pending()))
        self.arrivals_in_series = 0
        if progress is not None:
            progress(min(self.now, self.trace.duration))

    def cost(self) -> float:
        """US$ spent so far, as ``_result`` counts the whole run's."""
        standby = float(self.standby.metrics(self.tiers)["standby_cost"])
        return self.replica_seconds / 3600.0 * self.config.profile.price_per_hour + standby

    def finished(self) -> bool:
        """Every request has arrived and none is buffered or in the fleet."""
        return (
            self.next_arrival >= len(self.trace) and not self.buffer and len(self.fleet.active) == 0
        )

    def result(self, name: str) -> Result:
        """The run's metrics; a request still unfinished counts as dropped."""
        requests = self.requests
        unfinished = (requests.state != DONE) & (requests.state != DROPPED)
        requests.state[unfinished] = DROPPED
        result = _result(
            name,
            requests,
            self.targets,
            self.config,
            self.replica_seconds,
            self.busy_seconds,
            self.cold_starts,
            self.series,
            self.decisions,
            self.standby.metrics(self.tiers),
        )
        if self.limited:
            result.series["pending"] = list(self.pending_series)
            result.metrics["pending_replica_seconds"] = self.pending_seconds
            result.metrics["max_pending"] = self.max_pending
        return result


def _record(
    requests: Requests,
    first: npt.NDArray[np.int64],
    finished: npt.NDArray[np.int64],
    counters: npt.NDArray[np.float64],
    hist: dict[str, tuple[tuple[float, ...], npt.NDArray[np.float64], npt.NDArray[np.float64]]],
) -> None:
    """The engines' counters and histograms for the ``first`` tokens and ``finished``.

    As vLLM counts them: prompt tokens at the first token (generated tokens are counted
    per step, by the tick: a finished-only count read a start's short requests as the
    whole mix); requests and the per-request histograms when they finish.
    """
    # The engine measures from when it got the request, not from the gateway's arrival.
    if len(first):
        ttft = requests.first_token[first] - requests.routed[first]
        _observe(hist["ttft"], requests.replica[first], ttft)
        np.add.at(counters[:, 0], requests.replica[first], requests.prompt[first])
    if len(finished):
        slots = requests.replica[finished]
        np.add.at(counters[:, 2], slots, 1.0)
        _observe(hist["e2e"], slots, requests.finished[finished] - requests.routed[finished])
        _observe(hist["prompt_length"], slots, requests.prompt[finished].astype(np.float64))
        _observe(hist["output_length"], slots, requests.output[finished].astype(np.float64))
        gaps = np.maximum(requests.output[finished] - 1, 1)
        _observe(hist["itl"], slots, requests.decode_time[finished] / gaps)


def _joined(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    if not parts:
        return np.empty(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _observe(
    entry: tuple[tuple[float, ...], npt.NDArray[np.float64], npt.NDArray[np.float64]],
    slots: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
) -> None:
    bounds, counts, sums = entry
    index = np.searchsorted(_bounds_array(bounds), values, side="left")
    np.add.at(counts, (slots, index), 1.0)
    np.add.at(sums, slots, values)


@functools.cache
def _bounds_array(bounds: tuple[float, ...]) -> npt.NDArray[np.float64]:
    """A histogram's bucket bounds as an array, made once per set of bounds."""
    return np.array(bounds)


def _engine_stats(
    s: int,
    fleet: Fleet,
    queues: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    counters: npt.NDArray[np.float64],
    hist: dict[str, tuple[tuple[float, ...], npt.NDArray[np.float64], npt.NDArray[np.float64]]],
    created: float,
) -> EngineStats:
    histograms = {}
    for name, (bounds, counts, sums) in hist.items():
        cumulative = np.cumsum(counts[s])
        histograms[name] = Histogram(
            bounds, tuple(cumulative.tolist()), float(cumulative[-1]), float(sums[s])
        )
    waiting, running = queues
    return EngineStats(
        "vllm",
        "replay",
        gauges={
            "running": float(running[s]),
            "waiting": float(waiting[s]),
            "kv_usage": float(fleet.kv_reserved[s] / fleet.kv_capacity),
        },
        counters={
            "prompt_tokens": float(counters[s, 0]),
            "generation_tokens": float(counters[s, 1]),
            "requests": float(counters[s, 2]),
            "preemptions": 0.0,
        },
        histograms=histograms,
        created=created,
    )


def _result(
    name: str,
    requests: Requests,
    targets: Targets,
    config: SimConfig,
    replica_seconds: float,
    busy_seconds: float,
    cold_starts: int,
    series: dict[str, list[float]],
    decisions: list[tuple[float, int, str]],
    standby: dict[str, float | int],
) -> Result:
    served = requests.state == DONE
    ttft = (requests.first_token - requests.arrival)[served]
    e2e = (requests.finished - requests.arrival)[served]
    gaps = np.maximum(requests.output - 1, 1)
    itl = requests.decode_time / gaps
    target = targets.ttft
    # The SLO (served, TTFT within its target, mean ITL within the SLO) is the anatomy's:
    # every miss has one cause, so the causes' shares add up to 1 - slo_attainment.
    cause = classify(requests, targets)
    ok = cause == MET
    ratio = np.where(
        served,
        np.maximum((requests.first_token - requests.arrival) / target, itl / config.slo_itl),
        np.inf,
    )
    gpu_hours = replica_seconds / 3600.0
    cost = gpu_hours * config.profile.price_per_hour + float(standby["standby_cost"])
    tokens = float((requests.prompt + requests.output)[served].sum())
    output_tokens = float(requests.output[served].sum())

    metrics: dict[str, float | int] = {
        "gpu_hours": gpu_hours,
        "cost": cost,
        "cost_per_million_tokens": cost / tokens * 1e6 if tokens else math.inf,
        "cost_per_million_output_tokens": cost / output_tokens * 1e6 if output_tokens else math.inf,
        "slo_attainment": float(ok.sum() / len(ok)) if len(ok) else math.nan,
        "ttft_p50_seconds": percentile(ttft, 50),
        "ttft_p95_seconds": percentile(ttft, 95),
        "ttft_p99_seconds": percentile(ttft, 99),
        "e2e_p95_seconds": percentile(e2e, 95),
        "itl_mean_p95_seconds": percentile(itl[served], 95),
        "mean_utilization": busy_seconds / replica_seconds if replica_seconds else 0.0,
        "requests": len(requests.arrival),
        "dropped": int((requests.state == DROPPED).sum()),
        "cold_starts": cold_starts,
        "max_replicas": int(max(series["replicas"], default=0)),
        # what a live fleet counts awake: the Deployment's, sleepers starting or woken
        "max_awake_replicas": int(max(series["awake"], default=0)),
        **standby,
        **_after_idle(requests, config.idle_gap),
        **anatomy(requests, targets, cause).metrics(),
    }
    assert not ((requests.state == WAITING).any()), "a request was neither served nor dropped"
    return Result(name, metrics, series, ttft, e2e, decisions, ok, ratio, cause)


@dataclass(slots=True)
class _Judged:
    """Requests the gateway judged within and outside the SLO over the last ``window`` s."""

    window: float
    ticks: deque[tuple[float, int, int]] = field(default_factory=deque)
    within: int = 0
    outside: int = 0
    outside_total: int = 0
    """Judged outside since the start (``Simulation.missed``)."""

    def add(self, now: float, within: int, outside: int) -> None:
        self.ticks.append((now, within, outside))
        self.within += within
        self.outside += outside
        self.outside_total += outside

    def rates(self, now: float) -> tuple[float, float]:
        """Within and outside per second over the window ending at ``now``."""
        ticks = self.ticks
        while ticks and now - ticks[0][0] >= self.window:
            _, within, outside = ticks.popleft()
            self.within -= within
            self.outside -= outside
        return self.within / self.window, self.outside / self.window


@dataclass(slots=True)
class _Standby:
    """The warm tiers' state: sleepers wanted, the Fluid cache, and what they cost."""

    target: int = 0
    cache_ready_at: float = math.inf
    """When the cache is (or becomes) warm; infinite while no cache is held."""
    sleeping_seconds: float = 0.0
    cache_seconds: float = 0.0
    wakes: int = 0
    gateway_wakes: int = 0
    """Of ``wakes``, those the gateway asked for (a request waiting, or pressure)."""
    cache_starts: int = 0
    loads: int = 0
    """Replicas started to sleep ahead of a forecast return."""
    reason: str = ""

    @classmethod
    def at_start(cls, config: SimConfig, tiers: WarmTiers) -> _Standby:
        """Earlier traffic warmed the cache, as it sized the warm-start fleet."""
        standby = config.standby
        warm = standby is not None and standby.cache
        return cls(cache_ready_at=0.0 if warm else math.inf)

    def cache_warm(self, now: float) -> bool:
        return now >= self.cache_ready_at

    def hold_cache(self, hold: bool, now: float, weights_gb: float, gbps: float) -> None:
        if not hold:
            self.cache_ready_at = math.inf
        elif math.isinf(self.cache_ready_at):
            self.cache_ready_at = now + weights_gb / gbps

    def accrue(self, sleepers: int, dt: float) -> None:
        self.sleeping_seconds += sleepers * dt
        if not math.isinf(self.cache_ready_at):
            self.cache_seconds += dt

    def metrics(self, tiers: WarmTiers) -> dict[str, float | int]:
        sleeping_hours = self.sleeping_seconds / 3600.0
        cache_hours = self.cache_seconds / 3600.0
        cost = sleeping_hours * tiers.sleeping_per_hour + cache_hours * tiers.cache_per_hour
        return {
            "sleeping_hours": sleeping_hours,
            "cache_hours": cache_hours,
            "standby_cost": cost,
            "wakes": self.wakes,
            "gateway_wakes": self.gateway_wakes,
            "cache_starts": self.cache_starts,
            "standby_loads": self.loads,
        }


def _after_idle(requests: Requests, idle_gap: float) -> dict[str, float | int]:
    """TTFT of each request arriving ``idle_gap`` or more after the one before (or the start).

    A dropped one counts as infinitely late (the mean and max say n/a then).
    """
    order = np.argsort(requests.arrival, kind="stable")
    # the trace's start counts as the arrival before its first request
    gaps = np.diff(requests.arrival[order], prepend=0.0)
    after = order[gaps >= idle_gap]
    ttft = np.where(
        requests.state[after] == DONE,
        requests.first_token[after] - requests.arrival[after],
        math.inf,
    )
    return {
        "after_idle_requests": len(after),
        "after_idle_ttft_mean_seconds": float(ttft.mean()) if len(ttft) else math.nan,
        "after_idle_ttft_max_seconds": float(ttft.max()) if len(ttft) else math.nan,
    }


def percentile(values: npt.NDArray[np.float64], q: float) -> float:
    """The ``q``-th percentile, NaN (not 0) when there are no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan
