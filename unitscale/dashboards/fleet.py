"""The fleet dashboard: every deployment's accelerators, spend, utilization and SLOs.

Totals over the dashboard's time range integrate a gauge with a subquery at Grafana's
``$__interval``: ``sum_over_time(g[$__range:$__interval]) * $__interval_ms / 3600000``
is the gauge's hours (accelerator-hours for ``unitscale_accelerators``, US$ for
``unitscale_cost_per_hour``), whatever the scrape interval.
"""

from __future__ import annotations

from unitscale.dashboards.build import (
    SLO_TARGET,
    Board,
    Panel,
    Query,
    Row,
    attainment,
    label_variable,
    missed,
    one_copy,
    slo_variables,
    the_datasource,
)

N = 'namespace=~"$namespace"'
BY = "namespace, deployment"
HOURS = "* $__interval_ms / 3600000"
"""A sum of samples taken every $__interval, in hours."""


def _samples(selector: str) -> str:
    """The sum of one copy's samples (``one_copy``) taken every $__interval in the range."""
    return f"sum(sum_over_time(({one_copy(selector)})[$__range:$__interval]))"


def _in_range(selector: str) -> str:
    return f"{_samples(selector)} {HOURS}"


def _mean_over_range(selector: str) -> str:
    """The sum over series of one copy's mean over the range."""
    return f"sum(avg_over_time(({one_copy(selector)})[$__range:$__interval]))"


def _sum_by(by: str, selector: str) -> str:
    return f"sum by ({by}) ({one_copy(selector)})"


def _attainment(metric: str, slo: str) -> str:
    """Share of the time each deployment's stable-window p95 was within the SLO, averaged."""
    p95 = f'max by ({BY}) ({metric}{{{N}, window="stable", quantile="0.95"}})'
    return f"avg(avg_over_time(({p95} <= bool ${slo})[$__range:$__interval]))"


def fleet_board() -> Board:
    """Accelerator-hours, cost, utilization, SLO attainment and signal health, fleet-wide."""
    return Board(
        file="unitscale-fleet.json",
        uid="unitscale-fleet",
        title="unitscale / fleet",
        description="Every deployment: accelerator-hours, spend, utilization, SLO attainment.",
        variables=(
            the_datasource(),
            label_variable(
                "namespace", "Namespace", "label_values(unitscale_replicas, namespace)", every=True
            ),
            *slo_variables(),
        ),
        rows=(_totals_row(), _cost_row(), _slo_row(), _health_row()),
    )


def _totals_row() -> Row:
    spend = _in_range(f"unitscale_cost_per_hour{{{N}}}")
    tokens = _samples(f'unitscale_token_rate{{{N}, window="stable"}}')
    return Row(
        "In the time range",
        (
            Panel(
                "Accelerator-hours",
                "How many accelerator-hours did the fleet hold (HAMi shares as fractions)?",
                "count:accelerator-h",
                (Query(_in_range(f"unitscale_accelerators{{{N}}}"), "accelerator-hours"),),
                kind="stat",
                width=6,
            ),
            Panel(
                "Spend",
                "What did those accelerators cost?",
                "currencyUSD",
                (Query(spend, "US$"),),
                kind="stat",
                width=6,
            ),
            Panel(
                "Cost per 1M tokens",
                "What did a million tokens cost, idle replicas' time included?",
                "currencyUSD",
                # Both integrate at the same step: the step cancels out.
                (
                    Query(
                        f"({_samples(f'unitscale_cost_per_hour{{{N}}}')} / 3600)"
                        f" / ({tokens} / 1e6)",
                        "US$ per 1M tokens",
                    ),
                ),
                kind="stat",
                width=6,
            ),
            Panel(
                "Utilization",
                "How much of the answering replicas' capacity did the load use on average?",
                "percentunit",
                (
                    Query(
                        _mean_over_range(f"unitscale_scaler_load_replicas{{{N}}}")
                        + " / "
                        + _mean_over_range(f'unitscale_replicas{{{N}, state="up"}}'),
                        "load / answering replicas",
                    ),
                ),
                kind="stat",
                width=6,
            ),
        ),
    )


def _cost_row() -> Row:
    return Row(
        "Accelerators and cost by deployment",
        (
            Panel(
                "Accelerators held",
                "Which deployments hold the accelerators now?",
                "short",
                (Query(_sum_by(BY, f"unitscale_accelerators{{{N}}}"), "{{deployment}}"),),
            ),
            Panel(
                "Spend per hour",
                "Which deployments cost the most per hour?",
                "currencyUSD",
                (Query(_sum_by(BY, f"unitscale_cost_per_hour{{{N}}}"), "{{deployment}}"),),
            ),
            Panel(
                "Cost per 1M tokens",
                "Which deployments are expensive per token (+Inf: paid, none served)?",
                "currencyUSD",
                (
                    Query(
                        f'max by ({BY}) (unitscale_cost_per_million_tokens{{{N}, kind="total"}})',
                        "{{deployment}}",
                    ),
                ),
            ),
            Panel(
                "Utilization",
                "How full are the replicas of each deployment (KV cache) and each namespace?",
                "percentunit",
                (
                    Query(
                        f"max by ({BY}) (unitscale_kv_cache_usage{{{N}}})",
                        "KV cache {{deployment}}",
                    ),
                    Query(
                        _sum_by("namespace", f"unitscale_scaler_load_replicas{{{N}}}")
                        + " / "
                        + _sum_by("namespace", f'unitscale_replicas{{{N}, state="up"}}'),
                        "load / answering {{namespace}}",
                    ),
                ),
            ),
        ),
    )


def _slo_row() -> Row:
    return Row(
        "SLO attainment",
        (
            Panel(
                "SLO attainment",
                "What share of the fleet's requests met the SLO, and which deployments fall short?",
                "percentunit",
                (
                    Query(attainment(N, "5m"), "fleet (5m)"),
                    Query(attainment(N, "1h"), "fleet (1h)"),
                    Query(attainment(N, "1h", BY), "{{deployment}} (1h)"),
                    Query(f"max({SLO_TARGET}{{{N}}})", "target"),
                ),
            ),
            Panel(
                "Why requests missed",
                "Which deployments' requests miss the SLO, and why?",
                "reqps",
                (Query(missed(N, f"{BY}, reason"), "{{deployment}} {{reason}}"),),
            ),
            Panel(
                "TTFT SLO attainment",
                "For what share of the time was p95 time to first token within its SLO?",
                "percentunit",
                (Query(_attainment("unitscale_ttft_seconds", "slo_ttft"), "TTFT"),),
                kind="stat",
                width=6,
            ),
            Panel(
                "Inter-token SLO attainment",
                "For what share of the time was p95 inter-token latency within its SLO?",
                "percentunit",
                (Query(_attainment("unitscale_inter_token_seconds", "slo_itl"), "inter-token"),),
                kind="stat",
                width=6,
            ),
            Panel(
                "p95 time to first token by deployment",
                "Which deployments miss the TTFT SLO, and when?",
                "s",
                (
                    Query(
                        f"max by ({BY}) (unitscale_ttft_seconds"
                        f'{{{N}, window="stable", quantile="0.95"}})',
                        "{{deployment}}",
                    ),
                    Query("vector($slo_ttft)", "SLO"),
                ),
            ),
        ),
    )


def _health_row() -> Row:
    return Row(
        "The signal path",
        (
            Panel(
                "Replicas known and answering",
                "Does the exporter reach every replica it knows of?",
                "short",
                (
                    Query(
                        _sum_by(BY, f'unitscale_replicas{{{N}, state="known"}}'),
                        "known {{deployment}}",
                    ),
                    Query(
                        _sum_by(BY, f'unitscale_replicas{{{N}, state="up"}}'),
                        "answering {{deployment}}",
                    ),
                ),
            ),
            Panel(
                "Scrape errors",
                "Why do scrapes of replicas fail (timeout, connect, parse, ...)?",
                "cps",
                (
                    Query(
                        f"sum by ({BY}, reason) (rate(unitscale_target_scrape_errors_total{{{N}}}"
                        "[$__rate_interval]))",
                        "{{deployment}} {{reason}}",
                    ),
                ),
            ),
            Panel(
                "Signal age",
                "Are the signals fresh (the scaler refuses them past max-signal-age)?",
                "s",
                (Query(f"max by ({BY}) (unitscale_signal_age_seconds{{{N}}})", "{{deployment}}"),),
            ),
            Panel(
                "Scaler has signals",
                "Which ScaledObjects does the scaler decide for, and which fall back?",
                "bool",
                (
                    Query(
                        "min by (namespace, scaled_object)"
                        f" (unitscale_scaler_signals_available{{{N}}})",
                        "{{scaled_object}}",
                    ),
                ),
                kind="state-timeline",
            ),
            Panel(
                "Config reloads",
                "Did a ConfigMap change apply, or was it refused (the last good config stays)?",
                "short",
                (
                    Query(
                        "sum by (job, result) (increase(unitscale_config_reloads_total[$__range]))",
                        "{{job}} {{result}}",
                    ),
                ),
            ),
        ),
    )
