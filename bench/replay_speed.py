"""Replay speed, each policy: a one-hour trace at 20x, and a day of production traffic.

Goals: each policy over the hour in under 60 s a run here; each policy over one
trace-day (ServeGen's day 1 at scale 0.01, about 0.8M requests) in at most 60 s of one
core (issue 26: fast enough for ``unitscale tune`` to search).
"""

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
from replay.trace import Trace, read_trace, scale
from replay.workloads import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
ONLINE = ("unitscale", "kpa", "production-stack", "aibrix-kv", "static-peak")
DAY = f"servegen:{TRACES / 'servegen-m-small'}?scale=0.01&days=1-1"


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
    parser.add_argument("--no-day", dest="day", action="store_false", help="the hour alone")
    parser.add_argument("--no-record", dest="record", action="store_false")
    args = parser.parse_args()
    # The fleet as `unitscale replay` runs it: the chunk budget for the 100 ms ITL SLO.
    config = SimConfig(LLAMA3_8B_H200.for_itl_slo(0.1), max_replicas=128)
    hour = scale(read_trace(args.trace), args.rate_multiplier, 1.0, seed=0)
    label = f"{args.trace.name} x{args.rate_multiplier:g}"
    policies = args.policy or ONLINE
    rows, hourly = _time(hour, label, str(args.trace), args.rate_multiplier, policies, config, args)
    daily: dict[str, float] = {}
    if args.day:
        day = load_trace(DAY, 0)
        more, daily = _time(day, "ServeGen M day 1 x0.01", DAY, 1.0, policies, config, args)
        rows += more
    table = "\n".join(
        [
            "| trace | policy | requests | trace span | wall time | CPU time | CPU per trace hour"
            " | ticks of 0.2 s | peak replicas |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    slowest_hour = max(v for v in hourly.values())
    notes = [
        "Goal: each policy over a one-hour trace at 20x in under 60 s:"
        f" {'met' if slowest_hour < 60 else 'MISSED'} (slowest {slowest_hour:.1f} s per"
        " trace hour, CPU)."
    ]
    if daily:
        slowest_day = max(daily.values())
        notes.append(
            "Goal: each policy over a trace-day in at most 60 s of one core:"
            f" {'met' if slowest_day <= 60 else 'MISSED'} (slowest {slowest_day:.0f} s)."
        )
    print(table)
    print("\n".join(notes))
    if args.record:
        append("Replay speed, each policy (bench/replay_speed.py)", table, " ".join(notes))
    print(
        json.dumps(
            {
                "cpu_seconds_per_trace_hour": hourly,
                "cpu_seconds_per_trace_day": daily,
                "requests": len(hour),
            }
        )
    )
    return 0


def _time(
    trace: Trace,
    label: str,
    source: str,
    multiplier: float,
    policies: tuple[str, ...] | list[str],
    config: SimConfig,
    args: argparse.Namespace,
) -> tuple[list[str], dict[str, float]]:
    """One row per policy; and per policy its CPU seconds per trace hour (or trace day)."""
    options = ReplayOptions(source, multiplier, 1.0, 0)
    rows: list[str] = []
    per: dict[str, float] = {}
    peak = args.static_replicas
    for name in policies:
        # static-peak holds the hour's --static-replicas, or the most unitscale ran on the day
        knobs = {"replicas": peak} if name == "static-peak" else {}
        policy = make_policy(name, config, options, **knobs)
        start, cpu = time.perf_counter(), time.process_time()
        result = simulate(trace, policy, config)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        hours = trace.duration / 3600
        per[name] = round(cpu if hours > 12 else cpu / hours, 2)
        if name == "unitscale" and hours > 12:
            peak = int(result.metrics["max_replicas"])
        rows.append(
            f"| {label} | {name} | {len(trace):,} | {trace.duration / 3600:.1f} h"
            f" | {wall:.1f} s | {cpu:.1f} s | {cpu / hours:.1f} s"
            f" | {int(trace.duration / config.dt):,} | {result.metrics['max_replicas']} |"
        )
        print(rows[-1], flush=True)
    return rows, per


if __name__ == "__main__":
    sys.exit(main())
