"""Every object deploy/ ships passes a real API server's validation (``dryRun=All``).

What is sent: every object of ``kustomize build`` of the base and of each overlay (the
real kustomize, ``tests/test_deploy.py``; an object identical in several renderings is
sent once), and the example files applied on their own (``deploy/scaledobjects/``,
``deploy/admission/check.yaml`` and ``queues.yaml``). Server-side dry run runs
defaulting, schema validation (OpenAPI for built-ins, the CRD's structural schema for
KEDA's, Kueue's, cert-manager's, the Prometheus Operator's and our kinds;
``fieldValidation=Strict`` refuses an unknown or duplicated field) and admission, then
stores nothing. Namespaced objects go into the test's namespace, so the manifests' own
namespaces need not exist.

CRDs are installed for real first: KEDA's, Kueue's, cert-manager's and the Prometheus
Operator's (ServiceMonitor, PrometheusRule) from their Go modules (cert-manager's
``deploy/crds`` are plain YAML, so the TLS component's Certificates and ClusterIssuers
are validated like the rest), Fluid's from the shared
reference copy when there (nothing deploy/ renders is a Fluid kind yet). Our own CRD
(``deploy/admission/crd.yaml``) is not dry-run: the ``admission_crd`` fixture creates it
from the same file, which is the stronger check, and its objects need it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import versions
from tests.k8s.conftest import crd_files
from tests.k8s.control_plane import ApiError
from tests.shared_data import SHARED
from tests.test_deploy import RENDERINGS, render

pytestmark = pytest.mark.k8s

DEPLOY = Path(__file__).parents[2] / "deploy"
# Applied on their own, not through a kustomization.
EXAMPLES = sorted(
    [
        *DEPLOY.glob("scaledobjects/*.yaml"),
        *(DEPLOY / "admission" / f for f in ("check.yaml", "queues.yaml")),
    ]
)
# Optional here (nothing deploy/ renders is a Fluid kind yet), so not shared(): where
# shared/ lies is still tests.shared_data's one answer.
FLUID_CRDS = SHARED / "crds" / "fluid" if (SHARED / "crds" / "fluid").is_dir() else None


def _id(origin: str, doc: dict[str, Any]) -> str:
    return f"{origin}-{doc['kind']}-{doc['metadata']['name']}".lower()


def documents() -> list[Any]:
    """Every object to dry-run, once each, named after where it first came from.

    The renderings are read when the tests are collected, so without kustomize
    (``tests.test_deploy.render`` skips, or fails under CI=true) only the examples run.
    """
    seen: set[str] = set()
    params = []

    def add(origin: str, doc: dict[str, Any]) -> None:
        key = json.dumps(doc, sort_keys=True)
        if doc["kind"] != "CustomResourceDefinition" and key not in seen:
            seen.add(key)
            params.append(pytest.param(doc, id=_id(origin, doc)))

    for path in EXAMPLES:
        stem = path.relative_to(DEPLOY).with_suffix("").as_posix()
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                add(stem, doc)
    try:
        for directory in RENDERINGS:
            for doc in render(directory):
                add(directory, doc)
    except pytest.skip.Exception:
        pass  # the renderings' own tests report the missing binary
    return params


def collection_path(plane, api_version: str, kind: str, namespace: str) -> str:
    """The URL path to POST a ``kind`` to, found through API discovery."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    for resource in plane.request("GET", base)["resources"]:
        if resource["kind"] == kind and "/" not in resource["name"]:
            if resource["namespaced"]:
                return f"{base}/namespaces/{namespace}/{resource['name']}"
            return f"{base}/{resource['name']}"
    raise AssertionError(f"{api_version} has no kind {kind}")


@pytest.fixture(scope="session")
def cert_manager_crds(control_plane) -> list[str]:
    module, version = versions.MODULES["cert-manager"]
    return control_plane.apply_crds(crd_files(module, version, "deploy/crds"))


@pytest.fixture(scope="session")
def prometheus_operator_crds(control_plane) -> list[str]:
    module, version = versions.MODULES["prometheus-operator"]
    files = crd_files(module, version, "example/prometheus-operator-crd")
    wanted = [
        f for f in files if f.name.endswith(("_servicemonitors.yaml", "_prometheusrules.yaml"))
    ]
    return control_plane.apply_crds(wanted)


@pytest.fixture(scope="session")
def fluid_crds_if_there(control_plane) -> list[str]:
    if FLUID_CRDS is None:
        return []
    kinds = ("datasets", "dataloads")
    return control_plane.apply_crds([FLUID_CRDS / f"data.fluid.io_{k}.yaml" for k in kinds])


def in_namespace(manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The object moved into ``namespace``, with the bindings' subjects alike."""
    moved = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    if "subjects" in manifest:
        moved["subjects"] = [
            {**s, "namespace": namespace} if "namespace" in s else s for s in manifest["subjects"]
        ]
    return moved


@pytest.mark.parametrize("manifest", documents())
def test_the_manifest_passes_server_side_validation(
    control_plane,
    keda_crds,
    kueue_crds,
    cert_manager_crds,
    prometheus_operator_crds,
    fluid_crds_if_there,
    admission_crd,
    namespace,
    manifest,
):
    manifest = in_namespace(manifest, namespace)
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


def test_a_wrong_field_is_refused_so_the_dry_run_can_fail(control_plane, keda_crds, namespace):
    """The same request with one misspelled field answers 400 (else the above prove little)."""
    (scaled,) = [
        d
        for d in yaml.safe_load_all((DEPLOY / "scaledobjects/recommended.yaml").read_text())
        if d["kind"] == "ScaledObject"
    ]
    scaled = in_namespace(scaled, namespace)
    scaled["spec"]["maxReplicaCout"] = scaled["spec"].pop("maxReplicaCount")
    path = collection_path(control_plane, scaled["apiVersion"], "ScaledObject", namespace)
    with pytest.raises(ApiError) as refused:
        control_plane.request("POST", f"{path}?dryRun=All&fieldValidation=Strict", scaled)
    assert refused.value.code in (400, 422)
    assert "maxReplicaCout" in str(refused.value)
