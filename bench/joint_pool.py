"""The joint replay (issue #19): one pool, training and inference, three baselines.

The default run of ``unitscale replay --pool`` (``replay.pool.joint.run_all``): the
Alibaba openb node list and default pod list at ``--pool-fraction`` (0.03: 41 nodes,
199 GPUs), training arrivals compressed into the inference trace's hour and multiplied
until their offered load is the cards inference leaves on average, and one
``builtin:business-day`` deployment under the unitscale scaler (llama3-8b-h200). Rows:
``static`` (inference's peak carved out), ``kueue`` (no headroom signal, no
preemption), ``manager`` (our admission check and reclaims) with binpack, and the
manager with spread and FGD placement.

Goals (issue #19): the manager's pool utilization >= 70 % with inference SLO attainment
>= 99 % and training p95 queueing delay no worse than the static partition's;
unallocatable GPUs from fragmentation (FGD's measure) with our placement at most 0.6x
HAMi's binpack on the same trace. Misses are printed and recorded as such.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from foundation.replica_model import PROFILES
from replay.pool.cluster import read_nodes, read_tasks
from replay.pool.joint import Inference, JointOptions, run_all
from replay.pool.report import goals, ratios, table
from replay.run import json_number
from replay.simulate import SimConfig
from replay.workloads import load_trace

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "alibaba-gpu-2023"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-fraction", type=float, default=0.03)
    parser.add_argument("--training-load", type=float, default=1.0)
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    started = time.monotonic()
    nodes = read_nodes(args.traces / "openb_node_list_gpu_node.csv", args.pool_fraction)
    tasks = read_tasks(args.traces / "openb_pod_list_default.csv", args.pool_fraction)
    config = SimConfig(PROFILES["llama3-8b-h200"].for_itl_slo(0.1))
    deployment = Inference("business-day", load_trace("builtin:business-day"), config)
    run = run_all(nodes, tasks, [deployment], JointOptions(training_load=args.training_load))
    wall = time.monotonic() - started
    verdicts = goals(run)
    text = table(run) + "\n\n" + ratios(run)
    print(text)
    lines = [
        f"- {g.name}: {g.measured} (goal {g.target}):"
        f" {'met' if g.met else 'not measured' if g.met is None else 'MISSED'}"
        for g in verdicts
    ]
    notes = "\n".join(
        [
            f"Pool: {run.cards} GPUs of {len(nodes)} nodes (fraction {args.pool_fraction:g},"
            f" stratified by model); {len(run.tasks):,} training tasks ({run.multiplier:.2f}x"
            f" the fraction's GPU pods, arrivals compressed into {run.span:,.0f} s, durations"
            f" capped at 1,800 s, offering {run.offered_cards:.1f} cards on average); inference:"
            f" builtin:business-day under the unitscale scaler (llama3-8b-h200 replicas whatever"
            f" the node's GPU model), peak {run.peaks.peaks[0]} and mean"
            f" {run.peaks.mean_held:.1f} cards alone. Tick 5 s; {wall:.0f} s wall for"
            f" {len(run.results)} runs and the unconstrained one.",
            "",
            "Goals (issue #19):",
            "",
            *lines,
        ]
    )
    print(notes)
    if not args.no_append:
        append("Joint replay: one pool, training and inference (bench/joint_pool.py)", text, notes)
    summary = {
        "bench": "joint_pool",
        "cards": run.cards,
        "tasks": len(run.tasks),
        "wall_seconds": round(wall, 1),
        "runs": {r.name: {k: json_number(v) for k, v in r.metrics.items()} for r in run.results},
        "goals": {g.name: {"measured": g.measured, "met": g.met} for g in verdicts},
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
