"""What ``unitscale tune`` writes: the proposal, the trials and the report.

``scaler-config.yaml`` is the scaler's config file (what ``--config``, the ConfigMap's
``config.yaml`` and ``unitscale replay --scaler-config`` read), written only when a trial
met the target; a tuned trigger key (``standbyBurstSleepers``) is named in its header
and the report, as the ScaledObject carries it. A baseline's proposal is ``knobs.yaml``
instead (its ``make_policy`` keywords). ``trials.csv`` holds every trial, ``report.md``
the predicted cost and attainment per trace of the proposal, today's config, the
smallest static fleet, the instant bound and (``--clairvoyant``) the clairvoyant, and
``replicas.png`` their replicas over time.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from foundation.files import write_file, write_png
from replay.simulate import SimConfig
from unitscale.tune import Prepared, Problem, Run, Settings, Trial, is_grid, space

PLOTTED_TRACES = 4
"""Traces drawn in ``replicas.png`` (the first ones given)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished search: everything the outputs say."""

    problem: Problem
    sources: tuple[str, ...]
    settings: Settings
    workers: int
    prepared: tuple[Prepared, ...]
    trials: tuple[Trial, ...]
    proposal: Trial
    """The cheapest feasible trial, or the closest to the target when none is."""
    defaults: tuple[Run, ...] | None
    """Today's config replayed (None for static-peak, which has no default size)."""
    seconds: float
    command: str
    ray: str | None = None
    """The Ray cluster's address the replays ran on as tasks (``--ray``); None: workers."""

    @property
    def target(self) -> float:
        return self.problem.options.slo_target

    @property
    def reached(self) -> bool:
        return self.proposal.feasible(self.target)


OUT_FILES = ("scaler-config.yaml", "knobs.yaml", "trials.csv", "replicas.png", "report.md")
"""What ``write_outcome`` writes in ``--out`` (a proposal is one of the first two)."""


def write_outcome(outcome: Outcome, out: Path) -> None:
    """Every output file in ``out`` (which exists); a stale proposal is removed when none."""
    proposal = out / (
        "scaler-config.yaml" if outcome.problem.policy == "unitscale" else "knobs.yaml"
    )
    if outcome.reached:
        write_file(proposal, _proposal_text(outcome))
    else:
        proposal.unlink(missing_ok=True)  # an earlier night's proposal is not tonight's
    _write_trials(outcome, out / "trials.csv")
    _plot(outcome, out / "replicas.png")
    write_file(out / "report.md", "\n".join(_report(outcome)) + "\n")


def _proposal_text(outcome: Outcome) -> str:
    problem, trial = outcome.problem, outcome.proposal
    header = [
        f"# Proposed by unitscale tune (trial {trial.number} of {len(outcome.trials)}) on"
        f" {', '.join(outcome.sources)}:",
        f"# predicted US$ {trial.cost_per_million_tokens:.4f} per 1M tokens at"
        f" >= {trial.attainment:.2%} SLO attainment (target {outcome.target:.2%}); report.md",
        "# has the figures per trace. Review, then apply it as the scaler's config"
        " (docs/replay.md).",
    ]
    trigger = problem.trigger_metadata(trial.knobs)
    if trigger:
        header.append("# With it, on the ScaledObject's trigger (metadata, beside standby: true):")
        header += [f'#   {key}: "{value}"' for key, value in trigger.items()]
    if problem.policy == "unitscale":
        body: dict[str, object] = problem.scaler_mapping(trial.knobs)
    else:
        body = {"policy": problem.policy, "knobs": dict(trial.knobs)}
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False)


def _write_trials(outcome: Outcome, path: Path) -> None:
    keys = [k.key for k in space(outcome.problem.policy, outcome.problem.config)]
    handle = io.StringIO(newline="")
    writer = csv.writer(handle)
    columns = ["cost_per_million_tokens", "slo_attainment", "feasible", "stopped_early"]
    writer.writerow(["trial", *keys, *columns])
    for t in outcome.trials:
        writer.writerow(
            [
                t.number,
                *(t.knobs[k] for k in keys),
                f"{t.cost_per_million_tokens:.6f}",
                f"{t.attainment:.6f}",
                t.feasible(outcome.target),
                t.stopped,  # then cost is at least, attainment at most, the figure
            ]
        )
    write_file(path, handle.getvalue())


def _report(outcome: Outcome) -> list[str]:
    problem, settings = outcome.problem, outcome.settings
    config, options = problem.config, problem.options
    knobs = space(problem.policy, config)
    grid = is_grid(knobs, settings.budget)
    feasible = sum(t.feasible(outcome.target) for t in outcome.trials)
    stopped = sum(bool(t.stopped) for t in outcome.trials)
    lines = [
        f"# unitscale tune: {problem.policy} on {len(problem.traces)} trace(s)",
        "",
        _verdict(outcome),
        "",
        f"- traces: {', '.join(f'`{s}`' for s in outcome.sources)} (rate multiplier"
        f" {options.rate_multiplier:g}, time compression {options.time_compression:g},"
        f" seed {options.seed})",
        f"- target: SLO attainment >= {outcome.target:.2%} on every trace; the SLO: TTFT"
        f" <= the larger of {config.slo_ttft:g} s and {config.slo_prefill_multiple:g}x the"
        f" request's idle prefill, mean inter-token latency <= {config.slo_itl * 1000:g} ms",
        f"- fleet: {config.profile.name} (${config.profile.price_per_hour:.2f} per"
        f" accelerator-hour), cold start {config.cold_start_tier}, at most"
        f" {config.max_replicas} replicas{_sleepers(config)}, each policy started warm as"
        " `unitscale replay` does",
        f"- search: {len(outcome.trials)} trials ("
        + ("every value" if grid else f"TPE, budget {settings.budget}, batch {settings.batch}")
        + f", seed {settings.seed}), {feasible} met the target, {stopped} stopped once"
        " they could neither reach it nor be cheaper (`trials.csv`);"
        + (f" Ray tasks on `{outcome.ray}`" if outcome.ray else f" {outcome.workers} worker(s)")
        + f", {outcome.seconds:,.0f} s",
        f"- command: `{outcome.command}`",
        "",
        "## Knobs",
        "",
        "| knob | searched | today | proposal |",
        "|---|---|---:|---:|",
        *_knob_rows(outcome),
        "",
        "## Predicted per trace",
        "",
        "| trace | configuration | cost per 1M tokens | SLO attainment | GPU-hours"
        " | max replicas |",
        "|---|---|---:|---:|---:|---:|",
        *_trace_rows(outcome),
        "",
        "![replicas over time](replicas.png)",
        "",
        "The instant bound starts each replica the moment its interval needs it (no cold"
        " start): a lower bound on cost, looser than the clairvoyant."
        + (
            " The clairvoyant is the cheapest schedule found knowing every arrival in"
            " advance, each replica started a cold start ahead (`unitscale replay`'s oracle)."
            if any(p.clairvoyant is not None for p in outcome.prepared)
            else " `--clairvoyant` adds it (about 20 replays a trace)."
        ),
        "",
    ]
    return lines


def _sleepers(config: SimConfig) -> str:
    """The fleet's warm tier in words (empty without sleepers)."""
    if config.standby is None:
        return ""
    pressure = config.wake_pressure
    woken = f", woken at {pressure.floor} outstanding a replica" if pressure is not None else ""
    return f" and up to {config.standby.max_sleeping} sleeping{woken}"


def _verdict(outcome: Outcome) -> str:
    trial = outcome.proposal
    if not outcome.reached:
        return (
            f"**No trial reached {outcome.target:.2%} SLO attainment on every trace** in"
            f" {len(outcome.trials)} trials: the closest, trial {trial.number}, reached"
            f" {trial.attainment:.2%} at US$ {trial.cost_per_million_tokens:.4f} per 1M"
            " tokens. No proposal is written: more replicas (`--max-replicas`), another"
            " policy or a lower target."
        )
    text = (
        f"**Proposal (trial {trial.number}): US$ {trial.cost_per_million_tokens:.4f} per 1M"
        f" tokens** at >= {trial.attainment:.2%} SLO attainment on every trace"
    )
    if outcome.defaults is not None:
        today = Trial(-1, {}, outcome.defaults)
        if today.runs == trial.runs:  # trial 0, today's knobs, won
            text += f"; today's config, as no other setting in {len(outcome.trials)} trials"
            text += " met the target for less"
        else:
            text += f"; today's config: {_compared(trial, today, outcome.target)}"
    name = "scaler-config.yaml" if outcome.problem.policy == "unitscale" else "knobs.yaml"
    text += f". Written to `{name}`"
    trigger = outcome.problem.trigger_metadata(trial.knobs)
    if trigger:
        keys = ", ".join(f'`{key}: "{value}"`' for key, value in trigger.items())
        text += f", with the ScaledObject's trigger metadata {keys}"
    text += "."
    static = Trial(-1, {}, tuple(p.static for p in outcome.prepared))
    if outcome.problem.policy != "static-peak" and static.feasible(outcome.target):
        text += f" The smallest static fleet: {_compared(trial, static, outcome.target)}."
        if static.cost_per_million_tokens < trial.cost_per_million_tokens:
            text += " A fixed fleet meets the target for less on this traffic."
    oracles = [p.clairvoyant for p in outcome.prepared]
    if all(o is not None for o in oracles):
        clairvoyant = Trial(-2, {}, tuple(o for o in oracles if o is not None))
        ratio = trial.cost_per_million_tokens / clairvoyant.cost_per_million_tokens
        text += (
            f" The clairvoyant: US$ {clairvoyant.cost_per_million_tokens:.4f} at"
            f" {clairvoyant.attainment:.2%} (the proposal {ratio:.2f}x its cost)."
        )
    return text


def _compared(proposal: Trial, other: Trial, target: float) -> str:
    """``other``'s cost and attainment, and how the proposal's cost compares."""
    text = f"US$ {other.cost_per_million_tokens:.4f} at {other.attainment:.2%}"
    if not other.feasible(target):
        return text + " (below the target)"
    change = proposal.cost_per_million_tokens / other.cost_per_million_tokens - 1
    return text + f" (the proposal {abs(change):.1%} {'cheaper' if change <= 0 else 'dearer'})"


def _knob_rows(outcome: Outcome) -> list[str]:
    problem = outcome.problem
    today = problem.defaults() or {}
    rows = []
    for knob in space(problem.policy, problem.config):
        now = today.get(knob.key)
        where = " (trigger metadata)" if knob.trigger else ""
        rows.append(
            f"| `{knob.key}`{where} | {knob.describe()} |"
            f" {'-' if now is None else _value(now)} | {_value(outcome.proposal.knobs[knob.key])} |"
        )
    return rows


def _trace_rows(outcome: Outcome) -> list[str]:
    rows = []
    for i, source in enumerate(outcome.sources):
        ready = outcome.prepared[i]
        static = f"smallest static fleet ({ready.static_replicas} replicas)"
        if not ready.static_reached:
            static += f", below target even at {ready.static_replicas}"
        shown = [("proposal" if outcome.reached else "closest trial", outcome.proposal.runs[i])]
        if outcome.defaults is not None:
            shown.append(("today's config", outcome.defaults[i]))
        shown += [(static, ready.static), ("instant bound", ready.instant)]
        if ready.clairvoyant is not None:
            below = "" if ready.clairvoyant_reached else ", below target"
            shown.append((f"clairvoyant{below}", ready.clairvoyant))
        rows += [
            f"| `{source}` | {label} | {_money(r.cost_per_million_tokens)} | {r.attainment:.2%}"
            f" | {r.gpu_hours:,.2f} | {r.max_replicas} |"
            for label, r in shown
        ]
    return rows


def _plot(outcome: Outcome, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = min(len(outcome.sources), PLOTTED_TRACES)
    fig, axes = plt.subplots(count, 1, figsize=(10, 3 * count), squeeze=False)
    for i, ax in enumerate(axes[:, 0]):
        ready = outcome.prepared[i]
        lines = [] if outcome.defaults is None else [("today", outcome.defaults[i], "-")]
        lines += [("static", ready.static, "-"), ("instant bound", ready.instant, "-")]
        if ready.clairvoyant is not None:
            lines.append(("clairvoyant", ready.clairvoyant, "-"))
        lines.append(("proposal", outcome.proposal.runs[i], "--"))  # dashed: today's shows under
        for label, run, style in lines:
            hours = [t / 3600 for t in run.t]
            ax.step(hours, run.replicas, where="post", label=label, lw=1.2, linestyle=style)
        ax.set_title(outcome.sources[i], fontsize=9)
        ax.set_ylabel("replicas")
        ax.legend(fontsize=8, ncol=4)
    axes[-1, 0].set_xlabel("hours")
    fig.tight_layout()
    write_png(path, fig, dpi=100)
    plt.close(fig)


def _money(value: float) -> str:
    return f"US$ {value:.4f}" if math.isfinite(value) else "n/a"


def _value(value: float | int) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
