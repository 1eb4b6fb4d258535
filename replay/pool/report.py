"""The joint replay's report: ``report.md``, ``results.json`` and plots over time.

``goals`` judges a run against issue #19's goals (the bench and the report both print
them): pool utilization >= 70 % with inference SLO attainment >= 99 % and training p95
queueing delay no worse than the static partition's, and unallocatable GPUs from
fragmentation at least 40 % below HAMi's binpack on the same trace.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from admission.pool import ManagerPolicy
from foundation.files import write_file, write_png
from replay.pool.joint import JointResult, JointRun
from replay.run import json_number

COLUMNS = (
    ("allocation", "allocation", "pct"),
    ("utilization", "utilization", "pct"),
    ("slo_attainment", "SLO", "pct"),
    ("cost_per_million_tokens", "$/1M tok", "money"),
    ("queue_delay_p50_seconds", "queue p50 s", "seconds"),
    ("queue_delay_p95_seconds", "queue p95 s", "seconds"),
    ("completed", "completed", "count"),
    ("preemptions", "preemptions", "count"),
    ("lost_card_hours", "lost card-h", "float"),
    ("unallocatable_cards", "unallocatable", "float"),
)
"""The table's columns: metric, heading, format."""
UTILIZATION_GOAL = 0.70
SLO_GOAL = 0.99
FRAGMENTATION_GOAL = 0.60
"""Our placement's unallocatable cards at most this share of binpack's (40 % below)."""


@dataclass(frozen=True, slots=True)
class Goal:
    """One of the issue's goals: what was measured against what, and whether it was met."""

    name: str
    measured: str
    target: str
    met: bool | None
    """None: not measurable in this run (a row it needs is missing)."""


def manager_row(run: JointRun) -> JointResult | None:
    """The manager's run with the first placement policy (the headline row)."""
    return next((r for r in run.results if r.config.baseline == "manager"), None)


def manager_rows(run: JointRun, policy: ManagerPolicy | None = None) -> list[JointResult]:
    """The manager's runs under ``policy`` (None: the first manager run's), in run order."""
    managers = [r for r in run.results if r.config.baseline == "manager"]
    if policy is None and managers:
        policy = managers[0].config.manager
    return [r for r in managers if r.config.manager == policy]


def goals(run: JointRun, policy: ManagerPolicy | None = None) -> list[Goal]:
    """Issue #19's goals on this run, misses included.

    The manager's rows are those under ``policy`` (None: the first manager run's); a
    headroom sweep judges each.
    """
    rows = manager_rows(run, policy)
    ours = rows[0] if rows else None
    static = next((r for r in run.results if r.config.baseline == "static"), None)
    out: list[Goal] = []
    if ours is not None:
        util, slo = ours.metrics["utilization"], ours.metrics["slo_attainment"]
        out.append(
            Goal(
                f"pool utilization ({ours.name})",
                f"{util:.1%}",
                ">= 70%",
                _at_least(util, UTILIZATION_GOAL),
            )
        )
        out.append(
            Goal(
                f"inference SLO attainment ({ours.name})",
                f"{slo:.2%}",
                ">= 99%",
                _at_least(slo, SLO_GOAL),
            )
        )
    if ours is not None and static is not None:
        mine, theirs = (
            ours.metrics["queue_delay_p95_seconds"],
            static.metrics["queue_delay_p95_seconds"],
        )
        out.append(
            Goal(
                f"training p95 queueing delay ({ours.name} vs {static.name})",
                f"{mine:,.0f} s vs {theirs:,.0f} s",
                "<= static's",
                _at_least(theirs, mine),
            )
        )
    binpack = next((r for r in rows if r.config.placement == "binpack"), None)
    fgd = next((r for r in rows if r.config.placement == "fgd"), None)
    if binpack is not None and fgd is not None:
        ours_u, base_u = fgd.metrics["unallocatable_cards"], binpack.metrics["unallocatable_cards"]
        ratio = ours_u / base_u if base_u > 0 else (0.0 if ours_u == 0 else math.inf)
        out.append(
            Goal(
                f"unallocatable GPUs from fragmentation ({fgd.name} vs {binpack.name})",
                f"{ours_u:.2f} vs {base_u:.2f} cards ({ratio:.2f}x)",
                "<= 0.60x",
                _at_least(FRAGMENTATION_GOAL, ratio) if math.isfinite(base_u) else None,
            )
        )
    else:
        out.append(Goal("unallocatable GPUs from fragmentation", "n/a", "<= 0.60x binpack", None))
    return out


def _at_least(value: float, bound: float) -> bool | None:
    """``value >= bound``; None when either is not a number (NaN: nothing was measured)."""
    if math.isnan(value) or math.isnan(bound):
        return None
    return bool(value >= bound)


def cell(value: float | int, kind: str) -> str:
    """One table cell; NaN and infinities are n/a."""
    if isinstance(value, float) and not math.isfinite(value):
        return "n/a"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "money":
        return f"{value:.4f}"
    if kind == "seconds":
        return f"{value:,.0f}"
    if kind == "count":
        return f"{int(value):,}"
    return f"{value:.2f}"


def table(run: JointRun) -> str:
    """The side-by-side table (markdown), one row per baseline x placement."""
    head = "| run | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    rows = [
        f"| {r.name} | " + " | ".join(cell(r.metrics[k], f) for k, _, f in COLUMNS) + " |"
        for r in run.results
    ]
    return "\n".join([head, rule, *rows])


def ratios(run: JointRun) -> str:
    """Each run against the static partition: utilization, SLO, p95 delay, completed.

    And its SLO against the same scaler run alone, unconstrained: the pool's cost to
    inference, in points.
    """
    static = next((r for r in run.results if r.config.baseline == "static"), None)
    if static is None:
        return ""
    keys = ("utilization", "slo_attainment", "queue_delay_p95_seconds", "completed")
    alone = run.peaks.slo_attainment
    head = "| run vs static | " + " | ".join(keys) + " | SLO vs scaler alone |"
    rule = "|---|" + "---:|" * (len(keys) + 1)
    rows = []
    for r in run.results:
        cells = []
        for key in keys:
            base, value = float(static.metrics[key]), float(r.metrics[key])
            known = base and math.isfinite(base) and math.isfinite(value)
            cells.append(f"{value / base:.2f}x" if known else "n/a")
        slo = float(r.metrics["slo_attainment"])
        cells.append(f"{slo - alone:+.1%}" if math.isfinite(alone + slo) else "n/a")
        rows.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])


REPORT_FILES = ("results.json", "report.md", "pool.png")
"""What ``write_report`` writes in its directory."""


def write_report(run: JointRun, out: Path, notes: tuple[str, ...] = ()) -> None:
    """``REPORT_FILES`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "cards": run.cards,
        "tasks": len(run.tasks),
        "task_multiplier": run.multiplier,
        "offered_training_cards": run.offered_cards,
        "training_arrival_window_seconds": run.window,
        "inference_peaks": list(run.peaks.peaks),
        "inference_mean_held": run.peaks.mean_held,
        "runs": {r.name: {k: json_number(v) for k, v in r.metrics.items()} for r in run.results},
        "goals": [
            {"goal": g.name, "measured": g.measured, "target": g.target, "met": g.met}
            for g in goals(run)
        ],
    }
    write_file(out / "results.json", json.dumps(payload, indent=2, sort_keys=True) + "\n")
    verdicts = [
        f"- {g.name}: {g.measured} (goal {g.target}):"
        f" {'met' if g.met else 'not measured' if g.met is None else 'MISSED'}"
        for g in goals(run)
    ]
    lines = [
        "# Joint replay: one pool, training and inference",
        "",
        f"- pool: {run.cards} cards; {len(run.tasks):,} training tasks"
        f" ({run.multiplier:.2f}x the trace's, arriving over {run.span:,.0f} s"
        f" from {run.window:,.0f} s of the pod list's time,"
        f" offering {run.offered_cards:.1f} cards on average)",
        f"- inference: peak {', '.join(map(str, run.peaks.peaks))} cards"
        f" (static's carve-out), mean {run.peaks.mean_held:.1f} held, run alone",
        *notes,
        "",
        table(run),
        "",
        ratios(run),
        "",
        "Goals (issue #19):",
        "",
        *verdicts,
        "",
        "![pool over time](pool.png)",
        "",
    ]
    reasons = [r for res in run.results for r in res.reasons[:3]]
    if reasons:
        lines += ["Reclaims (the manager's reasons, first few):", ""]
        lines += [f"- {reason}" for reason in reasons] + [""]
    write_file(out / "report.md", "\n".join(lines))
    plots(run, out / "pool.png")


PANELS = (
    ("allocation", "allocation"),
    ("inference_held", "inference cards held"),
    ("inference_pending", "inference replicas pending"),
    ("training_held", "training cards held"),
    ("queue", "training queue"),
    ("unallocatable", "unallocatable cards"),
)


def plots(run: JointRun, path: Path) -> None:
    """Every run's series over simulated time, one panel per quantity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(10, 2.0 * len(PANELS)), sharex=True)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        for result in run.results:
            t = np.array(result.series["t"]) / 60
            ax.plot(t, result.series[key], lw=0.9, label=result.name)
        ax.set_ylabel(label, fontsize=8)
    first = run.results[0] if run.results else None
    if first is not None:
        t = np.array(first.series["t"]) / 60
        axes[1].plot(
            t,
            first.series["inference_wanted"],
            color="black",
            lw=0.6,
            ls=":",
            label="wanted (first run)",
        )
    axes[0].legend(fontsize=7, ncol=3)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    write_png(path, fig, dpi=90)
    plt.close(fig)


__all__ = [
    "COLUMNS",
    "Goal",
    "goals",
    "manager_row",
    "manager_rows",
    "plots",
    "ratios",
    "table",
    "write_report",
]
