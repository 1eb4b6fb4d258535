"""Every manifest in deploy/ passes a real API server's validation (``dryRun=All``).

Server-side dry run runs defaulting, schema validation (OpenAPI for built-ins, the
CRD's structural schema for KEDA's, Kueue's and our kinds) and admission, then stores
nothing. Objects go into the test's namespace, so the manifests' own namespaces need not
exist. ``deploy/admission/crd.yaml`` itself is not dry-run: the ``admission_crd`` fixture
creates it for real (and waits until it is Established), which its objects need.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.k8s.control_plane import ApiError

pytestmark = pytest.mark.k8s

DEPLOY = Path(__file__).parents[2] / "deploy"


def documents():
    for path in sorted([*DEPLOY.glob("*.yaml"), *DEPLOY.glob("admission/*.yaml")]):
        stem = path.relative_to(DEPLOY).with_suffix("").as_posix()
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] != "CustomResourceDefinition":
                name = f"{stem}-{doc['kind']}-{doc['metadata']['name']}".lower()
                yield pytest.param(doc, id=name)


def collection_path(plane, api_version: str, kind: str, namespace: str) -> str:
    """The URL path to POST a ``kind`` to, found through API discovery."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    for resource in plane.request("GET", base)["resources"]:
        if resource["kind"] == kind and "/" not in resource["name"]:
            if resource["namespaced"]:
                return f"{base}/namespaces/{namespace}/{resource['name']}"
            return f"{base}/{resource['name']}"
    raise AssertionError(f"{api_version} has no kind {kind}")


@pytest.mark.parametrize("manifest", list(documents()))
def test_the_manifest_passes_server_side_validation(
    control_plane, keda_crds, kueue_crds, admission_crd, namespace, manifest
):
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    path = collection_path(control_plane, manifest["apiVersion"], manifest["kind"], namespace)
    try:
        created = control_plane.request(
            "POST", f"{path}?dryRun=All&fieldValidation=Strict", manifest
        )
    except ApiError as err:
        pytest.fail(str(err))
    assert created["metadata"]["name"] == manifest["metadata"]["name"]
    # Nothing was stored.
    with pytest.raises(ApiError) as missing:
        control_plane.request("GET", f"{path}/{manifest['metadata']['name']}")
    assert missing.value.code == 404
