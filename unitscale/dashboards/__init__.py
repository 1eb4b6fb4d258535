"""Grafana dashboards for unitscale's metrics, generated with Grafana's foundation SDK.

Two dashboards, one file each in ``deploy/dashboards/``: **deployment** (one scaled
workload, picked by ``namespace``, ``deployment`` and its ScaledObject) and **fleet**
(every deployment: accelerator-hours, spend, utilization, SLO attainment, the health
of the signal path). Every panel is described here as plain data (``Panel``: a title,
the question it answers, a unit, PromQL queries) and built into the SDK's dashboard
model; ``docs/dashboards.md`` explains each panel and ``tests/test_dashboards.py`` runs
every query against a real Prometheus scraping the stack under load.

Metric names are the ones the exporter (``exporter/collector.py``), the gateway
(``serving/gateway_metrics.py``) and the scaler (``scaler/telemetry.py``) export. The
scaler labels its series by ``scaled_object``, the exporter and the gateway by
``deployment``: the deployment dashboard has a variable for each.

``unitscale dashboards --out deploy/dashboards`` writes the files; ``--check`` says
whether the committed ones are what this code generates.
"""

from __future__ import annotations

from pathlib import Path

from unitscale.dashboards.build import Board, render
from unitscale.dashboards.deployment import deployment_board
from unitscale.dashboards.fleet import fleet_board

DIRECTORY = Path("deploy/dashboards")
"""Where the committed dashboards are, from the repository root."""


def boards() -> tuple[Board, ...]:
    """Every dashboard unitscale ships."""
    return (deployment_board(), fleet_board())


def generate() -> dict[str, str]:
    """File name -> JSON text, for every dashboard."""
    return {board.file: render(board) for board in boards()}


def write(directory: Path) -> list[Path]:
    """Write every dashboard into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in generate().items():
        path = directory / name
        path.write_text(content, encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Dashboards in ``directory`` that differ from what this code generates (or are missing)."""
    found = []
    for name, content in generate().items():
        path = directory / name
        # Bytes, not text: a file that is no UTF-8 differs, it is no error to report.
        if not path.is_file() or path.read_bytes() != content.encode("utf-8"):
            found.append(name)
    return found
