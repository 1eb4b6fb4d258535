"""The shipped manifests say what the code accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scaler.metadata import parse_metadata

DEPLOY = Path(__file__).parent.parent / "deploy"


def triggers():
    for path in sorted(DEPLOY.glob("scaledobject-*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "ScaledObject":
                for trigger in doc["spec"]["triggers"]:
                    yield pytest.param(doc, trigger, id=f"{path.stem}-{trigger['type']}")


@pytest.mark.parametrize(("scaled_object", "trigger"), list(triggers()))
def test_example_triggers_parse_and_agree_with_the_scaled_object(scaled_object, trigger):
    assert trigger["type"] in {"external", "external-push"}
    assert all(isinstance(v, str) for v in trigger["metadata"].values()), "KEDA wants strings"
    metadata = parse_metadata(trigger["metadata"])
    assert metadata.deployment == scaled_object["spec"]["scaleTargetRef"]["name"]
    assert metadata.max_replicas >= scaled_object["spec"]["maxReplicaCount"] or (
        "maxReplicas" not in trigger["metadata"]
    )


def test_the_scaler_docs_examples_are_the_shipped_ones():
    docs = (DEPLOY.parent / "docs" / "scaler.md").read_text()
    for path in sorted(DEPLOY.glob("scaledobject-*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for trigger in doc["spec"].get("triggers", []):
                for key, value in trigger["metadata"].items():
                    assert f"{key}: {value}" in docs or f'{key}: "{value}"' in docs, (
                        f"{path.name}: {key}: {value} is not shown in docs/scaler.md"
                    )
