"""Pinned upstream versions of the test control plane and where their binaries live.

Shared by `tests/k8s/build-control-plane` (which builds them) and the pytest fixture
(which runs them), so both always agree on the cache directory.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# kube-apiserver is built from k8s.io/kubernetes; its staging modules are published as
# v0.<minor>.<patch>. 1.35.4 is the newest 1.35 the Go proxy serves, and Kueue 0.17 is
# built against k8s.io/* v0.35.
KUBERNETES = "v1.35.4"
# envtest pairs Kubernetes 1.35/1.36 with etcd 3.6.6/3.6.8; 3.6.8 is on the proxy.
ETCD = "v3.6.8"
# Kueue 0.17: API v1beta2 (storage version); the newest version the Go proxy serves.
KUEUE = "v0.17.0"
# KEDA: its operator and metrics API server (cmd/adapter) are built, its CRDs read from
# the module (config/crd/bases). 2.21 is built against k8s.io/* v0.36.
KEDA = "v2.21.0"

# cert-manager: only its CRDs are read (deploy/crds, plain YAML), for the dry run of
# deploy/components/scaler-tls. v1.21.2: the newest release the Go proxy serves.
CERT_MANAGER = "v1.21.2"
# Prometheus Operator: only its CRDs are read (example/prometheus-operator-crd), for the
# dry run of deploy/components/monitoring (ServiceMonitor, PrometheusRule).
PROMETHEUS_OPERATOR = "v0.85.0"

# kustomize renders deploy/ (tests/test_deploy.py). The standalone binary, not kubectl's
# built-in `kubectl kustomize`: a ~10 s build of a small module graph (kubectl is
# k8s.io/kubernetes again, a long link) at the release we choose, where kubectl 1.35
# embeds an older one. v5.8.2, as v5.8.3 needs Go 1.27.
KUSTOMIZE = "v5.8.2"

BINARIES = (
    "kube-apiserver",
    "etcd",
    "kueue",
    "kube-controller-manager",
    "keda-operator",
    "keda-adapter",
)

MODULES = {
    "kueue": ("sigs.k8s.io/kueue", KUEUE),
    "keda": ("github.com/kedacore/keda/v2", KEDA),
    "cert-manager": ("github.com/cert-manager/cert-manager", CERT_MANAGER),
    "prometheus-operator": (
        "github.com/prometheus-operator/prometheus-operator",
        PROMETHEUS_OPERATOR,
    ),
}


def cache_dir() -> Path:
    """The version-keyed directory holding the built binaries.

    Returns:
        `$UNITSCALE_K8S_CACHE/<key>` when that variable is set, else `.cache/k8s/<key>`
        in the repository (git-ignored).
    """
    root = Path(os.environ.get("UNITSCALE_K8S_CACHE", REPO_ROOT / ".cache" / "k8s"))
    return root / f"kube-{KUBERNETES}_etcd-{ETCD}_kueue-{KUEUE}_keda-{KEDA}"


def kustomize_path() -> Path:
    """The kustomize binary, in a directory of its own next to `cache_dir()`.

    Keyed by kustomize's version alone: bumping it does not relink the control plane,
    and bumping the control plane does not rebuild kustomize.
    """
    return cache_dir().parent / f"kustomize-{KUSTOMIZE}" / "kustomize"
