"""The alert rules (deploy/alerts/): generated, checked and unit-tested by the real promtool.

- The committed rules file and PrometheusRule are exactly what deploy/alerts/generate.py
  writes with its defaults, and carry the same groups.
- ``promtool check rules`` accepts both; ``promtool test rules`` passes every file in
  deploy/alerts/tests/, and those tests see every alert both fire and stay silent.
- Every metric an expression reads is one our code exports (read from its collectors, so a
  rename fails here), one KEDA v2.21 exports (read from its source in the Go module cache),
  Prometheus's own ``up``, or one the rules record themselves.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).parent.parent
ALERTS = ROOT / "deploy" / "alerts"
UNIT_TESTS = sorted((ALERTS / "tests").glob("*.yaml"))
PROMTOOL = shutil.which("promtool")
if PROMTOOL is None and os.environ.get("CI") == "true":
    raise RuntimeError("CI must have promtool (Debian's prometheus; tools/install-system-deps)")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)

# Prometheus writes ``up`` for every scrape target itself.
PROMETHEUS_OWN = {"up"}
KEDA_MODULE = "github.com/kedacore/keda/v2"


def load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("alerts_generate", ALERTS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


generate = load_generator()


def rules_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ALERTS / generate.RULES_FILE).read_text())
    return loaded


def all_rules() -> list[dict[str, Any]]:
    return [rule for group in rules_file()["groups"] for rule in group["rules"]]


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


# --- generated, and one set of groups -------------------------------------------------


def test_the_committed_files_are_what_the_generator_writes(tmp_path):
    written = generate.write(tmp_path, generate.Settings())
    for path in written:
        committed = ALERTS / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed.relative_to(ROOT)} differs from deploy/alerts/generate.py's output:"
            " run `.venv/bin/python deploy/alerts/generate.py` and commit"
        )


def test_the_prometheus_rule_carries_the_rules_files_groups():
    rule = yaml.safe_load((ALERTS / generate.PROMETHEUS_RULE_FILE).read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == rules_file()["groups"]


@needs_promtool
def test_promtool_accepts_the_rules_file_and_the_prometheus_rules_groups(tmp_path):
    spec = yaml.safe_load((ALERTS / generate.PROMETHEUS_RULE_FILE).read_text())["spec"]
    extracted = tmp_path / "from-prometheusrule.yaml"
    extracted.write_text(yaml.safe_dump({"groups": spec["groups"]}))
    done = promtool("check", "rules", ALERTS / generate.RULES_FILE, extracted)
    assert done.returncode == 0, done.stdout + done.stderr
    count = len(all_rules())
    assert done.stdout.count(f"SUCCESS: {count} rules found") == 2, done.stdout


# --- promtool unit tests --------------------------------------------------------------


@needs_promtool
@pytest.mark.parametrize("path", UNIT_TESTS, ids=[p.stem for p in UNIT_TESTS])
def test_promtool_unit_tests_pass(path):
    done = promtool("test", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_a_wrong_expectation_fails_promtool(tmp_path):
    """The harness can fail: an alert expected where none fires is reported."""
    case = {
        "rule_files": [str(ALERTS / generate.RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": 'up{job="unitscale-scaler"}', "values": "1x10"}],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "UnitscaleScalerUnavailable",
                        "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump(case))
    done = promtool("test", "rules", path)
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


def unit_test_expectations() -> dict[str, dict[str, int]]:
    """Per alert name: how many unit-test checks expect it firing, and silent."""
    seen: dict[str, dict[str, int]] = {}
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                counts = seen.setdefault(check["alertname"], {"firing": 0, "silent": 0})
                counts["firing" if check.get("exp_alerts") else "silent"] += 1
    return seen


def test_every_alert_is_unit_tested_firing_and_silent():
    seen = unit_test_expectations()
    names = {rule["alert"] for rule in all_rules() if "alert" in rule}
    assert set(seen) <= names, f"unit tests of alerts that do not exist: {set(seen) - names}"
    for name in sorted(names):
        counts = seen.get(name, {"firing": 0, "silent": 0})
        assert counts["firing"] > 0, f"no unit test sees {name} fire"
        assert counts["silent"] > 0, f"no unit test sees {name} stay silent"


# --- labels, annotations, runbooks ----------------------------------------------------


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(r, id=f"{r['alert']}-{r['labels'].get('burn_window', '')}")
        for r in all_rules()
        if "alert" in r
    ],
)
def test_each_alert_has_a_severity_a_duration_and_a_runbook(rule):
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert rule["labels"]["component"]
    assert re.fullmatch(r"\d+[mh]", rule["for"]), rule["for"]
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    page, anchor = annotations["runbook_url"].split("#")
    assert page == "docs/alerts.md"
    assert anchor in anchors((ROOT / page).read_text()), f"docs/alerts.md has no #{anchor}"


# --- every metric name is one somebody exports ----------------------------------------

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors; not functions or labels)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(_GROUPING, " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group() in _KEYWORDS:
            continue  # a function, or an operator
        names.add(match.group())
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        pytest.param('sum by (job) (up{job="a"}) == 0', {"up"}, id="grouping labels are no metric"),
        pytest.param(
            'rate(a:b_total{le="2.5"}[5m]) / on (x) group_left (y) c_count > 14.4 * (1 - 0.99)',
            {"a:b_total", "c_count"},
            id="recorded names, ranges, matching and numbers",
        ),
        pytest.param("absent(x) or y unless z", {"x", "y", "z"}, id="operators are no metric"),
    ],
)
def test_metric_names_are_read_from_expressions(expr, names):
    assert metric_names(expr) == names


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry's families expose, samples present or not."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "info": ("_info",),
    }
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def our_exported_names() -> set[str]:
    """Read from the collectors of the scaler, the exporter, the gateway and the replica."""
    from exporter.collector import registry_for
    from exporter.config import ExporterConfig
    from exporter.runtime import Exporter
    from foundation.kube import KubeAccess
    from foundation.reload import ConfigStore
    from scaler.prewarm.shell import Prewarmer
    from scaler.registry import ScaledObjectRegistry
    from scaler.signals import SignalStore
    from scaler.telemetry import DecisionCollector
    from serving.gateway_metrics import GatewayMetrics
    from serving.vllm_metrics import VllmMetrics

    scaler = CollectorRegistry(auto_describe=False)
    configs: ConfigStore[Any] = ConfigStore(None, lambda _name, _text: None)
    objects = ScaledObjectRegistry(SignalStore(), 30.0)
    prewarm = Prewarmer(objects, KubeAccess())  # nothing started: its families only
    scaler.register(DecisionCollector(objects, configs, prewarm))
    exporter = registry_for(Exporter(ExporterConfig.model_validate({"deployments": []})))
    registries = [scaler, exporter, GatewayMetrics("ns", "d").registry, VllmMetrics("m").registry]
    return set().union(*(exposed_names(r) for r in registries))


def used_names() -> tuple[set[str], set[str]]:
    """The metric names the rules read, and the ones they record."""
    recorded = {rule["record"] for rule in all_rules() if "record" in rule}
    used = set().union(*(metric_names(rule["expr"]) for rule in all_rules()))
    return used, recorded


def test_every_metric_the_rules_read_is_exported_by_our_code_or_recorded():
    used, recorded = used_names()
    ours = our_exported_names()
    assert {
        "unitscale_signal_age_seconds",
        "vllm:time_to_first_token_seconds_bucket",
        "unitscale_scaler_prewarm_write_errors_total",
    } <= ours
    unknown = sorted(n for n in used - recorded - PROMETHEUS_OWN if not n.startswith("keda_"))
    assert not [n for n in unknown if n not in ours], (
        f"metrics no collector of ours exports: {[n for n in unknown if n not in ours]}"
    )
    assert recorded <= used, f"recorded and never read: {recorded - used}"


def keda_exported_names(source: str) -> set[str]:
    """The Prometheus names KEDA's metricscollector registers (Namespace_Subsystem_Name)."""
    names = set()
    for chunk in source.split("prometheus.New")[1:]:
        kind = re.match(r"(\w+?)Vec|(\w+)", chunk)
        name = re.search(r'\bName:\s*"(\w+)"', chunk)
        if kind is None or name is None:
            continue
        namespace = "keda" if "DefaultPromMetricsNamespace" in chunk.split("Name:")[0] else ""
        subsystem = re.search(r'Subsystem:\s*"(\w+)"', chunk.split("Name:")[0])
        full = "_".join(
            p for p in (namespace, subsystem and subsystem.group(1), name.group(1)) if p
        )
        if chunk.startswith("Histogram"):
            names |= {f"{full}_bucket", f"{full}_count", f"{full}_sum"}
        else:
            names.add(full)
    return names


def test_every_keda_metric_the_rules_read_is_one_keda_exports():
    from tests.k8s import versions
    from tests.k8s.control_plane import UnavailableError, module_dir

    try:
        source = module_dir(KEDA_MODULE, versions.KEDA) / "pkg/metricscollector/prommetrics.go"
    except UnavailableError as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: KEDA's source must be readable: {err}", pytrace=False)
        pytest.skip(str(err))
    keda = keda_exported_names(source.read_text())
    assert {"keda_scaler_detail_errors_total", "keda_scaled_object_errors_total"} <= keda
    used, _ = used_names()
    wanted = {n for n in used if n.startswith("keda_")}
    assert wanted, "the rules read no KEDA metric: is this test still needed?"
    assert wanted <= keda, f"not exported by KEDA {versions.KEDA}: {wanted - keda}"


# --- the settings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--slo-target", "1"], "between 0 and 1", id="an SLO of 100% has no budget"),
        pytest.param(
            ["--ttft-slo-seconds", "2"], "not a bucket bound", id="a TTFT SLO between buckets"
        ),
        pytest.param(["--cost-budget", "-1"], "positive", id="a negative budget"),
        pytest.param(["--max-signal-age-seconds", "nan"], "positive", id="a NaN signal age"),
        pytest.param(
            ["--scaler-job", 'x"} or vector(1) or up{job="y'],
            "PromQL matcher",
            id="a job name that closes its matcher's quotes is no job name",
        ),
        pytest.param(["--exporter-job", "a\\b"], "backslashes", id="a backslash in a job"),
        pytest.param(["--keda-scalers", ""], "non-empty", id="no scaler names at all"),
    ],
)
def test_bad_settings_are_refused_with_the_reason(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        generate.main([*argv, "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "nothing is written for bad settings"


def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder")
    assert generate.main(["--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write into --out" in err and "Traceback" not in err


@needs_promtool
def test_other_settings_move_the_thresholds_and_a_whole_second_bucket_matches_both_spellings(
    tmp_path,
):
    out = tmp_path / "rules"
    assert (
        generate.main(["--slo-target", "0.999", "--ttft-slo-seconds", "5", "--out", str(out)]) == 0
    )
    text = (out / generate.RULES_FILE).read_text()
    assert "14.4 * (1 - 0.999)" in text
    assert "--slo-target=0.999" in text.splitlines()[1]
    # prometheus_client writes le="5.0"; Prometheus 3 stores it as le="5".
    series = []
    for pod, le in (("a", "5.0"), ("b", "5")):
        labels = f'namespace="n", model_name="m", pod="{pod}"'
        series += [
            {"series": f"vllm:time_to_first_token_seconds_count{{{labels}}}", "values": "0+10x10"},
            {
                "series": f'vllm:time_to_first_token_seconds_bucket{{{labels}, le="{le}"}}',
                "values": "0+9x10",
            },
        ]
    case = {
        "rule_files": [str(out / generate.RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": "round(unitscale:ttft_slo_errors:ratio_rate5m, 0.001)",
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": '{namespace="n", model_name="m"}', "value": 0.1}
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "le.yaml"
    path.write_text(yaml.safe_dump(case))
    done = promtool("test", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr
