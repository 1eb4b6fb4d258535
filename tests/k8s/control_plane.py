"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ Kueue) as subprocesses.

The binaries come from ``tests/k8s/build-control-plane`` (``make k8s-bins``), in the
version-keyed cache of ``tests/k8s/versions.py``. Everything listens on 127.0.0.1 free
ports; the fixture stops only the processes it started. There is no
kube-controller-manager or kubelet: no garbage collection, no namespace deletion, no
pods (as in controller-runtime's envtest).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from foundation.net import free_port
from tests.k8s import versions

FRONT_PROXY_CLIENT = "front-proxy-client"
"""The aggregation layer's client certificate's CN (--requestheader-allowed-names)."""


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, method: str, path: str, code: int, body: str) -> None:
        super().__init__(f"{method} {path}: {code} {body[:1000]}")
        self.code = code
        self.body = body


class UnavailableError(Exception):
    """The control plane cannot run here (no binaries, no Go); the message says why."""


def binaries(names: tuple[str, ...] = ("etcd", "kube-apiserver")) -> Path:
    """The cache directory holding ``names``.

    Raises:
        UnavailableError: a binary is missing (with how to build it, or why it cannot be).
    """
    cache = versions.cache_dir()
    missing = [name for name in names if not (cache / name).exists()]
    if not missing:
        return cache
    if shutil.which("go") is None and not os.access("/usr/local/go/bin/go", os.X_OK):
        raise UnavailableError(
            f"no Go toolchain, so no test control plane ({', '.join(missing)} missing in "
            f"{cache}); install Go >= 1.25 and run `make k8s-bins`"
        )
    raise UnavailableError(f"{', '.join(missing)} not built in {cache}: run `make k8s-bins`")


def module_dir(module: str, version: str) -> Path:
    """Where the Go module cache holds ``module@version`` (downloaded if needed)."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = {**os.environ, "GOSUMDB": os.environ.get("GOSUMDB", "off"), "GOFLAGS": "-mod=mod"}
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        check=False,
    )
    if done.returncode != 0:
        raise UnavailableError(
            f"go mod download {module}@{version} failed: {done.stdout}{done.stderr}"
        )
    return Path(json.loads(done.stdout)["Dir"])


@dataclass
class Process:
    """One subprocess we started, its log in a file."""

    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )

    def check(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Terminate this PID (only ours), kill it after 10 s."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def wait_until(what: str, ready: Any, process: Process, timeout: float = 60.0) -> None:
    """Poll ``ready()`` until true; fail early when ``process`` died."""
    deadline = time.monotonic() + timeout
    while True:
        process.check()
        try:
            if ready():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:.0f}s:\n{process.tail()}")
        time.sleep(0.1)


def _http_ok(url: str, context: ssl.SSLContext | None = None, token: str = "") -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return int(response.status) == 200
    except urllib.error.HTTPError as err:
        err.close()
        return False


@dataclass
class ControlPlane:
    """etcd and kube-apiserver, started and stopped by the session fixture."""

    bins: Path
    workdir: Path
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    processes: dict[str, Process] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        # kube-apiserver self-signs this (SANs include 127.0.0.1) on first start and
        # reuses it on restart.
        return self.workdir / "apiserver-certs" / "apiserver.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start_etcd()
        self._write_credentials()
        self.start_apiserver()
        self._write_kubeconfig()

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        etcd = Process(
            "etcd",
            [
                str(self.bins / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                # Test data: losing it on a crash is fine, fsync costs seconds.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        )
        etcd.start()
        self.processes["etcd"] = etcd
        wait_until("etcd", lambda: _http_ok(f"{client}/health"), etcd)

    def _write_credentials(self) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.workdir / "sa.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        (self.workdir / "sa.pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        (self.workdir / "tokens.csv").write_text(f'{self.token},admin,admin-uid,"system:masters"\n')
        self._write_front_proxy_credentials()

    def _write_front_proxy_credentials(self) -> None:
        """The aggregation layer's front-proxy CA and the client cert kube-apiserver presents
        to aggregated API servers (KEDA's metrics server), which trust that CA for the
        user it names in headers."""
        directory = self.workdir / "front-proxy"
        directory.mkdir(exist_ok=True)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(directory / "ca.crt"))
        client = ca.issue_cert(FRONT_PROXY_CLIENT, common_name=FRONT_PROXY_CLIENT)
        client.cert_chain_pems[0].write_to_path(str(directory / "client.crt"))
        client.private_key_pem.write_to_path(str(directory / "client.key"))

    def start_apiserver(self) -> None:
        """Start (or restart) kube-apiserver on the same port, and wait for /readyz."""
        apiserver = Process(
            "kube-apiserver",
            [
                str(self.bins / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--cert-dir={self.ca_file.parent}",
                f"--secure-port={self.port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # No service-account controller runs, so no default ServiceAccount exists.
                "--disable-admission-plugins=ServiceAccount",
                "--authorization-mode=RBAC",
                f"--service-account-issuer=https://127.0.0.1:{self.port}/",
                f"--service-account-key-file={self.workdir / 'sa.pub'}",
                f"--service-account-signing-key-file={self.workdir / 'sa.key'}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                *self._aggregation_flags(),
                "--v=0",
            ],
            self.workdir / "kube-apiserver.log",
        )
        apiserver.start()
        self.processes["kube-apiserver"] = apiserver
        wait_until("kube-apiserver", self._ready, apiserver)

    def _aggregation_flags(self) -> list[str]:
        front_proxy = self.workdir / "front-proxy"
        return [
            f"--requestheader-client-ca-file={front_proxy / 'ca.crt'}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={front_proxy / 'client.crt'}",
            f"--proxy-client-key-file={front_proxy / 'client.key'}",
        ]

    def _ready(self) -> bool:
        if not self.ca_file.exists():
            return False
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return _http_ok(f"{self.host}/readyz", context, self.token)

    def stop_apiserver(self) -> None:
        self.processes.pop("kube-apiserver").stop()

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again (etcd keeps the data)."""
        self.stop_apiserver()
        self.start_apiserver()

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.host, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def stop(self) -> None:
        """Stop every process we started, newest first."""
        for name in reversed(list(self.processes)):
            self.processes.pop(name).stop()

    # A tiny synchronous REST client for fixtures (CRDs, namespaces): no event loop needed.

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """One API call; returns the decoded JSON.

        Raises:
            ApiError: a non-2xx answer.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.host}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", content_type)
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            with err:  # closes the connection the error holds
                raise ApiError(
                    method, path, err.code, err.read().decode(errors="replace")
                ) from None

    def merge_patch(self, path: str, body: dict[str, Any]) -> Any:
        """A JSON merge patch (status subresources included); returns the object."""
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def ensure(self, path: str, body: dict[str, Any]) -> None:
        """Create the object at collection ``path`` unless it exists."""
        try:
            self.request("POST", path, body)
        except ApiError as err:
            if err.code != 409:
                raise

    def create_namespace(self, name: str) -> None:
        self.ensure("/api/v1/namespaces", {"metadata": {"name": name}})

    def apply_crds(self, files: list[Path], transform: Any = None) -> list[str]:
        """Create the CRDs in ``files`` and wait until each is Established."""
        names = []
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                if transform is not None:
                    doc = transform(doc)
                self.ensure("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
                names.append(doc["metadata"]["name"])
        for name in names:
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            wait_until(
                f"CRD {name}",
                lambda path=path: _established(self.request("GET", path)),
                self.processes["kube-apiserver"],
            )
        return names


def _established(crd: dict[str, Any]) -> bool:
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@dataclass
class Kueue:
    """The Kueue controller-manager, outside a pod, against a ControlPlane.

    Kueue hard-codes its metrics certificate path (``/etc/kueue/metrics/certs``) when
    internal cert management is off; that off switch is what lets it run without its
    webhook Service. So it runs in a private mount namespace (``unshare``) whose
    ``/etc`` is an overlay adding that directory; the real ``/etc`` is untouched.
    Webhooks are not registered with the API server: Kueue's job reconciler handles a
    Job created suspended with the queue-name label without them.
    """

    plane: ControlPlane
    workdir: Path
    health_port: int = field(default_factory=free_port)
    webhook_port: int = field(default_factory=free_port)
    visibility_port: int = field(default_factory=free_port)
    overrides: dict[str, Any] = field(default_factory=dict)
    """Configuration keys set over the fixture's (a benchmark raises clientConnection)."""
    process: Process | None = None

    def start(self) -> None:
        if shutil.which("unshare") is None:
            raise UnavailableError(
                "Kueue needs util-linux `unshare` (see tests/k8s/control_plane.py)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        webhook_certs = self.workdir / "webhook-certs"
        upper = self.workdir / "etc-upper"
        metrics_certs = upper / "kueue" / "metrics" / "certs"
        for directory in (webhook_certs, metrics_certs, self.workdir / "etc-work"):
            directory.mkdir(parents=True, exist_ok=True)
            server.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
            server.private_key_pem.write_to_path(str(directory / "tls.key"))
        (self.workdir / "etc-work" / "tls.crt").unlink()
        (self.workdir / "etc-work" / "tls.key").unlink()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(webhook_certs),
            },
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job"]},
            **self.overrides,
        }
        config_file = self.workdir / "kueue-config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.plane.create_namespace("kueue-system")
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare[1:1] = ["--user", "--map-root-user"]
        script = (
            "mount -t overlay overlay "
            f"-o lowerdir=/etc,upperdir={upper},workdir={self.workdir / 'etc-work'} /etc "
            f'&& exec "$0" "$@"'
        )
        self.process = Process(
            "kueue",
            [
                *unshare,
                "sh",
                "-c",
                script,
                str(self.plane.bins / "kueue"),
                f"--config={config_file}",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--visibility-server-port={self.visibility_port}",
                "--feature-gates=VisibilityOnDemand=false",
            ],
            self.workdir / "kueue.log",
        )
        self.process.start()
        wait_until(
            "kueue",
            lambda: _http_ok(f"http://127.0.0.1:{self.health_port}/readyz"),
            self.process,
            timeout=90,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


KEDA_NAMESPACE = "keda"
METRICS_SERVICE = "keda-metrics-apiserver"
EXTERNAL_METRICS_APISERVICE = "v1beta1.external.metrics.k8s.io"


@dataclass
class Keda:
    """KEDA's operator and metrics API server, and the HPA's kube-controller-manager.

    The metrics server is registered as the ``v1beta1.external.metrics.k8s.io``
    APIService behind an ExternalName Service naming 127.0.0.1: kube-aggregator's
    resolver dials an ExternalName's host and the Service's port as they are, while
    Endpoints and EndpointSlices refuse loopback addresses. Its serving certificate
    names ``keda-metrics-apiserver.keda.svc``, the name the aggregator verifies.
    kube-controller-manager runs only the HPA, Deployment and ReplicaSet controllers
    (``hpa_sync`` seconds between HPA syncs); no scheduler or kubelet, so pods stay
    Pending and the tests watch a Deployment's ``spec.replicas``.
    """

    plane: ControlPlane
    workdir: Path
    hpa_sync: str = "1s"
    operator_grpc_port: int = field(default_factory=free_port)
    operator_health_port: int = field(default_factory=free_port)
    adapter_port: int = field(default_factory=free_port)
    processes: dict[str, Process] = field(default_factory=dict)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        certs = self._write_certs()
        self.plane.create_namespace(KEDA_NAMESPACE)
        env = {
            **os.environ,
            "KUBECONFIG": str(self.plane.kubeconfig),
            "POD_NAMESPACE": KEDA_NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
            "WATCH_NAMESPACE": "",
        }
        self._start("kube-controller-manager", self._controller_manager_args(), env)
        self._start("keda-operator", self._operator_args(certs), env)
        wait_until(
            "keda-operator",
            lambda: _http_ok(f"http://127.0.0.1:{self.operator_health_port}/readyz"),
            self.processes["keda-operator"],
            timeout=90,
        )
        self._start("keda-adapter", self._adapter_args(certs), env)
        self._register_metrics_server(certs)
        wait_until(
            EXTERNAL_METRICS_APISERVICE,
            self._metrics_api_available,
            self.processes["keda-adapter"],
            timeout=90,
        )

    def _write_certs(self) -> Path:
        """One CA and one cert for KEDA's operator <-> metrics server gRPC (mutual TLS,
        ``ca.crt``/``tls.crt``/``tls.key`` in ``--cert-dir``) and the metrics server's
        HTTPS, which the aggregator verifies as the Service's DNS name."""
        directory = self.workdir / "certs"
        directory.mkdir(exist_ok=True)
        ca = trustme.CA()
        cert = ca.issue_cert(
            "127.0.0.1",
            "localhost",
            f"{METRICS_SERVICE}.{KEDA_NAMESPACE}.svc",
            f"keda-operator.{KEDA_NAMESPACE}.svc",
        )
        ca.cert_pem.write_to_path(str(directory / "ca.crt"))
        cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
        cert.private_key_pem.write_to_path(str(directory / "tls.key"))
        return directory

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> None:
        process = Process(name, [str(self.plane.bins / name), *args], self.workdir / f"{name}.log")
        process.start(env)
        self.processes[name] = process

    def _controller_manager_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.plane.kubeconfig}",
            "--controllers=horizontal-pod-autoscaler-controller,deployment-controller,"
            "replicaset-controller",
            f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync}",
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            "--v=1",
        ]

    def _operator_args(self, certs: Path) -> list[str]:
        return [
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--cert-dir={certs}",
            f"--metrics-service-bind-address=127.0.0.1:{self.operator_grpc_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.operator_health_port}",
            "--metrics-bind-address=0",
            "--enable-webhook-patching=false",
            "--enable-apiservice-patching=false",
            f"--ca-dir={certs}",
            "--zap-log-level=info",
        ]

    def _adapter_args(self, certs: Path) -> list[str]:
        kubeconfig = str(self.plane.kubeconfig)
        return [
            f"--kubeconfig={kubeconfig}",
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--secure-port={self.adapter_port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={certs}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--metrics-service-address=127.0.0.1:{self.operator_grpc_port}",
            f"--port={free_port()}",
        ]

    def _register_metrics_server(self, certs: Path) -> None:
        self._replace(
            f"/api/v1/namespaces/{KEDA_NAMESPACE}/services",
            {
                "metadata": {"name": METRICS_SERVICE},
                "spec": {
                    "type": "ExternalName",
                    "externalName": "127.0.0.1",
                    "ports": [{"name": "https", "port": self.adapter_port}],
                },
            },
        )
        ca_bundle = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
        self._replace(
            "/apis/apiregistration.k8s.io/v1/apiservices",
            {
                "metadata": {"name": EXTERNAL_METRICS_APISERVICE},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "service": {
                        "name": METRICS_SERVICE,
                        "namespace": KEDA_NAMESPACE,
                        "port": self.adapter_port,
                    },
                    "caBundle": ca_bundle,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        )

    def _replace(self, collection: str, body: dict[str, Any]) -> None:
        """Create ``body``, replacing an object of that name (an earlier stack's ports)."""
        try:
            self.plane.request("DELETE", f"{collection}/{body['metadata']['name']}")
        except ApiError as err:
            if err.code != 404:
                raise
        self.plane.request("POST", collection, body)

    def _metrics_api_available(self) -> bool:
        for process in self.processes.values():
            process.check()
        service = self.plane.request(
            "GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{EXTERNAL_METRICS_APISERVICE}"
        )
        conditions = service.get("status", {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def log(self, name: str) -> list[str]:
        """The lines ``name`` (keda-operator, keda-adapter, ...) has logged so far."""
        return self.processes[name].log.read_text(errors="replace").splitlines()

    def log_tails(self) -> str:
        return "\n".join(f"--- {n}\n{p.tail()}" for n, p in self.processes.items())

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            self.processes.pop(name).stop()
