"""Hot reload from a mounted ConfigMap directory: kubelet ``..data`` symlink swaps."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

from exporter.app import ExporterServer
from exporter.config import load_config
from foundation.errors import ConfigError
from foundation.reload import ConfigSource, ConfigStore, parse_configmap_ref
from scaler.config import load_config as load_scaler_config
from scaler.server import ScalerServer
from tests.conftest import eventually
from tests.kubelet_volume import KubeletVolume

SCALER_BEFORE = """
max-signal-age: 30s
signal-sources:
  - address: 127.0.0.1:1
"""
SCALER_AFTER = """
max-signal-age: 10s
signal-sources:
  - address: 127.0.0.1:2
  - address: 127.0.0.1:3
"""


@pytest.fixture
def volume(tmp_path):
    return KubeletVolume(tmp_path / "config")


async def scaler_on(volume, text):
    volume.write({"config.yaml": text})
    path = volume.path("config.yaml")
    source = ConfigSource(path, poll_interval=0.05)
    server = ScalerServer(load_scaler_config(path), "127.0.0.1:0", source=source)
    await server.start()
    return server


async def test_the_scaler_follows_a_kubelet_symlink_swap(volume):
    server = await scaler_on(volume, SCALER_BEFORE)
    try:
        assert server.watched_sources == ["127.0.0.1:1"]
        volume.write({"config.yaml": SCALER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert server.config.max_signal_age == 10.0
        assert server.registry._default_max_age == 10.0
        assert server.watched_sources == ["127.0.0.1:2", "127.0.0.1:3"]
        assert server.configs.errors == 0
    finally:
        await server.stop(grace=0)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("max-signal-age: [", "not valid YAML", id="broken-yaml-is-refused"),
        pytest.param("max-signal-agee: 5s\n", "max-signal-agee", id="an-unknown-key-is-named"),
        pytest.param("max-signal-age: -5s\n", "max-signal-age", id="a-bad-value-is-named"),
        pytest.param(
            "signal-sources: [{address: ''}]\n", "signal-sources.0.address", id="nested-keys-named"
        ),
    ],
)
async def test_a_bad_update_keeps_the_last_good_config(volume, caplog, text, fragment):
    server = await scaler_on(volume, SCALER_BEFORE)
    before = server.config
    try:
        with caplog.at_level(logging.ERROR, logger="foundation.reload"):
            volume.write({"config.yaml": text})
            await eventually(lambda: server.configs.errors == 1, "refused update")
        assert server.config is before
        assert server.watched_sources == ["127.0.0.1:1"]
        assert fragment in server.configs.last_error
        assert any(fragment in r.getMessage() for r in caplog.records)
        # A good update after a bad one applies and clears the error.
        volume.write({"config.yaml": SCALER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert server.configs.last_error == ""
    finally:
        await server.stop(grace=0)


EXPORTER_BEFORE = """
interval: 1s
timeout: 500ms
deployments:
  - {namespace: team-a, deployment: llama, targets: ["127.0.0.1:1"]}
  - {namespace: team-a, deployment: qwen, targets: ["127.0.0.1:2"]}
"""
EXPORTER_AFTER = """
interval: 2s
timeout: 1s
stable-window: 30s
deployments:
  - {namespace: team-a, deployment: llama, targets: ["127.0.0.1:1", "127.0.0.1:3"]}
  - {namespace: team-b, deployment: mistral, targets: ["127.0.0.1:4"]}
"""


async def test_the_exporter_follows_a_kubelet_symlink_swap(volume):
    volume.write({"exporter.yaml": EXPORTER_BEFORE})
    path = volume.path("exporter.yaml")
    server = ExporterServer(load_config(path), source=ConfigSource(path, poll_interval=0.05))
    await server.start()
    try:
        exporter = server.exporter
        await eventually(lambda: exporter.cycles >= 1, "first cycle")
        llama = exporter.deployments[0]
        volume.write({"exporter.yaml": EXPORTER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert (exporter.config.interval, exporter.config.timeout) == (2.0, 1.0)
        assert exporter.config.stable_window == 30.0
        assert [d.key for d in exporter.deployments] == [
            ("team-a", "llama", ""),
            ("team-b", "mistral", ""),
        ]
        # A deployment that stays keeps its state (histories, errors); its config is new.
        assert exporter.deployments[0] is llama
        assert llama.config.targets[-1] == "http://127.0.0.1:3/metrics"
        exposition = generate_latest(server.registry).decode()
        assert 'unitscale_config_reloads_total{result="success"} 1.0' in exposition
        assert 'unitscale_config_reloads_total{result="error"} 0.0' in exposition
    finally:
        await server.stop()


def test_a_store_ignores_an_update_that_changes_nothing():
    store = ConfigStore(load_scaler_config(None), lambda text, origin: load_scaler_config(None))
    assert not store.update("", "same")
    assert (store.reloads, store.errors) == (0, 0)


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        pytest.param("keda/unitscale", ("keda", "unitscale", "config.yaml"), id="key-defaults"),
        pytest.param("a/b:exporter.yaml", ("a", "b", "exporter.yaml"), id="key-after-a-colon"),
    ],
)
def test_configmap_refs(ref, expected):
    assert parse_configmap_ref(ref) == expected


@pytest.mark.parametrize(
    "ref",
    [
        pytest.param("unitscale", id="a-name-without-namespace-is-refused"),
        pytest.param("a/b/c", id="two-slashes-are-refused"),
        pytest.param("/b", id="an-empty-namespace-is-refused"),
    ],
)
def test_bad_configmap_refs(ref):
    with pytest.raises(ConfigError, match="NAMESPACE/NAME"):
        parse_configmap_ref(ref)


def test_file_and_configmap_exclude_each_other(tmp_path):
    with pytest.raises(ConfigError, match="exclude each other"):
        ConfigSource(tmp_path / "x.yaml", "a/b")
