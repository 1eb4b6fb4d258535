"""The joint replay (issue #19): one pool, training and inference, on two inference mixes.

``replay.pool.joint.run_all`` on the Alibaba openb node list and default pod list at
``--pool-fraction`` (0.03: 41 nodes, 199 GPUs), training arrivals compressed into the
inference trace's span and multiplied until their offered load is the cards inference
leaves on average, under two inference mixes, each one Deployment under the unitscale
scaler (llama3-8b-h200):

- ``business-day``: ``builtin:business-day`` (55 min; its lunch burst outruns cold starts,
  so the scaler alone attains 87.6%: 99% is out of the pool's reach), started cold (its
  instant bound's first interval is 0 replicas: the warm start is the same);
- ``mooncake-x4``: ``mooncake_synthetic_trace.jsonl`` x4 (17 min of bursty long-context
  traffic, where the scaler alone meets the SLO: 99.6%, peak 32 replicas; at x1 it peaks
  at 8 of the 199 cards and every baseline ties), warm-started as ``unitscale replay``
  does (the instant bound's first interval, ``replay.run.warm_replicas``; cold, the
  first burst meets no replica), training load 2 (``Mix``).

Rows per mix: ``static`` (inference's peak carved out), ``kueue`` (no headroom signal,
no preemption), and the manager with binpack and FGD placement at burst headrooms
(``ManagerPolicy.headroom_fraction``) 0, 0.1, 0.25, 1 and 3; FGD's target workload is the
joint one (training's tasks plus inference's replicas by arrivals), and the manager at
headroom 0 runs again against training's mix alone, to compare. About 4 min on 2 cores.

Goals (issue #19), judged per mix and headroom: the manager's pool utilization >= 70 %
with inference SLO attainment >= 99 % and training p95 queueing delay no worse than the
static partition's; unallocatable GPUs (FGD's measure) with FGD at most 0.6x HAMi's
binpack. Misses are printed and recorded as such.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from foundation.replica_model import PROFILES
from replay.oracle import find_instant_bound
from replay.pool.cluster import Node, Task, read_nodes, read_tasks
from replay.pool.joint import Inference, JointOptions, JointResult, JointRun, run_all, run_joint
from replay.pool.report import cell, goals, manager_rows, ratios, table
from replay.run import ReplayOptions, json_number, warm_replicas
from replay.simulate import SimConfig
from replay.trace import scale
from replay.workloads import load_trace

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
HEADROOMS = (0.0, 0.1, 0.25, 1.0, 3.0)
"""The small sweep (0, 10%, 25%) and two large points, to show where the trade turns."""


@dataclass(frozen=True, slots=True)
class Mix:
    """One inference mix: its trace, rate multiplier, warm start and training load."""

    name: str
    source: str
    multiplier: float
    warm: bool
    training_load: float = 1.0
    """``JointOptions.training_load``: 1 contends the pool when the span is well above the
    1,800 s duration cap; a 17-minute span needs 2 (at 1 most tasks are still running at
    the span's end, so the pool never fills: 46% utilization, no queue)."""


MIXES = (
    Mix("business-day", "builtin:business-day", 1.0, warm=False),
    # x4: inference is a real share of the pool (peak 32 replicas alone, 99.6% SLO alone);
    # at x1 it peaks at 8 of 199 cards and every baseline ties.
    Mix(
        "mooncake-x4",
        str(SHARED / "mooncake_synthetic_trace.jsonl"),
        4.0,
        warm=True,
        training_load=2.0,
    ),
)


def deployment(mix: Mix, config: SimConfig) -> Inference:
    """The mix's Deployment, warm-started like ``unitscale replay`` where ``mix.warm``."""
    trace = scale(load_trace(mix.source, 0), mix.multiplier, 1.0, seed=0)
    initial = 0
    if mix.warm:
        _, schedule = find_instant_bound(trace, config)
        initial = warm_replicas(schedule, config, ReplayOptions(mix.source, mix.multiplier, 1, 0))
    return Inference(mix.name, trace, config, initial_replicas=initial)


def training_mix_rows(
    nodes: tuple[Node, ...], run: JointRun, inference: Inference, options: JointOptions
) -> list[JointResult]:
    """The manager at headroom 0 again, FGD's target workload training's tasks alone."""
    alone = replace(options, mix="training", headrooms=(0.0,))
    configs = [c for c in alone.configs(run.peaks.peaks) if c.baseline == "manager"]
    return [run_joint(nodes, run.tasks, [inference], c) for c in configs]


def mix_table(joint: list[JointResult], alone: list[JointResult]) -> str:
    """Unallocatable cards and the goal's ratio under each target workload."""
    head = "| FGD's target workload | binpack unalloc. | fgd unalloc. | fgd / binpack |"
    head += " util binpack / fgd | SLO binpack / fgd | queue p95 binpack / fgd |"
    rows = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for label, pair in (("training + inference (joint)", joint), ("training alone", alone)):
        by = {r.config.placement: r.metrics for r in pair}
        b, f = by["binpack"], by["fgd"]
        ours, base = float(f["unallocatable_cards"]), float(b["unallocatable_cards"])
        # as the goal has it: binpack leaving nothing unallocatable is no division by zero
        ratio = ours / base if base > 0 else (0.0 if ours == 0 else math.inf)
        rows.append(
            f"| {label} | {cell(base, 'float')} | {cell(ours, 'float')} | "
            f"{cell(ratio, 'float')}x | "
            f"{cell(b['utilization'], 'pct')} / {cell(f['utilization'], 'pct')} | "
            f"{cell(b['slo_attainment'], 'pct')} / {cell(f['slo_attainment'], 'pct')} | "
            f"{cell(b['queue_delay_p95_seconds'], 'seconds')} / "
            f"{cell(f['queue_delay_p95_seconds'], 'seconds')} |"
        )
    return "\n".join(rows)


def verdicts(run: JointRun) -> list[str]:
    """Each headroom's goals, one line each, misses marked."""
    lines = []
    policies = {r.config.manager: None for r in run.results if r.config.baseline == "manager"}
    for policy in policies:
        h = policy.headroom_fraction
        for g in goals(run, policy):
            met = "met" if g.met else "not measured" if g.met is None else "MISSED"
            lines.append(f"- h={h:.0%}: {g.name}: {g.measured} (goal {g.target}): {met}")
    return lines


def one_mix(
    mix: Mix, nodes: tuple[Node, ...], tasks: tuple[Task, ...], args: argparse.Namespace
) -> tuple[str, dict[str, object]]:
    """The mix's tables, notes and JSON summary."""
    started = time.monotonic()
    config = SimConfig(PROFILES["llama3-8b-h200"].for_itl_slo(0.1))
    inference = deployment(mix, config)
    load = args.training_load if args.training_load is not None else mix.training_load
    options = JointOptions(placements=("binpack", "fgd"), training_load=load, headrooms=HEADROOMS)
    run = run_all(nodes, tasks, [inference], options)
    alone_rows = training_mix_rows(nodes, run, inference, options)
    joint_rows = manager_rows(run)  # the first manager policy's: headroom 0
    wall = time.monotonic() - started
    share = next(r.config.inference_share for r in run.results)
    text = "\n\n".join(
        [
            f"### {mix.name}",
            table(run),
            ratios(run),
            mix_table(joint_rows, alone_rows),
            "\n".join(
                [
                    f"Inference: `{Path(mix.source).name}` x{mix.multiplier:g}, warm start"
                    f" {inference.initial_replicas} replicas; alone, unconstrained: peak"
                    f" {run.peaks.peaks[0]}, mean {run.peaks.mean_held:.1f} cards, SLO"
                    f" {run.peaks.slo_attainment:.2%}, {run.peaks.replica_starts} replica"
                    f" starts ({share:.1%} of the pool's arrivals: FGD's joint mix). Training:"
                    f" {len(run.tasks):,} tasks ({run.multiplier:.2f}x the fraction's GPU pods,"
                    f" arrivals over {run.span:,.0f} s, offering {run.offered_cards:.1f} cards"
                    f" on average, training load {load:g}). {wall:.0f} s wall.",
                    "",
                    "Goals (issue #19):",
                    "",
                    *verdicts(run),
                ]
            ),
        ]
    )
    summary: dict[str, object] = {
        "wall_seconds": round(wall, 1),
        "slo_alone": json_number(run.peaks.slo_attainment),
        "runs": {r.name: {k: json_number(v) for k, v in r.metrics.items()} for r in run.results},
        "training_mix": {r.name: json_number(r.metrics["unallocatable_cards"]) for r in alone_rows},
    }
    return text, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-fraction", type=float, default=0.03)
    parser.add_argument("--training-load", type=float, help="every mix's (default: each its own)")
    parser.add_argument("--traces", type=Path, default=SHARED / "alibaba-gpu-2023")
    parser.add_argument("--mix", choices=[m.name for m in MIXES], action="append")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    started = time.monotonic()
    nodes = read_nodes(args.traces / "openb_node_list_gpu_node.csv", args.pool_fraction)
    tasks = read_tasks(args.traces / "openb_pod_list_default.csv", args.pool_fraction)
    texts, summaries = [], {}
    for mix in MIXES:
        if args.mix and mix.name not in args.mix:
            continue
        text, summaries[mix.name] = one_mix(mix, tuple(nodes), tuple(tasks), args)
        print(text, flush=True)
        texts.append(text)
    wall = time.monotonic() - started
    notes = (
        f"Pool: {sum(n.gpus for n in nodes)} GPUs of {len(nodes)} nodes (fraction"
        f" {args.pool_fraction:g}, stratified by model); training durations capped at 1,800 s;"
        " llama3-8b-h200 replicas whatever the node's GPU model; tick 5 s; `h=` rows are the"
        " manager's burst headroom (the allowance keeps ceil(needed x (1 + h)) cards for"
        " inference; reclaim only for the real shortfall). `SLO vs scaler alone`: points"
        f" against the same Deployment run alone, unconstrained. Wall {wall:.0f} s in all."
    )
    print(notes)
    if not args.no_append:
        title = "Joint replay: one pool, two inference mixes, headroom sweep (bench/joint_pool.py)"
        append(title, "\n\n".join(texts), notes)
    summary = {"bench": "joint_pool", "wall_seconds": round(wall, 1), "mixes": summaries}
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
