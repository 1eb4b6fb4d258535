"""Dashboards as plain data (``Panel``, ``Row``, ``Board``) built with Grafana's foundation SDK."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from grafana_foundation_sdk.builders import dashboard as grafana
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, text, timeseries
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    VariableModel,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from scaler.core.model import Policy

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
_DEFAULTS = Policy()
Kind = Literal["timeseries", "stat", "state-timeline"]


def one_copy(expr: str) -> str:
    """``expr`` with one series per identity, however many replicas of ours export it.

    The ha and production overlays run two exporters and three scalers, and each exports
    every series alike, told apart only by its target's ``instance`` and ``pod``: a sum
    over them would count each replica, load and dollar once per exporter or scaler.
    """
    return f"max without (instance, pod) ({expr})"


SLO_REQUESTS = "unitscale_gateway_slo_requests_total"
"""The gateway's judgment of every request: ``result`` within or outside, and ``reason``."""
SLO_TARGET = "unitscale_gateway_slo_attainment_target_ratio"
"""The gateway's attainment target (its ``slo`` block), on every gateway replica."""


def attainment(selector: str, window: str, by: str = "") -> str:
    """Requests within over requests judged, over ``window``, summed over gateway replicas.

    Each gateway replica counts the requests it judged: a sum counts each once. No request
    judged is 0/0, which PromQL keeps as NaN: a gap, not 0% or 100%.
    """
    grouping = f" by ({by})" if by else ""
    within = f'sum{grouping} (rate({SLO_REQUESTS}{{{selector}, result="within"}}[{window}]))'
    judged = f"sum{grouping} (rate({SLO_REQUESTS}{{{selector}}}[{window}]))"
    return f"{within} / {judged}"


def missed(selector: str, by: str) -> str:
    """Requests per second judged outside the SLO over 5 minutes, by ``by`` (with reason)."""
    return f'sum by ({by}) (rate({SLO_REQUESTS}{{{selector}, result="outside"}}[5m]))'


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True, slots=True)
class Panel:
    """A panel as the docs describe it: what it shows and the question it answers."""

    title: str
    question: str
    unit: str
    queries: tuple[Query, ...]
    kind: Kind = "timeseries"
    width: int = 12


@dataclass(frozen=True, slots=True)
class Row:
    """A titled row of panels."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True, slots=True)
class Board:
    """A dashboard: its file name, uid, title, variables and rows."""

    file: str
    uid: str
    title: str
    description: str
    variables: tuple[cog.Builder[VariableModel], ...]
    rows: tuple[Row, ...]
    notes: tuple[str, ...] = field(default=())
    """Text panels at the top (what the metrics cannot show)."""


# --- variables -----------------------------------------------------------------------------


def the_datasource() -> grafana.DatasourceVariable:
    return grafana.DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def label_variable(
    name: str, label: str, query: str, *, every: bool = False
) -> grafana.QueryVariable:
    """A variable over a label's values (Grafana's ``label_values()``)."""
    variable = (
        grafana.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )
    if every:
        variable = variable.multi(True).include_all(True).all_value(".*")
    return variable


def _seconds_variable(name: str, label: str, seconds: float) -> grafana.TextBoxVariable:
    value = f"{seconds:g}"
    return (
        grafana.TextBoxVariable(name)
        .label(label)
        .default_value(value)
        .current(VariableOption(selected=True, text=value, value=value))
    )


def slo_variables() -> tuple[grafana.TextBoxVariable, grafana.TextBoxVariable]:
    """The SLOs the scaler defaults to (its p95 targets): set them to the ScaledObject's."""
    return (
        _seconds_variable("slo_ttft", "TTFT SLO (s, p95)", _DEFAULTS.slo_ttft_seconds),
        _seconds_variable("slo_itl", "Inter-token SLO (s, p95)", _DEFAULTS.slo_itl_seconds),
    )


# --- building --------------------------------------------------------------------------------


def _target(query: Query, ref_id: str, instant: bool) -> prometheus.Dataquery:
    target = prometheus.Dataquery().expr(query.expr).ref_id(ref_id).datasource(DATASOURCE)
    if query.legend:
        target = target.legend_format(query.legend)
    return target.instant() if instant else target.range()


_PanelBuilder = timeseries.Panel | stat.Panel | statetimeline.Panel


def _panel(spec: Panel, panel_id: int) -> _PanelBuilder:
    built: _PanelBuilder
    if spec.kind == "stat":
        built = stat.Panel()
    elif spec.kind == "state-timeline":
        built = statetimeline.Panel()
    else:
        built = timeseries.Panel()
    built = (
        built.id(panel_id)
        .title(spec.title)
        .description(spec.question)
        .unit(spec.unit)
        .datasource(DATASOURCE)
        .span(spec.width)
        .height(4 if spec.kind == "stat" else 8)
    )
    for index, query in enumerate(spec.queries):
        built = built.with_target(_target(query, chr(ord("A") + index), spec.kind == "stat"))
    return built


def build(board: Board) -> grafana.Dashboard:
    """The SDK's dashboard builder for ``board``: notes first, then each row and its panels."""
    dashboard = (
        grafana.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags(["unitscale"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .editable()
    )
    for variable in board.variables:
        dashboard = dashboard.with_variable(variable)
    panel_id = 0
    for note in board.notes:
        panel_id += 1
        dashboard = dashboard.with_panel(
            text.Panel().id(panel_id).title("Reading this dashboard").content(note).span(24)
        )
    for row in board.rows:
        panel_id += 1
        dashboard = dashboard.with_row(grafana.Row(row.title).id(panel_id))
        for spec in row.panels:
            panel_id += 1
            dashboard = dashboard.with_panel(_panel(spec, panel_id))
    return dashboard


def render(board: Board) -> str:
    """The dashboard's JSON as committed: sorted keys, two-space indents, a final newline."""
    model = build(board).build()
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
