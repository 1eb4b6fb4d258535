"""Who changes the replica count in a replay: one controller object per policy.

``simulate`` knows only the ``Controller`` protocol: ``start`` sizes the fleet before
the first tick, ``tick`` acts on each tick's ``View`` through an ``Actuator`` (the
simulated Deployment). Each controller keeps its own loop state and timers:

============  ==============================================================
controller    acts like
============  ==============================================================
static        a fixed Deployment: its replicas, ready from the start
schedule      a clairvoyant: replicas from a schedule, started instantly
keda          KEDA + HPA over a policy's metric (``replay.keda``), push too
kpa           Knative's KPA and activator on in-flight requests
============  ==============================================================
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from foundation.replica_model import WarmTiers
from replay.keda import Answer, LoopState, ScalingSpec, hpa_sync, keda_poll
from scaler.core.seasonal import SeasonalPolicy, seasonal_forecast
from scaler.core.standby import STANDBY_INTERVAL, STANDBY_WINDOW
from scaler.core.tiers import StandbyInputs, StandbyPolicy, plan_standby

if TYPE_CHECKING:
    from replay.policies import Kpa, View


class Actuator(Protocol):
    """The simulated Deployment a controller scales."""

    def scale_to(self, replicas: int, reason: str, instant: bool = False) -> None:
        """Start or stop replicas; ``instant`` ones skip the cold start."""
        ...

    def running(self) -> int:
        """Replicas starting or ready (what the Deployment's replica count says)."""
        ...

    def hold_standby(
        self, sleeping: int, cache_warm: bool, reason: str, load: bool = False
    ) -> None:
        """Hold ``sleeping`` sleepers (``load``: start some to sleep) and the cache, or not."""
        ...


class Controller(Protocol):
    """Sizes the fleet at the start and acts on every tick."""

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        """Size the fleet before the first tick (``initial_replicas`` ready, if it may)."""
        ...

    def tick(self, view: View, actuator: Actuator) -> None:
        """Act on what can be seen at ``view.now``."""
        ...


class KedaTrigger(Protocol):
    """A ScaledObject's trigger: its scaling settings and its answer to a view."""

    spec: ScalingSpec
    push: bool
    """Activates at once on buffered requests (external-push)."""

    def answer(self, view: View) -> Answer:
        """The metric, target and activity the trigger gives KEDA and the HPA."""
        ...


def warm_start(actuator: Actuator, min_replicas: int, initial_replicas: int) -> None:
    """Replicas running before the trace, as earlier traffic would have left them."""
    warm = max(min_replicas, initial_replicas)
    if warm > 0:
        actuator.scale_to(warm, "running before the trace", instant=True)


@dataclass(slots=True)
class StaticController:
    """A fixed fleet, ready from the start."""

    replicas: int

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        actuator.scale_to(self.replicas, "static", instant=True)

    def tick(self, view: View, actuator: Actuator) -> None:
        pass


@dataclass(slots=True)
class ScheduleController:
    """Replicas from ``schedule(now)``, started and stopped instantly (the oracle)."""

    schedule: Callable[[float], int]

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        actuator.scale_to(self.schedule(0.0), "schedule", instant=True)

    def tick(self, view: View, actuator: Actuator) -> None:
        actuator.scale_to(self.schedule(view.now), "schedule", instant=True)


@dataclass(slots=True)
class KedaController:
    """KEDA's poll (0 <-> 1, cooldown) and the HPA's sync (1 <-> N) over a trigger."""

    trigger: KedaTrigger
    state: LoopState = field(default_factory=LoopState)
    next_poll: float = 0.0
    next_hpa: float = 0.0

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        warm_start(actuator, self.trigger.spec.min_replicas, initial_replicas)

    def tick(self, view: View, actuator: Actuator) -> None:
        spec, now = self.trigger.spec, view.now
        if self.trigger.push and view.gateway.buffered and actuator.running() == 0:
            answer = self.trigger.answer(view)
            if answer.active:
                actuator.scale_to(max(spec.min_replicas, 1), "push: " + answer.reason)
                self.state = self.state.activated(now)
        if now >= self.next_poll:
            self.next_poll += spec.polling_interval
            answer = self.trigger.answer(view)
            replicas, self.state = keda_poll(actuator.running(), answer, self.state, now, spec)
            actuator.scale_to(replicas, "keda: " + answer.reason)
        if now >= self.next_hpa:
            self.next_hpa += spec.hpa_sync
            answer = self.trigger.answer(view)
            replicas, self.state = hpa_sync(actuator.running(), answer, self.state, now, spec)
            actuator.scale_to(replicas, "hpa: " + answer.reason)


KPA_TICK = 2.0
"""Knative's autoscaler ticks every 2 s."""


@dataclass(slots=True)
class KpaController:
    """Knative's KPA: in-flight samples, panic mode, and the activator at zero."""

    policy: Kpa
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    panic_until: float = -math.inf
    panic_floor: int = 0
    last_nonzero: float = -math.inf
    next_tick: float = 0.0

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        warm_start(actuator, self.policy.spec.min_replicas, initial_replicas)

    def tick(self, view: View, actuator: Actuator) -> None:
        self.observe(view.now, view.gateway.buffered + view.gateway.in_flight)
        if view.gateway.buffered and actuator.running() == 0:
            actuator.scale_to(1, "activator: request at zero")
        if view.now >= self.next_tick:
            self.next_tick += KPA_TICK
            actuator.scale_to(self.desired(view.now, view.ready), "kpa")

    def observe(self, now: float, concurrency: float) -> None:
        """Record one concurrency sample; keep the stable window's."""
        self.samples.append((now, concurrency))
        while self.samples and now - self.samples[0][0] > self.policy.stable_window:
            self.samples.popleft()
        if concurrency > 0:
            self.last_nonzero = now

    def desired(self, now: float, ready: int) -> int:
        """``ceil(window average / target)`` with Knative's panic and rate rules."""
        p = self.policy
        target = p.target_concurrency
        stable = [c for _, c in self.samples]
        panic = [c for t, c in self.samples if now - t <= p.panic_window]
        stable_avg = sum(stable) / len(stable) if stable else 0.0
        panic_avg = sum(panic) / len(panic) if panic else 0.0
        want_stable = math.ceil(stable_avg / target - 1e-9)
        want_panic = math.ceil(panic_avg / target - 1e-9)
        floor = math.floor(ready / p.max_scale_down_rate) if ready else 0
        if ready and want_panic / ready >= p.panic_threshold:
            self.panic_until = now + p.stable_window
        if now < self.panic_until:
            self.panic_floor = max(self.panic_floor, want_panic, ready)
            want = max(want_stable, self.panic_floor)
        else:
            self.panic_floor = 0
            want = max(want_stable, floor)
        if want == 0 and now - self.last_nonzero < p.scale_to_zero_grace:
            want = max(ready, 1) if ready else 0
        return min(want, p.spec.max_replicas)


@dataclass(slots=True)
class StandbyController:
    """Any controller, plus the warm-tier plan (``scaler.core.tiers``) after each of its acts.

    Every ``STANDBY_INTERVAL`` (the served plan's too, ``scaler.core.standby``) it samples
    the replicas the controller asked for (the fleet's need), notes whether any request
    was seen, and holds what ``plan_standby`` says: sleepers and the Fluid cache. It
    never changes the running count. With ``seasonal``, a confident ``seasonal_forecast``
    of the window one load ahead (a cold start and two plans) is the plan's
    ``forecast_peak``, and the sleepers it asks for are started to sleep if the fleet has
    too few (predictive prewarm).
    """

    inner: Controller
    tiers: WarmTiers
    policy: StandbyPolicy
    slo_ttft: float
    seasonal: SeasonalPolicy | None = None
    max_pods: int | None = None
    """KEDA's ``maxReplicaCount``, which counts sleepers as pods (``StandbyInputs.max_pods``)."""
    served_before: bool = True
    """``SimConfig.served_before``."""
    need: deque[tuple[float, float]] = field(default_factory=deque)
    pods: deque[tuple[float, int]] = field(default_factory=deque)
    """The plans' ``wanted_pods`` sampled (``StandbyInputs.recent_pods``)."""
    history: deque[tuple[float, float]] = field(default_factory=deque)
    """The need over the forecast's lookback (with ``seasonal``)."""
    last_activity: float = 0.0
    next_plan: float = 0.0
    planned_for: int = -1
    pods_held: int | None = None
    """Running + sleeping of the last plan (``StandbyInputs.pods_held``)."""

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        # A fleet that served before holds its sleepers from t=0; one that never served
        # (the scaler: "idle for ever") holds none until its first request.
        self.last_activity = 0.0 if self.served_before else -math.inf
        self.inner.start(actuator, initial_replicas)

    def tick(self, view: View, actuator: Actuator) -> None:
        self.inner.tick(view, actuator)
        gateway = view.gateway
        if gateway.arrival_rate > 0 or gateway.buffered or gateway.in_flight:
            self.last_activity = view.now
        running = actuator.running()
        # A scale-down is planned at once: its drained replicas sleep or stop by the plan
        # for the count they leave, not the count before.
        if view.now < self.next_plan and running == self.planned_for:
            return
        sampled = view.now >= self.next_plan
        if sampled:
            self.next_plan += STANDBY_INTERVAL
            self._sample(view.now, running)
        self.planned_for = running
        forecast, why = self._forecast(view.now)
        inputs = StandbyInputs(
            now=view.now,
            desired_running=running,
            recent_need=tuple(n for _, n in self.need),
            last_activity=self.last_activity,
            slo_ttft_seconds=self.slo_ttft,
            forecast_peak=forecast,
            max_pods=self.max_pods,
            recent_pods=tuple(self.pods),
            pods_held=self.pods_held,
        )
        plan = plan_standby(inputs, self.tiers, self.policy)
        if sampled:
            self.pods.append((view.now, plan.wanted_pods))
        self.pods_held = running + plan.sleeping
        load = forecast is not None and forecast > running
        actuator.hold_standby(plan.sleeping, plan.cache_warm, plan.reason + why, load)

    def _sample(self, now: float, running: int) -> None:
        self.need.append((now, float(running)))
        while self.need and now - self.need[0][0] > STANDBY_WINDOW:
            self.need.popleft()
        while self.pods and now - self.pods[0][0] > STANDBY_WINDOW:
            self.pods.popleft()
        if self.seasonal is not None:
            self.history.append((now, float(running)))
            keep = self.seasonal.lookback_days * self.seasonal.day_seconds + STANDBY_WINDOW
            while self.history and now - self.history[0][0] > keep:
                self.history.popleft()

    def _forecast(self, now: float) -> tuple[float | None, str]:
        """The confident seasonal forecast's replicas one load ahead (None: none)."""
        if self.seasonal is None:
            return None, ""
        lead = self.tiers.cold_wake_seconds + 2 * STANDBY_INTERVAL
        forecast = seasonal_forecast(tuple(self.history), now, lead, self.seasonal)
        if not forecast.confident or forecast.peak is None:
            return None, ""
        return forecast.peak, f"; {forecast.reason}"
