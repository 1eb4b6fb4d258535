"""Trigger metadata: what a ScaledObject may say, and how a mistake is reported."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import MetadataError, quote
from scaler.metadata import (
    ALLOWED_KEYS,
    REQUIRED_KEYS,
    SLO_ITL_RANGE,
    SLO_TTFT_RANGE,
    parse_metadata,
)

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
            {"enableTLS": "True", "unsafeSsl": "0"},
            {"enable_tls": True, "unsafe_ssl": False},
            id="every-spelling-of-a-boolean-kedas-parsebool-takes-is-accepted",
        ),
        pytest.param(
            {"targetConcurrency": "2.5", "model": "llama-3-8b"},
            {"target_concurrency": 2.5, "model": "llama-3-8b"},
            id="target-concurrency-may-be-fractional",
        ),
        pytest.param(
            {},
            {"pool": None, "accelerators_per_replica": None},
            id="a-scaled-object-without-a-pool-declares-no-accelerators",
        ),
        pytest.param(
            {"pool": "h200", "acceleratorsPerReplica": "1"},
            {"pool": "h200", "accelerators_per_replica": 1.0},
            id="a-pool-and-its-accelerators-per-replica-are-declared-together",
        ),
        pytest.param(
            {"pool": "a100-80g", "acceleratorsPerReplica": "8"},
            {"pool": "a100-80g", "accelerators_per_replica": 8.0},
            id="a-tensor-parallel-replica-holds-several-accelerators",
        ),
        pytest.param(
            {"pool": "h200", "acceleratorsPerReplica": "0.5"},
            {"accelerators_per_replica": 0.5},
            id="a-replica-may-hold-a-shared-fraction-of-an-accelerator",
        ),
        pytest.param(
            {"profile": "llama3-8b-h200", "profileUtilization": "0.85"},
            {"profile": "llama3-8b-h200", "profile_utilization": 0.85},
            id="a-scaled-object-names-its-replica-profile-and-how-full-to-plan-it",
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
            ["'targetConcurrency'='0'", "greater than or equal to 0.01"],
            id="zero-target-concurrency-is-refused",
        ),
        pytest.param(
            BASE | {"deployment": "Llama_3"},
            ["'deployment'='Llama_3'", "pattern"],
            id="a-deployment-name-kubernetes-would-refuse-is-refused",
        ),
        pytest.param(
            BASE | {"pool": "h200"},
            ["pool 'h200' needs acceleratorsPerReplica"],
            id="a-pool-without-accelerators-per-replica-is-refused",
        ),
        pytest.param(
            BASE | {"acceleratorsPerReplica": "1"},
            ["acceleratorsPerReplica needs pool"],
            id="accelerators-per-replica-without-a-pool-is-refused",
        ),
        pytest.param(
            BASE | {"profile": "llama-70b-b200"},
            ["'profile'='llama-70b-b200'", "one of llama3-8b-h200, qwen2.5-32b-h200"],
            id="an-unknown-profile-is-refused-naming-the-known-ones",
        ),
        pytest.param(
            BASE | {"profileUtilization": "1.5"},
            ["'profileUtilization'='1.5'"],
            id="a-profile-utilization-above-1-is-refused",
        ),
        pytest.param(
            BASE | {"pool": "H200_sxm", "acceleratorsPerReplica": "1"},
            ["'pool'='H200_sxm'", "lowercase RFC 1123 label"],
            id="a-pool-name-kubernetes-would-not-take-as-a-label-is-refused",
        ),
        pytest.param(
            BASE | {"pool": "", "acceleratorsPerReplica": "1"},
            ["'pool'=''", "lowercase RFC 1123 label"],
            id="an-empty-pool-is-refused",
        ),
        pytest.param(
            BASE | {"pool": "p" * 64, "acceleratorsPerReplica": "1"},
            ["'pool'", "at most 63 characters"],
            id="a-pool-name-beyond-63-characters-is-refused",
        ),
        pytest.param(
            BASE | {"pool": "h200", "acceleratorsPerReplica": "0"},
            ["'acceleratorsPerReplica'='0'", "greater than or equal to 0.01"],
            id="zero-accelerators-per-replica-is-refused",
        ),
        pytest.param(
            BASE | {"pool": "h200", "acceleratorsPerReplica": "1e-9"},
            ["'acceleratorsPerReplica'='1e-9'", "greater than or equal to 0.01"],
            id="a billionth of a card a replica is refused: the pool's demand read as none",
        ),
        pytest.param(
            BASE | {"pool": "h200", "acceleratorsPerReplica": "2000"},
            ["'acceleratorsPerReplica'='2000'", "less than or equal to 1024"],
            id="more-accelerators-per-replica-than-any-replica-holds-is-refused",
        ),
        pytest.param(
            BASE | {"pool": "h200", "acceleratorsPerReplica": "one"},
            ["'acceleratorsPerReplica'='one'", "decimal number"],
            id="accelerators-per-replica-in-words-is-refused",
        ),
        pytest.param(
            BASE | {"sloItl": "1ns"},
            ["'sloItl'='1ns'", "greater than or equal to 0.001"],
            id="an-itl-slo-of-one-nanosecond-is-refused-not-maxreplicas",
        ),
        pytest.param(
            BASE | {"sloItl": "10000h"},
            ["'sloItl'='10000h'", "less than or equal to 10"],
            id="an-itl-slo-of-ten-thousand-hours-is-refused-not-maxreplicas",
        ),
        pytest.param(
            BASE | {"sloTtft": "1ns"},
            ["'sloTtft'='1ns'", "greater than or equal to 0.01"],
            id="a-ttft-slo-of-one-nanosecond-is-refused",
        ),
        pytest.param(
            BASE | {"sloTtft": "2562047h"},
            ["'sloTtft'='2562047h'", "less than or equal to 600"],
            id="a-ttft-slo-of-go-s-largest-duration-is-refused",
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
        "prefillTokensPerSecond",
        "decodeTokensPerSecond",
        "pool",
        "acceleratorsPerReplica",
        "profile",
        "profileUtilization",
        "fluidDataset",
        "fluidDatasetNamespace",
        "prewarmPaths",
        "prewarmTimeout",
        "keepWarmAfterZero",
        "prewarmCachedPercentage",
        "seasonalPrewarmLead",
        "seasonalUtcOffsetHours",
        "standby",
        "standbyMaxSleeping",
        "standbyBurstSleepers",
        "standbyReleaseAfter",
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


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        pytest.param(
            {"minReplicas": "5_0"}, ["'minReplicas'='5_0'", "integer"],
            id="underscores-in-an-integer-are-refused",
        ),
        pytest.param(
            {"minReplicas": "5.0"}, ["'minReplicas'='5.0'", "integer"],
            id="a-fraction-for-an-integer-is-refused",
        ),
        pytest.param(
            {"maxReplicas": " 5"}, ["'maxReplicas'=' 5'", "integer"],
            id="spaces-around-an-integer-are-refused",
        ),
        pytest.param(
            {"maxReplicas": "\u0665"}, ["'maxReplicas'", "integer"],
            id="non-ascii-digits-are-not-an-integer",
        ),
        pytest.param(
            {"targetConcurrency": "1_0.5"}, ["'targetConcurrency'='1_0.5'", "decimal number"],
            id="underscores-in-a-number-are-refused",
        ),
        pytest.param(
            {"targetConcurrency": "\u0662"}, ["'targetConcurrency'", "decimal number"],
            id="non-ascii-digits-are-not-a-number",
        ),
        pytest.param(
            {"prefillTokensPerSecond": "inf"}, ["'prefillTokensPerSecond'='inf'"],
            id="infinity-is-not-a-capacity",
        ),
        pytest.param(
            {"decodeTokensPerSecond": "1e400"}, ["'decodeTokensPerSecond'='1e400'", "finite"],
            id="a-number-beyond-floats-is-refused",
        ),
        pytest.param(
            {"profileUtilization": "nan"}, ["'profileUtilization'='nan'"],
            id="nan-is-not-a-utilization",
        ),
        pytest.param(
            {"maxSignalAge": "\u0663s"}, ["'maxSignalAge'", "duration"],
            id="non-ascii-digits-are-not-a-duration",
        ),
        pytest.param(
            {"sloTtft": "\u0661"}, ["'sloTtft'", "duration"],
            id="a-bare-non-ascii-number-is-not-a-duration",
        ),
        pytest.param(
            {"enableTLS": "yes"}, ["'enableTLS'='yes'", "true or false"],
            id="yes-is-not-a-boolean",
        ),
        pytest.param(
            {"unsafeSsl": "on"}, ["'unsafeSsl'='on'", "true or false"],
            id="on-is-not-a-boolean",
        ),
    ],
)  # fmt: skip
def test_only_the_documented_forms_parse(extra, fragments):
    with pytest.raises(MetadataError) as caught:
        parse_metadata(BASE | extra)
    for fragment in fragments:
        assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param({"targetConcurrency": "16"}, 16.0, id="an-integer-is-a-number"),
        pytest.param({"targetConcurrency": "0.5"}, 0.5, id="a-decimal-fraction"),
        pytest.param({"targetConcurrency": ".5"}, 0.5, id="a-fraction-without-a-leading-zero"),
        pytest.param({"targetConcurrency": "1e3"}, 1000.0, id="an-ascii-exponent"),
    ],
)
def test_documented_numbers_parse(extra, expected):
    assert parse_metadata(BASE | extra).target_concurrency == expected


OVERSIZED = 100_000
"""Past every metadata bound, within the scaler's request bound."""
MEGABYTE = 1_000_000


@pytest.mark.parametrize(
    ("metadata", "fragments"),
    [
        pytest.param(
            BASE | {"model": "m" * MEGABYTE},
            ["'model'", "1000000 characters", "at most 4096"],
            id="a-megabyte-value-is-refused-by-its-length",
        ),
        pytest.param(
            BASE | {"deployment": "d" * MEGABYTE},
            ["'deployment'", "1000000 characters"],
            id="a-megabyte-deployment-is-refused-by-its-length",
        ),
        pytest.param(
            BASE | {"k" * MEGABYTE: "1"},
            ["unknown key", "1000000 characters"],
            id="a-megabyte-key-is-quoted-with-a-cap",
        ),
        pytest.param(
            BASE | {f"key{i}": "1" for i in range(10_000)},
            ["10002 keys", "at most 64"],
            id="ten-thousand-keys-are-refused-by-their-count",
        ),
        pytest.param(
            BASE | {f"key{i}": "1" for i in range(40)},
            ["unknown key 'key0'", "more problems"],
            id="forty-unknown-keys-are-listed-up-to-a-cap",
        ),
        pytest.param(
            BASE | {"maxReplicas": "9" * 4000},
            ["'maxReplicas'", "4000 characters"],
            id="a-long-number-is-quoted-with-a-cap",
        ),
        pytest.param(
            BASE | {"maxSignalAge": "9" * 4000 + "s"},
            ["'maxSignalAge'", "4001 characters"],
            id="a-long-duration-is-quoted-with-a-cap",
        ),
    ],
)
def test_an_oversized_input_gives_a_short_message(metadata, fragments):
    with pytest.raises(MetadataError) as caught:
        parse_metadata(metadata)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message
    assert len(message) < 2048, len(message)


@pytest.mark.parametrize(
    ("name", "namespace", "fragment"),
    [
        pytest.param("n" * 254, "team-a", "ScaledObject name", id="a-name-beyond-253-is-refused"),
        pytest.param("llama", "n" * 64, "namespace", id="a-namespace-beyond-63-is-refused"),
        pytest.param("n" * MEGABYTE, "team-a", "1000000 characters", id="a-megabyte-name"),
        pytest.param("Llama_3", "team-a", "ScaledObject name", id="a-name-kubernetes-refuses"),
        pytest.param("llama", "team.a", "namespace", id="a-namespace-is-a-dns-label"),
    ],
)
def test_the_scaled_object_s_name_and_namespace_have_kubernetes_limits(name, namespace, fragment):
    with pytest.raises(MetadataError) as caught:
        parse_metadata(BASE, name=name, namespace=namespace)
    assert fragment in str(caught.value)
    assert len(str(caught.value)) < 2048


def test_a_name_and_namespace_within_the_limits_parse():
    assert parse_metadata(BASE, name="n" * 253, namespace="n" * 63).deployment == "llama"


def test_an_oversized_scaled_object_is_not_stored():
    from scaler.registry import ScaledObjectRegistry
    from scaler.signals import SignalStore

    registry = ScaledObjectRegistry(SignalStore(), 30.0)
    for name, metadata in [("n" * MEGABYTE, BASE), ("llama", BASE | {"model": "m" * MEGABYTE})]:
        with pytest.raises(MetadataError):
            registry.resolve(name, "team-a", metadata)
    assert len(registry) == 0


@pytest.mark.parametrize(
    ("field", "rpc"),
    [
        pytest.param("model", "GetMetricSpec", id="a-100-kb-model-on-get-metric-spec"),
        pytest.param("maxSignalAge", "IsActive", id="a-100-kb-duration-on-is-active"),
        pytest.param("deployment", "GetMetricSpec", id="a-100-kb-deployment"),
        pytest.param("x" * OVERSIZED, "GetMetricSpec", id="a-100-kb-unknown-key"),
    ],
)
async def test_a_100_kb_value_is_invalid_argument_with_a_short_message(scaler, stub, field, rpc):
    """A standard client gets INVALID_ARGUMENT, not RESOURCE_EXHAUSTED for a huge status.

    100 KB: past every field's bound, within the request's (``MAX_REQUEST_BYTES``); a
    megabyte request is refused unread (``tests/test_scaler_faults.py``).
    """
    from tests.conftest import ref

    so = ref(**{field: "9" * OVERSIZED})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(stub, rpc)(so, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert "characters" in details and quote(field) in details
    assert len(details.encode()) < 2048, len(details)
    assert len(scaler.registry) == 0


@pytest.mark.parametrize(
    ("name", "namespace"),
    [
        pytest.param("n" * OVERSIZED, "team-a", id="a-100-kb-scaled-object-name"),
        pytest.param("llama", "n" * OVERSIZED, id="a-100-kb-namespace"),
    ],
)
async def test_a_100_kb_name_is_invalid_argument_and_not_stored(scaler, stub, name, namespace):
    from protos.externalscaler import externalscaler_pb2 as keda

    so = keda.ScaledObjectRef(
        name=name, namespace=namespace, scalerMetadata={"scalerAddress": "a:1", "deployment": "x"}
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetMetricSpec(so, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert "100000 characters" in details
    assert len(details.encode()) < 2048, len(details)
    assert len(scaler.registry) == 0


async def test_a_100_kb_metric_name_is_not_found_with_a_short_message(stub):
    from protos.externalscaler import externalscaler_pb2 as keda
    from tests.conftest import ref

    request = keda.GetMetricsRequest(scaledObjectRef=ref(), metricName="m" * OVERSIZED)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetMetrics(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert len((caught.value.details() or "").encode()) < 2048


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([("sloItl", SLO_ITL_RANGE), ("sloTtft", SLO_TTFT_RANGE)]),
    st.integers(1, 10**15),
)
def test_an_slo_is_taken_within_its_range_or_refused_naming_the_key(key_range, micros):
    """Any duration: inside the key's range it is the policy's SLO, else refused by name."""
    key, (low, high) = key_range
    seconds = micros / 1e6
    try:
        metadata = parse_metadata(BASE | {key: f"{micros}us"})
    except MetadataError as err:
        assert not low <= seconds <= high
        assert f"'{key}'" in str(err)
    else:
        assert low <= seconds <= high
        policy = metadata.policy()
        got = policy.slo_itl_seconds if key == "sloItl" else policy.slo_ttft_seconds
        assert got == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("extra", "tier"),
    [
        pytest.param({}, False, id="without standby no burst tier"),
        pytest.param({"standby": "true"}, False, id="standby with no burst sleepers is no tier"),
        pytest.param(
            {"standby": "true", "standbyBurstSleepers": "2"},
            True,
            id="standby with burst sleepers is a burst tier",
        ),
        pytest.param(
            {"standby": "true", "standbyBurstSleepers": "2", "standbyMaxSleeping": "0"},
            False,
            id="burst sleepers with room for none are no tier",
        ),
    ],
)
def test_the_policy_knows_its_burst_tier_from_the_standby_keys(
    extra: dict[str, str], tier: bool
) -> None:
    assert parse_metadata({**BASE, **extra}).policy().burst_tier is tier
