"""Trigger metadata: what a ScaledObject may say, and how a mistake is reported."""

from __future__ import annotations

import pytest

from foundation.errors import MetadataError
from scaler.metadata import ALLOWED_KEYS, REQUIRED_KEYS, parse_metadata

BASE = {"scalerAddress": "unitscale-scaler.keda:9090", "deployment": "llama"}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param(
            {},
            {"deployment": "llama", "namespace": None, "min_replicas": 0, "max_replicas": 100},
            id="only-the-required-keys-give-the-documented-defaults",
        ),
        pytest.param(
            {"minReplicas": "2", "maxReplicas": "8", "namespace": "serving"},
            {"min_replicas": 2, "max_replicas": 8, "namespace": "serving"},
            id="strings-from-kubernetes-are-parsed-into-numbers",
        ),
        pytest.param(
            {"maxSignalAge": "1m30s"},
            {"max_signal_age": 90.0},
            id="durations-are-go-style",
        ),
        pytest.param(
            {"enableTLS": "true", "unsafeSsl": "false"},
            {"enable_tls": True, "unsafe_ssl": False},
            id="keda-own-tls-keys-are-accepted",
        ),
        pytest.param(
            {"targetConcurrency": "2.5", "model": "llama-3-8b"},
            {"target_concurrency": 2.5, "model": "llama-3-8b"},
            id="target-concurrency-may-be-fractional",
        ),
    ],
)
def test_valid_metadata_parses(extra, expected):
    parsed = parse_metadata(BASE | extra)
    for attribute, value in expected.items():
        assert getattr(parsed, attribute) == value


@pytest.mark.parametrize(
    ("metadata", "fragments"),
    [
        pytest.param(
            {"scalerAddress": "s:1"},
            ["missing required key 'deployment'"],
            id="a-missing-deployment-is-named",
        ),
        pytest.param(
            BASE | {"maxReplica": "3"},
            ["unknown key 'maxReplica'", "maxReplicas"],
            id="a-typo-is-an-unknown-key-and-the-allowed-keys-are-listed",
        ),
        pytest.param(
            BASE | {"minReplicas": "-1"},
            ["'minReplicas'='-1'", "greater than or equal to 0"],
            id="negative-min-replicas-is-refused-with-the-allowed-range",
        ),
        pytest.param(
            BASE | {"maxReplicas": "many"},
            ["'maxReplicas'='many'", "integer"],
            id="a-non-number-is-refused",
        ),
        pytest.param(
            BASE | {"minReplicas": "5", "maxReplicas": "2"},
            ["minReplicas (5) must not exceed maxReplicas (2)"],
            id="min-above-max-is-refused",
        ),
        pytest.param(
            BASE | {"maxSignalAge": "soon"},
            ["'maxSignalAge'='soon'", "'2m3s'"],
            id="a-bad-duration-shows-the-expected-form",
        ),
        pytest.param(
            BASE | {"targetConcurrency": "0"},
            ["'targetConcurrency'='0'", "greater than 0"],
            id="zero-target-concurrency-is-refused",
        ),
        pytest.param(
            BASE | {"deployment": "Llama_3"},
            ["'deployment'='Llama_3'", "pattern"],
            id="a-deployment-name-kubernetes-would-refuse-is-refused",
        ),
        pytest.param(
            {"deployment": "x", "bogus": "1", "minReplicas": "x"},
            ["missing required key 'scalerAddress'", "unknown key 'bogus'", "'minReplicas'='x'"],
            id="every-problem-is-reported-at-once",
        ),
    ],
)
def test_invalid_metadata_names_the_key(metadata, fragments):
    with pytest.raises(MetadataError) as caught:
        parse_metadata(metadata)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_key_lists_match_the_documented_keys():
    assert REQUIRED_KEYS == ("deployment", "scalerAddress")
    assert set(ALLOWED_KEYS) == {
        "scalerAddress",
        "enableTLS",
        "unsafeSsl",
        "deployment",
        "namespace",
        "model",
        "minReplicas",
        "maxReplicas",
        "targetConcurrency",
        "maxSignalAge",
        "targetUtilization",
        "sloTtft",
        "sloItl",
        "idleGrace",
        "costBudgetPerMillionTokens",
        "prefillTokensPerSecond",
        "decodeTokensPerSecond",
    }


def test_every_key_is_documented_in_the_scaler_docs():
    """docs/scaler.md's trigger metadata table has a row for every key, and no other."""
    from pathlib import Path

    docs = (Path(__file__).parent.parent / "docs" / "scaler.md").read_text()
    section = docs.split("## Trigger metadata keys", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {row.split("`")[1] for row in rows}
    for key in ALLOWED_KEYS:
        assert f"| `{key}` |" in section, key
    assert documented == set(ALLOWED_KEYS)
