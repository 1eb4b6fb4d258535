"""The gateway's metrics exist before their first event, where their labels are known.

prometheus_client creates a labelled series at its first use, and ``rate()`` over a series
that first appears at 1 never shows that 1: the first 404, upstream error or wake after a
restart would be lost to every dashboard and alert. So the gateway creates, at 0, every
series whose label values it knows when it starts, and no series whose value it does not
know yet (the replica gauges, before the first health round).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.gateway_metrics import (
    REJECT_STATUSES,
    SLO_SERIES,
    WAKE_RESULTS,
    GatewayMetrics,
)
from serving.gateway_metrics import UPSTREAM_ERROR_KINDS as ERROR_KINDS

GATEWAY = Path(__file__).parent.parent / "serving" / "gateway.py"
LABELS = {"namespace": "serving", "deployment": "llama"}


def samples(metrics: GatewayMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


def series(name: str, **extra: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset({**LABELS, **extra}.items())


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param([series("unitscale_gateway_requests_total")], id="arrivals"),
        pytest.param(
            [series("unitscale_gateway_upstream_errors_total", kind=k) for k in ERROR_KINDS],
            id="upstream errors of every kind",
        ),
        pytest.param(
            [series("unitscale_gateway_rejected_total", status=str(s)) for s in REJECT_STATUSES],
            id="rejections of every status the gateway answers",
        ),
        pytest.param(
            [series("unitscale_gateway_wakes_total", result=r) for r in WAKE_RESULTS],
            id="wakes by each result",
        ),
        pytest.param(
            [
                series("unitscale_gateway_slo_requests_total", result=r, reason=why)
                for r, why in SLO_SERIES
            ],
            id="requests judged within and outside the SLO, for every reason",
        ),
        pytest.param(
            [series("unitscale_gateway_slo_unjudged_requests_total")],
            id="requests whose client left too early to judge",
        ),
        pytest.param(
            [
                series("unitscale_gateway_buffer_seconds_count"),
                series("unitscale_gateway_buffer_seconds_bucket", le="+Inf"),
                series("unitscale_gateway_wake_seconds_count"),
                series("unitscale_gateway_wake_seconds_bucket", le="+Inf"),
            ],
            id="the histograms",
        ),
        pytest.param(
            [
                series("unitscale_gateway_buffered"),
                series("unitscale_gateway_buffered_bytes"),
                series("unitscale_gateway_in_flight"),
            ],
            id="nothing buffered or in flight at the start is a known 0",
        ),
    ],
)
def test_a_new_gateway_exports_its_known_series_at_zero(expected):
    found = samples(GatewayMetrics(**LABELS))
    assert {key: found.get(key) for key in expected} == dict.fromkeys(expected, 0.0)


def test_the_replica_gauges_are_absent_until_a_health_round_not_zero():
    metrics = GatewayMetrics(**LABELS)
    names = {name for name, _ in samples(metrics)}
    assert not names & {"unitscale_gateway_replicas_ready", "unitscale_gateway_replicas_sleeping"}
    metrics.set_replicas(2, 1)
    found = samples(metrics)
    assert found[series("unitscale_gateway_replicas_ready")] == 2
    assert found[series("unitscale_gateway_replicas_sleeping")] == 1


def literal_arguments(method: str, position: int) -> set[object]:
    """Argument ``position`` of each ``self.<method>(...)`` in serving/gateway.py, if a literal."""
    found: set[object] = set()
    for node in ast.walk(ast.parse(GATEWAY.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
            and len(node.args) > position
        ):
            argument = node.args[position]
            if isinstance(argument, ast.Constant):
                found.add(argument.value)
    return found


@pytest.mark.parametrize(
    ("used", "declared"),
    [
        pytest.param(
            literal_arguments("_reject", 0), set(REJECT_STATUSES), id="every status it answers"
        ),
        pytest.param(
            # _upstream_failed(replica, kind, message, ...) counts every kind.
            literal_arguments("_upstream_failed", 1),
            set(ERROR_KINDS),
            id="every upstream error it counts",
        ),
    ],
)
def test_every_label_value_the_gateway_uses_is_created_at_the_start(used, declared):
    assert len(used) >= 3, f"the calls were not found in {GATEWAY}: {used}"
    assert used <= declared, f"not created at the start: {sorted(map(str, used - declared))}"
