from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from foundation.errors import ConfigError
from scaler.config import ScalerConfig, load_config, parse_config

DEPLOY = Path(__file__).parent.parent / "deploy"


def test_the_documented_example_parses_to_the_defaults():
    configmap = yaml.safe_load((DEPLOY / "scaler" / "configmap.yaml").read_text())
    assert parse_config(configmap["data"]["_example"]) == ScalerConfig()


def test_the_shipped_config_parses():
    configmap = yaml.safe_load((DEPLOY / "scaler" / "configmap.yaml").read_text())
    config = parse_config(configmap["data"]["config.yaml"])
    assert [s.address for s in config.signal_sources] == [
        "unitscale-exporter.unitscale.svc:9091",
        "unitscale-gateway.unitscale.svc:9093",  # the gateway's --grpc-listen
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("max-signal-age: soon", "key 'max-signal-age'='soon'", id="bad-duration"),
        pytest.param("max-signal-age: 0s", "greater than or equal to 0.1", id="zero-age"),
        pytest.param("max-signal-ages: 5s", "unknown key 'max-signal-ages'", id="typo"),
        pytest.param(
            "signal-sources: [{reconnect-min: 1s}]",
            "missing required key 'signal-sources.0.address'",
            id="nested-missing-key-has-its-path",
        ),
        pytest.param("- a\n- b", "expected a mapping", id="not-a-mapping"),
        pytest.param("a: [", "not valid YAML", id="broken-yaml"),
    ],
)
def test_bad_config_names_the_key(text, fragment):
    with pytest.raises(ConfigError, match=r"config\.yaml") as caught:
        parse_config(text, origin="config.yaml")
    assert fragment in str(caught.value)


def test_an_empty_file_is_the_defaults(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("")
    assert load_config(path) == ScalerConfig()


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_the_exporter_example_parses_to_the_defaults():
    from exporter.config import ExporterConfig, load_config

    configmap = yaml.safe_load((DEPLOY / "exporter" / "configmap.yaml").read_text())
    example = yaml.safe_load(configmap["data"]["_example"])
    assert load_config(None, example) == ExporterConfig()
    shipped = load_config(None, yaml.safe_load(configmap["data"]["exporter.yaml"]))
    assert [d.accelerator.fraction() for d in shipped.deployments] == [1.0, 0.5]


def test_a_reloaded_policy_section_reaches_every_scaled_object():
    from scaler.registry import ScaledObjectRegistry
    from scaler.signals import SignalStore

    registry = ScaledObjectRegistry(
        SignalStore(), 30.0, policy_defaults=ScalerConfig().policy.policy()
    )
    meta = {"scalerAddress": "s:1", "deployment": "llama", "sloTtft": "1s"}
    scaled = registry.resolve("llama", "team-a", meta)
    reloaded = parse_config("policy: {target-utilization: 0.9, slo-ttft: 3s}")
    registry.set_policy_defaults(reloaded.policy.policy())
    assert scaled.policy.target_utilization == 0.9  # from the new config
    assert scaled.policy.slo_ttft_seconds == 1.0  # the ScaledObject's own override stays


def test_the_gateway_example_parses_to_the_defaults():
    from serving.config import GatewayConfig
    from serving.config import parse_config as parse_gateway

    configmap = yaml.safe_load((DEPLOY / "gateway" / "configmap.yaml").read_text())
    assert parse_gateway(configmap["data"]["_example"], "_example") == GatewayConfig()
    shipped = parse_gateway(configmap["data"]["gateway.yaml"], "gateway.yaml")
    assert shipped.endpoint_slices is not None and shipped.endpoint_slices.service == "llama-chat"


def _scaler(text):
    return parse_config(text, origin="config.yaml")


def _exporter(text):
    from exporter.config import parse_config as parse_exporter

    return parse_exporter(text, origin="config.yaml")


def _gateway(text):
    from serving.config import parse_config as parse_gateway

    return parse_gateway(text, origin="config.yaml")


BIG = 10**400


@pytest.mark.parametrize(
    ("parse", "text", "fragments"),
    [
        pytest.param(
            _scaler, "max-signal-age: null", ["key 'max-signal-age'=None", "duration", "null"],
            id="scaler-a-null-duration-names-the-key-and-the-allowed-form",
        ),
        pytest.param(
            _scaler, "max-signal-age: [1, 2]",
            ["key 'max-signal-age'=a list of 2 items", "duration"],
            id="scaler-a-list-for-a-duration-names-the-key",
        ),
        pytest.param(
            _scaler, "max-signal-age: {a: 1}", ["key 'max-signal-age'", "got a mapping"],
            id="scaler-a-mapping-for-a-duration-names-the-key",
        ),
        pytest.param(
            _scaler, "max-signal-age: 2024-01-01", ["key 'max-signal-age'", "got a date"],
            id="scaler-a-date-for-a-duration-names-the-key",
        ),
        pytest.param(
            _scaler, f"max-signal-age: {BIG}", ["key 'max-signal-age'", "bits"],
            id="scaler-an-integer-beyond-floats-names-the-key",
        ),
        pytest.param(
            _scaler, "signal-sources: [{address: 'a:1', reconnect-min: ~}]",
            ["key 'signal-sources.0.reconnect-min'", "null"],
            id="scaler-a-nested-null-duration-has-its-path",
        ),
        pytest.param(
            _scaler, "policy: {slo-ttft: 2024-01-01 10:00:00}",
            ["key 'policy.slo-ttft'", "timestamp"],
            id="scaler-a-timestamp-in-the-policy-has-its-path",
        ),
        pytest.param(
            _scaler, "policy: {target-concurrency: .inf}", ["key 'policy.target-concurrency'"],
            id="scaler-an-infinite-number-is-refused",
        ),
        pytest.param(
            _scaler, "policy: {target-concurrency: true, headroom-max: false}",
            ["target-concurrency", "expected a number, got True"],
            id="scaler-a-boolean-is-no-number-in-the-policy",
        ),
        pytest.param(
            _scaler, "max-signal-age: 5_0s", ["key 'max-signal-age'='5_0s'"],
            id="scaler-underscores-are-not-a-duration",
        ),
        pytest.param(
            _exporter, "interval: [1]", ["key 'interval'", "got a list"],
            id="exporter-a-list-for-the-interval-names-the-key",
        ),
        pytest.param(
            _exporter, "interval: ~", ["key 'interval'", "null"],
            id="exporter-a-null-interval-names-the-key",
        ),
        pytest.param(
            _exporter, "deployments: [{accelerator: {price-per-hour: .inf}}]",
            ["key 'deployments.0.accelerator.price-per-hour'"],
            id="exporter-an-infinite-price-is-refused",
        ),
        pytest.param(
            _exporter, "deployments: [{accelerator: {price-per-hour: 1e9}}]",
            ["key 'deployments.0.accelerator.price-per-hour'"],
            id="exporter-a-billion-dollar-accelerator-hour-is-refused",
        ),
        pytest.param(
            _exporter, "deployments: [{targets: ['http://[::1']}]",
            ["key 'deployments.0.targets'"],
            id="exporter-a-broken-url-names-the-key",
        ),
        pytest.param(
            _exporter, "deployments: 5", ["key 'deployments'"],
            id="exporter-a-number-for-the-deployments-names-the-key",
        ),
        pytest.param(
            _gateway, "buffer-timeout: {a: 1}", ["key 'buffer-timeout'", "got a mapping"],
            id="gateway-a-mapping-for-the-buffer-timeout-names-the-key",
        ),
        pytest.param(
            _gateway, "buffer-timeout: 2024-01-01", ["key 'buffer-timeout'", "got a date"],
            id="gateway-a-date-for-the-buffer-timeout-names-the-key",
        ),
        pytest.param(
            _gateway, "health-interval: ~", ["key 'health-interval'", "null"],
            id="gateway-a-null-health-interval-names-the-key",
        ),
        pytest.param(
            _gateway, "replicas: [5]", ["key 'replicas.0'"],
            id="gateway-a-number-for-a-replica-url-names-the-key",
        ),
        pytest.param(
            _gateway, "a: " + "[" * 5000 + "]" * 5000, ["nested too deeply"],
            id="gateway-yaml-nested-beyond-the-parser-is-a-config-error",
        ),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_a_config_error_naming_the_key(parse, text, fragments):
    with pytest.raises(ConfigError, match=r"config\.yaml") as caught:
        parse(text)
    for fragment in fragments:
        assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("parse", "text", "shown"),
    [
        pytest.param(
            _scaler, "max-signal-age: '" + "9" * 1_000_000 + "x'", "(1000001 characters)",
            id="scaler-a-megabyte-duration-is-quoted-with-a-cap",
        ),
        pytest.param(
            _scaler, "".join(f"unknown-{i}: 1\n" for i in range(10_000)), "more problems",
            id="scaler-ten-thousand-unknown-keys-are-counted-not-listed",
        ),
        pytest.param(
            _scaler, "'" + "k" * 1000 + "': 1", "(1000 characters)",
            id="scaler-a-long-unknown-key-is-quoted-with-a-cap",
        ),
        pytest.param(
            _exporter, "deployments: [{targets: ['" + "h" * 1_000_000 + "://x']}]",
            "(1000004 characters)",
            id="exporter-a-megabyte-target-is-quoted-with-a-cap",
        ),
        pytest.param(
            _gateway, "dns: '" + "h" * 1_000_000 + "'", "(1000000 characters)",
            id="gateway-a-megabyte-dns-name-is-quoted-with-a-cap",
        ),
        pytest.param(
            _gateway, "replicas: ['" + "h" * 1_000_000 + "']", "(1000000 characters)",
            id="gateway-a-megabyte-replica-url-is-quoted-with-a-cap",
        ),
    ],
)  # fmt: skip
def test_a_huge_value_gives_a_short_message(parse, text, shown):
    with pytest.raises(ConfigError) as caught:
        parse(text)
    message = str(caught.value)
    assert shown in message
    assert len(message) < 4000, len(message)


@pytest.mark.parametrize(
    "load",
    [
        pytest.param(load_config, id="the-scaler-names-a-file-that-is-not-utf-8"),
        pytest.param(
            lambda path: __import__("exporter.config").config.load_config(path),
            id="the-exporter-names-a-file-that-is-not-utf-8",
        ),
    ],
)
def test_a_file_that_is_not_utf_8_is_a_config_error(tmp_path, load):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"max-signal-age: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"cannot read config file .*config\.yaml"):
        load(path)


def test_a_validator_that_raises_something_else_is_still_a_config_error_naming_the_key():
    """Defence in depth: only ValueError becomes a pydantic error; the rest would escape."""
    from typing import Annotated

    from pydantic import BaseModel, BeforeValidator

    from foundation.configfile import KEBAB_CASE, validate

    def fragile(value: object) -> object:
        return {"a": 1}[str(value)]  # KeyError for anything but "a"

    class Fragile(BaseModel):
        model_config = KEBAB_CASE
        plain: int = 0
        touchy_key: Annotated[int, BeforeValidator(fragile)] = 1

    assert validate(Fragile, {"touchy-key": "a"}, "x.yaml").touchy_key == 1
    with pytest.raises(ConfigError, match=r"x\.yaml: key 'touchy-key'='b': invalid \(KeyError"):
        validate(Fragile, {"plain": 2, "touchy-key": "b"}, "x.yaml")


@pytest.mark.parametrize(
    ("key", "why"),
    [
        pytest.param("panic-threshold", "no panic mode", id="panic-threshold says panic is gone"),
        pytest.param("panic-hold", "no panic mode", id="panic-hold says so too"),
        pytest.param(
            "forecast-lookback", "no linear trend", id="forecast-lookback names the trend"
        ),
        pytest.param(
            "risk-quantile", "no risk-sized", id="risk-quantile says the risk headroom is gone"
        ),
        pytest.param("risk-lookback", "no risk-sized", id="risk-lookback says so too"),
    ],
)
def test_a_removed_policy_key_is_refused_with_why(key: str, why: str) -> None:
    from pydantic import ValidationError

    from scaler.config import PolicyConfig

    with pytest.raises(ValidationError, match=f"{key}: removed \\({why}"):
        PolicyConfig.model_validate({key: 1, "slo-ttft": "2s"})
