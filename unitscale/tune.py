"""``unitscale tune``: search a policy's knobs by replay for the cheapest one meeting the SLO.

Every trial is one setting of the policy's knobs (``space``) replayed over every
``--trace`` exactly as ``unitscale replay`` runs it (the same ``SimConfig``, the same warm
start, ``replay.run.make_policy``). A trial is *feasible* when its SLO attainment reaches
``--slo-attainment`` on every trace; of those, the proposal costs least per 1M tokens
(all traces' cost over all their served tokens). None feasible: the trial that came
closest is reported, and no config is written.

The search is Optuna's TPE (``TPESampler``: ``constraints_func`` keeps infeasible trials
behind feasible ones, ``constant_liar`` spreads a batch), or, for one whole-number knob
whose values fit the budget (a static fleet's size), every value in order. The current
config's knobs (snapped to the grid) are the first trial.

Determinism: trials are asked ``--batch`` at a time, replayed (over ``--workers``
processes), and told in trial order before the next batch is asked. The sampler (seeded
with ``--seed``) sees the same history at every ask whatever the workers' speed or
count, so a seed, budget and batch give the same proposal on any machine.
``--workers`` only changes the wall time.

Writes ``DIR/scaler-config.yaml`` (``--policy unitscale``: the scaler's config, the
``--scaler-config`` given with its policy knobs replaced) or ``DIR/knobs.yaml`` (a
baseline's ``make_policy`` keywords), ``DIR/trials.csv`` and ``DIR/report.md`` with
``DIR/replicas.png`` (``unitscale.tune_report``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from foundation.errors import ConfigError
from unitscale import flags

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.samplers import BaseSampler
    from optuna.study import Study
    from optuna.trial import FrozenTrial

    from replay.policies import Policy
    from replay.run import ReplayOptions
    from replay.simulate import Result, SimConfig, Simulation
    from replay.trace import Trace
    from unitscale.flags import Commands

TUNABLE = ("unitscale", "static-peak", "kpa", "aibrix-kv", "production-stack")
"""The policies ``--policy`` takes: those with knobs (``replay.run.KNOBS``)."""
Value = float | int
Knobs = dict[str, Value]


# --- the search space -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Knob:
    """One knob's range: a scaler config key (unitscale) or a ``make_policy`` keyword."""

    key: str
    low: float
    high: float
    step: float | None = None
    """Values are ``low + k * step``; None: any (a float) or every whole number."""
    log: bool = False
    whole: bool = False
    seconds: bool = False
    """Written to the scaler config as a Go duration (``"90s"``)."""
    rising: bool = False
    """Attainment and cost both rise with it (a static fleet's size): the smallest value
    meeting the target is the cheapest, found by bisection (``_bisect``)."""
    trigger: bool = False
    """A key of the ScaledObject's trigger metadata (``scaler.metadata``), not of the
    scaler config: the replayed fleet carries it (``Problem.config_for``)."""

    def distribution(self) -> BaseDistribution:
        """The knob as Optuna samples it."""
        from optuna.distributions import FloatDistribution, IntDistribution

        if self.whole:
            step = int(self.step or 1)
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=step)
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def value(self, sampled: Any) -> Value:
        """What a trial replays: a whole number, or a float rounded to its step."""
        if self.whole:
            return int(sampled)
        return round(float(sampled), 6)  # 0.15000000000000002 on a 0.05 grid is 0.15

    def snap(self, value: float) -> Value:
        """``value`` moved onto the range (the grid's nearest point within it)."""
        inside = min(max(float(value), self.low), self.high)
        if self.step is not None:
            inside = self.low + round((inside - self.low) / self.step) * self.step
        return self.value(round(inside) if self.whole else inside)

    def values(self) -> list[int]:
        """Every value of a whole-number knob (for the grid)."""
        return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))

    def describe(self) -> str:
        """The range with its unit and grid or scale, for the report: ``0-600 s, step 15``."""
        unit = " s" if self.seconds else ""
        scale = ", log" if self.log else f", step {self.step:g}" if self.step else ""
        return f"{self.low:g}-{self.high:g}{unit}{scale}"


UNITSCALE_SPACE = (
    Knob("headroom-step", 0.0, 0.3, step=0.01),
    Knob("headroom-max", 0.0, 2.0, step=0.05),
    Knob("headroom-half-life", 60, 7200, log=True, whole=True, seconds=True),
    Knob("scale-down-window", 0, 1800, step=30, whole=True, seconds=True),
    Knob("backlog-drain", 5, 120, log=True, whole=True, seconds=True),
    # At most 0.85: above it the planner keeps no headroom of its own and the SLO rests on
    # the attainment loop's learned headroom, which a short half-life forgets before a
    # burst the tuning days never had (docs/replay.md, "What it searches").
    Knob("profile-utilization", 0.5, 0.85, step=0.05),
)
"""The scaler's policy knobs that trade cost for attainment (docs/scaler.md, "What each
knob trades"); the SLO, the replica model and the bounds describe the service and stay."""
BURST_SLEEPERS = Knob("standbyBurstSleepers", 0.0, 3.0, step=0.5, trigger=True)
"""Sleepers held per running replica for a burst (the trigger's, with ``standby``): what a
burst the recent windows did not foresee wakes, priced at every quiet hour. How many pays
depends on how the traffic bursts, so it is searched where the fleet has sleepers."""
TRIGGER_KEYS = frozenset({BURST_SLEEPERS.key})


def space(policy: str, config: SimConfig) -> tuple[Knob, ...]:
    """``policy``'s knobs and their ranges on ``config``.

    unitscale's include the burst tier where the fleet holds sleepers
    (``--standby-max-sleeping``). docs/replay.md, "What it searches", explains each range.
    """
    max_replicas = config.max_replicas
    if policy == "unitscale":
        if config.standby is not None and config.standby.max_sleeping > 0:
            return (*UNITSCALE_SPACE, BURST_SLEEPERS)
        return UNITSCALE_SPACE
    if policy == "static-peak":
        return (Knob("replicas", 1, max_replicas, whole=True, rising=True),)
    if policy == "kpa":
        return (
            Knob("target", 2.0, 256.0, log=True),
            Knob("scale_down_delay", 0, 900, step=15, whole=True),
            Knob("target_utilization", 0.4, 1.0, step=0.05),
            Knob("min_scale", 0, min(4, max_replicas), whole=True),
        )
    if policy == "production-stack":
        return (Knob("threshold", 0.5, 50.0, log=True),)
    if policy == "aibrix-kv":
        return (Knob("target", 0.02, 1.0, log=True),)
    raise ValueError(f"unknown policy {policy!r}; one of {', '.join(TUNABLE)}")


# --- the problem, as every worker holds it ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """What every trial replays: the traces, the fleet and the policy's fixed settings."""

    policy: str
    traces: tuple[Trace, ...]
    config: SimConfig
    options: ReplayOptions
    """``unitscale replay``'s options; ``slo_target`` is the tune's target."""
    base: dict[str, object] = field(default_factory=dict)
    """The ``--scaler-config`` as a mapping (unitscale), empty for the defaults."""

    def scaler_mapping(self, knobs: Knobs | None) -> dict[str, object]:
        """The scaler config with ``knobs`` and the target in its policy section.

        None: the base as given (the defaults row). Keys the base spells with ``_``
        (pydantic takes both) are dropped where a knob replaces them.
        """
        if knobs is None:
            return dict(self.base)
        given = self.base.get("policy")
        policy = {
            str(k): v
            for k, v in (given.items() if isinstance(given, dict) else ())
            if str(k).replace("_", "-") not in {*knobs, "slo-attainment"}
        }
        seconds = {k.key for k in UNITSCALE_SPACE if k.seconds}
        for key, value in knobs.items():
            if key not in TRIGGER_KEYS:
                policy[key] = f"{value:g}s" if key in seconds else value
        policy["slo-attainment"] = self.options.slo_target
        return {**self.base, "policy": policy}

    def trigger_metadata(self, knobs: Knobs | None) -> dict[str, str]:
        """The trigger metadata keys ``knobs`` set, as the ScaledObject spells them."""
        return {k: f"{v:g}" for k, v in (knobs or {}).items() if k in TRIGGER_KEYS}

    def config_for(self, knobs: Knobs | None) -> SimConfig:
        """The fleet a trial replays: ``config`` with the trigger knobs ``knobs`` set."""
        standby = self.config.standby
        if knobs is None or standby is None or BURST_SLEEPERS.key not in knobs:
            return self.config
        burst = float(knobs[BURST_SLEEPERS.key])
        return replace(self.config, standby=replace(standby, burst_sleepers=burst))

    def policy_for(self, knobs: Knobs | None) -> Policy:
        """The policy a trial replays (None: the defaults)."""
        from foundation.configfile import validate
        from replay.run import make_policy
        from scaler.config import ScalerConfig

        if self.policy == "unitscale":
            config = validate(ScalerConfig, self.scaler_mapping(knobs), "the tuned config")
            options = replace(self.options, policy=config.policy_defaults())
            return make_policy("unitscale", self.config_for(knobs), options)
        return make_policy(self.policy, self.config, self.options, **(knobs or {}))

    def defaults(self) -> Knobs | None:
        """The knobs' values today: the base config's (unitscale) or the policy's own."""
        from replay.policies import AibrixKv, Kpa, ProductionStack
        from scaler.config import ScalerConfig

        if self.policy == "unitscale":
            from foundation.configfile import validate

            policy = validate(ScalerConfig, self.base, "--scaler-config").policy
            today: Knobs = {
                k.key: getattr(policy, k.key.replace("-", "_")) for k in UNITSCALE_SPACE
            }
            if BURST_SLEEPERS in space(self.policy, self.config) and self.config.standby:
                today[BURST_SLEEPERS.key] = self.config.standby.burst_sleepers
            return today
        if self.policy == "static-peak":
            return None
        baseline = {"kpa": Kpa(), "production-stack": ProductionStack(), "aibrix-kv": AibrixKv()}
        policy_object = baseline[self.policy]
        knobs = space(self.policy, self.config)
        return {k.key: getattr(policy_object, k.key) for k in knobs}

    def base_attainment(self) -> float:
        """The ``slo-attainment`` the base config's scaler aims at."""
        from foundation.configfile import validate
        from scaler.config import ScalerConfig

        return validate(ScalerConfig, self.base, "--scaler-config").policy.slo_attainment


@dataclass(frozen=True, slots=True)
class Run:
    """What one replay of one trace came to (the report's figures, no per-request arrays)."""

    cost: float
    tokens: float
    """Tokens served (prompt and output)."""
    attainment: float
    cost_per_million_tokens: float
    gpu_hours: float
    max_replicas: int
    t: tuple[float, ...] = ()
    replicas: tuple[float, ...] = ()
    stopped: str = ""
    """Why the replay stopped before the trace's end (``Stop.why``), empty when it ran
    whole: then ``cost`` is a lower bound, ``tokens`` the trace's (an upper bound) and
    ``attainment`` an upper bound."""


def run_of(result: Result) -> Run:
    """The figures of ``result`` the tune keeps."""
    m = result.metrics
    cost, per_million = float(m["cost"]), float(m["cost_per_million_tokens"])
    tokens = cost / per_million * 1e6 if 0 < per_million < math.inf else 0.0
    return Run(
        cost,
        tokens,
        float(m["slo_attainment"]),
        per_million,
        float(m["gpu_hours"]),
        int(m["max_replicas"]),
        tuple(result.series["t"]),
        tuple(result.series["replicas"]),
    )


@dataclass(frozen=True, slots=True)
class Prepared:
    """A trace's references, found before the trials: the replay's warm start and bounds."""

    warm: int
    """Replicas every policy starts with (the instant bound's first interval's)."""
    static_replicas: int
    static: Run
    static_reached: bool
    instant: Run
    clairvoyant: Run | None = None
    """The cheapest schedule found in hindsight (``replay.oracle.find_clairvoyant``), where
    asked (``--clairvoyant``): about 20 more replays of the trace."""
    clairvoyant_reached: bool = False


_PROBLEM: Problem | None = None
"""The problem in this process: the worker's, from ``_install``, or the command's own."""


def _install(problem: Problem) -> None:
    global _PROBLEM  # one problem per worker process, set once
    _PROBLEM = problem


def _problem() -> Problem:
    if _PROBLEM is None:
        raise RuntimeError("no tune problem installed in this process")
    return _PROBLEM


def prepare(index: int, clairvoyant: bool = False) -> Prepared:
    """Trace ``index``'s warm start, smallest static fleet and instant bound (a worker job).

    With ``clairvoyant``, the clairvoyant's schedule too, seeded as ``unitscale replay``
    seeds it (the instant bound's replicas, the static fleet a candidate).
    """
    from replay.oracle import REACHED, find_clairvoyant, find_instant_bound, smallest_static
    from replay.run import static_hint, warm_replicas, without_standby

    problem = _problem()
    trace, target = problem.traces[index], problem.options.slo_target
    config = without_standby(problem.config)  # as unitscale replay's references
    instant, schedule = find_instant_bound(trace, config, target)
    warm = warm_replicas(schedule, config, problem.options)
    static, size = smallest_static(trace, config, target, hint=static_hint(schedule, config))
    oracle = (
        find_clairvoyant(trace, config, target, seed=schedule.replicas(), static=(static, size))[0]
        if clairvoyant
        else None
    )
    return Prepared(
        warm=warm,
        static_replicas=size,
        static=run_of(static),
        static_reached=bool(static.metrics[REACHED]),
        instant=run_of(instant),
        clairvoyant=None if oracle is None else run_of(oracle),
        clairvoyant_reached=oracle is not None and bool(oracle.metrics[REACHED]),
    )


STOP_CHECK_SECONDS = 60.0
"""Trace seconds between two looks at whether a trial's outcome is settled (``Stop``):
two counters read, so often enough that a settled replay runs at most a minute more."""


@dataclass(frozen=True, slots=True)
class Stop:
    """When a trial's replay of one trace may stop: its place in the search is settled.

    Both rules are exact, never a guess: requests outside the SLO stay outside, and spend
    only grows. ``target``: more misses than ``1 - target`` of the trace's requests and
    the trial cannot reach it. ``cost_per_million``: the cheapest feasible trial told so
    far; once this trace's spend over every trace's tokens (all the trial could serve)
    is above it, the trial cannot be cheaper. Optuna's pruners stop on a guess from
    intermediate values; these stop only where the answer is known.
    """

    target: float
    cost_per_million: float = math.inf
    tokens: float = math.inf
    """Every trace's prompt and output tokens, all the trial's runs could serve."""

    def why(self, missed: int, requests: int, cost: float) -> str:
        """Why the replay may stop now (``MISSES_TARGET`` or ``DEARER``; "": it goes on)."""
        if requests and (requests - missed) / requests < self.target:
            return MISSES_TARGET
        if cost / self.tokens * 1e6 > self.cost_per_million:
            return DEARER
        return ""


MISSES_TARGET = "cannot reach the target"
"""A replay stopped with more requests outside the SLO than the target allows."""
DEARER = "dearer than the cheapest trial at the target"
"""A replay stopped having spent more than the cheapest feasible trial's whole cost."""


def replay(index: int, warm: int, knobs: Knobs | None, stop: Stop | None = None) -> Run:
    """One trial's replay of trace ``index`` (a worker job); None: the defaults.

    With ``stop``, the replay ends as soon as its outcome is settled (``Stop``): the
    run then holds what was settled (``Run.stopped``).
    """
    from replay.simulate import Simulation

    problem = _problem()
    trace = problem.traces[index]
    config = problem.config_for(knobs)
    simulation = Simulation(trace, problem.policy_for(knobs), config, initial_replicas=warm)
    if stop is None:
        simulation.advance(math.inf)
        return run_of(simulation.result())
    while not simulation.finished:
        simulation.advance(simulation.now + STOP_CHECK_SECONDS)
        why = stop.why(simulation.missed, len(trace), simulation.cost)
        if why:
            return _stopped(simulation, trace, why)
    return run_of(simulation.result())


def _stopped(simulation: Simulation, trace: Trace, why: str) -> Run:
    """What a replay stopped early settled: lower bounds on cost, upper on attainment."""
    cost, tokens = simulation.cost, trace_tokens(trace)
    series = simulation.series
    return Run(
        cost,
        tokens,
        1.0 - simulation.missed / len(trace),
        cost / tokens * 1e6 if tokens else math.inf,
        simulation.replica_seconds / 3600.0,
        int(max(series["replicas"], default=0)),
        tuple(series["t"]),
        tuple(series["replicas"]),
        stopped=why,
    )


def trace_tokens(trace: Trace) -> float:
    """Prompt and output tokens of every request of ``trace``."""
    return float(trace.prompt.sum() + trace.output.sum())


# --- the search -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Trial:
    """One setting of the knobs and its replay of every trace."""

    number: int
    knobs: Knobs
    runs: tuple[Run, ...]

    @property
    def attainment(self) -> float:
        """The lowest SLO attainment over the traces (-1 where one has none)."""
        return min((r.attainment if math.isfinite(r.attainment) else -1.0) for r in self.runs)

    @property
    def cost_per_million_tokens(self) -> float:
        """All traces' cost over all the tokens they served, per 1M (inf: none served)."""
        tokens = sum(r.tokens for r in self.runs)
        return sum(r.cost for r in self.runs) / tokens * 1e6 if tokens else math.inf

    @property
    def stopped(self) -> str:
        """Why a replay of it stopped early (``Stop``); empty: every one ran whole."""
        return next((r.stopped for r in self.runs if r.stopped), "")

    def feasible(self, target: float) -> bool:
        """Whether every trace's attainment reached ``target`` (known: it ran whole)."""
        return self.attainment >= target and not self.stopped


def best(trials: Sequence[Trial], target: float) -> Trial:
    """The cheapest feasible trial (first of equals); none: the closest to the target.

    A trial stopped early is never the proposal while another ran whole: its figures are
    bounds, not results.

    Raises:
        ValueError: no trials.
    """
    if not trials:
        raise ValueError("best: no trials")
    feasible = [t for t in trials if t.feasible(target)]
    if feasible:
        return min(feasible, key=lambda t: (t.cost_per_million_tokens, t.number))
    return min(
        trials,
        key=lambda t: (bool(t.stopped), -t.attainment, t.cost_per_million_tokens, t.number),
    )


def stop_for(trials: Sequence[Trial], target: float, tokens: float) -> Stop:
    """The ``Stop`` for the next batch: ``target``, and the cheapest feasible trial so far."""
    cheapest = min(
        (t.cost_per_million_tokens for t in trials if t.feasible(target)), default=math.inf
    )
    return Stop(target, cheapest, tokens)


Mapper = Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]]
"""Runs a job over argument tuples, results in the arguments' order (``worker_pool``)."""
Progress = Callable[[list[Trial]], None]


@dataclass(frozen=True, slots=True)
class Settings:
    """How the search runs: ``--budget``, ``--batch`` and ``--seed``."""

    budget: int
    batch: int
    seed: int
    stop_early: bool = True
    """Stop a trial's replay once its outcome is settled (``Stop``); ``--no-stop-early``."""


def search(
    problem: Problem,
    prepared: Sequence[Prepared],
    settings: Settings,
    run_jobs: Mapper,
    progress: Progress | None = None,
) -> list[Trial]:
    """``settings.budget`` trials (fewer: a grid smaller than it), in trial order.

    A batch is asked, its settings not yet replayed are replayed (every trace each, by
    ``run_jobs``), and the batch is told in trial order: the module docstring's
    determinism. A setting asked again is not replayed again (replays are deterministic).
    """
    from optuna.trial import TrialState

    knobs = space(problem.policy, problem.config)
    if len(knobs) == 1 and knobs[0].rising and not is_grid(knobs, settings.budget):
        return _bisect(problem, prepared, knobs[0], settings, run_jobs, progress)
    study, budget = _study(problem, knobs, settings)
    distributions = {k.key: k.distribution() for k in knobs}
    seen: dict[tuple[Value, ...], tuple[Run, ...]] = {}
    trials: list[Trial] = []
    target, tokens = problem.options.slo_target, sum(map(trace_tokens, problem.traces))
    while len(trials) < budget:
        asked = [study.ask(distributions) for _ in range(min(settings.batch, budget - len(trials)))]
        sets = [{k.key: k.value(t.params[k.key]) for k in knobs} for t in asked]
        new = list({tuple(s.values()): s for s in sets if tuple(s.values()) not in seen}.values())
        # From the trials told before the batch, never its own: the same on any workers.
        stop = stop_for(trials, target, tokens) if settings.stop_early else None
        runs = run_jobs(replay, [(i, p.warm, s, stop) for s in new for i, p in enumerate(prepared)])
        for n, s in enumerate(new):
            seen[tuple(s.values())] = tuple(runs[n * len(prepared) : (n + 1) * len(prepared)])
        for asked_trial, s in zip(asked, sets, strict=True):
            trial = Trial(asked_trial.number, s, seen[tuple(s.values())])
            # read by the sampler's constraints_func when told
            asked_trial.set_user_attr("attainment", trial.attainment)
            if trial.stopped == DEARER:
                # Its cost is a lower bound, not a value: told as the cheapest feasible
                # trials' neighbour, it drew the search to settings known to be dearer.
                # Pruned, TPE ranks it after every feasible trial, before the infeasible.
                study.tell(asked_trial, state=TrialState.PRUNED)
            else:
                study.tell(asked_trial, min(trial.cost_per_million_tokens, 1e12))
            trials.append(trial)
        if progress is not None:
            progress(trials)
    return trials


def _bisect(
    problem: Problem,
    prepared: Sequence[Prepared],
    knob: Knob,
    settings: Settings,
    run_jobs: Mapper,
    progress: Progress | None,
) -> list[Trial]:
    """The smallest value of a ``rising`` knob meeting the target, in at most ``budget``.

    The first guess is the largest of the traces' smallest static fleets (``prepare``
    found them), then its neighbour, then halving: two trials where the guess is right
    (a static fleet over 1-64 replicas: at most 8), against a sampler's dozens. Trials
    are replayed one value at a time, the traces in parallel; deterministic.
    """
    target, budget = problem.options.slo_target, settings.budget
    low, high = int(knob.low), int(knob.high)
    guess = max((p.static_replicas for p in prepared), default=high)
    trials: list[Trial] = []

    # Stopped at the first sign of a miss: only whether it reaches the target counts here.
    stop = Stop(target) if settings.stop_early else None

    def meets(value: int) -> bool:
        knobs: Knobs = {knob.key: value}
        runs = run_jobs(replay, [(i, p.warm, knobs, stop) for i, p in enumerate(prepared)])
        trials.append(Trial(len(trials), knobs, tuple(runs)))
        if progress is not None:
            progress(trials)
        return trials[-1].feasible(target)

    value = min(max(guess, low), high)
    while low <= high and len(trials) < budget:
        if meets(value):
            high = value - 1  # the answer is at most value
            value = value - 1 if len(trials) == 1 else (low + high) // 2
        else:
            low = value + 1
            value = value + 1 if len(trials) == 1 else (low + high) // 2
    return trials


def _study(problem: Problem, knobs: Sequence[Knob], settings: Settings) -> tuple[Study, int]:
    """The study and its trial count, with its first trials enqueued.

    A grid enqueues every value in order; otherwise today's knobs (snapped to the
    ranges) are the first trial, so the proposal is never worse than what runs now.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler, budget = _sampler(knobs, settings, problem.options.slo_target)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    today = problem.defaults()
    if is_grid(knobs, settings.budget):
        for value in knobs[0].values():
            study.enqueue_trial({knobs[0].key: value})
    elif today is not None and budget > 1:
        study.enqueue_trial({k.key: k.snap(today[k.key]) for k in knobs})
    return study, budget


def is_grid(knobs: Sequence[Knob], budget: int) -> bool:
    """Whether the search tries every value: one whole-number knob with at most ``budget``."""
    return len(knobs) == 1 and knobs[0].whole and len(knobs[0].values()) <= budget


def _sampler(knobs: Sequence[Knob], settings: Settings, target: float) -> tuple[BaseSampler, int]:
    """The sampler and the trials to run: every value of one whole knob that fits, else TPE."""
    from optuna.exceptions import ExperimentalWarning
    from optuna.samplers import RandomSampler, TPESampler

    if is_grid(knobs, settings.budget):
        # every value enqueued in order (``search``): GridSampler stops the study when its
        # grid is done, which only Study.optimize allows
        return RandomSampler(seed=settings.seed), len(knobs[0].values())

    def constraints(trial: FrozenTrial) -> list[float]:
        # <= 0 is feasible: the lowest attainment over the traces at or above the target
        return [target - float(trial.user_attrs.get("attainment", -1.0))]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # constant_liar, multivariate
        sampler = TPESampler(
            seed=settings.seed,
            multivariate=True,
            constant_liar=True,
            constraints_func=constraints,
            # random trials before TPE models the results: Optuna's 10 at a budget of 50
            # or more, fewer below, so a small budget still searches around the best
            n_startup_trials=min(10, max(4, settings.budget // 5)),
        )
    return sampler, settings.budget


@contextmanager
def worker_pool(problem: Problem, workers: int, ray: str | None = None) -> Iterator[Mapper]:
    """A ``Mapper`` over ``workers`` processes (spawned: no fork of a threaded process).

    One worker runs the jobs here, in order. With ``ray`` (an address, or ``local``) the
    jobs are Ray tasks instead (``ray_pool``), as many at once as the cluster has CPUs.
    """
    if ray is not None:
        from unitscale.tune_ray import ray_pool

        with ray_pool(problem, ray) as run_jobs:
            yield run_jobs
        return
    if workers == 1:
        _install(problem)

        def here(job: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
            return [job(*a) for a in args]

        yield here
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, context, _install, (problem,)) as pool:

        def there(job: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
            return list(pool.map(job, *zip(*args, strict=True))) if args else []

        yield there


# --- the command ------------------------------------------------------------------------------


def add_command(commands: Commands) -> None:
    """Register ``unitscale tune`` and its flags (nothing heavy imported: every command parses)."""
    tune = commands.add_parser(
        "tune", help="search a policy's knobs by replay for the cheapest meeting the SLO"
    )
    tune.add_argument(
        "--trace",
        action="append",
        type=flags.trace_source,
        required=True,
        help="repeatable, at most 16: an Azure LLM CSV, a directory of them as one trace"
        " (the gateway's recorded arrivals), Mooncake JSONL, builtin:NAME or"
        " servegen:DIR?scale=X&days=A-B",
    )
    tune.add_argument("--policy", choices=TUNABLE, default="unitscale")
    tune.add_argument("--profile", default="llama3-8b-h200", help="the replayed replica model")
    tune.add_argument(
        "--slo-attainment",
        type=flags.ATTAINMENT,
        help="share of requests within the SLO on every trace (default: the scaler"
        " config's slo-attainment, 0.99)",
    )
    tune.add_argument("--budget", type=flags.TRIALS, default=50, help="trials (default 50)")
    tune.add_argument(
        "--batch",
        type=flags.BATCH,
        default=8,
        help="trials asked before their results are told (default 8); the proposal"
        " depends on it, never on --workers",
    )
    tune.add_argument("--seed", type=flags.SEED, default=0)
    tune.add_argument(
        "--no-stop-early",
        dest="stop_early",
        action="store_false",
        help="replay every trial whole (by default a trial stops once it cannot reach"
        " the target or be cheaper than the best so far; the proposal is the same kind)",
    )
    tune.add_argument("--workers", type=flags.WORKERS, help="processes (default: the CPUs)")
    tune.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="replay the trials as Ray tasks instead of --workers processes: 'local' starts"
        " a Ray here, else a running cluster's address ('auto', 'ray://HEAD:10001') whose"
        " workers have unitscale installed; needs the ray extra (pip install"
        " 'unitscale[ray]'); the proposal is the same",
    )
    tune.add_argument(
        "--scaler-config",
        type=flags.path,
        help="the scaler's config to start from (--policy unitscale): the proposal keeps"
        " everything but the tuned policy knobs",
    )
    tune.add_argument(
        "--clairvoyant",
        action="store_true",
        help="find each trace's clairvoyant schedule too (the cheapest in hindsight, as"
        " unitscale replay's oracle row) and report the proposal against it: about 20"
        " more replays a trace",
    )
    tune.add_argument("--out", type=flags.path, required=True, help="output directory")
    fleet = tune.add_argument_group("the replayed fleet (as unitscale replay)")
    fleet.add_argument("--rate-multiplier", type=flags.RATE_MULTIPLIER, default=1.0)
    fleet.add_argument("--time-compression", type=flags.TIME_COMPRESSION, default=1.0)
    fleet.add_argument("--price", type=flags.PRICE, help="US$ per accelerator-hour")
    fleet.add_argument("--slo-ttft", type=flags.SLO_SECONDS, default=2.0)
    fleet.add_argument("--slo-itl", type=flags.SLO_SECONDS, default=0.1)
    fleet.add_argument(
        "--cold-start", default="local-disk", help="a cold start tier (default %(default)s)"
    )
    fleet.add_argument("--max-replicas", type=flags.REPLICAS, default=64)
    fleet.add_argument(
        "--target-concurrency",
        type=flags.CONCURRENCY,
        default=flags.TARGET_CONCURRENCY,
        help="the unitscale policy's targetConcurrency (default %(default)s)",
    )
    flags.standby_arguments(fleet)  # with sleepers, the burst tier is searched too
    tune.set_defaults(run=run, default_log_level="warning")


def run(args: argparse.Namespace) -> int:
    """``unitscale tune``: 0 with a proposal, 1 when no trial met the target."""
    from unitscale.outputs import given_inputs, report_directory
    from unitscale.tune_report import OUT_FILES, Outcome, write_outcome

    started = time.monotonic()
    problem, sources = _problem_of(args)
    # A bad --out fails before the search, not after.
    report_directory(args.out, "--out", OUT_FILES, given_inputs(args))
    settings = Settings(args.budget, args.batch, args.seed, args.stop_early)
    workers = _workers(args.workers, settings.batch * len(problem.traces))
    target = problem.options.slo_target
    pool = worker_pool(problem, workers, ray=args.ray)
    with pool as run_jobs, _bar(settings.budget, target) as progress:
        jobs = [(i, args.clairvoyant) for i in range(len(problem.traces))]
        prepared = run_jobs(prepare, jobs)
        trials = search(problem, prepared, settings, run_jobs, progress)
        defaults = _defaults(problem, prepared, trials, run_jobs)
        proposal = best(trials, target)
        if proposal.stopped:
            # None ran whole (every trial missed early): the closest is reported with
            # its figures, not the bounds it stopped at (half its cost, hostile pass 29).
            runs = run_jobs(replay, [(i, p.warm, proposal.knobs) for i, p in enumerate(prepared)])
            proposal = replace(proposal, runs=tuple(runs))
    outcome = Outcome(
        problem=problem,
        sources=tuple(sources),
        settings=settings,
        workers=workers,
        prepared=tuple(prepared),
        trials=tuple(trials),
        proposal=proposal,
        defaults=defaults,
        seconds=time.monotonic() - started,
        command="unitscale " + " ".join(sys.argv[1:]),
        ray=args.ray,
    )
    write_outcome(outcome, args.out)
    print((args.out / "report.md").read_text())  # noqa: T201 - the command's output
    return 0 if outcome.reached else 1


def _workers(asked: int | None, at_once: int) -> int:
    """Processes for the trials: ``--workers`` (default the CPUs), at most the CPUs.

    Nor more than the replays one batch holds. Each worker holds the whole problem (every
    trace), so more processes than CPUs only cost memory; the proposal does not depend on
    the count.
    """
    cpus = _cpus()
    workers = min(asked or cpus, cpus, max(1, at_once))
    if asked is not None and asked > workers:
        sys.stderr.write(f"unitscale tune: --workers {asked}: {workers} used ({cpus} CPUs here)\n")
    return workers


def _cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, not the node's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _defaults(
    problem: Problem, prepared: Sequence[Prepared], trials: Sequence[Trial], run_jobs: Mapper
) -> tuple[Run, ...] | None:
    """The defaults' replays: the first trial's when it was exactly them, else their own."""
    today = problem.defaults()
    if today is None:
        return None
    knobs = space(problem.policy, problem.config)
    same_target = problem.policy != "unitscale" or (
        problem.base_attainment() == problem.options.slo_target
    )
    first = trials[0] if trials else None
    if (
        first is not None
        and not first.stopped
        and same_target
        and first.knobs == {k.key: k.snap(today[k.key]) for k in knobs}
    ):
        if all(k.snap(today[k.key]) == today[k.key] for k in knobs):
            return first.runs
    return tuple(run_jobs(replay, [(i, p.warm, None) for i, p in enumerate(prepared)]))


def _problem_of(args: argparse.Namespace) -> tuple[Problem, list[str]]:
    """The checked problem: the traces read, the fleet built as ``unitscale replay`` does."""
    from foundation.configfile import load_mapping
    from foundation.files import MAX_CONFIG_BYTES, read_text
    from replay.run import ReplayOptions
    from scaler.config import load_config
    from unitscale.commands.common import read_traces

    flags.unitscale_only(args, args.policy)
    if args.workers is not None and args.ray is not None:
        raise ConfigError("--workers is the local processes' count; Ray places its tasks: drop it")
    scaler = load_config(args.scaler_config)  # the ConfigError names the key
    base: dict[str, object] = {}
    if args.scaler_config is not None:
        text = read_text(args.scaler_config, MAX_CONFIG_BYTES, "config file")
        base = load_mapping(text, str(args.scaler_config))
    target = args.slo_attainment or scaler.policy.slo_attainment
    traces = tuple(read_traces(args.trace, args))  # bounded as one replay's requests in all
    options = ReplayOptions(
        ",".join(args.trace),
        args.rate_multiplier,
        args.time_compression,
        args.seed,
        args.target_concurrency,
        slo_target=target,
        policy=scaler.policy_defaults(),
    )
    return Problem(args.policy, traces, flags.fleet_of(args), options, base), list(args.trace)


@contextmanager
def _bar(budget: int, target: float) -> Iterator[Progress]:
    """Progress over the trials: a bar on a terminal, else a line per batch (job logs)."""
    from rich.progress import Progress as Bar

    def text(trials: list[Trial]) -> str:
        top = best(trials, target)
        found = (
            f"best US$ {top.cost_per_million_tokens:.4f} per 1M tokens"
            if top.feasible(target)
            else f"none at target yet (best attainment {top.attainment:.2%})"
        )
        return f"{len(trials)}/{budget} trials, {found}"

    if sys.stderr.isatty():
        with Bar(transient=True) as bar:
            task = bar.add_task("tune: replaying the references", total=budget)

            def advance(trials: list[Trial]) -> None:
                bar.update(task, completed=len(trials), description=f"tune: {text(trials)}")

            yield advance
        return

    def line(trials: list[Trial]) -> None:
        sys.stderr.write(f"unitscale tune: {text(trials)}\n")
        sys.stderr.flush()

    yield line
