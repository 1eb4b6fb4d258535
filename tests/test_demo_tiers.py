"""The demo report's warm-tier what-if: ``unitscale replay --compare-tiers`` for the demo."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from foundation.replica_model import PROFILES
from replay.run import TIERS, ReplayOptions, compare_tiers, json_number
from replay.simulate import Result, simulate
from replay.trace import Trace
from unitscale.demo.report import LiveRun, write_report
from unitscale.demo.run import default_policy
from unitscale.demo.tiers import COLUMNS, compare_plan_tiers
from unitscale.demo.workload import WorkloadShape, generate
from unitscale.demo.world import make_plan, prediction

ROOT = Path(__file__).resolve().parent.parent
QWEN = PROFILES["qwen2.5-32b-h200"]
PLAN = make_plan(
    10.0,
    QWEN,
    ROOT / "deploy" / "scaledobjects" / "recommended.yaml",
    default_policy(QWEN),
    8,
    16.0,
)
"""The default demo's plan (sleepers held: ``standby: "true"``)."""
NO_STANDBY_PLAN = make_plan(
    10.0,
    QWEN,
    ROOT / "deploy" / "scaledobjects" / "recommended.yaml",
    default_policy(QWEN),
    8,
    16.0,
    standby=False,
)
"""``--no-standby``: every start a cold one."""
SHAPE = WorkloadShape(length=1200.0)
"""The demo's workload, shorter: its idle stretch (264 s) still lets the fleet reach zero
(220 s does not: idle grace, then KEDA's cooldown) and outlasts the 120 s idle gap."""
HEADERS = [
    "tier",
    "first token after idle, max (s)",
    "first token after idle, mean (s)",
    "requests after idle",
    "SLO attainment",
    "cost per 1M tokens (US$)",
    "accelerator-hours",
    "standby cost (US$)",
    "cold starts",
    "cache starts",
    "wakes",
]
HEADING = "## What the replay predicts from each warm tier (same trace, from zero)"


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate(SHAPE, 0)


@pytest.fixture(scope="module")
def tiers(trace: Trace) -> dict[str, Result]:
    return compare_plan_tiers(PLAN, trace)


def _numbers(result: Result) -> dict[str, float | int | None]:
    """Every metric, NaN as None, so that two runs compare equal."""
    return {k: json_number(v) for k, v in result.metrics.items()}


def test_the_demos_rows_are_compare_tiers_for_the_demos_policy_fleet_and_start(
    trace: Trace, tiers: dict[str, Result]
) -> None:
    policy, config = prediction(PLAN)
    options = ReplayOptions("demo", 1.0, 1.0, 0, warm_start=False)
    direct = compare_tiers(trace, config, options, base=policy)
    assert list(tiers) == list(TIERS) == ["cold", "cache-warm", "sleeping", "always-on-1"]
    assert {n: _numbers(r) for n, r in tiers.items()} == {n: _numbers(r) for n, r in direct.items()}


def test_the_cold_row_is_the_no_standby_demos_prediction_whichever_the_demo_runs(
    trace: Trace, tiers: dict[str, Result]
) -> None:
    """From zero replicas, with the demo's policy and fleet: what ``--no-standby`` predicts.

    Each row sets its own warm tier: the table is the same with or without the flag.
    """
    assert _numbers(tiers["cold"]) == _numbers(simulate(trace, *prediction(NO_STANDBY_PLAN)))
    without = compare_plan_tiers(NO_STANDBY_PLAN, trace)
    assert {n: _numbers(r) for n, r in tiers.items()} == {
        n: _numbers(r) for n, r in without.items()
    }


def test_after_idle_a_sleeper_answers_first_then_the_cache_then_a_cold_start(
    tiers: dict[str, Result],
) -> None:
    first = {n: r.metrics["after_idle_ttft_max_seconds"] for n, r in tiers.items()}
    assert all(r.metrics["after_idle_requests"] >= 1 for r in tiers.values())
    assert first["sleeping"] <= 5.0 < first["cache-warm"] < first["cold"]
    assert first["cache-warm"] <= 0.5 * first["cold"]
    assert tiers["sleeping"].metrics["wakes"] >= 1 and tiers["cache-warm"].metrics["wakes"] == 0
    assert tiers["cache-warm"].metrics["cache_starts"] >= 1
    assert tiers["cold"].metrics["standby_cost"] == 0 < tiers["sleeping"].metrics["standby_cost"]


def _table(report: str) -> list[list[str]]:
    """The cells of the table under the tiers' heading, its header first (no rule)."""
    section = report.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _write(out: Path, predicted: Result, tiers: dict[str, Result] | None) -> None:
    """The demo's report for a live run that served nothing (the tiers do not need one)."""
    write_report(out, PLAN, LiveRun([], [], [], []), predicted, "demo", "demo", {}, tiers)


def test_the_report_holds_the_tier_table_and_results_the_replays_numbers(
    tmp_path: Path, tiers: dict[str, Result]
) -> None:
    _write(tmp_path, tiers["cold"], tiers)  # the cold row is the prediction (tested above)
    header, *rows = _table((tmp_path / "report.md").read_text())
    assert header == HEADERS and [r[0] for r in rows] == list(TIERS)
    for cells, (name, result) in zip(rows, tiers.items(), strict=True):
        m = result.metrics
        shown = dict(zip(HEADERS[1:], cells[1:], strict=True))
        assert shown["first token after idle, max (s)"] == f"{m['after_idle_ttft_max_seconds']:.1f}"
        assert shown["SLO attainment"] == f"{m['slo_attainment']:.1%}", name
        assert shown["cost per 1M tokens (US$)"] == f"{m['cost_per_million_tokens']:.3f}", name
        assert shown["wakes"] == f"{m['wakes']:,}", name
    stored = json.loads((tmp_path / "results.json").read_text())["tiers"]
    assert stored == {
        name: {key: json_number(r.metrics[key]) for key, _, _ in COLUMNS}
        for name, r in tiers.items()
    }
    assert all(math.isfinite(stored[n]["after_idle_ttft_max_seconds"]) for n in TIERS)


def test_a_report_without_tiers_has_no_tier_section_and_no_rows(
    tmp_path: Path, tiers: dict[str, Result]
) -> None:
    _write(tmp_path, tiers["cold"], None)
    assert HEADING not in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["tiers"] == {}
