"""The fixture itself: a real kube-apiserver on etcd, reachable with the kubeconfig."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from tests.k8s import versions

pytestmark = pytest.mark.k8s


async def test_the_api_server_reports_the_pinned_version(kube_api):
    info = await client.VersionApi(kube_api).get_code()
    assert info.git_version == versions.KUBERNETES
    assert (info.major, info.minor) == ("1", versions.KUBERNETES.split(".")[1])


async def test_each_test_gets_its_own_empty_namespace(kube_api, namespace):
    core = client.CoreV1Api(kube_api)
    assert (await core.list_namespaced_config_map(namespace)).items == []
    await core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"), data={"a": "1"})
    )
    assert (await core.read_namespaced_config_map("x", namespace)).data == {"a": "1"}


def test_the_kubeconfig_file_names_the_server_and_token(control_plane):
    text = control_plane.kubeconfig.read_text()
    assert control_plane.host in text
    assert control_plane.token in text
