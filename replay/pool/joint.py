"""The joint replay: one heterogeneous pool shared by training tasks and inference fleets.

Every ``tick`` (5 s) of simulated time, in this order (docs/replay.md, "The joint replay
(one pool)"):

1. each inference ``Simulation`` (``replay.simulate``, the unitscale scaler's registry
   and ``decide()``) advances to the tick;
2. training tasks that arrived join the ClusterQueue (``replay.pool.kueue``); those
   whose run is over release their cards;
3. under ``manager``, the capacity manager plans: ``admission.pool.plan_pool`` over the
   pool's cards, the training admitted, and the inference demand the scalers serve
   (``scaler.demand.pool_demand`` over each policy's registry entry, as
   ``GetInferenceDemand`` computes it); its reclaims evict training tasks, which go
   back to the queue at their original arrival and start again from scratch;
4. inference replicas the Deployments want and that hold no card are placed, one whole
   card each (under ``static`` they use the cards carved out for inference instead);
5. Kueue admits queued tasks in BestEffortFIFO order while the quota, the admission
   check (``manager``: ``admission.pool.within_allowance``) and the pool's room allow;
6. each Simulation's accelerator limit becomes the cards its replicas hold, so replicas
   not placed stay Pending.

Baselines: ``static`` (inference's peak carved out, training's quota the rest, no
preemption), ``kueue`` (training's quota the whole pool, no headroom signal, no
preemption: inference waits for cards to free), ``manager`` (quota the whole pool, our
admission check and reclaims). Pure: no clock, no I/O; the caller passes the nodes,
tasks and traces, and gets ``JointResult`` values back.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from admission.pool import (
    Admitted,
    InferenceNeed,
    ManagerPolicy,
    PoolPlan,
    PoolState,
    plan_pool,
    within_allowance,
)
from admission.reclaim import others_cards
from replay.policies import Unitscale, unitscale_policy
from replay.pool.cluster import Node, Task
from replay.pool.kueue import ClusterQueue, Workload
from replay.pool.placement import Placement, PlacementPolicy, Pool, TaskMix, TaskShape
from replay.simulate import Result, SimConfig, Simulation
from replay.trace import Trace
from scaler.core.model import Policy as CorePolicy
from scaler.demand import pool_demand

Baseline = Literal["static", "kueue", "manager"]
MixSource = Literal["joint", "training"]
"""What FGD's target workload is: training's tasks and inference's replicas (``joint``),
or training's alone (``training``, the pod list's mix as the placement bench uses)."""
BASELINES: tuple[Baseline, ...] = ("static", "kueue", "manager")
POOL = "shared"
"""The pool every inference ScaledObject declares (``pool`` trigger metadata)."""
TICK = 5.0
"""Seconds between the pool's steps (the scaler's decisions come every 15 s polling)."""
QOS_PRIORITY = {"Guaranteed": 3, "LS": 2, "Burstable": 1, "BE": 0}
"""The trace's QoS classes as Kueue workload priorities."""
PREEMPTIBLE_MAX_PRIORITY = 0
"""Workloads at or below this priority are preemptible (the manager's default maxPriority)."""
DURATION_CAP = 1800.0
"""Seconds a training task runs at most: the trace records some for months."""
MAX_TASKS = 1_000_000
"""Training tasks one replay holds after the training load's copies, as many as a pod list
may have rows (``replay.pool.cluster.MAX_ROWS``). The copies are asked for by the offered
load, not the file's size: one task of a second on four cards was 66,857 tasks at
``--training-load 30`` (18 s) and 2.2M at 1,000, and a day's trace asked for 10^8."""
ARRIVAL_START_QUANTILE = 0.01
"""Training arrivals before this quantile come at the start (``prepare_tasks``)."""
REPLICA_CPU_MILLI = 8000
REPLICA_MEMORY_MIB = 32768
"""What one inference replica's pod requests besides its card."""


class PoolError(ValueError):
    """The nodes, tasks and traces together ask what the pool cannot run.

    A partition larger than the pool, an unknown QoS, a task name twice: the command's
    input, not a fault here, so ``unitscale replay --pool`` reports it as one line.
    """


@dataclass(frozen=True, slots=True)
class Inference:
    """One inference deployment: a trace replayed under the unitscale scaler."""

    name: str
    trace: Trace
    config: SimConfig
    target_concurrency: float = 32.0
    max_replicas: int = 64
    defaults: CorePolicy | None = None
    profile: str | None = "llama3-8b-h200"
    initial_replicas: int = 0
    """The warm start: replicas the Deployment starts with (``unitscale replay``'s is the
    instant bound's first interval, ``replay.run.warm_replicas``); 0: cold."""

    @property
    def horizon(self) -> float:
        """Seconds the replay runs: the trace and its tail."""
        return self.trace.duration + self.config.tail

    def simulation(self) -> Simulation:
        """A fresh replay under the scaler, its ScaledObject declaring the pool.

        It runs through the tail (``run_tail``): the pool goes on to the horizon, and a
        fleet frozen at the last request would hold its cards, and the scaler's demand,
        until then.
        """
        policy = unitscale_policy(
            self.target_concurrency, self.max_replicas, self.defaults, self.profile, pool=POOL
        )
        return Simulation(
            self.trace, policy, self.config, initial_replicas=self.initial_replicas, run_tail=True
        )


@dataclass(frozen=True, slots=True)
class JointConfig:
    """One run's baseline and placement, and the knobs they share."""

    baseline: Baseline
    placement: PlacementPolicy = "binpack"
    tick: float = TICK
    manager: ManagerPolicy = field(default_factory=ManagerPolicy)
    inference_gpu_type: str | None = None
    """Only nodes of this model take inference replicas; None: any."""
    reserved: tuple[int, ...] = ()
    """``static``: cards carved out per deployment (its peak held when unconstrained)."""
    inference_share: float = 0.0
    """Inference replicas' share of the arrivals in FGD's target workload (``joint_mix``);
    0: the training tasks' mix alone."""

    def __post_init__(self) -> None:
        _check_tick(self.tick)

    @property
    def name(self) -> str:
        base = f"{self.baseline}/{self.placement}"
        if self.baseline != "manager":
            return base
        return base + _headroom_label(self.manager)


def _check_tick(tick: float) -> None:
    """A step of 0 (or NaN, or infinity) would never reach the horizon, or skip it."""
    if not (math.isfinite(tick) and tick > 0):
        raise ValueError(f"the pool's tick is a number of seconds > 0, not {tick!r}")


def _headroom_label(policy: ManagerPolicy) -> str:
    """``""`` without headroom, else `` h=25%`` / `` h=25%+2``."""
    parts = []
    if policy.headroom_fraction:
        parts.append(f"{policy.headroom_fraction:.0%}")
    if policy.headroom_cards:
        parts.append(f"+{policy.headroom_cards}" if parts else f"{policy.headroom_cards}")
    return f" h={''.join(parts)}" if parts else ""


@dataclass(slots=True)
class TaskOutcome:
    """What became of one training task."""

    task: Task
    priority: int
    state: Literal["arriving", "queued", "running", "completed"] = "arriving"
    queued_since: float = math.nan
    waited: float = 0.0
    """Seconds spent queued, every wait summed (after a preemption it waits again)."""
    first_start: float | None = None
    started: float = math.nan
    """The current (or last) run's start."""
    preemptions: int = 0
    lost_card_hours: float = 0.0

    @property
    def preemptible(self) -> bool:
        return self.priority <= PREEMPTIBLE_MAX_PRIORITY


@dataclass(frozen=True, slots=True)
class JointResult:
    """One run: its metrics, series for the plots, and every task's and trace's fate."""

    name: str
    config: JointConfig
    cards: int
    metrics: dict[str, float | int]
    series: dict[str, list[float]]
    inference: tuple[Result, ...]
    tasks: tuple[TaskOutcome, ...]
    reasons: tuple[str, ...]
    """The manager's plan reasons at its preemptions (the first few), for the report."""


def priority_of(task: Task) -> int:
    """The task's Kueue priority from its QoS class (``QOS_PRIORITY``)."""
    try:
        return QOS_PRIORITY[task.qos]
    except KeyError:
        known = ", ".join(QOS_PRIORITY)
        raise PoolError(f"task {task.name}: QoS {task.qos!r} is not one of {known}") from None


def _unit(name: str, salt: int) -> float:
    """A stable number in [0, 1) for ``name`` (crc32: the same on every run)."""
    return zlib.crc32(f"{name}#{salt}".encode()) / 2**32


def prepare_tasks(
    tasks: Sequence[Task], span: float, multiplier: float = 1.0, cap: float = DURATION_CAP
) -> tuple[Task, ...]:
    """The GPU tasks with arrivals compressed into ``span`` and ``multiplier`` x as many.

    Arrivals keep their order and relative spacing, scaled so the last lands at ``span``
    (from the ``ARRIVAL_START_QUANTILE`` arrival on; the few before it arrive at 0);
    durations are as recorded, capped at ``cap``. ``multiplier`` X keeps each task and adds
    copies (floor(X) - 1, plus one for a stable hash share frac(X)), each arriving within
    one mean inter-arrival gap after its original: more load with the trace's mix. Below
    1 it keeps only that stable hash share of the tasks (less load, the same mix).
    CPU-only tasks are dropped: they take no card.
    """
    if not span > 0 or not multiplier > 0 or not cap > 0:
        raise ValueError(f"span {span:g}, multiplier {multiplier:g}, cap {cap:g}: must be > 0")
    gpu = [t for t in tasks if t.gpus > 0]
    if not gpu:
        return ()
    start, last = arrival_window(gpu)
    squeeze = span / last if last > 0 else 0.0
    gap = span / len(gpu)
    out: list[Task] = []
    whole, part = math.floor(multiplier), multiplier - math.floor(multiplier)
    for task in gpu:
        base = min(span, max(0.0, task.arrival - start) * squeeze)  # no rounding past it
        for copy in range(math.ceil(multiplier)):
            if copy >= whole and _unit(task.name, copy) >= part:
                continue
            name = task.name if copy == 0 else f"{task.name}~{copy}"
            arrival = base if copy == 0 else min(span, base + gap * _unit(task.name, -copy))
            out.append(replace(task, name=name, arrival=arrival, duration=min(task.duration, cap)))
    return tuple(sorted(out, key=lambda t: (t.arrival, t.name)))


def arrival_window(tasks: Sequence[Task]) -> tuple[float, float]:
    """(start, length): the trace time the GPU tasks' arrivals are compressed from.

    The trace's first arrivals are months before the rest (its pods were listed at the
    end of 149 days; 98% arrived in the last 37): time starts at the
    ``ARRIVAL_START_QUANTILE`` arrival and ends at the last. (0, 0): no GPU task.
    """
    arrivals = [t.arrival for t in tasks if t.gpus > 0]
    if not arrivals:
        return 0.0, 0.0
    start = float(np.quantile(arrivals, ARRIVAL_START_QUANTILE))
    return start, max(arrivals) - start


def offered_cards(tasks: Sequence[Task], span: float) -> float:
    """Training's offered load: the cards its tasks would hold on average over ``span``."""
    return sum(t.cards * t.duration for t in tasks) / span if span > 0 else math.inf


@dataclass(frozen=True, slots=True)
class InferencePeaks:
    """Each deployment run alone, unconstrained: the peak and mean accelerators held."""

    peaks: tuple[int, ...]
    mean_held: float
    """All deployments together, over the longest horizon."""
    slo_attainment: float = math.nan
    """All deployments' requests together: the scaler's own SLO, the pool's cost aside."""
    replica_starts: int = 0
    """Replicas placed over the run (each tick's rise in cards held, the first fleet
    included): inference's arrivals on the pool, for ``joint_mix``."""


def joint_mix(tasks: Sequence[Task], replica: Task | None, share: float) -> TaskMix:
    """FGD's target workload: the training tasks' mix and the inference replica's shape.

    The replica class takes ``share`` of the popularity and the training classes the rest
    in their proportions. FGD's popularity is the chance that the next arriving task is of
    the class (its measure is the expected unallocatable GPUs for it), so the share counts
    arrivals: replicas placed against training tasks arriving, not cards held.

    Without a GPU task the replica's shape is the whole mix, whatever ``share``.

    Raises:
        ValueError: ``share`` outside [0, 1], or neither a GPU task nor a replica to measure.
    """
    if not 0 <= share <= 1:
        raise ValueError(f"inference share {share!r}: must be within [0, 1]")
    gpu = [t for t in tasks if t.gpus > 0]
    if replica is None or (share == 0 and gpu):
        return TaskMix.of(gpu)
    shape = TaskShape(
        replica.gpus, replica.gpu_milli, replica.gpu_types, replica.cpu_milli, replica.memory_mib
    )
    if not gpu or share == 1:  # no training to weigh it against: the replica is the mix
        return TaskMix(((shape, 1.0),))
    training = TaskMix.of(gpu).classes
    return TaskMix((*((s, w * (1 - share)) for s, w in training), (shape, share)))


def arrival_share(peaks: InferencePeaks, tasks: Sequence[Task]) -> float:
    """Inference replicas' share of the pool's arrivals: placed replicas over all."""
    total = peaks.replica_starts + sum(1 for t in tasks if t.gpus > 0)
    return peaks.replica_starts / total if total else 0.0


def inference_peaks(
    deployments: Sequence[Inference],
    tick: float = TICK,
    progress: Callable[[float], None] | None = None,
) -> InferencePeaks:
    """Run every deployment without a limit, sampled each ``tick`` (the static carve-out)."""
    _check_tick(tick)
    sims = [d.simulation() for d in deployments]
    horizon = max(d.horizon for d in deployments)
    peaks, last = [0] * len(sims), [0] * len(sims)
    held_sum, ticks, now, starts = 0.0, 0, 0.0, 0
    while now <= horizon:
        for i, sim in enumerate(sims):
            sim.advance(now)
            held = sim.accelerators_held()
            peaks[i] = max(peaks[i], held)
            starts += max(0, held - last[i])
            last[i] = held
            held_sum += held
        ticks += 1
        if progress is not None:
            progress(now)
        now += tick
    results = [sim.result() for sim in sims]
    requests = sum(int(r.metrics["requests"]) for r in results)
    slo = sum(int(r.met.sum()) for r in results) / requests if requests else math.nan
    return InferencePeaks(tuple(peaks), held_sum / ticks if ticks else 0.0, slo, starts)


@dataclass(frozen=True, slots=True)
class JointOptions:
    """What one ``run_all`` compares, and the training side's scaling."""

    placements: tuple[PlacementPolicy, ...] = ("binpack", "spread", "fgd")
    """The manager runs with each; ``static`` and ``kueue`` with the first."""
    training_load: float = 1.0
    """Offered training load as a share of the cards inference leaves on average
    (the pool minus inference's mean need): 1 keeps the pool contended."""
    duration_cap: float = DURATION_CAP
    tick: float = TICK
    inference_gpu_type: str | None = None
    manager: ManagerPolicy = field(default_factory=ManagerPolicy)
    headrooms: tuple[float, ...] = ()
    """The manager runs with each of these ``headroom_fraction`` values for each placement
    (the rest of ``manager`` as given); empty: ``manager``'s own alone."""
    mix: MixSource = "joint"
    """FGD's target workload (``MixSource``), for every run alike."""

    def __post_init__(self) -> None:
        _check_tick(self.tick)
        if not (math.isfinite(self.training_load) and self.training_load > 0):
            raise ValueError(f"JointOptions.training_load {self.training_load!r}: finite, > 0")
        if not self.duration_cap > 0:  # infinity: durations as recorded
            raise ValueError(f"JointOptions.duration_cap {self.duration_cap!r}: must be > 0")

    def configs(
        self, reserved: tuple[int, ...], inference_share: float = 0.0
    ) -> tuple[JointConfig, ...]:
        """Every run: static and kueue, then the manager per placement, per headroom."""
        if not self.placements:
            raise ValueError("at least one placement policy")
        first = self.placements[0]
        share = inference_share if self.mix == "joint" else 0.0

        def run(
            baseline: Baseline,
            placement: PlacementPolicy,
            manager: ManagerPolicy = self.manager,
            reserved: tuple[int, ...] = (),
        ) -> JointConfig:
            gpu_type = self.inference_gpu_type
            return JointConfig(baseline, placement, self.tick, manager, gpu_type, reserved, share)

        managers = [replace(self.manager, headroom_fraction=h) for h in self.headrooms] or [
            self.manager
        ]
        runs = [run("static", first, reserved=reserved), run("kueue", first)]
        runs += [run("manager", p, m) for p in self.placements for m in managers]
        return tuple(runs)


@dataclass(frozen=True, slots=True)
class JointRun:
    """Every baseline's run on one pool, and how the training side was scaled."""

    results: tuple[JointResult, ...]
    peaks: InferencePeaks
    tasks: tuple[Task, ...]
    multiplier: float
    """Copies of the trace's tasks (``prepare_tasks``) the training load asked for."""
    offered_cards: float
    cards: int
    span: float
    """Seconds the training arrivals span (the longest inference trace)."""
    horizon: float
    window: float = 0.0
    """Seconds of the pod list's time those arrivals were compressed from
    (``arrival_window``): a report shows it, so one far-off row is seen, not silent."""


def run_all(
    nodes: Sequence[Node],
    tasks: Sequence[Task],
    deployments: Sequence[Inference],
    options: JointOptions,
    progress: Callable[[str, float], None] | None = None,
) -> JointRun:
    """The unconstrained inference run (the static carve-out), then every baseline.

    ``progress(label, seconds)`` counts simulated seconds over all runs
    (``(1 + len(runs)) x horizon`` in all).
    """
    if not deployments:
        raise ValueError("the joint replay needs at least one inference deployment")
    horizon = max(d.horizon for d in deployments)
    span = max(d.trace.duration for d in deployments) or horizon
    done = 0.0

    def step(label: str) -> Callable[[float], None]:
        return lambda now: progress(label, done + now) if progress is not None else None

    peaks = inference_peaks(deployments, options.tick, step("inference alone"))
    done += horizon
    cards = sum(n.gpus for n in nodes)
    base = prepare_tasks(tasks, span, 1.0, options.duration_cap)
    target = options.training_load * max(0.0, cards - peaks.mean_held)
    offered_base = offered_cards(base, span)
    multiplier = target / offered_base if offered_base > 0 and target > 0 else 1.0
    if len(base) * multiplier > MAX_TASKS:  # counted before the copies exist
        raise PoolError(
            f"training would need {len(base) * multiplier:,.0f} tasks ({multiplier:,.0f}x the"
            f" {len(base):,} the pod list holds) to offer {target:,.1f} cards over"
            f" {span:,.0f} s; a replay holds at most {MAX_TASKS:,}: lower --training-load"
            " or give tasks that hold their cards longer"
        )
    scaled = prepare_tasks(tasks, span, multiplier, options.duration_cap)
    results = []
    share = arrival_share(peaks, scaled)
    for config in options.configs(peaks.peaks, share):
        results.append(run_joint(nodes, scaled, deployments, config, step(config.name)))
        done += horizon
    return JointRun(
        tuple(results),
        peaks,
        scaled,
        multiplier,
        offered_cards(scaled, span),
        cards,
        span,
        horizon,
        arrival_window(tasks)[1],
    )


def run_joint(
    nodes: Sequence[Node],
    tasks: Sequence[Task],
    deployments: Sequence[Inference],
    config: JointConfig,
    progress: Callable[[float], None] | None = None,
) -> JointResult:
    """Replay ``tasks`` and ``deployments`` on one pool of ``nodes`` under ``config``."""
    if not deployments:
        raise ValueError("the joint replay needs at least one inference deployment")
    if config.baseline == "static" and len(config.reserved) != len(deployments):
        raise ValueError("the static baseline needs each deployment's reserved cards")
    run = _Joint(nodes, tasks, deployments, config)
    horizon = max(d.horizon for d in deployments)
    now = 0.0
    while now <= horizon:
        run.step(now)
        if progress is not None:
            progress(now)
        now += config.tick
    return run.result()


class _Joint:
    """One joint run's state: the pool, the queue, the tasks, the inference replays."""

    def __init__(
        self,
        nodes: Sequence[Node],
        tasks: Sequence[Task],
        deployments: Sequence[Inference],
        config: JointConfig,
    ) -> None:
        self.config, self.deployments = config, tuple(deployments)
        self.pool = Pool.of(nodes)
        self.card_ids = self.pool.card_ids()
        self.mix = joint_mix(tasks, self._replica(0, 0), config.inference_share)
        self.tasks = sorted(tasks, key=lambda t: (t.arrival, t.name))
        self.outcomes = {t.name: TaskOutcome(t, priority_of(t)) for t in self.tasks}
        if len(self.outcomes) != len(self.tasks):
            raise PoolError("task names must be unique")
        self.sims = [d.simulation() for d in deployments]
        self.replicas: list[list[Placement]] = [[] for _ in deployments]
        self.running: dict[str, Placement] = {}
        self.next_arrival = 0
        self.reserved = self._carve_out()
        self._place_warm_fleets()
        self.queue = ClusterQueue(float(self.pool.cards - sum(config.reserved)))
        self.series: dict[str, list[float]] = {k: [] for k in SERIES}
        self.training_card_seconds = 0.0
        self.preemptions = 0
        self.reasons: list[str] = []
        self.plans_unknown = 0

    def _carve_out(self) -> int:
        """``static``: the inference partition, whole cards placed packed (binpack)."""
        reserved = 0
        for i, cards in enumerate(self.config.reserved):
            for k in range(cards):
                placement = self.pool.place(self._replica(i, k), "binpack", self.mix)
                if placement is None:
                    raise PoolError(
                        f"the static partition needs {sum(self.config.reserved)} whole cards"
                        f" for inference; the pool has room for {reserved}"
                    )
                reserved += 1
        return reserved

    def _place_warm_fleets(self) -> None:
        """Each Deployment's warm fleet takes its cards before the first tick.

        The limit is set before the Simulation's first ``advance`` (its warm start and
        first tick): set after, a warm start larger than the pool's room would hold cards
        no placement gave it.
        """
        for i, sim in enumerate(self.sims):
            if self.config.baseline == "static":
                sim.set_accelerator_limit(self.config.reserved[i])
                continue
            self._place_replicas(i, self.deployments[i].initial_replicas)
            sim.set_accelerator_limit(len(self.replicas[i]))

    def _replica(self, deployment: int, index: int) -> Task:
        """One inference replica's pod: a whole card, on the configured model if any."""
        model = self.config.inference_gpu_type
        return Task(
            name=f"{self.deployments[deployment].name}/replica-{index}",
            arrival=0.0,
            duration=math.inf,
            gpus=1,
            gpu_milli=1000,
            gpu_types=(model,) if model else (),
            qos="Guaranteed",
            cpu_milli=REPLICA_CPU_MILLI,
            memory_mib=REPLICA_MEMORY_MIB,
        )

    # --- one tick --------------------------------------------------------------------

    def step(self, now: float) -> None:
        for sim in self.sims:
            sim.advance(now)
        self._arrive(now)
        self._release_finished(now)
        plan = self._plan(now) if self.config.baseline == "manager" else None
        if plan is not None:
            self._preempt(plan, now)
        self._place_inference()
        self._admit(now, plan)
        static = self.config.baseline == "static"
        for i, sim in enumerate(self.sims):
            sim.set_accelerator_limit(self.config.reserved[i] if static else len(self.replicas[i]))
        self._record(now)

    def _arrive(self, now: float) -> None:
        while self.next_arrival < len(self.tasks) and self.tasks[self.next_arrival].arrival <= now:
            task = self.tasks[self.next_arrival]
            self.next_arrival += 1
            self._enqueue(self.outcomes[task.name], now)

    def _enqueue(self, outcome: TaskOutcome, now: float) -> None:
        outcome.state, outcome.queued_since = "queued", now
        task = outcome.task
        self.queue.push(Workload(task.name, outcome.priority, task.arrival, task.cards))

    def _stop(self, outcome: TaskOutcome) -> None:
        """Its pods leave the pool and its quota is free."""
        task = outcome.task
        self.pool.release(self.running.pop(task.name))
        self.queue.finish(Workload(task.name, outcome.priority, task.arrival, task.cards))

    def _release_finished(self, now: float) -> None:
        for name in list(self.running):
            outcome = self.outcomes[name]
            if outcome.started + outcome.task.duration <= now:
                self._stop(outcome)
                outcome.state = "completed"

    def _plan(self, now: float) -> PoolPlan:
        """The capacity manager's plan, from exactly what serving feeds it."""
        policies = [sim.policy for sim in self.sims]
        declared = [p.declared() for p in policies if isinstance(p, Unitscale)]
        demand = pool_demand([d for d in declared if d is not None], POOL).get(POOL)
        need, missing = None, "no ScaledObject declares the pool"
        if demand is not None:
            held, needed = demand.accelerators_held, demand.accelerators_needed
            missing = demand.unknown
            if held is not None and needed is not None:
                need = InferenceNeed(held=held, needed=needed)
        # The inventory's view, as the served check derives it (admission.reclaim): the
        # cards' worth training's shares do not account for, a starting replica's card
        # included (plan_pool takes the larger of this and the scalers' serving count).
        admitted = [self._admitted(name) for name in self.running]
        taken = self.pool.taken()
        state = PoolState(self.pool.cards, taken, inference_cards=others_cards(taken, admitted))
        plan = plan_pool(state, need, admitted, now, self.config.manager, missing)
        if not plan.known:
            self.plans_unknown += 1
        return plan

    def _admitted(self, name: str) -> Admitted:
        outcome, placement = self.outcomes[name], self.running[name]
        shares: dict[str, float] = {}
        for gpu, milli in placement.gpus:
            shares[self.card_ids[gpu]] = shares.get(self.card_ids[gpu], 0.0) + milli / 1000
        return Admitted(name, outcome.priority, outcome.started, outcome.preemptible, shares)

    def _preempt(self, plan: PoolPlan, now: float) -> None:
        if plan.reclaim and len(self.reasons) < MAX_REASONS:
            self.reasons.append(f"t={now:,.0f} s: {plan.reason}")
        for reclaim in plan.reclaim:
            outcome = self.outcomes[reclaim.key]
            self._stop(outcome)
            outcome.preemptions += 1
            outcome.lost_card_hours += outcome.task.cards * (now - outcome.started) / 3600
            self.preemptions += 1
            # Back to the queue at its original arrival: its delay keeps growing.
            self._enqueue(outcome, now)

    def _place_inference(self) -> None:
        """Replicas that lost their pod free its card; pending ones get one if any is whole.

        Each replica holding a card keeps it and each pending one asks for one: a replica
        draining after a scale-down still holds its card while a later scale-up's pod
        waits for another (the Deployment's count alone would leave it pending until the
        drain ends, free cards or not).
        """
        if self.config.baseline == "static":
            return
        for i, sim in enumerate(self.sims):
            placed = self.replicas[i]
            cards = sim.accelerators_held() + sim.pending()
            while len(placed) > cards:
                self.pool.release(placed.pop())
            self._place_replicas(i, cards)

    def _place_replicas(self, deployment: int, cards: int) -> None:
        """Place deployment's replicas, a whole card each, until ``cards`` or no room."""
        placed = self.replicas[deployment]
        while len(placed) < cards:
            placement = self.pool.place(
                self._replica(deployment, len(placed)), self.config.placement, self.mix
            )
            if placement is None:
                return
            placed.append(placement)

    def _admit(self, now: float, plan: PoolPlan | None) -> None:
        refused_cards = math.inf
        no_room: set[tuple[object, ...]] = set()

        def check(workload: Workload, admitted: float) -> bool:
            nonlocal refused_cards
            if plan is None or workload.cards >= refused_cards:
                return plan is None
            allowed, _ = within_allowance(replace(plan, training_held=admitted), workload.cards)
            if not allowed:
                refused_cards = workload.cards
            return allowed

        def place(workload: Workload) -> bool:
            task = self.outcomes[workload.key].task
            shape = (task.gpus, task.gpu_milli, task.gpu_types, task.cpu_milli, task.memory_mib)
            if shape in no_room:
                return False  # the pool only fills within one pass
            placement = self.pool.place(task, self.config.placement, self.mix)
            if placement is None:
                no_room.add(shape)
                return False
            self.running[task.name] = placement
            return True

        for workload in self.queue.admit(check, place):
            self._start(self.outcomes[workload.key], now)

    def _start(self, outcome: TaskOutcome, now: float) -> None:
        outcome.waited += now - outcome.queued_since
        outcome.state, outcome.started = "running", now
        if outcome.first_start is None:
            outcome.first_start = now

    def _record(self, now: float) -> None:
        series, cards = self.series, self.pool.cards
        training = self.queue.admitted
        held = sum(sim.accelerators_held() for sim in self.sims)
        self.training_card_seconds += training * self.config.tick
        allocated = self.pool.allocated_cards()
        if allocated > cards + 1e-6:
            raise AssertionError(f"t={now:g}: {allocated:g} of {cards} cards allocated")
        static = self.config.baseline == "static"
        for i, sim in enumerate(self.sims):
            own = self.config.reserved[i] if static else len(self.replicas[i])
            if sim.accelerators_held() > own:
                raise AssertionError(
                    f"t={now:g}: {self.deployments[i].name} holds {sim.accelerators_held()}"
                    f" accelerators on {own} cards"
                )
        series["t"].append(now)
        series["allocation"].append((training + held) / cards)
        series["allocated_cards"].append(allocated)
        series["inference_held"].append(float(held))
        series["inference_wanted"].append(float(sum(s.replicas_wanted() for s in self.sims)))
        series["inference_pending"].append(float(sum(s.pending() for s in self.sims)))
        series["training_held"].append(training)
        series["queue"].append(float(len(self.queue)))
        series["unallocatable"].append(self.pool.unallocatable_cards(self.mix))

    # --- the end ---------------------------------------------------------------------

    def result(self) -> JointResult:
        end = self.series["t"][-1] if self.series["t"] else 0.0
        for outcome in self.outcomes.values():
            if outcome.state == "queued":
                outcome.waited += end - outcome.queued_since  # its wait so far
        results = tuple(sim.result() for sim in self.sims)
        metrics = _metrics(self, results, end)
        return JointResult(
            self.config.name,
            self.config,
            self.pool.cards,
            metrics,
            self.series,
            results,
            tuple(self.outcomes.values()),
            tuple(self.reasons),
        )


SERIES = (
    "t",
    "allocation",
    "allocated_cards",
    "inference_held",
    "inference_wanted",
    "inference_pending",
    "training_held",
    "queue",
    "unallocatable",
)
MAX_REASONS = 20


def _metrics(run: _Joint, results: tuple[Result, ...], end: float) -> dict[str, float | int]:
    """The run's figures (docs/replay.md says how each is computed)."""
    cards, elapsed = run.pool.cards, len(run.series["t"]) * run.config.tick
    busy = sum(_busy_seconds(r) for r in results)
    requests = sum(int(r.metrics["requests"]) for r in results)
    met = sum(int(r.met.sum()) for r in results)
    cost = sum(float(r.metrics["cost"]) for r in results)
    tokens = sum(_tokens(r) for r in results)
    outcomes = list(run.outcomes.values())
    arrived = [o for o in outcomes if o.state != "arriving"]
    waits = np.array([o.waited for o in arrived], dtype=np.float64)
    states = [o.state for o in outcomes]
    return {
        "cards": cards,
        "allocation": float(np.mean(run.series["allocation"])) if elapsed else math.nan,
        "utilization": (run.training_card_seconds + busy) / (cards * elapsed)
        if elapsed
        else math.nan,
        "slo_attainment": met / requests if requests else math.nan,
        "cost_per_million_tokens": cost / tokens * 1e6 if tokens else math.inf,
        "requests": requests,
        "dropped": sum(int(r.metrics["dropped"]) for r in results),
        "queue_delay_p50_seconds": _pct(waits, 50),
        "queue_delay_p95_seconds": _pct(waits, 95),
        "tasks": len(outcomes),
        "completed": states.count("completed"),
        "running_at_end": states.count("running"),
        "queued_at_end": states.count("queued"),
        "never_started": sum(1 for o in arrived if o.first_start is None),
        "preemptions": run.preemptions,
        "lost_card_hours": sum(o.lost_card_hours for o in outcomes),
        "unallocatable_cards": float(np.mean(run.series["unallocatable"])) if elapsed else 0.0,
        "max_inference_pending": int(max(run.series["inference_pending"], default=0)),
        "plans_unknown": run.plans_unknown,
        "end_seconds": end,
    }


def _busy_seconds(result: Result) -> float:
    """Accelerator-seconds the replicas spent working (utilization x replica-seconds)."""
    return float(result.metrics["mean_utilization"]) * float(result.metrics["gpu_hours"]) * 3600


def _tokens(result: Result) -> float:
    """Tokens served, from the replay's own cost per 1M tokens."""
    per_million = float(result.metrics["cost_per_million_tokens"])
    if not math.isfinite(per_million) or per_million <= 0:
        return 0.0
    return float(result.metrics["cost"]) / per_million * 1e6


def _pct(values: np.ndarray[tuple[int], np.dtype[np.float64]], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


__all__ = [
    "BASELINES",
    "DURATION_CAP",
    "POOL",
    "QOS_PRIORITY",
    "TICK",
    "Baseline",
    "Inference",
    "InferencePeaks",
    "JointConfig",
    "JointOptions",
    "JointResult",
    "JointRun",
    "MixSource",
    "TaskOutcome",
    "arrival_share",
    "inference_peaks",
    "joint_mix",
    "offered_cards",
    "prepare_tasks",
    "priority_of",
    "run_all",
    "run_joint",
]
