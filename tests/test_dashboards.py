"""The Grafana dashboards: generated from code, every query answered by a real Prometheus.

The committed JSON in ``deploy/dashboards/`` is what ``unitscale.dashboards`` generates.
Every panel that shows data has a Grafana unit and says the question it answers, and
docs/dashboards.md describes it. Then a real Prometheus (Debian's) scrapes the serving
stack under load (``tests/prometheus_stack.py``: sim replicas coming up from zero
through the gateway's buffer, the exporter, the scaler asked by a KEDA stand-in) and
every PromQL expression of every panel, with the dashboard's variables substituted as
Grafana would, must return data; every variable's ``label_values()`` must list the
stack's namespace, deployment and ScaledObject. The Fluid prewarm row's queries need
Fluid's objects on an API server: ``tests/k8s/test_dashboards_prewarm.py`` runs those.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.prometheus_stack import (
    DEAD_DEPLOYMENT,
    DEPLOYMENT,
    NAMESPACE,
    Prometheus,
    ServingStack,
    needs_prometheus,
)
from unitscale.dashboards import generate, stale, write
from unitscale.dashboards.__main__ import main as dashboards_main
from unitscale.dashboards.deployment import PREWARM_ROW

ROOT = Path(__file__).parent.parent
DIRECTORY = ROOT / "deploy" / "dashboards"
FILES = sorted(DIRECTORY.glob("*.json"))
DOC = ROOT / "docs" / "dashboards.md"

# Grafana's built-in unit ids the dashboards use (packages/grafana-data valueFormats);
# custom units are "count:", "suffix:", "prefix:", "si:" or "currency:" plus a symbol.
GRAFANA_UNITS = {"s", "reqps", "cps", "percent", "percentunit", "currencyUSD", "short", "bool"}
CUSTOM_UNIT = re.compile(r"^(count|suffix|prefix|si|currency):\S.*$")

# Grafana's own variables, as Grafana would set them for a 5-minute range with 1 s steps;
# $__rate_interval covers the whole stack's life, so every counter's first increase counts.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval_ms": "1000",
    "__interval": "1s",
    "__range_s": "300",
    "__range": "5m",
}
# The stack's target as each dashboard's query variables select it (fleet: "All").
CHOSEN = {
    "unitscale-deployment.json": {
        "namespace": NAMESPACE,
        "deployment": DEPLOYMENT,
        "scaled_object": DEPLOYMENT,
    },
    "unitscale-fleet.json": {"namespace": NAMESPACE},
}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def sections(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every panel (rows themselves left out) with its row's title ("" before the first)."""
    found: list[tuple[str, dict[str, Any]]] = []
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            found.extend((row, inner) for inner in panel.get("panels", []))  # collapsed
        else:
            found.append((row, panel))
    return found


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for _, panel in sections(dashboard)]


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard["templating"]["list"])


def values_for(file: str, **chosen: str) -> dict[str, str]:
    """Each variable's value as Grafana substitutes it into a query (``chosen`` overrides)."""
    dashboard = load(DIRECTORY / file)
    values = dict(BUILTINS)
    for variable in variables(dashboard):
        name = variable["name"]
        if variable["type"] == "textbox":
            values[name] = variable["query"]
        elif variable["type"] == "query":
            every = variable.get("includeAll") and file == "unitscale-fleet.json"
            values[name] = variable["allValue"] if every else CHOSEN[file][name]
    return values | chosen


def substitute(text: str, values: dict[str, str]) -> str:
    """``$name`` and ``${name}`` replaced, longest names first; none may be left over."""
    for name in sorted(values, key=len, reverse=True):
        text = text.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in text, f"an unknown variable is left in {text!r}"
    return text


def targets(prewarm: bool) -> list[tuple[str, str, str, str]]:
    """(file, panel title, refId, expr) of every query, in the prewarm row or out of it.

    The prewarm's series need Fluid on an API server: tests/k8s/test_dashboards_prewarm.py
    runs those; the serving stack here runs the rest.
    """
    return [
        (path.name, panel["title"], target["refId"], target["expr"])
        for path in FILES
        for row, panel in sections(load(path))
        if (row == PREWARM_ROW) == prewarm
        for target in panel.get("targets", [])
    ]


def queries() -> list[Any]:
    return [
        pytest.param(file, expr, id=f"{file.removesuffix('.json')}: {title} ({ref}) returns data")
        for file, title, ref, expr in targets(prewarm=False)
    ]


def variable_queries() -> list[Any]:
    return [
        pytest.param(path.name, v, id=f"{path.stem}: ${v['name']} lists the stack's value")
        for path in FILES
        for v in variables(load(path))
        if v["type"] == "query"
    ]


# --- the files -----------------------------------------------------------------------------


def test_the_prewarm_row_is_found_and_holds_queries():
    assert len(targets(prewarm=True)) >= 4, "the prewarm row's title or layout changed"


def test_the_committed_dashboards_are_what_the_code_generates():
    assert sorted(generate()) == [p.name for p in FILES], "a dashboard file is missing or extra"
    assert stale(DIRECTORY) == [], "run: .venv/bin/python -m unitscale.dashboards"


def test_a_check_over_a_file_that_is_no_utf8_reports_it_as_differing(tmp_path, capsys):
    write(tmp_path)
    (tmp_path / FILES[0].name).write_bytes(b"\xff\xfe not UTF-8")
    assert dashboards_main(["--out", str(tmp_path), "--check"]) == 1
    assert FILES[0].name in capsys.readouterr().err


def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder")
    with pytest.raises(SystemExit) as exited:
        dashboards_main(["--out", str(taken)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "cannot write into --out" in err


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in FILES])
def test_every_panel_with_data_has_a_unit_and_a_question(path):
    for panel in panels(load(path)):
        if panel["type"] == "text":
            continue
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        assert unit in GRAFANA_UNITS or CUSTOM_UNIT.match(unit), (panel["title"], unit)
        assert panel["targets"], f"{panel['title']}: no query"
        assert panel["description"].endswith("?"), f"{panel['title']}: no question answered"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:  # a missing signal is never drawn as 0
            assert not re.search(r"\bor\s+vector\(", target["expr"]), target["expr"]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in FILES])
def test_panel_ids_and_query_refs_are_unique(path):
    dashboard = load(path)
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    ids = [p["id"] for p in rows + panels(dashboard)]
    assert len(ids) == len(set(ids)) and 0 not in ids
    for panel in panels(dashboard):
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)) and all(refs), panel["title"]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in FILES])
def test_the_doc_describes_every_panel(path):
    doc = DOC.read_text(encoding="utf-8")
    dashboard = load(path)
    assert f"`{path.relative_to(ROOT)}`" in doc
    for panel in panels(dashboard):
        if panel["type"] != "text":
            assert f"**{panel['title']}**" in doc, f"docs/dashboards.md lacks {panel['title']}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("rate(x[$__rate_interval])", "rate(x[1m])", id="a builtin is replaced"),
        pytest.param(
            "$__interval_ms / $__interval", "1000 / 1s", id="the longer name wins over its prefix"
        ),
        pytest.param('x{a="${namespace}"}', 'x{a="demo"}', id="the braced form is replaced"),
    ],
)
def test_substitution_is_as_grafana_does_it(text, expected):
    assert substitute(text, {**BUILTINS, "namespace": "demo"}) == expected


def test_an_unknown_variable_fails_the_substitution():
    with pytest.raises(AssertionError, match="unknown variable"):
        substitute("x{a=$nope}", BUILTINS)


# --- against a real Prometheus ------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prometheus(tmp_path_factory):
    # Two exporters scraping the same replicas, as the ha and production overlays run.
    stack = await ServingStack.start(replicas=REPLICAS, exporters=2)
    server = None
    try:
        server = await Prometheus.start(tmp_path_factory.mktemp("prometheus"), stack.scrape_jobs())
        await server.wait_for('up{job="unitscale-gateway"} == 1')
        # Scraped once already: the gateway's series are there, at 0, before their first
        # event (serving.gateway_metrics), so one round of incidents shows in rate().
        await stack.serve()
        yield server
    finally:
        if server is not None:
            await server.stop()
        await stack.stop()


REPLICAS = 2
"""The stack's replicas of DEPLOYMENT."""


async def data(server: Prometheus, promql: str, within: float = 30.0) -> list[dict[str, Any]]:
    """The result once it holds a number (not only NaN: a quantile of no observation)."""
    deadline = time.monotonic() + within
    while True:
        result = await server.query(promql)
        if any(not math.isnan(float(r["value"][1])) for r in result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"no data within {within:g}s for {promql!r}: {result}")
        await _pause()


async def _pause() -> None:
    await asyncio.sleep(0.25)


@needs_prometheus
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("file", "expr"), queries())
async def test_every_panel_query_returns_data(prometheus, file, expr):
    await data(prometheus, substitute(expr, values_for(file)))


LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$")


@needs_prometheus
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("file", "variable"), variable_queries())
async def test_every_variable_lists_the_stack(prometheus, file, variable):
    parsed = LABEL_VALUES.match(variable["query"])
    assert parsed, f"${variable['name']}: not a label_values() query: {variable['query']}"
    match = parsed["match"] and substitute(parsed["match"], values_for(file))
    deadline = time.monotonic() + 30
    while CHOSEN[file][variable["name"]] not in (
        found := await prometheus.label_values(parsed["label"], match)
    ):
        assert time.monotonic() < deadline, f"${variable['name']} lists {found}"
        await _pause()
    if variable["name"] == "deployment":  # the namespace's other deployment too, no other
        assert sorted(found) == sorted([DEPLOYMENT, DEAD_DEPLOYMENT])


def expr_of(file: str, title: str, legend: str) -> str:
    """The query of ``title`` whose legend is ``legend``, in ``file``."""
    (found,) = [
        target["expr"]
        for panel in panels(load(DIRECTORY / file))
        if panel["title"] == title
        for target in panel.get("targets", [])
        if target.get("legendFormat") == legend
    ]
    return str(found)


@needs_prometheus
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("file", "title", "legend"),
    [
        pytest.param(
            "unitscale-deployment.json",
            "Desired and ready replicas",
            "known (exporter)",
            id="the deployment's replicas known",
        ),
        pytest.param(
            "unitscale-fleet.json",
            "Replicas known and answering",
            "known {{deployment}}",
            id="the fleet's replicas known by deployment",
        ),
    ],
)
async def test_a_sum_counts_each_replica_once_however_many_exporters_scrape_it(
    prometheus, file, title, legend
):
    selector = f'namespace="{NAMESPACE}", deployment="{DEPLOYMENT}", state="known"'
    copies = await data(prometheus, f"count(unitscale_replicas{{{selector}}})")
    assert float(copies[0]["value"][1]) == 2  # each exporter exports the deployment's
    result = await data(prometheus, substitute(expr_of(file, title, legend), values_for(file)))
    counted = {r["metric"].get("deployment", DEPLOYMENT): float(r["value"][1]) for r in result}
    assert counted[DEPLOYMENT] == REPLICAS
