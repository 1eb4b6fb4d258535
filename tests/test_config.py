from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from foundation.errors import ConfigError
from scaler.config import ScalerConfig, load_config, parse_config

DEPLOY = Path(__file__).parent.parent / "deploy"


def test_the_documented_example_parses_to_the_defaults():
    configmap = yaml.safe_load((DEPLOY / "scaler-configmap.yaml").read_text())
    assert parse_config(configmap["data"]["_example"]) == ScalerConfig()


def test_the_shipped_config_parses():
    configmap = yaml.safe_load((DEPLOY / "scaler-configmap.yaml").read_text())
    config = parse_config(configmap["data"]["config.yaml"])
    assert [s.address for s in config.signal_sources] == [
        "unitscale-exporter.unitscale.svc:9091",
        "unitscale-gateway.unitscale.svc:9091",
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("max-signal-age: soon", "key 'max-signal-age'='soon'", id="bad-duration"),
        pytest.param("max-signal-age: 0s", "greater than 0", id="zero-age"),
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

    configmap = yaml.safe_load((DEPLOY / "exporter-configmap.yaml").read_text())
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

    configmap = yaml.safe_load((DEPLOY / "gateway-configmap.yaml").read_text())
    assert parse_gateway(configmap["data"]["_example"], "_example") == GatewayConfig()
    shipped = parse_gateway(configmap["data"]["gateway.yaml"], "gateway.yaml")
    assert shipped.endpoint_slices is not None and shipped.endpoint_slices.service == "llama-chat"
