"""The demo's warm-tier what-if: cold vs cache-warm vs sleeping scale-from-zero.

The rows are ``unitscale replay --compare-tiers``'s (``replay.run.compare_tiers``), run
with the demo's own unitscale policy and fleet (``world.prediction``) on the demo's
trace, from zero replicas as the live run and the prediction start; each row sets its own
warm tier, so the ``cold`` row is the prediction of ``--no-standby``, and the
``sleeping`` row the default's plus a Fluid cache (which the demo does not have).
Simulated only, so it takes seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from replay.run import ReplayOptions, compare_tiers, json_number, tier_notes
from replay.simulate import Result, SimConfig
from replay.trace import Trace
from unitscale.demo.world import Plan, prediction

# (metric, column header, format): the table's columns, all from ``Result.metrics``.
COLUMNS = (
    ("after_idle_ttft_max_seconds", "first token after idle, max (s)", ".1f"),
    ("after_idle_ttft_mean_seconds", "first token after idle, mean (s)", ".1f"),
    ("after_idle_requests", "requests after idle", "d"),
    ("slo_attainment", "SLO attainment", ".1%"),
    ("cost_per_million_tokens", "cost per 1M tokens (US$)", ".3f"),
    ("gpu_hours", "accelerator-hours", ".3f"),
    ("standby_cost", "standby cost (US$)", ".3f"),
    ("cold_starts", "cold starts", "d"),
    ("cache_starts", "cache starts", "d"),
    ("wakes", "wakes", "d"),
)


def compare_plan_tiers(plan: Plan, trace: Trace) -> dict[str, Result]:
    """``compare_tiers`` for the demo's plan and trace, one ``Result`` per ``TIERS`` row."""
    policy, config = prediction(plan)
    # Only warm_start matters with a base policy: every row starts from zero, as the demo.
    options = ReplayOptions(trace.name, 1.0, 1.0, 0, warm_start=False)
    return compare_tiers(trace, config, options, base=policy)


def tier_config(plan: Plan) -> SimConfig:
    """The fleet the rows share (the prediction's), for the tiers' figures."""
    return prediction(plan)[1]


def tier_section(plan: Plan, results: Mapping[str, Result]) -> list[str]:
    """The report's section: the tiers' figures and one table row per tier."""
    if not results:
        return []
    header = " | ".join(label for _, label, _ in COLUMNS)
    return [
        "## What the replay predicts from each warm tier (same trace, from zero)",
        "",
        "`unitscale replay --compare-tiers` for the demo's unitscale and fleet: scale-from-zero"
        f" from cold starts ({_cold_is(plan)}), with the Fluid cache held warm, with"
        " sleeping replicas (vLLM sleep mode level 1) and the cache, and a fleet never below"
        " one replica.",
        "",
        *tier_notes(tier_config(plan)),
        "",
        f"| tier | {header} |",
        "|---|" + "---:|" * len(COLUMNS),
        *[
            f"| {name} | "
            + " | ".join(_cell(r.metrics[key], spec) for key, _, spec in COLUMNS)
            + " |"
            for name, r in results.items()
        ],
        "",
    ]


def _cold_is(plan: Plan) -> str:
    """What the ``cold`` row is to the prediction above it."""
    if plan.standby is None:
        return "the prediction above"
    return "the demo with `--no-standby`; the prediction above holds sleepers, no cache"


def tier_results(results: Mapping[str, Result]) -> dict[str, dict[str, float | int | None]]:
    """``results.json``'s ``tiers``: each row's columns, as JSON numbers (n/a: null)."""
    return {
        name: {key: json_number(r.metrics[key]) for key, _, _ in COLUMNS}
        for name, r in results.items()
    }


def _cell(value: float | int, spec: str) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "n/a"  # an after-idle request dropped, or none
    return format(value, spec if spec != "d" else ",")
