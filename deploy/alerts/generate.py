"""Writes unitscale's alert rules: a plain Prometheus rules file and a PrometheusRule.

Both carry the same groups, made here from one definition; the committed files are this
script's output with its defaults (``tests/test_alerts.py`` regenerates and compares).
For other thresholds, run it with your own and apply what it writes::

    python deploy/alerts/generate.py --slo-target 0.995 --cost-budget 3 --out my-alerts/

What each alert means, its thresholds and what to do: docs/alerts.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from serving.vllm_buckets import TTFT

HERE = Path(__file__).resolve().parent
RULES_FILE = "unitscale.rules.yaml"
PROMETHEUS_RULE_FILE = "prometheusrule.yaml"

# The SRE workbook's multi-window, multi-burn-rate alerts (chapter 5, table 5-8): a burn
# rate spends the given share of a 30-day budget within the long window; the short window
# (1/12 of it) makes the alert resolve soon after the burn stops.
BURN_TIERS = (
    # (burn rate, long window, short window, severity, for)
    (14.4, "1h", "5m", "critical", "2m"),  # 2% of the budget in an hour: page
    (6.0, "6h", "30m", "critical", "15m"),  # 5% in six hours: page
    (1.0, "3d", "6h", "warning", "1h"),  # 10% in three days: a ticket
)
SLO_BY = "namespace, model_name"  # vLLM labels its series by model_name
# The same form over the gateway's judgment of every request (attainment: within the TTFT
# and mean-ITL targets of its slo block). A fast burn pages; a slower one is a ticket: the
# scaler's attainment loop raises its headroom by itself, a person looks within the day.
ATTAINMENT_BURN_TIERS = (
    # (burn rate, long window, short window, severity, for)
    (14.4, "1h", "5m", "critical", "2m"),  # 2% of the budget in an hour: page
    (6.0, "6h", "30m", "warning", "15m"),  # 5% in six hours: a ticket
)
ATTAINMENT_BY = "namespace, deployment"  # the gateway labels its series by deployment
ATTAINMENT_BUDGET = "unitscale:gateway_slo_error_budget:ratio"
"""The recorded error budget, 1 - the gateway's attainment target (its ``slo`` block)."""


@dataclass(frozen=True)
class Settings:
    """The knobs of the rules (docs/alerts.md#settings)."""

    slo_target: float = 0.99
    ttft_slo_seconds: float = 2.5
    cost_budget: float = 5.0
    max_signal_age_seconds: float = 30.0
    scaler_job: str = "unitscale-scaler"
    exporter_job: str = "unitscale-exporter"
    keda_scalers: str = "externalScaler|externalPushScaler"
    runbook_base: str = "docs/alerts.md"

    def __post_init__(self) -> None:
        if not 0 < self.slo_target < 1:
            raise ValueError(
                f"--slo-target must be between 0 and 1 (exclusive), not {self.slo_target}"
            )
        if self.ttft_slo_seconds not in TTFT:
            raise ValueError(
                f"--ttft-slo-seconds {self.ttft_slo_seconds:g} s is not a bucket bound of vLLM's"
                f" time_to_first_token histogram: choose one of {', '.join(f'{b:g}' for b in TTFT)}"
            )
        for name in ("cost_budget", "max_signal_age_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(
                    f"--{name.replace('_', '-')} must be a positive number, not {value}"
                )
        for name in ("scaler_job", "exporter_job", "keda_scalers"):
            # Each goes between the double quotes of a PromQL matcher: a quote ended it
            # and the rest became query (`x"} or vector(1) or up{job="y`).
            value = getattr(self, name)
            if not value or any(c in value for c in '"\\\n\r'):
                raise ValueError(
                    f"--{name.replace('_', '-')} goes into a PromQL matcher: it must be"
                    " non-empty, without double quotes, backslashes or line breaks"
                )


def _number(value: float) -> str:
    return f"{value:g}"


def _le_matcher(bound: float) -> str:
    # Prometheus 3 normalises le="5.0" to le="5" at ingestion, 2.x keeps what the target
    # wrote (prometheus_client writes "5.0"): match both spellings of a whole number.
    if bound == int(bound):
        return f'le=~"{int(bound)}|{int(bound)}\\\\.0"'
    return f'le="{_number(bound)}"'


def _alert(
    settings: Settings,
    name: str,
    expr: str,
    duration: str,
    labels: dict[str, str],
    summary: str,
    description: str,
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": duration,
        "labels": labels,
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{settings.runbook_base}#{name.lower()}",
        },
    }


def signal_rules(s: Settings) -> dict[str, Any]:
    """The exporter's signals: there, fresh, from an exporter that is up."""
    job = f'job="{s.exporter_job}"'
    age = _number(s.max_signal_age_seconds)
    return {
        "name": "unitscale-signals",
        "rules": [
            _alert(
                s,
                "UnitscaleExporterDown",
                f"up{{{job}}} == 0 or absent(up{{{job}}})",
                "5m",
                {"severity": "critical", "component": "exporter"},
                "A unitscale exporter is down or not scraped",
                "Prometheus cannot scrape the exporter, or finds no exporter target at all."
                " Without it the scaler's signals go stale and KEDA falls back.",
            ),
            _alert(
                s,
                "UnitscaleSignalsStale",
                # min: the scaler keeps the newest signals of any exporter (the ha overlay
                # runs two), so they are stale only when every exporter's are.
                f"min by (namespace, deployment, model) (unitscale_signal_age_seconds) > {age}",
                "2m",
                {"severity": "warning", "component": "exporter"},
                "Signals of {{ $labels.namespace }}/{{ $labels.deployment }} are stale",
                "The newest signals are {{ $value | humanizeDuration }} old, over the"
                f" scaler's max-signal-age ({age} s): the scaler answers UNAVAILABLE for them.",
            ),
            _alert(
                s,
                "UnitscaleSignalsMissing",
                "max by (namespace, deployment) (unitscale_target_up)"
                " unless on (namespace, deployment) unitscale_signal_age_seconds",
                "5m",
                {"severity": "warning", "component": "exporter"},
                "No signals for {{ $labels.namespace }}/{{ $labels.deployment }}",
                "The exporter has replicas to scrape for this deployment but derives no signals"
                " from them (every scrape failing, or no engine metrics): unknown, not zero.",
            ),
        ],
    }


def scaler_rules(s: Settings) -> dict[str, Any]:
    """The scaler as KEDA sees it: up, answering, not left to KEDA's fallback."""
    job = f'job="{s.scaler_job}"'
    keda = f'scaler=~"{s.keda_scalers}"'
    return {
        "name": "unitscale-scaler",
        "rules": [
            _alert(
                s,
                "UnitscaleScalerUnavailable",
                f"sum by (job) (up{{{job}}}) == 0 or absent(up{{{job}}})",
                "2m",
                {"severity": "critical", "component": "scaler"},
                "No unitscale scaler is up",
                "Prometheus scrapes no scaler replica: KEDA's calls fail, ScaledObjects with a"
                " fallback hold fallback.replicas and the others keep their last size.",
            ),
            _alert(
                s,
                "UnitscaleFallbackActive",
                "max by (namespace, scaled_object) (unitscale_scaler_signals_available) == 0",
                "2m",
                {"severity": "warning", "component": "scaler"},
                "KEDA is on fallback for {{ $labels.namespace }}/{{ $labels.scaled_object }}",
                "No scaler replica has usable signals for this ScaledObject, so every call"
                " answers UNAVAILABLE; after failureThreshold calls KEDA scales it to"
                " fallback.replicas (without a fallback: it stays at its last size).",
            ),
            _alert(
                s,
                "UnitscaleKedaScalerErrors",
                "sum by (namespace, scaledObject, scaler)"
                f" (increase(keda_scaler_detail_errors_total{{{keda}}}[5m])) > 0",
                "10m",
                {"severity": "warning", "component": "keda"},
                "KEDA's calls to the scaler fail for"
                " {{ $labels.namespace }}/{{ $labels.scaledObject }}",
                "KEDA counted {{ $value | humanize }} failed calls in 5 minutes, for 10 minutes."
                " KEDA stops counting once its fallback serves, so this is the failure that"
                " fallback does not cover: no fallback configured, or calls failing on and off.",
            ),
        ],
    }


def _error_ratio(s: Settings, window: str) -> str:
    bucket = f"vllm:time_to_first_token_seconds_bucket{{{_le_matcher(s.ttft_slo_seconds)}}}"
    return (
        f"1 - (\n  sum by ({SLO_BY}) (rate({bucket}[{window}]))\n/\n"
        f"  sum by ({SLO_BY}) (rate(vllm:time_to_first_token_seconds_count[{window}]))\n)"
    )


def ratio_name(window: str) -> str:
    """The recorded share of requests over the TTFT SLO, over ``window``."""
    return f"unitscale:ttft_slo_errors:ratio_rate{window}"


def slo_rules(s: Settings) -> dict[str, Any]:
    """Multi-window, multi-burn-rate alerts on the share of requests over the TTFT SLO."""
    windows = sorted({w for t in BURN_TIERS for w in t[1:3]}, key=_seconds)
    rules: list[dict[str, Any]] = [
        {"record": ratio_name(w), "expr": _error_ratio(s, w)} for w in windows
    ]
    budget = f"(1 - {_number(s.slo_target)})"
    ttft = _number(s.ttft_slo_seconds)
    for rate, long, short, severity, duration in BURN_TIERS:
        factor = _number(rate)
        rules.append(
            _alert(
                s,
                "UnitscaleTTFTBudgetBurn",
                f"{ratio_name(long)} > {factor} * {budget}\n"
                f"and\n{ratio_name(short)} > {factor} * {budget}",
                duration,
                {"severity": severity, "component": "slo", "burn_window": f"{long}/{short}"},
                "{{ $labels.model_name }} spends its TTFT error budget"
                f" {factor}x too fast ({long}/{short})",
                "{{ $value | humanizePercentage }} of the requests of the last"
                f" {long} (and too many of the last {short}) waited over {ttft} s for their"
                f" first token; the SLO is {_number(s.slo_target * 100)}% within {ttft} s.",
            )
        )
    bucket = f"vllm:time_to_first_token_seconds_bucket{{{_le_matcher(s.ttft_slo_seconds)}}}"
    rules.append(
        _alert(
            s,
            "UnitscaleTTFTSLOUnmeasurable",
            f"sum by ({SLO_BY}) (vllm:time_to_first_token_seconds_count)"
            f"\nunless on ({SLO_BY})\nsum by ({SLO_BY}) ({bucket})",
            "15m",
            {"severity": "warning", "component": "slo"},
            "The TTFT SLO of {{ $labels.model_name }} cannot be measured",
            f"Its engines export time_to_first_token without a {ttft} s bucket, so the burn"
            " rate alerts see nothing for it: a missing measurement, not a met SLO.",
        )
    )
    return {"name": "unitscale-slo", "rules": rules}


# The alert's target, read back from the gateway's gauge when the alert is rendered.
_TARGET = (
    '{{ with printf "max(unitscale_gateway_slo_attainment_target_ratio'
    '{namespace=%q, deployment=%q})" $labels.namespace $labels.deployment | query }}'
    "{{ . | first | value | humanizePercentage }}{{ end }}"
)


def attainment_ratio_name(window: str) -> str:
    """The recorded share of requests the gateway judged outside the SLO, over ``window``."""
    return f"unitscale:gateway_slo_errors:ratio_rate{window}"


def _attainment_error_ratio(window: str) -> str:
    counter = "unitscale_gateway_slo_requests_total"
    return (
        f'sum by ({ATTAINMENT_BY}) (rate({counter}{{result="outside"}}[{window}]))\n/\n'
        f"sum by ({ATTAINMENT_BY}) (rate({counter}[{window}]))"
    )


def attainment_rules(s: Settings) -> dict[str, Any]:
    """Multi-window, multi-burn-rate alerts on the requests the gateway judged outside.

    The target is the gateway's own (``unitscale_gateway_slo_attainment_target_ratio``,
    its ``slo`` block's ``attainment``), so the block that judges the requests and steers
    the scaler also sets the budget: no setting here. Every gateway replica exports it;
    the highest (the strictest, while a reload rolls out) is the target.
    """
    windows = sorted({w for t in ATTAINMENT_BURN_TIERS for w in t[1:3]}, key=_seconds)
    rules: list[dict[str, Any]] = [
        {
            "record": ATTAINMENT_BUDGET,
            "expr": f"1 - max by ({ATTAINMENT_BY}) (unitscale_gateway_slo_attainment_target_ratio)",
        },
        *(
            {"record": attainment_ratio_name(w), "expr": _attainment_error_ratio(w)}
            for w in windows
        ),
    ]
    for rate, long, short, severity, duration in ATTAINMENT_BURN_TIERS:
        factor = _number(rate)
        rules.append(
            _alert(
                s,
                "UnitscaleAttainmentBudgetBurn",
                f"{attainment_ratio_name(long)} > {factor} * {ATTAINMENT_BUDGET}\n"
                f"and\n{attainment_ratio_name(short)} > {factor} * {ATTAINMENT_BUDGET}",
                duration,
                {"severity": severity, "component": "slo", "burn_window": f"{long}/{short}"},
                "{{ $labels.namespace }}/{{ $labels.deployment }} spends its SLO error budget"
                f" {factor}x too fast ({long}/{short})",
                "{{ $value | humanizePercentage }} of the requests of the last"
                f" {long} (and too many of the last {short}) were outside the SLO (a late"
                " first token, slow tokens, too slow an answer, or failed); the target is"
                f" {_TARGET} within. The scaler's reason says whether its attainment"
                " headroom is rising.",
            )
        )
    rules.append(
        _alert(
            s,
            "UnitscaleRequestsUnjudged",
            f"{_unjudged_ratio('1h')} > {ATTAINMENT_BUDGET}",
            "30m",
            {"severity": "warning", "component": "slo"},
            "{{ $labels.namespace }}/{{ $labels.deployment }} leaves more requests unjudged"
            " than its SLO lets miss",
            "{{ $value | humanizePercentage }} of the requests of the last 1h ended with"
            " their client gone before any token, within the TTFT target: not judged, more"
            " than the SLO lets miss (the target is"
            f" {_TARGET} within), so the attainment the scaler steers by could hide a"
            " breach. Clients whose own timeout is below the TTFT target, or early cancels.",
        )
    )
    return {"name": "unitscale-attainment", "rules": rules}


def _unjudged_ratio(window: str) -> str:
    """Requests left unjudged (their client gone early) over every request that ended."""
    unjudged, judged = (
        "unitscale_gateway_slo_unjudged_requests_total",
        "unitscale_gateway_slo_requests_total",
    )
    left = f"sum by ({ATTAINMENT_BY}) (rate({unjudged}[{window}]))"
    judged = f"sum by ({ATTAINMENT_BY}) (rate({judged}[{window}]))"
    return f"{left}\n/\n({left} + {judged})"


def cost_rules(s: Settings) -> dict[str, Any]:
    """Cost per 1M tokens over the budget."""
    budget = _number(s.cost_budget)
    return {
        "name": "unitscale-cost",
        "rules": [
            _alert(
                s,
                "UnitscaleCostOverBudget",
                "max by (namespace, deployment, model, price)"
                f' (unitscale_cost_per_million_tokens{{kind="total"}}) > {budget}',
                "30m",
                {"severity": "warning", "component": "cost"},
                "{{ $labels.namespace }}/{{ $labels.deployment }} costs"
                " {{ $value | humanize }} US$ per 1M tokens",
                f"Over the budget of {budget} US$ per 1M tokens for 30 minutes (price:"
                " {{ $labels.price }}): more replicas than the traffic needs, or a"
                " minReplicaCount too high for a quiet deployment.",
            ),
        ],
    }


# The prewarm states that need a person: Fluid's CRDs or RBAC missing (unknown), the
# Dataset missing or unbound, the DataLoad failed, a warm-up given up after its timeout.
PREWARM_FAILING = ("unknown", "dataset-missing", "not-bound", "failed", "timed-out")


def prewarm_rules(s: Settings) -> dict[str, Any]:
    """Fluid prewarm: a state that needs a person, or writes the API server refuses."""
    failing = "|".join(PREWARM_FAILING)
    return {
        "name": "unitscale-prewarm",
        "rules": [
            _alert(
                s,
                "UnitscalePrewarmFailing",
                "max by (namespace, scaled_object, state)"
                f' (unitscale_scaler_prewarm_state{{state=~"{failing}"}}) == 1',
                "10m",
                {"severity": "warning", "component": "prewarm"},
                "Prewarm of {{ $labels.namespace }}/{{ $labels.scaled_object }}"
                " is {{ $labels.state }}",
                "For 10 minutes the Fluid cache of this ScaledObject's model has not been"
                " warmed: its replicas start on a cold cache. The decision's reason in the"
                " scaler's log says why.",
            ),
            _alert(
                s,
                "UnitscalePrewarmWriteErrors",
                "sum by (namespace, scaled_object)"
                " (increase(unitscale_scaler_prewarm_write_errors_total[15m])) > 0",
                "5m",
                {"severity": "warning", "component": "prewarm"},
                "The API server refuses the prewarm's DataLoads for"
                " {{ $labels.namespace }}/{{ $labels.scaled_object }}",
                "{{ $value | humanize }} DataLoad creates or deletes refused in 15 minutes"
                " (the scaler logs each answer): RBAC on dataloads.data.fluid.io, or a quota.",
            ),
        ],
    }


def _seconds(window: str) -> int:
    units = {"m": 60, "h": 3600, "d": 86400}
    return int(window[:-1]) * units[window[-1]]


def groups(settings: Settings) -> list[dict[str, Any]]:
    """Every rule group, in file order."""
    return [
        signal_rules(settings),
        scaler_rules(settings),
        slo_rules(settings),
        attainment_rules(settings),
        cost_rules(settings),
        prewarm_rules(settings),
    ]


def prometheus_rule(settings: Settings) -> dict[str, Any]:
    """The same groups as a prometheus-operator PrometheusRule."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "unitscale",
            "labels": {
                "app.kubernetes.io/name": "unitscale",
                "app.kubernetes.io/component": "alerts",
            },
        },
        "spec": {"groups": groups(settings)},
    }


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line expressions as literal blocks, keys in insertion order."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def dump(document: dict[str, Any], settings: Settings) -> str:
    """``document`` as YAML under a header naming the generator and its settings."""
    changed = {
        k: v for k, v in vars(settings).items() if v != Settings.__dataclass_fields__[k].default
    }
    how = " ".join(f"--{k.replace('_', '-')}={v}" for k, v in changed.items()) or "(defaults)"
    header = (
        "# Generated by deploy/alerts/generate.py: edit that, not this file.\n"
        f"# Settings: {how}. What each alert means: docs/alerts.md.\n"
    )
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=110)
    return header + body


def write(out: Path, settings: Settings) -> list[Path]:
    """Write both files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rules = out / RULES_FILE
    rules.write_text(dump({"groups": groups(settings)}, settings))
    operator = out / PROMETHEUS_RULE_FILE
    operator.write_text(dump(prometheus_rule(settings), settings))
    return [rules, operator]


def parse_args(argv: list[str]) -> tuple[Path, Settings]:
    """The output folder and the settings from the command line (a flag per setting)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into")
    for name, field in Settings.__dataclass_fields__.items():
        kind = float if isinstance(field.default, float) else str
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=field.default)
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    try:
        return out, Settings(**args)
    except ValueError as err:
        parser.error(str(err))


def main(argv: list[str] | None = None) -> int:
    """Generate into ``--out`` (this folder by default)."""
    out, settings = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        written = write(out, settings)
    except OSError as err:
        sys.stderr.write(f"generate.py: cannot write into --out {out}: {err.strerror or err}\n")
        return 2
    for path in written:
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
