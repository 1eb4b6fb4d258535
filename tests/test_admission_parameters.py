"""CapacityCheckParameters objects to ``Parameters``: defaults, every field, every refusal."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from admission.parameters import (
    DataParameters,
    Headroom,
    LoraParameters,
    Parameters,
    active_body,
    active_condition,
    check_parameters,
    parse_parameters,
)
from foundation.errors import ConfigError

CRD = Path(__file__).resolve().parents[1] / "deploy" / "admission" / "crd.yaml"


def params_object(spec=None, name="h200"):
    obj = {
        "apiVersion": "unitscale.io/v1alpha1",
        "kind": "CapacityCheckParameters",
        "metadata": {"name": name},
    }
    if spec is not None:
        obj["spec"] = spec
    return obj


FULL = {
    "poolNodeSelector": {"accelerator-pool": "h200", "example.com/zone": "a"},
    "gpuSchedulerPolicy": "spread",
    "nodeSchedulerPolicy": "binpack",
    "retryAfterSeconds": 30,
    "handshakeTimeoutSeconds": 120,
    "data": {"cachedPercentage": 99.5, "timeoutSeconds": 600, "createDataLoad": False},
    "inferenceHeadroom": {
        "scaler": "scaler.unitscale.svc:9090",
        "pool": "h200",
        "horizonSeconds": 300,
        "whenUnavailable": "Ignore",
    },
    "lora": {"tenantsPerInstance": 8},
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(None, Parameters(), id="an-object-without-spec-takes-every-default"),
        pytest.param({}, Parameters(), id="an-empty-spec-takes-every-default"),
        pytest.param(
            FULL,
            Parameters(
                pool_node_selector={"accelerator-pool": "h200", "example.com/zone": "a"},
                gpu_scheduler_policy="spread",
                node_scheduler_policy="binpack",
                retry_after_seconds=30,
                handshake_timeout_seconds=120,
                data=DataParameters(
                    cached_percentage=99.5, timeout_seconds=600, create_dataload=False
                ),
                inference_headroom=Headroom(
                    scaler="scaler.unitscale.svc:9090",
                    pool="h200",
                    horizon_seconds=300,
                    when_unavailable="Ignore",
                ),
                lora=LoraParameters(tenants_per_instance=8),
            ),
            id="every-field-set-is-read",
        ),
        pytest.param(
            {"inferenceHeadroom": {"scaler": "10.0.0.7:9090", "pool": "h200"}},
            Parameters(inference_headroom=Headroom(scaler="10.0.0.7:9090", pool="h200")),
            id="a-headroom-with-scaler-and-pool-defaults-horizon-and-hold",
        ),
        pytest.param(
            {"inferenceHeadroom": {"scaler": "[fd00::7]:9090", "pool": "h200"}},
            Parameters(inference_headroom=Headroom(scaler="[fd00::7]:9090", pool="h200")),
            id="an-ipv6-scaler-address-in-brackets-is-accepted",
        ),
        pytest.param(
            {"data": {"cachedPercentage": 100}},
            Parameters(data=DataParameters(cached_percentage=100.0)),
            id="an-integer-percentage-is-a-number",
        ),
        pytest.param(
            {"data": {"cachedPercentage": 0}, "lora": {"tenantsPerInstance": 1}},
            Parameters(
                data=DataParameters(cached_percentage=0.0),
                lora=LoraParameters(tenants_per_instance=1),
            ),
            id="the-lowest-bounds-are-inside",
        ),
        pytest.param(
            {"poolNodeSelector": {"pool": ""}},
            Parameters(pool_node_selector={"pool": ""}),
            id="an-empty-label-value-is-a-valid-selector",
        ),
    ],
)
def test_parameters_from_a_good_object(spec, expected):
    assert parse_parameters(params_object(spec)) == expected


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        pytest.param(
            {"gpuSchedulerPolicy": "round-robin"},
            "spec.gpuSchedulerPolicy='round-robin': one of binpack, spread, topology-aware",
            id="an-unknown-gpu-policy-is-refused-naming-the-choices",
        ),
        pytest.param(
            {"nodeSchedulerPolicy": "topology-aware"},
            "spec.nodeSchedulerPolicy='topology-aware': one of binpack, spread",
            id="topology-aware-is-no-node-policy",
        ),
        pytest.param(
            {"retryAfterSeconds": 0},
            "spec.retryAfterSeconds=0: must be between 1 and 86400",
            id="a-zero-retry-is-refused",
        ),
        pytest.param(
            {"retryAfterSeconds": "60"},
            "spec.retryAfterSeconds='60': expected an integer, got a string",
            id="a-quoted-number-is-no-integer",
        ),
        pytest.param(
            {"handshakeTimeoutSeconds": True},
            "spec.handshakeTimeoutSeconds=True: expected an integer, got a boolean",
            id="a-boolean-is-no-integer",
        ),
        pytest.param(
            {"retryAfterSeconds": 1.5},
            "spec.retryAfterSeconds=1.5: expected an integer, got a number",
            id="a-fraction-is-no-integer",
        ),
        pytest.param(
            {"data": {"cachedPercentage": 150}},
            "spec.data.cachedPercentage=150: must be between 0 and 100",
            id="a-percentage-over-100-is-refused",
        ),
        pytest.param(
            {"data": {"cachedPercentage": float("nan")}},
            "spec.data.cachedPercentage=nan: expected a number",
            id="a-nan-percentage-is-refused",
        ),
        pytest.param(
            {"data": {"createDataLoad": "yes"}},
            "spec.data.createDataLoad='yes': expected true or false",
            id="a-string-is-no-boolean",
        ),
        pytest.param(
            {"data": [95]},
            "spec.data: expected a mapping, got a list",
            id="a-list-where-a-section-goes-is-refused",
        ),
        pytest.param(
            {"lora": {"tenantsPerInstance": 9}},
            "spec.lora.tenantsPerInstance=9: must be between 1 and 8",
            id="more-than-eight-lora-tenants-are-refused",
        ),
        pytest.param(
            {"inferenceHeadroom": {"pool": "h200"}},
            "spec.inferenceHeadroom.scaler: required",
            id="a-headroom-without-scaler-is-refused",
        ),
        pytest.param(
            {"inferenceHeadroom": {"scaler": "scaler:99999", "pool": "h200"}},
            "spec.inferenceHeadroom.scaler='scaler:99999': expected host:port (port 1-65535)",
            id="a-port-out-of-range-is-refused",
        ),
        pytest.param(
            {"inferenceHeadroom": {"scaler": "http://scaler:9090", "pool": "h200"}},
            "spec.inferenceHeadroom.scaler='http://scaler:9090': expected host:port",
            id="a-url-is-no-host-port",
        ),
        pytest.param(
            {"inferenceHeadroom": {"scaler": "s:9090", "pool": "H200 pool"}},
            "spec.inferenceHeadroom.pool='H200 pool': expected a lowercase name",
            id="a-pool-name-with-a-space-is-refused",
        ),
        pytest.param(
            {"inferenceHeadroom": {"scaler": "s:9090", "pool": "h200", "whenUnavailable": "hold"}},
            "spec.inferenceHeadroom.whenUnavailable='hold': one of Hold, Ignore",
            id="when-unavailable-is-case-sensitive",
        ),
        pytest.param(
            {"poolNodeSelector": {"-bad-": "h200"}},
            "spec.poolNodeSelector: '-bad-' is not a valid label key",
            id="a-label-key-starting-with-a-dash-is-refused",
        ),
        pytest.param(
            {"poolNodeSelector": {"Example.com/pool": "h200"}},
            "spec.poolNodeSelector: 'Example.com/pool' is not a valid label key",
            id="a-label-key-prefix-must-be-a-lowercase-dns-name",
        ),
        pytest.param(
            {"poolNodeSelector": {"pool": "h200/a"}},
            "spec.poolNodeSelector.pool='h200/a': not a valid label value",
            id="a-label-value-with-a-slash-is-refused",
        ),
        pytest.param(
            {"poolNodeSelector": {"pool": 200}},
            "spec.poolNodeSelector.pool=200: not a valid label value",
            id="a-number-is-no-label-value",
        ),
        pytest.param(
            {"poolNodeSelector": ["pool=h200"]},
            "spec.poolNodeSelector: expected a mapping of labels, got a list",
            id="a-selector-written-as-a-list-is-refused",
        ),
        pytest.param(
            {"retryAfter": 60},
            "spec: unknown field 'retryAfter'",
            id="an-unknown-field-is-named",
        ),
        pytest.param(
            {"data": {"cachedPercent": 90}},
            "spec.data: unknown field 'cachedPercent'",
            id="an-unknown-nested-field-is-named-with-its-path",
        ),
    ],
)
def test_a_bad_object_is_refused_naming_the_field_and_value(spec, named):
    with pytest.raises(ConfigError) as raised:
        parse_parameters(params_object(spec))
    message = str(raised.value)
    assert message.startswith("CapacityCheckParameters 'h200': ")
    assert named in message


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as raised:
        parse_parameters(
            params_object({"retryAfterSeconds": -1, "lora": {"tenantsPerInstance": 0}})
        )
    assert "spec.retryAfterSeconds=-1" in str(raised.value)
    assert "spec.lora.tenantsPerInstance=0" in str(raised.value)


def test_another_kind_is_refused():
    obj = params_object({})
    obj["kind"] = "ProvisioningRequestConfig"
    with pytest.raises(ConfigError, match=r"expected apiVersion unitscale\.io/v1alpha1 kind"):
        parse_parameters(obj)


def test_a_huge_value_is_quoted_short():
    with pytest.raises(ConfigError) as raised:
        parse_parameters(params_object({"gpuSchedulerPolicy": "x" * 100_000}))
    assert len(str(raised.value)) < 400


# --- the CRD says the same as the parser -------------------------------------------------


def crd_schema():
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return crd, version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_the_crd_is_cluster_scoped_and_served_as_v1alpha1():
    crd, _ = crd_schema()
    assert crd["metadata"]["name"] == "capacitycheckparameters.unitscale.io"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == "CapacityCheckParameters"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]


def apply_schema_defaults(schema, value):
    """What the API server's defaulting makes of ``value`` (objects and scalars only)."""
    if schema.get("type") != "object" or not isinstance(value, dict):
        return value
    out = copy.deepcopy(value)
    for key, sub in (schema.get("properties") or {}).items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = apply_schema_defaults(sub, out[key])
    return out


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({}, id="an-empty-spec"),
        pytest.param({"inferenceHeadroom": {"scaler": "s:1", "pool": "p"}}, id="a-bare-headroom"),
    ],
)
def test_the_crd_defaults_are_the_parsers_defaults(spec):
    _, schema = crd_schema()
    defaulted = apply_schema_defaults(schema, spec)
    assert defaulted != spec  # the schema did fill something in
    assert parse_parameters(params_object(defaulted)) == parse_parameters(params_object(spec))


def test_the_crd_enums_and_bounds_are_the_parsers():
    _, schema = crd_schema()
    props = schema["properties"]
    assert props["gpuSchedulerPolicy"]["enum"] == ["binpack", "spread", "topology-aware"]
    assert props["nodeSchedulerPolicy"]["enum"] == ["binpack", "spread"]
    assert (props["retryAfterSeconds"]["minimum"], props["retryAfterSeconds"]["maximum"]) == (
        1,
        86400,
    )
    data = props["data"]["properties"]
    assert (data["cachedPercentage"]["minimum"], data["cachedPercentage"]["maximum"]) == (0, 100)
    headroom = props["inferenceHeadroom"]
    assert headroom["required"] == ["scaler", "pool"]
    assert headroom["properties"]["whenUnavailable"]["enum"] == ["Hold", "Ignore"]
    lora = props["lora"]["properties"]["tenantsPerInstance"]
    assert (lora["minimum"], lora["maximum"]) == (1, 8)


# --- an AdmissionCheck's parameters and Active condition -----------------------------------

NOW_TEXT = "2026-01-01T00:00:00Z"
EARLIER = "2025-12-31T00:00:00Z"


def admission_check(parameters=None, conditions=None, generation=2):
    spec = {"controllerName": "unitscale.io/capacity"}
    if parameters is not None:
        spec["parameters"] = parameters
    obj = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": "capacity", "uid": "ac-uid", "generation": generation},
        "spec": spec,
    }
    if conditions is not None:
        obj["status"] = {"conditions": conditions}
    return obj


REF = {"apiGroup": "unitscale.io", "kind": "CapacityCheckParameters", "name": "h200"}


@pytest.mark.parametrize(
    ("check", "objects", "expected"),
    [
        pytest.param(admission_check(), {}, Parameters(), id="no-reference-runs-on-the-defaults"),
        pytest.param(
            admission_check(REF),
            {"h200": params_object({"retryAfterSeconds": 5})},
            Parameters(retry_after_seconds=5),
            id="the-referenced-object-is-parsed",
        ),
    ],
)
def test_check_parameters(check, objects, expected):
    assert check_parameters(check, objects) == expected


@pytest.mark.parametrize(
    ("check", "objects", "message"),
    [
        pytest.param(
            admission_check(REF), {}, "CapacityCheckParameters 'h200' not found", id="missing"
        ),
        pytest.param(
            admission_check({**REF, "kind": "ProvisioningRequestConfig"}),
            {"h200": params_object()},
            "spec.parameters: expected apiGroup unitscale.io kind CapacityCheckParameters, "
            "got 'unitscale.io' 'ProvisioningRequestConfig'",
            id="another-kind",
        ),
        pytest.param(
            admission_check({**REF, "apiGroup": "kueue.x-k8s.io"}),
            {"h200": params_object()},
            "got 'kueue.x-k8s.io' 'CapacityCheckParameters'",
            id="another-group",
        ),
        pytest.param(
            admission_check(REF),
            {"h200": params_object({"lora": {"tenantsPerInstance": 80}})},
            "CapacityCheckParameters 'h200': spec.lora.tenantsPerInstance=80",
            id="an-invalid-object",
        ),
    ],
)
def test_a_bad_reference_names_the_problem(check, objects, message):
    with pytest.raises(ConfigError) as raised:
        check_parameters(check, objects)
    assert message in str(raised.value)


def active(status="True", reason="Active", message="The admission check is active", **more):
    return {
        "type": "Active",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": 2,
        "lastTransitionTime": EARLIER,
        **more,
    }


@pytest.mark.parametrize(
    ("check", "problem", "expected"),
    [
        pytest.param(
            admission_check(),
            None,
            {**active(), "lastTransitionTime": NOW_TEXT},
            id="a-new-check-becomes-active-now",
        ),
        pytest.param(
            admission_check(conditions=[active()]), None, None, id="an-active-check-is-left-alone"
        ),
        pytest.param(
            admission_check(conditions=[active()]),
            "CapacityCheckParameters 'h200' not found",
            {
                **active("False", "BadParametersRef", "CapacityCheckParameters 'h200' not found"),
                "lastTransitionTime": NOW_TEXT,
            },
            id="a-missing-object-makes-it-inactive-naming-it",
        ),
        pytest.param(
            admission_check(conditions=[active("False", "BadParametersRef", "old problem")]),
            "new problem",
            active("False", "BadParametersRef", "new problem"),
            id="a-new-problem-keeps-the-transition-time",
        ),
        pytest.param(
            admission_check(conditions=[active("False", "BadParametersRef", "old problem")]),
            None,
            {**active(), "lastTransitionTime": NOW_TEXT},
            id="fixed-parameters-make-it-active-again",
        ),
        pytest.param(
            admission_check(conditions=[active()], generation=3),
            None,
            {**active(), "observedGeneration": 3},
            id="a-new-generation-is-observed",
        ),
    ],
)
def test_active_condition(check, problem, expected):
    assert active_condition(check, problem, NOW_TEXT) == expected


def test_the_active_body_is_minimal():
    condition = active()
    assert active_body(admission_check(conditions=[active("False")]), condition) == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": "capacity", "uid": "ac-uid"},
        "status": {"conditions": [condition]},
    }
