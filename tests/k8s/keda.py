"""What the KEDA end-to-end tests and ``bench/keda_e2e.py`` drive: a real ``unitscale
scaler`` process fed by a test signal source, and the objects KEDA acts on.

- ``SignalSource``: a ``SignalsService`` (the exporter's and gateway's gRPC watch) on
  127.0.0.1, in a thread of its own, streaming whatever load the test sets; stopping it
  is "the signal source was killed".
- ``Scaler``: ``unitscale scaler`` as a subprocess watching that source (optionally with
  mutual TLS), its policy made immediate (no scale-down delay or window, no forecast).
- ``scaled_object``: a ScaledObject from ``deploy/`` (``SCALED_OBJECTS``, the one place
  tests name those manifests) pointed at the test's scaler and namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import trustme
import yaml
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from foundation.net import free_port
from protos.unitscale.v1 import signals_pb2 as sig
from protos.unitscale.v1 import signals_pb2_grpc as sig_grpc
from tests.k8s import versions
from tests.k8s.control_plane import ApiError, ControlPlane

DEPLOY = versions.REPO_ROOT / "deploy"
SCALED_OBJECTS = {
    # The shipped ScaledObjects, by trigger type: the one place tests name these files.
    "external": DEPLOY / "scaledobjects" / "external.yaml",
    "external-push": DEPLOY / "scaledobjects" / "external-push.yaml",
}

SCALER_SERVICE = "externalscaler.ExternalScaler"


def deploy_manifest(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of a manifest in ``deploy/``."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def eventually(
    condition: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.2
) -> Any:
    """Poll ``condition()`` until it returns something truthy; that value is returned.

    Raises:
        AssertionError: not within ``timeout`` seconds (with the last value seen).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def _stamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


@dataclass
class Load:
    """What the source reports for one deployment (None: no such snapshot)."""

    running: float | None = None
    queued: float = 0.0
    replicas_up: int = 0
    buffered: int | None = None
    in_flight: int = 0

    def messages(self, namespace: str, deployment: str, now: float) -> list[sig.Signals]:
        target = sig.Target(namespace=namespace, deployment=deployment)
        found = []
        if self.running is not None:
            engine = sig.EngineSignals(
                replicas_up=self.replicas_up,
                replicas_scraped=self.replicas_up,
                requests_running=self.running,
                queue_depth=self.queued,
            )
            found.append(
                sig.Signals(
                    target=target,
                    source=sig.SOURCE_EXPORTER,
                    observed_time=_stamp(now),
                    engine=engine,
                )
            )
        if self.buffered is not None:
            gateway = sig.GatewaySignals(buffered=self.buffered, in_flight=self.in_flight)
            found.append(
                sig.Signals(
                    target=target,
                    source=sig.SOURCE_GATEWAY,
                    observed_time=_stamp(now),
                    gateway=gateway,
                )
            )
        return found


class _Publisher(sig_grpc.SignalsServiceServicer):
    """Streams every deployment's load at once on a change, and every ``every`` s."""

    def __init__(self, every: float) -> None:
        self.loads: dict[tuple[str, str], Load] = {}
        self.every = every
        self.changed = asyncio.Event()

    async def WatchSignals(
        self, request: sig.WatchSignalsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[sig.WatchSignalsResponse]:
        while True:
            now = time.time()
            for (namespace, deployment), load in list(self.loads.items()):
                for message in load.messages(namespace, deployment, now):
                    yield sig.WatchSignalsResponse(signals=message)
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), self.every)


class SignalSource:
    """A test ``SignalsService`` on 127.0.0.1:``port``; ``stop()`` kills it, ``start()``
    brings it back on the same port with the same loads."""

    def __init__(self, every: float = 0.5) -> None:
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._publisher = self._call(self._make_publisher(every))
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=30)

    async def _make_publisher(self, every: float) -> _Publisher:
        return _Publisher(every)

    async def _serve(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        sig_grpc.add_SignalsServiceServicer_to_server(self._publisher, server)
        server.add_insecure_port(self.address)
        await server.start()
        return server

    def start(self) -> SignalSource:
        self._server = self._call(self._serve())
        return self

    def set(self, namespace: str, deployment: str, load: Load) -> None:
        """Report ``load`` for the deployment from now on (sent at once)."""

        def update() -> None:
            self._publisher.loads[(namespace, deployment)] = load
            self._publisher.changed.set()

        self._loop.call_soon_threadsafe(update)

    def stop(self) -> None:
        if self._server is not None:
            self._call(self._server.stop(grace=0))
            self._server = None

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


IMMEDIATE_POLICY = {
    # The HPA and KEDA are under test: the scaler's own smoothing is switched off so
    # that its decision is ceil(in flight / 16) at every signal.
    "target-utilization": 1,
    "scale-down-window": "0s",
    "forecast-horizon": "0s",
    "idle-grace": "0s",
}


@dataclass
class ScalerTls:
    """The scaler's serving cert and the client cert KEDA presents (mutual TLS)."""

    directory: Path
    ca: trustme.CA = field(default_factory=trustme.CA)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        client = self.ca.issue_cert("keda-operator")
        self.ca.cert_pem.write_to_path(str(self.directory / "ca.crt"))
        server.cert_chain_pems[0].write_to_path(str(self.directory / "server.crt"))
        server.private_key_pem.write_to_path(str(self.directory / "server.key"))
        client.cert_chain_pems[0].write_to_path(str(self.directory / "client.crt"))
        client.private_key_pem.write_to_path(str(self.directory / "client.key"))

    def secret_data(self) -> dict[str, str]:
        """A Secret's ``stringData`` for the TriggerAuthentication in ``deploy/``."""
        return {
            "ca.crt": (self.directory / "ca.crt").read_text(),
            "tls.crt": (self.directory / "client.crt").read_text(),
            "tls.key": (self.directory / "client.key").read_text(),
        }


@dataclass
class Scaler:
    """``unitscale scaler`` as a subprocess, watching ``source``."""

    source: SignalSource
    workdir: Path
    tls: ScalerTls | None = None
    max_signal_age: str = "3s"
    kubeconfig: Path | None = None
    """Given: the scaler reaches the API server (pools' ScaledObjects are checked there)."""
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"scaler-{self.port}.log"

    def start(self) -> Scaler:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "signal-sources": [
                {"address": self.source.address, "reconnect-min": "100ms", "reconnect-max": "1s"}
            ],
            "max-signal-age": self.max_signal_age,
            "policy": IMMEDIATE_POLICY,
        }
        config_file = self.workdir / f"scaler-{self.port}.yaml"
        config_file.write_text(yaml.safe_dump(config))
        args = [
            str(Path(sys.executable).parent / "unitscale"),
            "scaler",
            f"--listen={self.address}",
            f"--metrics-listen=127.0.0.1:{free_port()}",
            f"--config={config_file}",
        ]
        if self.kubeconfig is not None:
            args.append(f"--kubeconfig={self.kubeconfig}")
        if self.tls is not None:
            d = self.tls.directory
            args += [
                f"--tls-cert={d / 'server.crt'}",
                f"--tls-key={d / 'server.key'}",
                f"--tls-client-ca={d / 'ca.crt'}",
            ]
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=os.environ
            )
        eventually(self._serving, f"unitscale scaler on {self.address}", timeout=60)
        return self

    def _serving(self) -> bool:
        assert self.popen is not None
        if self.popen.poll() is not None:
            raise RuntimeError(f"unitscale scaler exited:\n{self.log.read_text()[-3000:]}")
        return self.log.exists() and "scaler serving on port" in self.log.read_text()

    def health(self) -> Any:
        """The gRPC health status (plain-text only)."""
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=SCALER_SERVICE), timeout=2)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


# The objects KEDA acts on.


def deployment(name: str, replicas: int = 0) -> dict[str, Any]:
    """A Deployment whose pods never run (no scheduler): only spec.replicas matters."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest"}]},
            },
        },
    }


FAST_BEHAVIOR = {
    # One HPA sync per step, no stabilization: what the HPA does is visible at once.
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 1}],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
    },
}


def scaled_object(
    trigger_type: str,
    namespace: str,
    scaler_address: str,
    *,
    polling: int = 1,
    cooldown: int = 2,
    behavior: dict[str, Any] | None = None,
    metadata: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The shipped ScaledObject for ``trigger_type`` (and its TriggerAuthentication) in
    ``namespace``, pointed at the scaler.

    Short ``pollingInterval``/``cooldownPeriod`` and the HPA ``behavior`` (default
    ``FAST_BEHAVIOR``) keep the tests quick; trigger ``metadata`` is set over the file's.
    """
    docs = deploy_manifest(SCALED_OBJECTS[trigger_type])
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        if doc["kind"] != "ScaledObject":
            continue
        spec = doc["spec"]
        spec["pollingInterval"] = polling
        spec["cooldownPeriod"] = cooldown
        advanced = spec.setdefault("advanced", {})
        advanced.setdefault("horizontalPodAutoscalerConfig", {})["behavior"] = (
            behavior if behavior is not None else FAST_BEHAVIOR
        )
        trigger = spec["triggers"][0]
        trigger["metadata"]["scalerAddress"] = scaler_address
        trigger["metadata"].update(metadata or {})
    return docs


PATHS = {
    "ScaledObject": "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects",
    "TriggerAuthentication": "/apis/keda.sh/v1alpha1/namespaces/{ns}/triggerauthentications",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
}


def create(plane: ControlPlane, namespace: str, doc: dict[str, Any]) -> None:
    plane.request("POST", PATHS[doc["kind"]].format(ns=namespace), doc)


def get(plane: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = plane.request("GET", PATHS[kind].format(ns=namespace) + f"/{name}")
    except ApiError as err:
        if err.code == 404:
            return None
        raise
    return found


def replicas(plane: ControlPlane, namespace: str, name: str) -> int:
    found = get(plane, namespace, "Deployment", name)
    assert found is not None, f"Deployment {namespace}/{name} is gone"
    return int(found["spec"].get("replicas", 1))


def condition(so: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """The ScaledObject's condition ``kind`` ({} when KEDA has not set it)."""
    for found in ((so or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return {}


class ReplicaWatch:
    """Every change of one Deployment's ``spec.replicas``, timed as the watch delivers it
    (a thread reading the API server's watch stream; the benchmark's clock)."""

    def __init__(self, plane: ControlPlane, namespace: str, name: str) -> None:
        self.plane = plane
        self.path = (
            f"/apis/apps/v1/namespaces/{namespace}/deployments"
            f"?watch=1&fieldSelector=metadata.name%3D{name}&allowWatchBookmarks=false"
        )
        self.changes: list[tuple[float, int]] = []
        self._changed = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            request = urllib.request.Request(f"{self.plane.host}{self.path}&timeoutSeconds=30")
            request.add_header("Authorization", f"Bearer {self.plane.token}")
            context = ssl.create_default_context(cafile=str(self.plane.ca_file))
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(request, timeout=60, context=context) as stream,
            ):
                for line in stream:
                    event = json.loads(line)
                    count = int(event["object"].get("spec", {}).get("replicas", 1))
                    with self._changed:
                        if not self.changes or self.changes[-1][1] != count:
                            self.changes.append((time.monotonic(), count))
                            self._changed.notify_all()

    def current(self) -> int | None:
        with self._changed:
            return self.changes[-1][1] if self.changes else None

    def wait_for(self, count: int, timeout: float) -> float:
        """When (monotonic) ``spec.replicas`` became ``count``; waits up to ``timeout``.

        Raises:
            TimeoutError: it did not within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self.changes or self.changes[-1][1] != count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"replicas {self.current()} after {timeout:.0f} s, not {count}"
                    )
                self._changed.wait(left)
            return self.changes[-1][0]

    def stop(self) -> None:
        self._stopping = True
