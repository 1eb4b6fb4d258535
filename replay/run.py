"""Run policies over a trace and write ``results.json``, ``report.md`` and plots."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from replay.oracle import find_oracle
from replay.policies import (
    AibrixKv,
    Kpa,
    Policy,
    ProductionStack,
    StaticPeak,
    unitscale_policy,
)
from replay.simulate import Result, SimConfig, simulate
from replay.trace import Trace
from scaler.core.model import Policy as CorePolicy

POLICIES = ("static-peak", "production-stack", "kpa", "aibrix-kv", "oracle", "unitscale")
COLUMNS = (
    "gpu_hours",
    "cost_per_million_tokens",
    "cost_per_million_output_tokens",
    "slo_attainment",
    "ttft_p50_seconds",
    "ttft_p95_seconds",
    "ttft_p99_seconds",
    "e2e_p95_seconds",
    "mean_utilization",
    "requests",
    "dropped",
    "cold_starts",
)


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """What ``unitscale replay`` was asked for."""

    trace_path: str
    rate_multiplier: float
    time_compression: float
    seed: int
    target_concurrency: float = 32.0
    slo_target: float = 0.99
    warm_start: bool = True
    """Start every policy with the oracle's first-interval replicas ready."""
    policy: CorePolicy = field(default_factory=CorePolicy)
    """The scaler config's policy section, for the unitscale policy."""


def run_policies(
    trace: Trace,
    names: list[str],
    config: SimConfig,
    options: ReplayOptions,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, Result]:
    """Every named policy over ``trace``; the oracle first (static-peak uses its peak)."""
    results: dict[str, Result] = {}
    result, schedule = find_oracle(trace, config, options.slo_target)
    oracle_peak = int(min(schedule.replicas().max(), config.max_replicas))
    # Every policy starts warm with the replicas the first interval needs.
    warm = int(min(schedule.replicas()[0], config.max_replicas)) if options.warm_start else 0
    if "oracle" in names:
        results["oracle"] = result
    for name in names:
        if name == "oracle":
            continue
        policy = make_policy(name, config, options, oracle_peak)
        callback = (lambda t, n=name: progress(n, t)) if progress else None
        results[name] = simulate(trace, policy, config, progress=callback, initial_replicas=warm)
    return {name: results[name] for name in names}


def make_policy(name: str, config: SimConfig, options: ReplayOptions, peak: int | None) -> Policy:
    """A policy by name, sized for ``config``'s replicas."""
    if name == "static-peak":
        assert peak is not None
        return StaticPeak(peak)
    if name == "production-stack":
        return ProductionStack()
    if name == "aibrix-kv":
        return AibrixKv()
    if name == "kpa":
        return Kpa(target_concurrency=options.target_concurrency * 0.7)
    if name == "unitscale":
        return unitscale_policy(options.target_concurrency, config.max_replicas, options.policy)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)} or all")


def write_report(
    results: dict[str, Result], config: SimConfig, options: ReplayOptions, out: Path
) -> None:
    """``results.json``, ``report.md``, ``replicas.png`` and ``latency_cdf.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        name: {k: json_number(v) for k, v in r.metrics.items()} for name, r in results.items()
    }
    (out / "results.json").write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    header = "| policy | " + " | ".join(COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    rows = [
        f"| {name} | " + " | ".join(_cell(r.metrics[c]) for c in COLUMNS) + " |"
        for name, r in results.items()
    ]
    lines = [
        f"# Replay of `{Path(options.trace_path).name}`",
        "",
        f"- profile: {config.profile.name}"
        f" (${config.profile.price_per_hour:.2f} per accelerator-hour)",
        f"- rate multiplier {options.rate_multiplier:g},"
        f" time compression {options.time_compression:g}, seed {options.seed}",
        f"- SLO: TTFT <= {config.slo_ttft:g} s and mean inter-token latency"
        f" <= {config.slo_itl * 1000:g} ms; dropped requests count as misses",
        f"- cold start: {config.cold_start_tier}"
        + (" (Fluid prewarm: cached)" if config.prewarm else ""),
        "",
        header,
        rule,
        *rows,
        "",
        "![replicas and load](replicas.png)",
        "",
        "![latency CDF](latency_cdf.png)",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
    _plots(results, out)


def _plots(results: dict[str, Result], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load, reps) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    first = next(iter(results.values()))
    load.plot(np.array(first.series["t"]) / 60, first.series["arrivals"], color="black", lw=0.8)
    load.set_ylabel("arrivals / s")
    for name, result in results.items():
        reps.step(
            np.array(result.series["t"]) / 60,
            result.series["replicas"],
            where="post",
            label=name,
            lw=1,
        )
    reps.set_ylabel("replicas")
    reps.set_xlabel("minutes")
    reps.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(out / "replicas.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, result in results.items():
        values = np.sort(result.ttft)
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=name, lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of served requests")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=100)
    plt.close(fig)


def json_number(value: float | int) -> float | int | None:
    """``value``, or None where JSON has no number (NaN, infinities)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: float | int) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:,.2f}"
