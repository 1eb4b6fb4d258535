"""Fixtures for tests against the real control plane (``@pytest.mark.k8s``).

- ``control_plane`` (session): etcd + kube-apiserver on 127.0.0.1 free ports, a
  kubeconfig file (``control_plane.kubeconfig``) and a tiny sync REST helper.
- ``kube_access`` / ``kube_api``: a ``KubeAccess`` for product code and a configured
  ``kubernetes_asyncio`` ``ApiClient`` for the test itself.
- ``namespace``: a fresh namespace per test (nothing deletes namespaces here).
- ``kueue`` (session, only when asked for): Kueue's CRDs from its Go module, and the
  Kueue controller-manager; ``kueue_crds``: the CRDs alone.
- ``keda`` (module, only when asked for): KEDA's CRDs, operator and metrics server
  (the external metrics APIService) and kube-controller-manager's HPA.
- ``admission_crd`` (session): our CapacityCheckParameters CRD
  (``deploy/admission/crd.yaml``).

Without the binaries the tests skip with the reason; under ``CI=true`` they fail, so
CI never passes by skipping.
"""

from __future__ import annotations

import gc
import os
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from foundation.kube import KubeAccess
from tests.k8s import versions
from tests.k8s.control_plane import (
    ControlPlane,
    Keda,
    Kueue,
    UnavailableError,
    binaries,
    module_dir,
)


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: the k8s tests must run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        bins = binaries()
    except UnavailableError as err:
        unavailable(str(err))
    plane = ControlPlane(bins, tmp_path_factory.mktemp("k8s"))
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def kube_access(control_plane: ControlPlane) -> KubeAccess:
    return KubeAccess(control_plane.kubeconfig)


@pytest.fixture
async def kube_api(kube_access: KubeAccess) -> AsyncIterator[client.ApiClient]:
    async with await kube_access.client() as api:
        yield api


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{secrets.token_hex(3)}"
    control_plane.create_namespace(name)
    return name


def crd_files(module: str, version: str, subdir: str) -> list[Path]:
    try:
        directory = module_dir(module, version) / subdir
    except UnavailableError as err:
        unavailable(str(err))
    files = sorted(directory.glob("*.yaml"))
    if not files:
        unavailable(f"no CRDs in {directory}")
    return files


@pytest.fixture(scope="session")
def kueue(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    try:
        binaries(("kueue",))
    except UnavailableError as err:
        unavailable(str(err))
    module, version = versions.MODULES["kueue"]
    control_plane.apply_crds(crd_files(module, version, "config/components/crd/bases"))
    controller = Kueue(control_plane, tmp_path_factory.mktemp("kueue"))
    try:
        controller.start()
    except UnavailableError as err:
        unavailable(str(err))
    try:
        yield controller
    finally:
        controller.stop()


@pytest.fixture(scope="session")
def kueue_crds(control_plane: ControlPlane) -> list[str]:
    module, version = versions.MODULES["kueue"]
    return control_plane.apply_crds(crd_files(module, version, "config/components/crd/bases"))


@pytest.fixture(scope="session")
def admission_crd(control_plane: ControlPlane) -> list[str]:
    return control_plane.apply_crds([versions.REPO_ROOT / "deploy" / "admission" / "crd.yaml"])


@pytest.fixture(scope="session")
def keda_crds(control_plane: ControlPlane) -> list[str]:
    module, version = versions.MODULES["keda"]
    return control_plane.apply_crds(crd_files(module, version, "config/crd/bases"))


@pytest.fixture(scope="module")
def keda(
    control_plane: ControlPlane, keda_crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Keda]:
    """KEDA's operator and metrics server and kube-controller-manager (HPA, Deployment,
    ReplicaSet controllers), started only for the tests that ask for them, and stopped
    after their module: other tests never meet controllers acting on their objects."""
    try:
        binaries(("kube-controller-manager", "keda-operator", "keda-adapter"))
    except UnavailableError as err:
        unavailable(str(err))
    stack = Keda(control_plane, tmp_path_factory.mktemp("keda"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


@pytest.fixture(autouse=True)
def _garbage_collected_after_each_test() -> Iterator[None]:
    """Collect garbage after each test, so that an unclosed socket or transport is
    reported (as an error, ``filterwarnings = error``) on the test that left it, not on
    whichever later test happens to trigger the collection."""
    yield
    gc.collect()
