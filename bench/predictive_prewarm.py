"""Predictive prewarm in replay: the first requests after each night, with and without the forecast.

The trace: a business week and a Monday, compressed (``--day`` seconds per 24 h, 1 h by
default): ``builtin:business-day``'s shape (``replay.workloads.BusinessDay``: idle
22:00-06:00, a ramp from 06:00, 09:00-17:00 plateau with spikes and the lunch burst) at
``--rate`` requests/s, Monday to Friday, Saturday and Sunday idle, then Monday again;
day ``d`` from seed ``--seed + d``. The scaler's forecast days are as long, and its UTC
offset puts the trace's start on a Monday 00:00 (the epoch was a Thursday).

Each row runs ``unitscale`` (the scaler's registry and decide(), external push, its
llama3-8b-h200 profile) from zero replicas: without the forecast's first replica
(``seasonal_floor`` off), with it, each with cold starts (``local-disk``, 38.5 s) and
with a warm Fluid cache (every start ``cached``), and a fleet kept at one replica at
least (``minReplicas: 1``, the always-on alternative). A *morning* is each day's first
request after the night (a gap of at least 20 minutes of the day); its first minute of
the day's clock (``--window`` seconds of trace time, a cold start and more) is where a
cold start hurts. Columns: the mornings' first-request TTFT (mean, max) over all six and
over the last four (the *learnt* ones: the forecast needs two earlier days of a kind,
so the first two mornings are cold in every row), the SLO attainment of the requests
in the mornings' first window (all, learnt), the whole run's SLO attainment, cost, cost
per 1M tokens, and the scale-ups a forecast decision made (and how many on days without
traffic: the weekend must stay idle). The replay ticks every ``--dt`` seconds (0.5,
not the replay's default 0.2, to keep the five runs near 8 minutes on a shared 2-core
machine; TTFTs are multiples of the tick).

Goal (issue 16, item 2): with the forecast, the first request after each learnt night
is served by a replica already up (TTFT near a warm replica's), at a cost below
always-on. The first two mornings cannot be forecast (two earlier days are needed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from foundation.replica_model import LLAMA3_8B_H200
from replay.policies import Unitscale, unitscale_policy
from replay.simulate import Result, SimConfig, simulate
from replay.trace import Trace
from replay.workloads import BusinessDay, business_day
from scaler.core.model import Policy

WEEK = (True, True, True, True, True, False, False, True)
"""Monday to Friday, a weekend, Monday: the days of the trace, working or idle."""
FORECAST_START = "forecast: traffic expected"
"""How a decision the seasonal forecast made begins (after KEDA's or the HPA's prefix)."""
LEARNING_MORNINGS = 2
"""The forecast needs two earlier days of a kind: the first two mornings are cold."""
MONDAY_OFFSET_DAYS = 4
"""The epoch's day 0 was a Thursday; 4 days on is a Monday."""


def week_trace(day_seconds: float, rate: float, seed: int) -> Trace:
    """``WEEK``'s days back to back: a business day on working days, nothing otherwise."""
    shape = BusinessDay(length=day_seconds, base_rate=rate)
    days = [(d, business_day(shape, seed + d)) for d, works in enumerate(WEEK) if works]
    arrival = np.concatenate([t.arrival + d * day_seconds for d, t in days])
    prompt = np.concatenate([t.prompt for _, t in days])
    output = np.concatenate([t.output for _, t in days])
    return Trace("business-week", arrival, prompt, output)


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    floor: bool
    cached: bool
    always_on: bool = False


ROWS = (
    Row("cold, no forecast", False, False),
    Row("cold, forecast", True, False),
    Row("Fluid cache, no forecast", False, True),
    Row("Fluid cache, forecast", True, True),
    Row("cold, always one replica", False, False, always_on=True),
)


def policy_for(row: Row, day_seconds: float) -> Unitscale:
    core = Policy(
        seasonal_floor=row.floor,
        seasonal_day_seconds=day_seconds,
        seasonal_utc_offset_hours=MONDAY_OFFSET_DAYS * day_seconds / 3600,
    )
    policy = unitscale_policy(32.0, 64, core, LLAMA3_8B_H200.name)
    if row.always_on:
        policy.metadata["minReplicas"] = "1"
    return policy


def mornings(trace: Trace, day_seconds: float) -> np.ndarray:
    """Indices of each day's first request after the night (a gap of 20 min of the day)."""
    gaps = np.diff(trace.arrival, prepend=-math.inf)
    return np.flatnonzero(gaps >= day_seconds / 72)


def measure(row: Row, trace: Trace, day_seconds: float, window: float, dt: float) -> dict[str, Any]:
    config = SimConfig(profile=LLAMA3_8B_H200, dt=dt, prewarm=row.cached)
    started = time.perf_counter()
    result = simulate(trace, policy_for(row, day_seconds), config, initial_replicas=0)
    wall = time.perf_counter() - started
    return summary(row, result, trace, day_seconds, window) | {"wall_s": round(wall, 1)}


def summary(
    row: Row, result: Result, trace: Trace, day_seconds: float, window: float
) -> dict[str, Any]:
    first = mornings(trace, day_seconds)
    served = result.met  # per request: within its TTFT target and the ITL SLO
    # Result.ttft holds the served requests only (a finite ratio), in the trace's order
    ttft = np.full(len(trace), math.inf)
    ttft[np.isfinite(result.slo_ratio)] = result.ttft
    in_window = np.zeros(len(trace), dtype=bool)
    learnt_window = np.zeros(len(trace), dtype=bool)
    for k, i in enumerate(first):
        inside = (trace.arrival >= trace.arrival[i]) & (trace.arrival < trace.arrival[i] + window)
        in_window |= inside
        if k >= LEARNING_MORNINGS:
            learnt_window |= inside
    learnt = first[LEARNING_MORNINGS:]
    # a start is a decision from zero (the actuator's log has one per change of count)
    starts = [(t, n, r) for t, n, r in result.decisions if FORECAST_START in r and n > 0]
    idle_days = {d for d, works in enumerate(WEEK) if not works}
    wrong = sum(1 for t, _, _ in starts if int(t // day_seconds) in idle_days)
    m = result.metrics
    return {
        "row": row.name,
        "mornings": len(first),
        "morning_ttft_mean_s": float(np.mean(ttft[first])),
        "morning_ttft_max_s": float(np.max(ttft[first])),
        "morning_ttft_by_day_s": [round(float(v), 2) for v in ttft[first]],
        "learnt_ttft_mean_s": float(np.mean(ttft[learnt])),
        "learnt_ttft_max_s": float(np.max(ttft[learnt])),
        "window_requests": int(in_window.sum()),
        "window_slo": float(served[in_window].mean()),
        "learnt_window_slo": float(served[learnt_window].mean()),
        "slo": float(m["slo_attainment"]),
        "cost": float(m["cost"]),
        "cost_per_million_tokens": float(m["cost_per_million_tokens"]),
        "forecast_starts": len(starts),
        "forecast_starts_on_idle_days": wrong,
        "cold_starts": int(m["cold_starts"]),
        "requests": int(m["requests"]),
        "dropped": int(m["dropped"]),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "| fleet | first request after the night: TTFT mean, max (all 6) | learnt mornings"
        " (last 4) | first-minute SLO (learnt) | SLO | cost $ | $/1M tokens"
        " | forecast starts (on idle days) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    body = [
        f"| {r['row']} | {r['morning_ttft_mean_s']:.2f} s, {r['morning_ttft_max_s']:.2f} s"
        f" | {r['learnt_ttft_mean_s']:.2f} s, {r['learnt_ttft_max_s']:.2f} s"
        f" | {r['window_slo']:.4f} ({r['learnt_window_slo']:.4f}) | {r['slo']:.4f}"
        f" | {r['cost']:.2f} | {r['cost_per_million_tokens']:.4f}"
        f" | {r['forecast_starts']} ({r['forecast_starts_on_idle_days']}) |"
        for r in rows
    ]
    return "\n".join(head + body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--day", type=float, default=3600.0, help="seconds per 24 h (3600)")
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s at the plateau (8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=float, default=60.0, help="seconds after a morning")
    parser.add_argument("--dt", type=float, default=0.5, help="replay tick (0.5 s: 8 minutes)")
    parser.add_argument("--no-append", action="store_true", help="print, do not append")
    args = parser.parse_args()
    trace = week_trace(args.day, args.rate, args.seed)
    started = time.perf_counter()
    results = []
    for row in ROWS:
        results.append(measure(row, trace, args.day, args.window, args.dt))
        print(f"{row.name}: {results[-1]['wall_s']} s", file=sys.stderr)
    wall = time.perf_counter() - started
    shown = table(results)
    print(shown)
    by_day = "\n".join(f"- {r['row']}: {r['morning_ttft_by_day_s']}" for r in results)
    notes = (
        f"Trace: {len(trace):,} requests over {len(WEEK)} days of {args.day:g} s (Mon-Fri,"
        f" Sat, Sun idle, Mon), {args.rate:g} req/s plateau, seed {args.seed}; mornings:"
        f" {results[0]['mornings']}; first window {args.window:g} s; tick {args.dt:g} s;"
        f" {wall:.0f} s for the {len(ROWS)} runs. First-request TTFT per morning, in"
        f" order (s):\n{by_day}"
    )
    if not args.no_append:
        append("Predictive prewarm (bench/predictive_prewarm.py)", shown, notes)
    print(notes)
    print(json.dumps({"bench": "predictive_prewarm", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
