"""Hot reload from a ConfigMap watched through the API (``--config-configmap``)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from exporter.app import ExporterServer
from exporter.config import parse_config as parse_exporter_config
from foundation.errors import ConfigError
from foundation.reload import ConfigSource
from scaler.config import parse_config
from scaler.server import ScalerServer
from tests.conftest import eventually
from unitscale.cli import main

pytestmark = pytest.mark.k8s

GOOD = "max-signal-age: 30s\nsignal-sources: [{address: '127.0.0.1:1'}]\n"
NEWER = "max-signal-age: 12s\nsignal-sources: [{address: '127.0.0.1:2'}]\n"


def configmap(name, **data):
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data=data)


async def start_scaler(kube_access, namespace):
    source = ConfigSource(configmap=f"{namespace}/unitscale-scaler", kube=kube_access)
    config = parse_config(await source.read(), source.origin)
    server = ScalerServer(config, "127.0.0.1:0", source=source)
    await server.start()
    return server


async def test_the_scaler_follows_its_configmap(kube_api, kube_access, namespace):
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_config_map(
        namespace, configmap("unitscale-scaler", **{"config.yaml": GOOD})
    )
    server = await start_scaler(kube_access, namespace)
    try:
        assert server.watched_sources == ["127.0.0.1:1"]
        await core.patch_namespaced_config_map(
            "unitscale-scaler", namespace, {"data": {"config.yaml": NEWER}}
        )
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert server.config.max_signal_age == 12.0
        assert server.watched_sources == ["127.0.0.1:2"]

        # A bad update: refused, counted, the last good config stays.
        await core.patch_namespaced_config_map(
            "unitscale-scaler", namespace, {"data": {"config.yaml": "max-signal-age: soon\n"}}
        )
        await eventually(lambda: server.configs.errors == 1, "refused update")
        assert "max-signal-age" in server.configs.last_error
        assert server.config.max_signal_age == 12.0

        # The key disappearing is a bad update too, not an empty config.
        await core.replace_namespaced_config_map(
            "unitscale-scaler", namespace, configmap("unitscale-scaler", other="x")
        )
        await eventually(lambda: server.configs.errors == 2, "missing key refused")
        assert "config.yaml" in server.configs.last_error
        assert server.watched_sources == ["127.0.0.1:2"]
    finally:
        await server.stop(grace=0)


async def test_the_exporter_follows_its_configmap(kube_api, kube_access, namespace):
    core = client.CoreV1Api(kube_api)
    text = "deployments: [{deployment: llama, targets: ['127.0.0.1:1']}]\n"
    await core.create_namespaced_config_map(
        namespace, configmap("unitscale-exporter", **{"exporter.yaml": text})
    )
    source = ConfigSource(
        configmap=f"{namespace}/unitscale-exporter:exporter.yaml", kube=kube_access
    )
    server = ExporterServer(parse_exporter_config(await source.read()), source=source)
    await server.start()
    try:
        newer = "interval: 3s\ndeployments: [{deployment: qwen, targets: ['127.0.0.1:2']}]\n"
        await core.patch_namespaced_config_map(
            "unitscale-exporter", namespace, {"data": {"exporter.yaml": newer}}
        )
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert server.exporter.config.interval == 3.0
        assert [d.config.deployment for d in server.exporter.deployments] == ["qwen"]
    finally:
        await server.stop()


async def test_a_missing_configmap_at_startup_is_a_config_error(kube_access, namespace):
    source = ConfigSource(configmap=f"{namespace}/absent", kube=kube_access)
    with pytest.raises(ConfigError, match="absent: 404"):
        await source.read()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param({"config.yaml": "max-signal-age: soon\n"}, "max-signal-age", id="a-bad-key"),
        pytest.param({"other.yaml": GOOD}, "no key 'config.yaml'", id="a-missing-key"),
    ],
)
def test_a_bad_configmap_at_startup_exits_2(control_plane, namespace, capsys, data, fragment):
    control_plane.ensure(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "unitscale-scaler"}, "data": data},
    )
    argv = [
        "scaler",
        "--listen",
        "127.0.0.1:0",
        "--config-configmap",
        f"{namespace}/unitscale-scaler",
        "--kubeconfig",
        str(control_plane.kubeconfig),
    ]
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err
