"""The per-deployment dashboard: one scaled workload, from its load to the scaler's decision."""

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

# The exporter and the gateway label by deployment, the scaler by ScaledObject.
D = 'namespace="$namespace", deployment="$deployment"'
S = 'namespace="$namespace", scaled_object="$scaled_object"'

PREWARM_ROW = "Fluid prewarm"
"""Its series exist only for ScaledObjects naming a Fluid Dataset (``fluidDataset``)."""

NOTE = (
    "The scaler logs every change of desired replicas with its reason (`load 2.40 replicas,"
    " need 3.00 at 80% -> 3 (forecast ...)`); the numbers in a reason are the series of"
    " *Why that many replicas*. Reasons are free text and stay out of metric labels."
    " A signal that is unknown is absent from a graph, never drawn as 0."
)


def _sum(selector: str, by: str = "") -> str:
    """A sum over one copy of an exporter's or the scalers' series (``one_copy``)."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} ({one_copy(selector)})"


def deployment_board() -> Board:
    """Load, replicas, queues, latency, throughput and cost, and the scaler's decisions."""
    return Board(
        file="unitscale-deployment.json",
        uid="unitscale-deployment",
        title="unitscale / deployment",
        description="One scaled deployment: load, replicas, latency, cost and decisions.",
        variables=(
            the_datasource(),
            label_variable("namespace", "Namespace", "label_values(unitscale_replicas, namespace)"),
            label_variable(
                "deployment",
                "Deployment",
                'label_values(unitscale_replicas{namespace="$namespace"}, deployment)',
            ),
            label_variable(
                "scaled_object",
                "ScaledObject",
                'label_values(unitscale_scaler_desired_replicas{namespace="$namespace"},'
                " scaled_object)",
            ),
            *slo_variables(),
        ),
        notes=(NOTE,),
        rows=(_load_row(), _latency_row(), _cost_row(), _decision_row(), _prewarm_row()),
    )


def _load_row() -> Row:
    return Row(
        "Load and replicas",
        (*_demand_panels(), *_gateway_panels(), *_wake_panels(), _utilization()),
    )


def _demand_panels() -> tuple[Panel, ...]:
    """Traffic, replicas and queues."""
    return (
        Panel(
            "Load",
            "How much traffic is the deployment getting, and is it rising?",
            "reqps",
            (
                Query(
                    f"sum(rate(unitscale_gateway_requests_total{{{D}}}[$__rate_interval]))",
                    "arriving at the gateway",
                ),
                Query(_sum(f'unitscale_request_rate{{{D}, window="stable"}}'), "finished"),
                Query(
                    _sum(f'unitscale_request_rate{{{D}, window="panic"}}'),
                    "finished (panic window)",
                ),
            ),
        ),
        Panel(
            "Desired and ready replicas",
            "Does the fleet follow what the scaler wants, and how far behind is it?",
            "short",
            (
                Query(f"max(unitscale_scaler_desired_replicas{{{S}}})", "desired (scaler)"),
                Query(_sum(f'unitscale_replicas{{{D}, state="known"}}'), "known (exporter)"),
                Query(_sum(f'unitscale_replicas{{{D}, state="up"}}'), "answering (exporter)"),
                Query(f"sum(unitscale_gateway_replicas_ready{{{D}}})", "ready (gateway)"),
                Query(f"sum(unitscale_gateway_replicas_sleeping{{{D}}})", "asleep (gateway)"),
            ),
        ),
        Panel(
            "Queues",
            "Where do requests wait: in the engines or in the gateway's buffer?",
            "short",
            (
                Query(_sum(f"unitscale_queue_depth{{{D}}}"), "waiting in the engines"),
                Query(_sum(f"unitscale_requests_running{{{D}}}"), "running in the engines"),
                Query(f"sum(unitscale_gateway_buffered{{{D}}})", "buffered at the gateway"),
                Query(f"sum(unitscale_gateway_in_flight{{{D}}})", "in flight (gateway)"),
            ),
        ),
    )


def _gateway_panels() -> tuple[Panel, ...]:
    """The gateway's buffer, its own answers and upstream failures."""
    return (
        Panel(
            "Time in the gateway's buffer",
            "How long did requests wait for a ready replica (activation from zero)?",
            "s",
            tuple(
                Query(
                    f"histogram_quantile({q}, sum by (le) (rate("
                    f"unitscale_gateway_buffer_seconds_bucket{{{D}}}[$__rate_interval])))",
                    f"p{round(q * 100)}",
                )
                for q in (0.5, 0.95, 0.99)
            ),
        ),
        Panel(
            "Requests the gateway answered itself, and upstream failures",
            "Who fails requests: the gateway (buffer full, timeout, no model) or a replica?",
            "reqps",
            (
                Query(
                    f"sum by (status) (rate(unitscale_gateway_rejected_total{{{D}}}"
                    "[$__rate_interval]))",
                    "answered {{status}}",
                ),
                Query(
                    f"sum by (kind) (rate(unitscale_gateway_upstream_errors_total{{{D}}}"
                    "[$__rate_interval]))",
                    "upstream {{kind}}",
                ),
            ),
        ),
    )


def _wake_panels() -> tuple[Panel, ...]:
    """Wakes of sleeping replicas (vLLM sleep mode) as the gateway sees them."""
    return (
        Panel(
            "Wakes from sleep",
            "How often does the gateway wake a sleeping replica, and does the wake work?",
            "cps",
            (
                Query(
                    f"sum by (result) (rate(unitscale_gateway_wakes_total{{{D}}}"
                    "[$__rate_interval]))",
                    "{{result}}",
                ),
            ),
            width=6,
        ),
        Panel(
            "Time to wake",
            "How long does a sleeping replica take to wake (requests wait meanwhile)?",
            "s",
            tuple(
                Query(
                    f"histogram_quantile({q}, sum by (le) (rate("
                    f"unitscale_gateway_wake_seconds_bucket{{{D}}}[$__rate_interval])))",
                    f"p{round(q * 100)}",
                )
                for q in (0.5, 0.95)
            ),
            width=6,
        ),
    )


def _utilization() -> Panel:
    return Panel(
        "Utilization",
        "How full are the replicas: KV cache, and load over the replicas answering?",
        "percentunit",
        (
            Query(f"max(unitscale_kv_cache_usage{{{D}}})", "KV-cache use"),
            Query(
                _sum(f"unitscale_scaler_load_replicas{{{S}}}")
                + " / "
                + _sum(f'unitscale_replicas{{{D}, state="up"}}'),
                "load / answering replicas",
            ),
        ),
    )


def _quantiles(metric: str, slo: str) -> tuple[Query, ...]:
    stable = tuple(
        Query(
            f'max by (quantile) ({metric}{{{D}, window="stable", quantile="{q}"}})',
            f"p{round(float(q) * 100)}",
        )
        for q in ("0.5", "0.9", "0.95", "0.99")
    )
    panic = Query(f'max({metric}{{{D}, window="panic", quantile="0.95"}})', "p95 (panic window)")
    return (*stable, panic, Query(f"vector(${slo})", "SLO"))


def _slo_panels() -> tuple[Panel, ...]:
    """The share of requests the gateway judged within the SLO, and why the others missed."""
    return (
        Panel(
            "SLO attainment",
            "What share of requests met the SLO (TTFT and mean ITL), against the target?",
            "percentunit",
            (
                Query(attainment(D, "5m"), "within (5m)"),
                Query(attainment(D, "1h"), "within (1h)"),
                Query(f"max({SLO_TARGET}{{{D}}})", "target"),
            ),
        ),
        Panel(
            "Why requests missed",
            "Why were requests outside the SLO: late, slow tokens, too slow an answer, failed?",
            "reqps",
            (Query(missed(D, "reason"), "{{reason}}"),),
        ),
    )


def _latency_row() -> Row:
    return Row(
        "Latency",
        (
            *_slo_panels(),
            Panel(
                "Time to first token",
                "Do users wait too long for the first token (the TTFT SLO)?",
                "s",
                _quantiles("unitscale_ttft_seconds", "slo_ttft"),
            ),
            Panel(
                "Inter-token latency",
                "Does text stream fast enough once it starts (the inter-token SLO)?",
                "s",
                _quantiles("unitscale_inter_token_seconds", "slo_itl"),
            ),
            Panel(
                "Queue time and end-to-end latency",
                "Is latency spent waiting in the engine queue or generating?",
                "s",
                (
                    Query(
                        f'max(unitscale_queue_time_seconds{{{D}, window="stable",'
                        ' quantile="0.95"})',
                        "queue p95",
                    ),
                    Query(
                        f'max(unitscale_e2e_seconds{{{D}, window="stable", quantile="0.95"}})',
                        "end-to-end p95",
                    ),
                ),
            ),
            Panel(
                "Preemptions",
                "Is the KV cache so full that the engines evict running sequences?",
                "reqps",
                (Query(_sum(f'unitscale_preemption_rate{{{D}, window="stable"}}'), "preempted"),),
            ),
        ),
    )


def _cost_row() -> Row:
    return Row(
        "Throughput and cost",
        (
            Panel(
                "Token throughput",
                "How many tokens does the deployment process, prompt and generated?",
                "count:tok/s",
                (Query(_sum(f'unitscale_token_rate{{{D}, window="stable"}}', "kind"), "{{kind}}"),),
            ),
            Panel(
                "Request mix",
                "How long are prompts and answers (what one replica can sustain depends on it)?",
                "count:tok",
                (
                    Query(
                        f'max by (kind) (unitscale_tokens_per_request{{{D}, window="stable"}})',
                        "{{kind}} tokens per request",
                    ),
                ),
            ),
            Panel(
                "Cost per 1M tokens",
                "What does a million tokens cost with the replicas held (+Inf: paid, none served)?",
                "currencyUSD",
                (
                    Query(
                        f"max by (kind) (unitscale_cost_per_million_tokens{{{D}}})",
                        "{{kind}} tokens",
                    ),
                ),
            ),
            Panel(
                "Spend per hour",
                "What do the accelerators held cost per hour, traffic or none?",
                "currencyUSD",
                (Query(_sum(f"unitscale_cost_per_hour{{{D}}}"), "US$ per hour"),),
            ),
        ),
    )


def _decision_row() -> Row:
    return Row(
        "Decisions",
        (
            Panel(
                "Why that many replicas",
                "What load and need led to the desired count?",
                "short",
                (
                    Query(f"max(unitscale_scaler_load_replicas{{{S}}})", "load"),
                    Query(
                        f"max(unitscale_scaler_load_panic_replicas{{{S}}})", "load (short window)"
                    ),
                    Query(f"max(unitscale_scaler_need_replicas{{{S}}})", "need"),
                    Query(f"max(unitscale_scaler_desired_replicas{{{S}}})", "desired"),
                ),
            ),
            Panel(
                "Scaler state",
                "Is the target active, and does the scaler have fresh signals?",
                "bool",
                (
                    Query(f"max(unitscale_scaler_active{{{S}}})", "active"),
                    Query(f"min(unitscale_scaler_signals_available{{{S}}})", "signals"),
                    Query(f"max(unitscale_signal_partial{{{D}}})", "signals partial"),
                ),
                kind="state-timeline",
            ),
            Panel(
                "Changes of desired replicas",
                "Does the scaler change its mind often (flapping)?",
                "short",
                (
                    Query(
                        f"max(changes(unitscale_scaler_desired_replicas{{{S}}}[$__rate_interval]))",
                        "changes",
                    ),
                ),
            ),
            Panel(
                "Learned capacity",
                "Does a replica serve what its profile says (100%), or more or less?",
                "percentunit",
                (Query(f"max(unitscale_scaler_capacity_scale{{{S}}})", "capacity / priors"),),
                width=6,
            ),
            Panel(
                "Signal age",
                "How old are the newest signals (the scaler refuses them past max-signal-age)?",
                "s",
                (Query(f"max(unitscale_signal_age_seconds{{{D}}})", "age"),),
                width=6,
            ),
        ),
    )


def _prewarm_row() -> Row:
    def increase(metric: str, legend: str, across: str = "sum") -> Query:
        # Each scaler counts what it did (creates, refused writes): summed. A timeout is
        # each scaler's view of the same warm-up: the most of them.
        return Query(f"{across}(increase({metric}{{{S}}}[$__range]))", legend)

    return Row(
        PREWARM_ROW,
        (
            Panel(
                "Prewarm state",
                "Is the model's Fluid cache warm, loading, or failing?",
                "bool",
                (Query(f"max by (state) (unitscale_scaler_prewarm_state{{{S}}})", "{{state}}"),),
                kind="state-timeline",
            ),
            Panel(
                "Cache warmed",
                "How much of the Dataset is in Fluid's cache (its cachedPercentage)?",
                "percent",
                (Query(f"max(unitscale_scaler_prewarm_cached_percent{{{S}}})", "cached"),),
                width=6,
            ),
            Panel(
                "Time to warm",
                "How long did the last warm-up take, from its trigger to a warm cache?",
                "s",
                (Query(f"max(unitscale_scaler_prewarm_time_to_warm_seconds{{{S}}})", "last"),),
                width=6,
            ),
            Panel(
                "DataLoads, timeouts and refused writes",
                "Does the prewarm create DataLoads, and do warm-ups time out or writes fail?",
                "short",
                (
                    increase("unitscale_scaler_prewarm_dataloads_created_total", "DataLoads"),
                    increase("unitscale_scaler_prewarm_timeouts_total", "timed out", "max"),
                    increase("unitscale_scaler_prewarm_write_errors_total", "writes refused"),
                ),
            ),
        ),
    )
