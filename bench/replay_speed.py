"""Replay speed: each policy over a one-hour trace at 20x rate (goal: under 60 s a run here)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from foundation.replica_model import LLAMA3_8B_H200
from replay.run import KNOBS, ReplayOptions, make_policy
from replay.simulate import SimConfig, simulate
from replay.trace import read_trace, scale

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
ONLINE = ("unitscale", "kpa", "production-stack", "aibrix-kv", "static-peak")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", type=Path, default=TRACES / "AzureLLMInferenceTrace_conv.csv")
    parser.add_argument("--rate-multiplier", type=float, default=20.0)
    parser.add_argument(
        "--policy", action="append", choices=sorted(KNOBS), help=f"repeat; default: {ONLINE}"
    )
    parser.add_argument(
        "--static-replicas", type=int, default=16, help="static-peak's fleet (default 16)"
    )
    parser.add_argument("--no-record", dest="record", action="store_false")
    args = parser.parse_args()
    trace = scale(read_trace(args.trace), args.rate_multiplier, 1.0, seed=0)
    # The fleet as `unitscale replay` runs it: the chunk budget for the 100 ms ITL SLO.
    config = SimConfig(LLAMA3_8B_H200.for_itl_slo(0.1), max_replicas=128)
    options = ReplayOptions(str(args.trace), args.rate_multiplier, 1.0, 0)
    rows: list[str] = []
    summary: dict[str, float] = {}
    peak = 0
    for name in args.policy or ONLINE:
        knobs = {"replicas": args.static_replicas} if name == "static-peak" else {}
        policy = make_policy(name, config, options, **knobs)
        start = time.perf_counter()
        result = simulate(trace, policy, config)
        elapsed = time.perf_counter() - start
        per_hour = elapsed / (trace.duration / 3600)
        rows.append(
            f"| {args.trace.name} x{args.rate_multiplier:g} | {name} | {len(trace):,}"
            f" | {trace.duration / 60:.1f} min | {elapsed:.1f} s | {per_hour:.1f} s"
            f" | {int(trace.duration / config.dt):,} | {result.metrics['max_replicas']} |"
        )
        summary[name] = round(per_hour, 2)
        peak = max(peak, int(result.metrics["max_replicas"]))
        print(rows[-1], flush=True)
    table = "\n".join(
        [
            "| trace | policy | requests | trace span | wall time | per trace hour"
            " | ticks of 0.2 s | peak replicas |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    slowest = max(summary.values())
    verdict = "met" if slowest < 60 else "MISSED"
    notes = (
        f"Goal: each policy over a one-hour trace at 20x in under 60 s: {verdict}"
        f" (slowest {slowest:.1f} s per trace hour)."
    )
    print(table)
    print(notes)
    if args.record:
        append("Replay speed, each policy (bench/replay_speed.py)", table, notes)
    print(
        json.dumps(
            {
                "sim_seconds_per_trace_hour": slowest,
                "per_policy": summary,
                "requests": len(trace),
                "max_replicas": peak,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
