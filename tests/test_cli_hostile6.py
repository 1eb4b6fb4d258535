"""The `unitscale` commands under the sixth hostile pass (issue 27): the demo's ScaledObject,
and config files with a key written twice.

A ScaledObject's minimum never exceeds its maximum (KEDA's webhook refuses it, and the
demo's KEDA launched a process per replica of the minimum); the demo's lead-in, made of the
file's waits, is bounded; and the trigger is read as the scaler reads it, with standby or
without. A key written twice in one YAML mapping is refused, naming it and both lines,
where PyYAML kept the last one silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.configfile import load_mapping
from foundation.errors import ConfigError
from replay.keda import read_scaled_object
from tests.test_cli_flags import TWO_ROWS, unitscale, write
from unitscale.demo.run import DemoOptions, _plan
from unitscale.demo.world import MAX_LEAD_IN

ROOT = Path(__file__).resolve().parent.parent
RECOMMENDED = ROOT / "deploy" / "scaledobjects" / "recommended.yaml"


def _scaled_object(tmp_path: Path, spec: dict[str, Any], **metadata: str) -> Path:
    """The recommended ScaledObject with ``spec`` and trigger ``metadata`` changed."""
    doc = yaml.safe_load(RECOMMENDED.read_text())
    doc["spec"].update(spec)
    doc["spec"]["triggers"][0]["metadata"].update(metadata)
    path = tmp_path / "scaledobject.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _manifest(**spec: object) -> dict[str, object]:
    trigger = {"type": "external-push", "metadata": {"scalerAddress": "s:9090"}}
    return {
        "kind": "ScaledObject",
        "metadata": {"name": "x"},
        "spec": {"triggers": [trigger], **spec},
    }


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        pytest.param(
            {"minReplicaCount": 3, "maxReplicaCount": 3}, False, id="min-equal-to-max-is-read"
        ),
        pytest.param(
            {"minReplicaCount": 4, "maxReplicaCount": 3}, True, id="min-above-max-is-refused"
        ),
        pytest.param({"minReplicaCount": 101}, True, id="min-above-kedas-default-max-is-refused"),
    ],
)
def test_a_scaled_objects_minimum_never_exceeds_its_maximum(spec, refused):
    if not refused:
        assert read_scaled_object(_manifest(**spec)).spec.min_replicas == 3
        return
    with pytest.raises(ConfigError, match=r"minReplicaCount .* is above maxReplicaCount"):
        read_scaled_object(_manifest(**spec))


@pytest.mark.parametrize(
    ("spec", "max_replicas"),
    [
        pytest.param(
            {"minReplicaCount": 1_000_000, "maxReplicaCount": 1_000_000},
            8,
            id="a-million-replicas-minimum-is-refused-before-a-process-starts",
        ),
        pytest.param(
            {"minReplicaCount": 9, "maxReplicaCount": 64},
            8,
            id="a-minimum-above-the-max-replicas-flag-is-refused",
        ),
    ],
)
def test_the_demo_refuses_a_minimum_above_its_max_replicas(tmp_path, spec, max_replicas):
    """The demo's KEDA keeps minReplicaCount whatever the maximum (``keda_poll``), and its
    fleet launched a sim-replica process for each: 1e6 of them (hostile pass 6, H1)."""
    options = DemoOptions(
        report=tmp_path / "r",
        scaled_object=_scaled_object(tmp_path, spec),
        max_replicas=max_replicas,
    )
    with pytest.raises(ConfigError, match="minReplicaCount"):
        _plan(options)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"cooldownPeriod": 1_000_000}, id="a-cooldown-of-a-million-seconds"),
        pytest.param(
            {
                "advanced": {
                    "horizontalPodAutoscalerConfig": {
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 100_000}}
                    }
                }
            },
            id="a-scale-down-stabilization-of-a-day",
        ),
    ],
)
def test_the_demos_lead_in_is_bounded_naming_its_parts(tmp_path, spec):
    """cooldownPeriod 1e6 made ``--duration 1`` play 1,000,335 s of trace before the
    workload, 28 hours of wall time at 10x (hostile pass 6, M1)."""
    options = DemoOptions(report=tmp_path / "r", scaled_object=_scaled_object(tmp_path, spec))
    with pytest.raises(ConfigError, match=r"lead-in .* cooldownPeriod .* --no-standby"):
        _plan(options)
    no_standby = DemoOptions(
        report=tmp_path / "r", scaled_object=_scaled_object(tmp_path, spec), standby=False
    )
    assert _plan(no_standby).lead_in == 0.0


def test_the_recommended_lead_in_is_well_within_the_bound():
    assert 0 < _plan(DemoOptions(report=Path("unused"))).lead_in < MAX_LEAD_IN / 4


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param({"sloTtft": "abc"}, id="a-ttft-slo-that-is-no-duration"),
        pytest.param({"sloItl": "0s"}, id="an-itl-slo-of-zero"),
        pytest.param({"sloTtft": "1e-300s"}, id="a-ttft-slo-of-1e-300-seconds"),
    ],
)
@pytest.mark.parametrize("standby", [True, False], ids=["with-standby", "without-standby"])
def test_the_demos_trigger_is_read_as_the_scaler_reads_it(tmp_path, metadata, standby):
    """Without standby the trigger went unchecked, and ``Plan.slo_ttft`` raised a 55-line
    traceback once the processes ran (hostile pass 6, M2)."""
    options = DemoOptions(
        report=tmp_path / "r",
        scaled_object=_scaled_object(tmp_path, {}, **metadata),
        standby=standby,
    )
    with pytest.raises(ConfigError, match=f"invalid scalerMetadata: key '{next(iter(metadata))}'"):
        _plan(options)


# --- duplicate YAML keys ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(
            "policy:\n  target-concurrency: 8\npolicy:\n  target-concurrency: 64\n",
            "policy",
            id="a-section-written-twice-is-refused-not-the-last-kept",
        ),
        pytest.param(
            "policy: {target-concurrency: 8, target-concurrency: 64}\n",
            "target-concurrency",
            id="a-key-twice-in-flow-style-is-refused",
        ),
        pytest.param("a: [{x: 1, x: 2}]\n", "x", id="a-key-twice-deep-in-a-list-is-refused"),
    ],
)
def test_a_key_written_twice_is_refused_naming_it_and_both_lines(text, key):
    with pytest.raises(ConfigError, match=rf"f.yaml: not valid YAML: key '{key}' is written twice"):
        load_mapping(text, "f.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "base: &b {a: 1}\nx: {<<: *b, a: 2}\n",
            {"base": {"a": 1}, "x": {"a": 2}},
            id="a-key-overriding-a-merged-one-is-read",
        ),
        pytest.param("a: 1\nb: {a: 2}\n", {"a": 1, "b": {"a": 2}}, id="one-key-in-two-mappings"),
        pytest.param('1: a\n"1": b\n', {1: "a", "1": "b"}, id="a-number-and-a-string-differ"),
    ],
)
def test_keys_that_are_distinct_are_read(text, expected):
    assert load_mapping(text, "f.yaml") == expected


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1),
        st.integers(),
        min_size=1,
    ),
    st.data(),
)
def test_any_mapping_reads_back_and_repeating_any_key_is_refused(mapping, data):
    text = yaml.safe_dump(mapping)
    assert load_mapping(text, "f") == mapping
    key = data.draw(st.sampled_from(sorted(mapping)))
    again = yaml.safe_dump({key: 0})
    with pytest.raises(ConfigError, match="is written twice"):
        load_mapping(text + again, "f")


def test_commands_refuse_a_config_key_written_twice(tmp_path):
    """replay --scaler-config, admission --config and demo --scaled-object: one line, exit 2
    (the last key won silently: hostile pass 1 L6, pass 6 M3)."""
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    config = write(tmp_path / "sc.yaml", b"policy: {target-concurrency: 8}\npolicy: {}\n")
    done = unitscale(
        "replay", "--trace", trace, "--policy", "unitscale", "--scaler-config", config,
        "--report", str(tmp_path / "r"),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith("key 'policy' is written twice (lines 1 and 2)")
    assert len(done.stderr.strip().splitlines()) == 1
    admission = write(tmp_path / "a.yaml", b"resync: 30s\nresync: 5m\n")
    done = unitscale("admission", "--config", admission)
    assert done.returncode == 2 and "key 'resync' is written twice" in done.stderr, done.stderr
    doc = RECOMMENDED.read_text().replace("  cooldownPeriod: 60\n", "  cooldownPeriod: 60\n" * 2)
    twice = tmp_path / "so.yaml"
    twice.write_text(doc)
    with pytest.raises(ConfigError, match="key 'cooldownPeriod' is written twice"):
        _plan(DemoOptions(report=tmp_path / "d", scaled_object=twice))
