"""Replay speed: one policy over a one-hour trace at 20x rate (goal: under 60 s here)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from foundation.replica_model import LLAMA3_8B_H200
from replay.policies import unitscale_policy
from replay.simulate import SimConfig, simulate
from replay.trace import read_trace, scale

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", type=Path, default=TRACES / "AzureLLMInferenceTrace_conv.csv")
    parser.add_argument("--rate-multiplier", type=float, default=20.0)
    parser.add_argument("--no-record", dest="record", action="store_false")
    args = parser.parse_args()
    trace = scale(read_trace(args.trace), args.rate_multiplier, 1.0, seed=0)
    config = SimConfig(LLAMA3_8B_H200, max_replicas=128)
    start = time.perf_counter()
    result = simulate(trace, unitscale_policy(32, 128), config)
    elapsed = time.perf_counter() - start
    per_hour = elapsed / (trace.duration / 3600)
    table = "\n".join(
        [
            "| trace | requests | trace span | wall time | per trace hour | ticks of 0.2 s |",
            "|---|---:|---:|---:|---:|---:|",
            f"| {args.trace.name} x{args.rate_multiplier:g} | {len(trace):,}"
            f" | {trace.duration / 60:.1f} min | {elapsed:.1f} s | {per_hour:.1f} s"
            f" | {int(trace.duration / config.dt):,} |",
        ]
    )
    verdict = "met" if per_hour < 60 else "MISSED"
    notes = f"Goal: one policy over a one-hour trace at 20x in under 60 s: {verdict}."
    print(table)
    print(notes)
    if args.record:
        append("Replay speed (bench/replay_speed.py)", table, notes)
    print(
        json.dumps(
            {
                "sim_seconds_per_trace_hour": round(per_hour, 2),
                "requests": len(trace),
                "max_replicas": result.metrics["max_replicas"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
