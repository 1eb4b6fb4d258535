"""Scaling policies, each answering from the same exporter and gateway signals.

=================  ============  ===========================================================
policy             controller    what it does (docs/replay.md: each setting and its source)
=================  ============  ===========================================================
static-peak        static        the smallest fixed fleet meeting the SLO target (``replicas``)
production-stack   KEDA + HPA    Prometheus trigger on vllm:num_requests_waiting, threshold 5
                                 (polling 15 s, cooldown 360 s, min 1: vLLM production-stack)
kpa                Knative KPA   ``target`` 32 at 70 % utilisation, 60 s stable / 6 s panic,
                                 panic at 200 %, ``scale_down_delay`` 300 s, min-scale 0
aibrix-kv          KEDA + HPA    KV-cache use target 0.15 per replica (``target``, min 1)
oracle             clairvoyant   per 15 s interval the fewest ready replicas meeting the SLO,
                                 each started one cold start ahead and billed from its start
instant-bound      schedule      the old fit: one multiplier on the work, instant starts
unitscale          KEDA + HPA    the scaler's registry and decide(), external-push activation
=================  ============  ===========================================================
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from foundation.errors import NoDataError
from foundation.signals import EngineSignals, GatewaySignals, Snapshot
from replay.controllers import (
    KPA_TICK,
    Actuator,
    Controller,
    KedaController,
    KedaTrigger,
    KpaController,
    ScheduleController,
    StaticController,
    warm_start,
)
from replay.keda import Answer, LoopState, ScalingSpec
from scaler.core.model import Policy as CorePolicy
from scaler.demand import Declared, declared
from scaler.registry import METRIC_NAME, TARGET_VALUE, ScaledObjectRegistry, metric_value
from scaler.signals import SignalStore

KEY = ("replay", "llm", "")


@dataclass(frozen=True, slots=True)
class GatewayView:
    """The gateway's numbers at one moment."""

    arrival_rate: float
    buffered: int
    in_flight: int
    slo_within_rate: float | None = None
    """Requests per second judged within the SLO over the gateway's stable window."""
    slo_outside_rate: float | None = None
    """Requests per second judged outside it (late, or dropped) over the same window."""


@dataclass(frozen=True, slots=True)
class View:
    """Everything a policy may look at, at ``now``."""

    now: float
    engine: EngineSignals | Callable[[], EngineSignals | None] | None
    """The exporter's signals, or what derives them when first read (``signals``)."""
    gateway: GatewayView
    replicas: int
    ready: int

    @property
    def signals(self) -> EngineSignals | None:
        """The exporter's signals at its last scrape (None before the first)."""
        return self.engine() if callable(self.engine) else self.engine


class Policy(Protocol):
    """A policy: its name, and a fresh controller (with its own state) for each run."""

    name: str

    def controller(self) -> Controller:
        """The controller that scales the replay's fleet for this policy."""
        ...


@dataclass
class StaticPeak:
    """Fixed replicas, ready from the start.

    ``replay.run`` sizes ``static-peak`` as the smallest fleet meeting the SLO target.
    """

    replicas: int
    name: str = "static-peak"

    def controller(self) -> Controller:
        return StaticController(self.replicas)


@dataclass
class Scheduled:
    """Replicas from a schedule known in advance, started instantly (the instant bound)."""

    schedule: Callable[[float], int]
    name: str = "instant-bound"

    def controller(self) -> Controller:
        return ScheduleController(self.schedule)


@dataclass
class Clairvoyant:
    """Every arrival known in advance, every policy's physics (the ``oracle`` row).

    ``ready[i]`` replicas must be ready through interval ``i`` (``[i, i + 1) * interval``).
    A replica is started ``lead`` seconds (its cold start plus a tick) before the first
    interval that needs it and is billed from its start, as every policy's are; at any
    moment the fleet holds the most any interval starting within ``lead`` needs, so it
    keeps replicas through a dip shorter than a cold start (stopping and restarting
    would bill the restart's cold start anyway) and stops them in a longer one. The
    replicas needed before a cold start could finish are running before the trace, as
    every policy's warm start is.
    """

    ready: Sequence[int]
    interval: float
    lead: float
    name: str = "oracle"

    def controller(self) -> Controller:
        return LookaheadController(tuple(int(r) for r in self.ready), self.interval, self.lead)

    def running_at(self, now: float) -> int:
        """Replicas starting or ready at ``now``: the most any interval within ``lead`` needs."""
        return _lookahead(tuple(int(r) for r in self.ready), self.interval, self.lead, now)


def _lookahead(ready: tuple[int, ...], interval: float, lead: float, now: float) -> int:
    if not ready:
        return 0
    last = len(ready) - 1
    first = min(int(now // interval), last)
    until = min(int((now + lead) // interval), last)
    return max(ready[first : until + 1])


@dataclass(slots=True)
class LookaheadController:
    """Starts (cold) what the intervals within ``lead`` need; drains what none needs."""

    ready: tuple[int, ...]
    interval: float
    lead: float

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        actuator.scale_to(
            _lookahead(self.ready, self.interval, self.lead, 0.0), "clairvoyant", instant=True
        )

    def tick(self, view: View, actuator: Actuator) -> None:
        actuator.scale_to(_lookahead(self.ready, self.interval, self.lead, view.now), "clairvoyant")


@dataclass(slots=True)
class WarmKedaController:
    """KEDA + HPA (``KedaController``) whose HPA remembers the warm start.

    A warm start stands for earlier traffic that sized the fleet: the HPA would have
    recommended those replicas within its scale-down stabilization window, so the
    window starts with them instead of empty (an empty window let the first sync, on
    one scrape of a just-started trace, drop the warm fleet at t = 0).
    """

    trigger: KedaTrigger
    keda: KedaController = field(init=False)

    def __post_init__(self) -> None:
        self.keda = KedaController(self.trigger)

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        self.keda.start(actuator, initial_replicas)
        running = actuator.running()
        if running:
            self.keda.state = LoopState(0.0, ((0.0, running),))

    def tick(self, view: View, actuator: Actuator) -> None:
        self.keda.tick(view, actuator)


@dataclass
class ProductionStack:
    """KEDA Prometheus trigger on the engines' waiting queue, threshold 5."""

    name: str = "production-stack"
    push: bool = False
    threshold: float = 5.0
    spec: ScalingSpec = field(
        default_factory=lambda: ScalingSpec(
            min_replicas=1, max_replicas=64, polling_interval=15.0, cooldown=360.0
        )
    )

    def answer(self, view: View) -> Answer:
        s = view.signals
        if s is None or s.queue_depth is None:
            return Answer(None, self.threshold, None, "no queue metric")
        return Answer(s.queue_depth, self.threshold, s.queue_depth > 0, "waiting")

    def controller(self) -> Controller:
        return WarmKedaController(self)


AIBRIX_KV_TARGET = 0.15
"""Below what a saturated replica holds (0.39-0.59 on the shared traces; docs/replay.md)."""


@dataclass
class AibrixKv:
    """AIBrix's KV-cache target: mean KV use per replica, HPA arithmetic.

    AIBrix's samples use 0.5 (``samples/autoscaling``); a replica whose 256 seats are
    full holds only 0.39-0.59 of this model's KV cache on the shared traces, so an
    operator sets the target below saturation, near what replicas hold while the fleet
    meets the SLO: 0.15 by default (``target``).
    """

    name: str = "aibrix-kv"
    push: bool = False
    target: float = AIBRIX_KV_TARGET
    spec: ScalingSpec = field(default_factory=lambda: ScalingSpec(min_replicas=1, max_replicas=64))

    def answer(self, view: View) -> Answer:
        s = view.signals
        if s is None or s.kv_usage is None:
            return Answer(None, self.target, None, "no kv metric")
        total = s.kv_usage * max(s.replicas_up or 0, 1)  # Prometheus sums the per-pod values
        return Answer(total, self.target, True, "kv")

    def controller(self) -> Controller:
        return WarmKedaController(self)


KPA_TARGET = 32.0
"""Knative's ``autoscaling.knative.dev/target`` for a vLLM replica (docs/replay.md)."""
KPA_SCALE_DOWN_DELAY = 300.0
"""Knative's ``scale-down-delay`` (default 0 s) as operators of slow-starting models set it."""


@dataclass
class Kpa:
    """Knative's KPA on in-flight requests, with Knative's knobs.

    ``target`` is ``autoscaling.knative.dev/target`` (in-flight requests per replica),
    ``target_utilization`` Knative's ``target-utilization-percentage`` (70 %), so the
    autoscaler aims at ``target * target_utilization`` per replica; ``scale_down_delay``
    (``scale-down-delay``) holds the highest recommendation of that window before any
    scale-down, zero included; ``min_scale`` is ``autoscaling.knative.dev/min-scale``.
    """

    target: float = KPA_TARGET
    target_utilization: float = 0.7
    scale_down_delay: float = KPA_SCALE_DOWN_DELAY
    min_scale: int = 0
    name: str = "kpa"
    stable_window: float = 60.0
    panic_window: float = 6.0
    panic_threshold: float = 2.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace: float = 30.0
    spec: ScalingSpec = field(default_factory=lambda: ScalingSpec(min_replicas=0, max_replicas=64))

    @property
    def target_concurrency(self) -> float:
        """In-flight requests per replica the autoscaler aims at."""
        return self.target * self.target_utilization

    def controller(self) -> Controller:
        # The activator holds requests at zero and pokes the autoscaler: push, in effect.
        return KnativeController(self)


@dataclass(slots=True)
class KnativeController:
    """Knative's KPA decider (``KpaController``), then its scale-down delay and bounds.

    Knative records each tick's recommendation in a window of ``scale-down-delay`` and
    scales to the window's highest (``pkg/autoscaler/scaling/autoscaler.go``), then
    applies min-scale and max-scale.
    """

    policy: Kpa
    decider: KpaController = field(init=False)
    recent: deque[tuple[float, int]] = field(default_factory=deque)
    next_tick: float = 0.0

    def __post_init__(self) -> None:
        self.decider = KpaController(self.policy)

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        warm_start(actuator, self.policy.min_scale, initial_replicas)
        # earlier traffic recommended the warm fleet within the delay window
        if self.policy.scale_down_delay > 0 and actuator.running():
            self.recent.append((0.0, actuator.running()))

    def tick(self, view: View, actuator: Actuator) -> None:
        p = self.policy
        self.decider.observe(view.now, view.gateway.buffered + view.gateway.in_flight)
        if view.gateway.buffered and actuator.running() == 0:
            actuator.scale_to(max(1, p.min_scale), "activator: request at zero")
        if view.now >= self.next_tick:
            self.next_tick += KPA_TICK
            want = self.delayed(view.now, self.decider.desired(view.now, view.ready))
            actuator.scale_to(min(max(want, p.min_scale), p.spec.max_replicas), "kpa")

    def delayed(self, now: float, want: int) -> int:
        """The highest recommendation of the last ``scale_down_delay`` seconds."""
        delay = self.policy.scale_down_delay
        if delay <= 0:
            return want
        self.recent.append((now, want))
        while self.recent and now - self.recent[0][0] >= delay:
            self.recent.popleft()
        return max(r for _, r in self.recent)


@dataclass
class Unitscale:
    """The scaler itself: ``ScaledObjectRegistry`` (the code serving KEDA) over the signals.

    Each view becomes the exporter's and the gateway's snapshots (``foundation.signals``,
    what the scaler decodes from the wire), fed to a ``SignalStore``; KEDA's calls are
    answered by ``ScaledObjectRegistry.current``, exactly as ``GetMetrics`` and
    ``IsActive`` answer them.
    """

    metadata: dict[str, str]
    defaults: CorePolicy = field(default_factory=CorePolicy)
    """The scaler config's policy section (``ScalerConfig.policy``)."""
    name: str = "unitscale"
    push: bool = True
    spec: ScalingSpec = field(default_factory=lambda: ScalingSpec(min_replicas=0, max_replicas=64))
    _now: float = 0.0
    _store: SignalStore = field(init=False)
    _registry: ScaledObjectRegistry = field(init=False)

    def __post_init__(self) -> None:
        self._store = SignalStore(clock=lambda: self._now)  # the simulated clock
        self._registry = ScaledObjectRegistry(
            self._store, 60.0, clock=lambda: self._now, policy_defaults=self.defaults
        )

    def controller(self) -> Controller:
        return KedaController(self)

    def answer(self, view: View) -> Answer:
        self._now = view.now
        if view.signals is not None:
            self._store.update(Snapshot(KEY, view.signals))
        self._store.update(self.gateway_signals(view))
        scaled = self._registry.resolve(KEY[1], KEY[0], self.metadata)
        try:
            decision = self._registry.current(scaled)
        except NoDataError as err:
            return Answer(None, TARGET_VALUE, None, str(err))
        # The value GetMetrics would return: the HPA then lands where decide() wants.
        return Answer(metric_value(decision), TARGET_VALUE, decision.active, decision.reason)

    def declared(self) -> Declared | None:
        """What its ScaledObject contributes to its pool's demand; None without a ``pool``.

        Read from the registry as ``GetInferenceDemand`` reads it (``scaler.demand.declared``).
        """
        return declared(self._registry.resolve(KEY[1], KEY[0], self.metadata))

    @staticmethod
    def gateway_signals(view: View) -> Snapshot:
        """The gateway's snapshot for a view, as the gateway publishes it."""
        gateway = GatewaySignals(
            time=view.now,
            arrival_rate=view.gateway.arrival_rate,
            buffered=view.gateway.buffered,
            in_flight=view.gateway.in_flight,
            slo_within_rate=view.gateway.slo_within_rate,
            slo_outside_rate=view.gateway.slo_outside_rate,
        )
        return Snapshot(KEY, gateway)


RECOMMENDED_SPEC = ScalingSpec(
    min_replicas=0,
    max_replicas=64,
    polling_interval=15.0,
    cooldown=60.0,
    scale_down_stabilization=0.0,
    scale_up_percent=400.0,
    scale_up_pods=16,
    scale_down_percent=50.0,
    fallback_replicas=2,
    failure_threshold=3,
)
"""``deploy/scaledobjects/recommended.yaml``'s scaling, as KEDA and the HPA act on it."""


def unitscale_policy(
    target_concurrency: float,
    max_replicas: int,
    defaults: CorePolicy | None = None,
    profile: str | None = None,
    pool: str | None = None,
) -> Unitscale:
    """The unitscale policy with trigger metadata as a ScaledObject would carry it.

    ``profile`` names the replica model in the metadata (``profile: llama3-8b-h200``), as
    an operator whose replicas run that model would. ``pool`` declares the accelerator
    pool its replicas run on, one accelerator each (``acceleratorsPerReplica: "1"``), so
    the pool's inference demand counts it (the joint replay, ``replay.pool.joint``).
    """
    metadata = {
        "scalerAddress": "replay:9090",
        "deployment": KEY[1],
        "targetConcurrency": f"{target_concurrency:g}",
        "maxReplicas": str(max_replicas),
    }
    if profile is not None:
        metadata["profile"] = profile
    if pool is not None:
        metadata["pool"] = pool
        metadata["acceleratorsPerReplica"] = "1"
    return Unitscale(
        defaults=defaults or CorePolicy(),
        metadata=metadata,
        # deploy/scaledobjects/recommended.yaml (a test keeps the two equal): the scaler
        # holds scale-down itself (scale-down-window), so the HPA's stabilization is 0.
        spec=replace(RECOMMENDED_SPEC, max_replicas=max_replicas),
    )


__all__ = [
    "AIBRIX_KV_TARGET",
    "KPA_SCALE_DOWN_DELAY",
    "KPA_TARGET",
    "METRIC_NAME",
    "AibrixKv",
    "Clairvoyant",
    "GatewayView",
    "Kpa",
    "Policy",
    "ProductionStack",
    "Scheduled",
    "StaticPeak",
    "Unitscale",
    "View",
    "unitscale_policy",
]
