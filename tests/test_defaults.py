"""One source for each policy default: the core's ``Policy``.

The config model takes its ``policy`` defaults from ``Policy()``; the ConfigMap example
(``deploy/scaler/configmap.yaml``'s ``_example``) and the docs table
(``docs/scaler.md``, "Policy keys") state them in words, and must state the same.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from scaler.config import REMOVED_POLICY_KEYS, PolicyConfig, parse_config
from scaler.core.model import Policy
from scaler.metadata import TriggerMetadata

ROOT = Path(__file__).parent.parent
CORE = Policy()
# Knobs that come from each ScaledObject's trigger, not from the scaler config.
PER_TRIGGER = {"min_replicas", "max_replicas", "burst_tier"}
# Knobs the scaler config sets outside its ``policy`` section (its top-level ``profiles``).
OUTSIDE_POLICY = {"profiles"}
# Mechanisms always on where served: the core keeps their switch for the benches that
# measure them, and the config refuses the key with the reason.
ALWAYS_ON = {"profile_fit", "seasonal_floor"}


def core_name(field: str) -> str:
    """The ``Policy`` field a config field sets (durations carry ``_seconds`` there)."""
    core_fields = {f.name for f in dataclasses.fields(Policy)}
    for name in (field, f"{field}_seconds"):
        if name in core_fields:
            return name
    raise AssertionError(f"PolicyConfig.{field} sets no Policy field")


def config_key(field: str) -> str:
    return field.replace("_", "-")


CONFIG_FIELDS = tuple(PolicyConfig.model_fields)
KEYS = tuple(config_key(field) for field in CONFIG_FIELDS)


def example_text() -> str:
    configmap = yaml.safe_load((ROOT / "deploy" / "scaler" / "configmap.yaml").read_text())
    text = configmap["data"]["_example"]
    assert isinstance(text, str)
    return text


def example_policy() -> dict[str, object]:
    """The keys the ConfigMap example writes out under ``policy``."""
    policy = yaml.safe_load(example_text())["policy"]
    assert isinstance(policy, dict)
    return policy


def docs_table() -> dict[str, str]:
    """docs/scaler.md's policy table: key to its default cell, backticks stripped."""
    docs = (ROOT / "docs" / "scaler.md").read_text()
    assert "### Policy keys" in docs, "docs/scaler.md lost its 'Policy keys' section"
    section = docs.split("### Policy keys", 1)[1].split("\n#", 1)[0]
    table: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            key = cells[0].strip("`")
            assert key not in table, f"{key} is listed twice"
            table[key] = cells[1].strip("`")
    return table


def read_as_config(key: str, text: str) -> object:
    """A documented default read the way the scaler reads its config file."""
    value = None if text == "none" else yaml.safe_load(text)
    field = CONFIG_FIELDS[KEYS.index(key)]
    return getattr(PolicyConfig.model_validate({key: value}), field)


def rows():
    for field in CONFIG_FIELDS:
        key = config_key(field)
        yield pytest.param("model", field, id=f"the config model's {key} default is the core's")
        yield pytest.param(
            "configmap", field, id=f"the ConfigMap example's {key} parses to the core's"
        )
        yield pytest.param("docs", field, id=f"docs/scaler.md states the core's {key}")


@pytest.mark.parametrize(("source", "field"), list(rows()))
def test_every_policy_default_is_the_cores(source, field):
    key = config_key(field)
    expected = getattr(CORE, core_name(field))
    if source == "model":
        stated = PolicyConfig.model_fields[field].default
    elif source == "configmap":
        assert key in example_policy(), f"the ConfigMap example does not list {key}"
        stated = getattr(parse_config(example_text(), "_example").policy, field)
    else:
        table = docs_table()
        assert key in table, f"docs/scaler.md's policy table does not list {key}"
        stated = read_as_config(key, table[key])
    assert stated == expected


@pytest.mark.parametrize(
    ("listed", "what"),
    [
        pytest.param(
            lambda: {config_key(f) for f in CONFIG_FIELDS},
            "the config model",
            id="every core knob but the replica bounds is a config key",
        ),
        pytest.param(
            lambda: set(example_policy()),
            "the ConfigMap example",
            id="the ConfigMap example lists every policy key and no other",
        ),
        pytest.param(
            lambda: set(docs_table()),
            "docs/scaler.md",
            id="the docs table lists every policy key and no other",
        ),
    ],
)
def test_every_policy_key_is_listed(listed, what):
    assert {config_key(name) for name in ALWAYS_ON} <= set(REMOVED_POLICY_KEYS)
    # ``Policy.profiles`` comes from the top-level ``profiles`` (``policy_defaults``).
    assert OUTSIDE_POLICY <= {f.name for f in dataclasses.fields(Policy)}
    core = {f.name for f in dataclasses.fields(Policy)} - PER_TRIGGER - OUTSIDE_POLICY - ALWAYS_ON
    expected = {config_key(name.removesuffix("_seconds")) for name in core}
    assert listed() == expected, what


@pytest.mark.parametrize(
    ("field", "alias"),
    [
        pytest.param(
            "min_replicas", "minReplicas", id="a trigger's minReplicas default is the core's"
        ),
        pytest.param(
            "max_replicas", "maxReplicas", id="a trigger's maxReplicas default is the core's"
        ),
    ],
)
def test_the_replica_bounds_default_to_the_cores(field, alias):
    expected = getattr(CORE, field)
    assert TriggerMetadata.model_fields[field].default == expected
    assert getattr(PolicyConfig().policy(), field) == expected
    docs = (ROOT / "docs" / "scaler.md").read_text()
    assert f"| `{alias}` | no | `{expected}` |" in docs
