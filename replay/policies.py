"""Scaling policies, each answering from the same exporter and gateway signals.

=================  ============  ===========================================================
policy             controller    what it does
=================  ============  ===========================================================
static-peak        static        the replicas the trace's peak needs, all the time
production-stack   KEDA + HPA    Prometheus trigger on vllm:num_requests_waiting, threshold 5
                                 (polling 15 s, cooldown 360 s, min 1: vLLM production-stack)
kpa                Knative KPA   concurrency target, 60 s stable / 6 s panic, panic at 200 %
aibrix-kv          KEDA + HPA    KV-cache use target 0.5 per replica (AIBrix benchmark, min 1)
oracle             schedule      the fewest replicas meeting the SLO per interval, no cold start
unitscale          KEDA + HPA    the scaler's registry and decide(), external-push activation
=================  ============  ===========================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from foundation.errors import NoDataError
from foundation.signals import EngineSignals, GatewaySignals, Snapshot
from replay.controllers import (
    Controller,
    KedaController,
    KpaController,
    ScheduleController,
    StaticController,
)
from replay.keda import Answer, ScalingSpec
from scaler.core.model import Policy as CorePolicy
from scaler.registry import METRIC_NAME, TARGET_VALUE, ScaledObjectRegistry, metric_value
from scaler.signals import SignalStore

KEY = ("replay", "llm", "")


@dataclass(frozen=True, slots=True)
class GatewayView:
    """The gateway's numbers at one moment."""

    arrival_rate: float
    buffered: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class View:
    """Everything a policy may look at, at ``now``."""

    now: float
    signals: EngineSignals | None
    gateway: GatewayView
    replicas: int
    ready: int


class Policy(Protocol):
    """A policy: its name, and a fresh controller (with its own state) for each run."""

    name: str

    def controller(self) -> Controller:
        """The controller that scales the replay's fleet for this policy."""
        ...


@dataclass
class StaticPeak:
    """Fixed replicas: enough for the trace's peak (from the oracle's schedule)."""

    replicas: int
    name: str = "static-peak"

    def controller(self) -> Controller:
        return StaticController(self.replicas)


@dataclass
class Scheduled:
    """Replicas from a schedule known in advance, started instantly (the oracle)."""

    schedule: Callable[[float], int]
    name: str = "oracle"

    def controller(self) -> Controller:
        return ScheduleController(self.schedule)


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
        return KedaController(self)


@dataclass
class AibrixKv:
    """AIBrix's KV-cache target: mean KV use 0.5 per replica, HPA arithmetic."""

    name: str = "aibrix-kv"
    push: bool = False
    target: float = 0.5
    spec: ScalingSpec = field(default_factory=lambda: ScalingSpec(min_replicas=1, max_replicas=64))

    def answer(self, view: View) -> Answer:
        s = view.signals
        if s is None or s.kv_usage is None:
            return Answer(None, self.target, None, "no kv metric")
        total = s.kv_usage * max(s.replicas_up, 1)  # Prometheus sums the per-pod values
        return Answer(total, self.target, True, "kv")

    def controller(self) -> Controller:
        return KedaController(self)


@dataclass
class Kpa:
    """Knative's KPA on in-flight requests (target x 70% utilisation per replica)."""

    target_concurrency: float
    name: str = "kpa"
    stable_window: float = 60.0
    panic_window: float = 6.0
    panic_threshold: float = 2.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace: float = 30.0
    spec: ScalingSpec = field(default_factory=lambda: ScalingSpec(min_replicas=0, max_replicas=64))

    def controller(self) -> Controller:
        # The activator holds requests at zero and pokes the autoscaler: push, in effect.
        return KpaController(self)


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
        self._store = SignalStore()
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

    @staticmethod
    def gateway_signals(view: View) -> Snapshot:
        """The gateway's snapshot for a view, as the gateway publishes it."""
        gateway = GatewaySignals(
            time=view.now,
            arrival_rate=view.gateway.arrival_rate,
            buffered=view.gateway.buffered,
            in_flight=view.gateway.in_flight,
        )
        return Snapshot(KEY, gateway)


RECOMMENDED_SPEC = ScalingSpec(
    min_replicas=0,
    max_replicas=64,
    polling_interval=15.0,
    cooldown=60.0,
    scale_down_stabilization=60.0,
    scale_up_percent=400.0,
    scale_up_pods=16,
    scale_down_percent=50.0,
)
"""``deploy/scaledobject-recommended.yaml``'s scaling, as KEDA and the HPA act on it."""


def unitscale_policy(
    target_concurrency: float, max_replicas: int, defaults: CorePolicy | None = None
) -> Unitscale:
    """The unitscale policy with trigger metadata as a ScaledObject would carry it."""
    return Unitscale(
        defaults=defaults or CorePolicy(),
        metadata={
            "scalerAddress": "replay:9090",
            "deployment": KEY[1],
            "targetConcurrency": f"{target_concurrency:g}",
            "maxReplicas": str(max_replicas),
        },
        # deploy/scaledobject-recommended.yaml (a test keeps the two equal): the scaler
        # delays scale-down itself, so the HPA's own stabilization is cut to 60 s.
        spec=replace(RECOMMENDED_SPEC, max_replicas=max_replicas),
    )


__all__ = [
    "METRIC_NAME",
    "AibrixKv",
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
