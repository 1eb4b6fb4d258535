"""The demo's report: the live run beside the replay's prediction, and the gap stated.

Everything is in trace time (the wall-clock run times the compression). Live latency
quantiles are the client's: TTFT from the streamed sample, end-to-end from every
request. Live cost counts each replica from its process start to its exit, as a pod
holds its accelerator, up to the last response (where the replay stops too); while it
sleeps (the standby plan's), it is billed as the replay bills a sleeper: its weights in
host memory (``foundation.replica_model.warm_tiers``), not an accelerator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from foundation.files import write_file, write_png
from foundation.replica_model import warm_tiers
from replay.run import json_number
from replay.simulate import Result, percentile
from scaler.core.capacity import profile_of
from unitscale.demo.fleet import Replica, held_seconds, sleeping_seconds, wakes
from unitscale.demo.load import Outcome
from unitscale.demo.observe import Sample
from unitscale.demo.tiers import tier_results, tier_section
from unitscale.demo.world import Plan

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# (key, label, unit, format): the comparison table's rows.
ROWS = (
    ("requests", "requests", "", "d"),
    ("served", "served", "", "d"),
    ("failed", "failed or dropped", "", "d"),
    ("gpu_hours", "accelerator-hours", "h", ".3f"),
    ("cost", "cost", "US$", ".2f"),
    ("cost_per_million_tokens", "cost per 1M tokens", "US$", ".3f"),
    ("slo_attainment", "SLO attainment", "", ".1%"),
    ("ttft_p50_seconds", "TTFT p50", "s", ".2f"),
    ("ttft_p95_seconds", "TTFT p95", "s", ".2f"),
    ("ttft_p99_seconds", "TTFT p99", "s", ".2f"),
    ("e2e_p95_seconds", "end-to-end p95", "s", ".2f"),
    ("max_awake_replicas", "most replicas awake", "", "d"),
    ("cold_starts", "replica starts", "", "d"),
    ("sleeping_hours", "sleeping replica-hours", "h", ".3f"),
    ("wakes", "wakes", "", "d"),
)


@dataclass(frozen=True, slots=True)
class LiveRun:
    """What the live run left behind, in wall seconds since its start."""

    outcomes: Sequence[Outcome]
    replicas: Sequence[Replica]
    samples: Sequence[Sample]
    events: Sequence[tuple[float, str]]
    """(trace seconds, text)."""
    replica_kind: str = "simulated replicas"
    interrupted: bool = False


def live_metrics(run: LiveRun, plan: Plan) -> dict[str, float | int]:
    """The replay's metrics, measured on the live run (trace units)."""
    c = plan.compression
    sent = [o for o in run.outcomes if o.sent is not None]
    ok = [o for o in sent if o.ok]
    end = max((o.finished for o in sent if o.finished is not None), default=0.0)
    replica_seconds = held_seconds(run.replicas, end) * c
    gpu_hours = replica_seconds / 3600.0
    sleeping_hours = sleeping_seconds(run.replicas, end) * c / 3600.0
    standby_cost = (
        sleeping_hours * warm_tiers(plan.replica_profile, plan.cold_start).sleeping_per_hour
    )
    cost = gpu_hours * plan.profile.price_per_hour + standby_cost
    tokens = float(sum(o.prompt + o.output for o in ok))
    streamed = [o for o in ok if o.streamed and o.first_token is not None]
    ttft = np.array([(o.first_token - o.sent) * c for o in streamed])  # type: ignore[operator]
    itl = np.array(
        [
            (o.finished - o.first_token) * c / max(o.output - 1, 1)  # type: ignore[operator]
            for o in streamed
        ]
    )
    e2e = np.array([(o.finished - o.sent) * c for o in ok])  # type: ignore[operator]
    sample_ok = (ttft <= plan.slo_ttft) & (itl <= plan.slo_itl)
    # A failed request misses the SLO; the sample stands for its share of requests.
    failed_share = 1 - len(ok) / len(sent) if sent else 0.0
    attainment = float(sample_ok.mean()) * (1 - failed_share) if len(streamed) else math.nan
    return {
        "requests": len(run.outcomes),
        "served": len(ok),
        "failed": len(run.outcomes) - len(ok),
        "gpu_hours": gpu_hours,
        "cost": cost,
        "cost_per_million_tokens": cost / tokens * 1e6 if tokens else math.nan,
        "slo_attainment": attainment,
        "ttft_p50_seconds": percentile(ttft, 50),
        "ttft_p95_seconds": percentile(ttft, 95),
        "ttft_p99_seconds": percentile(ttft, 99),
        "e2e_p95_seconds": percentile(e2e, 95),
        "max_awake_replicas": max((s.replicas for s in run.samples), default=0),
        "cold_starts": len(run.replicas),
        "sleeping_hours": sleeping_hours,
        "standby_cost": standby_cost,
        "wakes": wakes(run.replicas),
        "ttft_sample": len(streamed),
        "cold_start_seconds_mean": _mean(
            [(r.ready_at - r.started) * c for r in run.replicas if r.ready_at is not None]
        ),
    }


def predicted_metrics(result: Result) -> dict[str, float | int]:
    m = dict(result.metrics)
    m["served"] = int(m["requests"]) - int(m["dropped"])
    m["failed"] = int(m["dropped"])
    return m


REPORT_FILES = ("report.md", "results.json", "replicas.png", "latency.png", "cost.png")
"""What ``write_report`` writes in the demo's directory."""


def write_report(
    out: Path,
    plan: Plan,
    run: LiveRun,
    prediction: Result,
    trace_name: str,
    command: str,
    alternatives: Mapping[str, Result] | None = None,
    tiers: Mapping[str, Result] | None = None,
) -> dict[str, dict[str, float | int]]:
    """``report.md``, ``results.json`` and three PNGs in ``out``; returns both metric sets.

    ``alternatives`` are replay-only what-ifs on the same trace, listed after the run;
    ``tiers`` the warm-tier rows (``unitscale.demo.tiers.compare_plan_tiers``) after them.
    """
    out.mkdir(parents=True, exist_ok=True)
    live = live_metrics(run, plan)
    predicted = predicted_metrics(prediction)
    _plots(out, plan, run, prediction)
    lines = [
        *_setting(plan, run, live, trace_name, command),
        *_interruption(run),
        *_comparison(live, predicted),
        *_figures(live),
        *_alternatives(predicted, alternatives or {}),
        *tier_section(plan, tiers or {}),
        *_decisions(run),
    ]
    write_file(out / "report.md", "\n".join(lines))
    _write_results(out / "results.json", plan, run, live, predicted, tiers or {})
    return {"live": live, "predicted": predicted}


def _setting(
    plan: Plan, run: LiveRun, live: dict[str, float | int], trace_name: str, command: str
) -> list[str]:
    """The title, and what ran: command, trace, replicas, prediction, SLO, ScaledObject."""
    scaled = plan.scaled_object
    return [
        "# unitscale demo: live run vs replay prediction",
        "",
        f"- command: `{command}`",
        f"- trace: {trace_name}, {live['requests']} requests over"
        f" {_minutes(max((s.t for s in run.samples), default=0.0))} of trace time,"
        f" played {plan.compression:g}x faster",
        f"- replicas: {run.replica_kind}; measured cold start"
        f" {_cell(live['cold_start_seconds_mean'], '.1f')} s on average",
        f"- prediction: the replay's `{plan.profile.name}` replica model (US$"
        f" {plan.profile.price_per_hour:.2f} per accelerator-hour, which the live cost uses"
        f" too), cold start {plan.cold_start:.1f} s",
        f"- SLO: TTFT <= {plan.slo_ttft:g} s and mean inter-token <= {plan.slo_itl:g} s",
        f"- scaler: {_planning(plan)}",
        f"- warm tier: {_standby(plan)}",
        f"- ScaledObject: {'external-push' if scaled.push else 'external'},"
        f" polling {scaled.spec.polling_interval:g} s, cooldown"
        f" {scaled.spec.cooldown:g} s, max {scaled.spec.max_replicas}"
        " replicas",
        "",
    ]


def _planning(plan: Plan) -> str:
    """What the scaler plans with: the replicas' profile or the flat priors."""
    budget = plan.replica_profile.max_num_batched_tokens
    launch = f"replicas launched with a {budget}-token chunk budget for the ITL SLO"
    profile = profile_of(plan.policy.policy())
    if profile is None:
        return f"the capacity priors (no profile); {launch}"
    return (
        f"the `{profile}` profile (capacity for the observed mix within the SLOs,"
        f" headroom steered by attainment); {launch}"
    )


def _standby(plan: Plan) -> str:
    """What the fleet holds besides its running replicas."""
    if plan.standby is None:
        return "none (`--no-standby`): every start from zero is a cold start"
    tiers = warm_tiers(plan.replica_profile, plan.cold_start)
    return (
        f'sleeping replicas (`standby: "true"`, {plan.standby.burst_sleepers:g} per running'
        f" replica for bursts, at most {plan.standby.max_sleeping}): the gateway puts the"
        " standby plan's sleepers to sleep (vLLM sleep level 1) and wakes them in"
        f" {tiers.sleeping_wake_seconds:.1f} s when a request finds none ready or every"
        f" ready replica holds {plan.wake_at_outstanding} requests (`wake-at-outstanding`);"
        f" a sleeper costs US$ {tiers.sleeping_per_hour:.3f} per hour (its weights in host"
        " memory), live and predicted"
    )


def _interruption(run: LiveRun) -> list[str]:
    if not run.interrupted:
        return []
    return [
        "**Interrupted:** the live run stopped early; it covers only part of the"
        " trace, the prediction all of it.",
        "",
    ]


def _comparison(live: dict[str, float | int], predicted: dict[str, float | int]) -> list[str]:
    """The headline and the table: every ``ROWS`` metric, live, predicted and the gap."""
    lines = [
        headline(live, predicted),
        "",
        "| metric | live | predicted | gap |",
        "|---|---:|---:|---:|",
    ]
    for key, label, unit, spec in ROWS:
        a, b = live.get(key, math.nan), predicted.get(key, math.nan)
        lines.append(
            f"| {label}{f' ({unit})' if unit else ''} | {_cell(a, spec)} | {_cell(b, spec)}"
            f" | {_gap(a, b, spec)} |"
        )
    return lines


def _figures(live: dict[str, float | int]) -> list[str]:
    """How the table was measured, and the three plots."""
    return [
        "",
        f"Live TTFT and SLO attainment come from the {live['ttft_sample']} streamed requests"
        " (every 8th); end-to-end from every request. The gap is live minus predicted,"
        " relative to predicted (percentage points for SLO attainment).",
        "",
        "![replicas and load](replicas.png)",
        "![latency](latency.png)",
        "![cost](cost.png)",
        "",
    ]


def _decisions(run: LiveRun) -> list[str]:
    """Every event of the live run, in trace time order."""
    return [
        "## Decisions (trace time)",
        "",
        *[f"- {_minutes(t)}  {text}" for t, text in sorted(run.events, key=lambda e: e[0])],
        "",
    ]


def _write_results(
    path: Path,
    plan: Plan,
    run: LiveRun,
    live: dict[str, float | int],
    predicted: dict[str, float | int],
    tiers: Mapping[str, Result],
) -> None:
    """``results.json``: both metric sets and the warm tiers' rows, as JSON numbers."""
    write_file(
        path,
        json.dumps(
            {
                "live": {k: json_number(v) for k, v in live.items()},
                "predicted": {k: json_number(v) for k, v in predicted.items()},
                "tiers": tier_results(tiers),
                "compression": plan.compression,
                "interrupted": run.interrupted,
            },
            indent=2,
        ),
    )


def _alternatives(predicted: dict[str, float | int], others: Mapping[str, Result]) -> list[str]:
    if not others:
        return []
    lines = [
        "## What the replay predicts for alternatives (same trace)",
        "",
        "| policy | accelerator-hours | cost per 1M tokens (US$) | SLO attainment | TTFT p95 (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = {"unitscale as run (the prediction above)": predicted}
    rows.update({name: predicted_metrics(result) for name, result in others.items()})
    for name, m in rows.items():
        lines.append(
            f"| {name} | {_cell(m['gpu_hours'], '.3f')}"
            f" | {_cell(m['cost_per_million_tokens'], '.3f')}"
            f" | {_cell(m['slo_attainment'], '.1%')} | {_cell(m['ttft_p95_seconds'], '.2f')} |"
        )
    return [*lines, ""]


def headline(live: dict[str, float | int], predicted: dict[str, float | int]) -> str:
    """One sentence: cost, SLO attainment and replicas, live against predicted."""
    cost = _gap(live["cost_per_million_tokens"], predicted["cost_per_million_tokens"], ".3f")
    slo = _gap(live["slo_attainment"], predicted["slo_attainment"], ".1%")
    return (
        f"**Headline:** live cost per 1M tokens US$"
        f" {_cell(live['cost_per_million_tokens'], '.3f')} against US$"
        f" {_cell(predicted['cost_per_million_tokens'], '.3f')} predicted ({cost});"
        f" SLO attainment {_cell(live['slo_attainment'], '.1%')} against"
        f" {_cell(predicted['slo_attainment'], '.1%')} predicted ({slo}); at most"
        f" {live['max_awake_replicas']} replicas awake live,"
        f" {predicted['max_awake_replicas']} predicted."
    )


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _cell(value: float | int, spec: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if spec == "d":
        return f"{int(value):d}"
    return f"{value:{spec}}"


def _gap(live: float | int, predicted: float | int, spec: str) -> str:
    if any(isinstance(v, float) and (math.isnan(v) or math.isinf(v)) for v in (live, predicted)):
        return "n/a"
    if spec.endswith("%"):
        return f"{(live - predicted) * 100:+.1f} pp"
    if predicted == 0:
        return "n/a" if live != 0 else "0%"
    return f"{(live - predicted) / abs(predicted):+.0%}"


def _minutes(t: float) -> str:
    minutes, seconds = divmod(int(t), 60)
    return f"{minutes:02d}:{seconds:02d}"


def _plots(out: Path, plan: Plan, run: LiveRun, prediction: Result) -> None:
    import matplotlib

    matplotlib.use("Agg")
    _plot_replicas(out / "replicas.png", run, prediction)
    _plot_latency(out / "latency.png", plan, run, prediction)
    _plot_cost(out / "cost.png", plan, run, prediction)


def _minutes_axes(
    run: LiveRun, prediction: Result
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The live samples' and the prediction's times, in trace minutes."""
    return np.array([s.t for s in run.samples]) / 60, np.array(prediction.series["t"]) / 60


def _plot_replicas(path: Path, run: LiveRun, prediction: Result) -> None:
    """Load above, replicas (all and ready) below: live and predicted."""
    import matplotlib.pyplot as plt

    fig, (load, reps) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    _load_panel(load, run, prediction)
    _replicas_panel(reps, run, prediction)
    fig.suptitle("Load and replicas: live run vs replay prediction")
    _save(fig, path)


def _load_panel(ax: Axes, run: LiveRun, prediction: Result) -> None:
    t, pt = _minutes_axes(run, prediction)
    period = np.diff(np.r_[0.0, [s.t for s in run.samples]])
    rate = np.array([s.arrivals for s in run.samples]) / np.maximum(period, 1e-9)
    ax.plot(t, rate, label="live (sent)", color="tab:blue")
    ax.plot(pt, prediction.series["arrivals"], label="replay", color="tab:orange", alpha=0.7)
    ax.set_ylabel("requests/s")
    ax.legend(loc="upper right")


def _replicas_panel(ax: Axes, run: LiveRun, prediction: Result) -> None:
    t, pt = _minutes_axes(run, prediction)
    ax.step(t, [s.replicas for s in run.samples], where="post", label="live", color="tab:blue")
    ax.step(
        t,
        [s.ready for s in run.samples],
        where="post",
        label="live ready",
        color="tab:blue",
        linestyle=":",
    )
    ax.step(pt, prediction.series["awake"], where="post", label="predicted", color="tab:orange")
    ax.step(
        pt,
        prediction.series["ready"],
        where="post",
        label="predicted ready",
        color="tab:orange",
        linestyle=":",
    )
    ax.set_ylabel("replicas")
    ax.set_xlabel("trace time (minutes)")
    ax.legend(loc="upper right")


def _plot_latency(path: Path, plan: Plan, run: LiveRun, prediction: Result) -> None:
    """The TTFT distributions (CDFs), live sample and predicted, against the SLO."""
    import matplotlib.pyplot as plt

    c = plan.compression
    fig, ax = plt.subplots(figsize=(7, 4))
    live_ttft = np.sort(
        [
            (o.first_token - o.sent) * c  # type: ignore[operator]
            for o in run.outcomes
            if o.ok and o.streamed and o.first_token is not None
        ]
    )
    for values, label in (
        (live_ttft, "live (streamed sample)"),
        (np.sort(prediction.ttft), "predicted"),
    ):
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label)
    ax.axvline(plan.slo_ttft, color="grey", linestyle="--", label="SLO")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s, trace time)")
    ax.set_ylabel("share of requests")
    ax.legend()
    _save(fig, path)


def _plot_cost(path: Path, plan: Plan, run: LiveRun, prediction: Result) -> None:
    """Accelerator cost so far, live and predicted."""
    import matplotlib.pyplot as plt

    c = plan.compression
    t, pt = _minutes_axes(run, prediction)
    fig, ax = plt.subplots(figsize=(7, 4))
    price = plan.profile.price_per_hour
    ends = [s.t / c for s in run.samples]
    live_cost = [held_seconds(run.replicas, e) * c / 3600 * price for e in ends]
    predicted_cost = np.cumsum(np.array(prediction.series["awake"]) * 10.0) / 3600 * price
    ax.plot(t, live_cost, label="live", color="tab:blue")
    ax.plot(pt, predicted_cost, label="predicted", color="tab:orange")
    ax.set_xlabel("trace time (minutes)")
    ax.set_ylabel("accelerator cost (US$)")
    ax.legend()
    _save(fig, path)


def _save(fig: Figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    write_png(path, fig, dpi=110)
    plt.close(fig)
