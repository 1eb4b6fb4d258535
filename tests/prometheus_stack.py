"""A real Prometheus (Debian's) scraping a running unitscale stack under load, for PromQL tests.

Two reusable pieces:

- ``Prometheus``: the ``prometheus`` binary on 127.0.0.1 with a short scrape interval,
  scraping the jobs it is given; ``query`` runs PromQL through the HTTP API (a bad
  expression raises ``PromQLError`` with Prometheus's own message), ``label_values``
  answers as Grafana's ``label_values()`` does, ``wait_for`` polls until a result is
  non-empty, with a deadline.
- ``ServingStack``: simulated vLLM replicas, the gateway, the exporter and the scaler,
  in process on port 0, with a KEDA stand-in asking the scaler every half second and
  clients sending completions through the gateway. ``serve()`` comes up the way a
  fleet does from zero: requests wait in the gateway's buffer until the replicas
  start. ``incidents()`` leaves one of each: requests buffered at zero replicas, every
  replica asleep (vLLM sleep mode) until the gateway wakes one, a request for an unknown
  model (404), a replica that drops a request (an upstream error). A second exporter
  deployment with a replica that is not there gives scrape-error series and a second
  deployment for fleet-wide sums.

Use them together (``tests/test_dashboards.py``): start the stack, point Prometheus at
it, then serve, so that Prometheus sees every counter from before its first event::

    stack = await ServingStack.start()
    prometheus = await Prometheus.start(tmp, stack.scrape_jobs())
    await stack.serve()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import grpc
import pytest
import yaml

from exporter.app import ExporterServer
from exporter.config import ExporterConfig
from foundation.net import free_port
from foundation.replica_model import LLAMA3_8B_H200
from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler.config import ScalerConfig
from scaler.server import ScalerServer
from serving.gateway_settings import GatewaySettings
from serving.server import GatewayServer, SimReplicaServer
from tests.test_gateway_faults import Fake, close_before_headers

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None and os.environ.get("CI") == "true":
    raise RuntimeError("CI must have Debian's prometheus installed (tools/install-system-deps)")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (tools/install-system-deps)"
)

NAMESPACE = "demo"
DEPLOYMENT = "llama-chat"
"""The deployment the stack serves (and its ScaledObject's name)."""
DEAD_DEPLOYMENT = "batch"
"""A second exporter deployment whose one replica never answers."""
MODEL = "sim-llama"


class PromQLError(AssertionError):
    """Prometheus refused a query; the message is Prometheus's."""


@dataclass
class Prometheus:
    """A running ``prometheus`` process and its HTTP API."""

    process: asyncio.subprocess.Process
    port: int
    client: aiohttp.ClientSession
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    async def start(
        cls,
        directory: Path,
        jobs: Mapping[str, Sequence[str]],
        *,
        scrape_interval: str = "500ms",
        rule_files: Sequence[Path] = (),
        within: float = 60.0,
        target_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Prometheus:
        """Start Prometheus scraping ``jobs`` (name -> ``host:port`` targets), ready to query.

        ``target_labels`` gives a target labels of its own (``namespace`` and ``pod``, as
        Kubernetes service discovery would; ``__metrics_path__`` for another path).

        Raises:
            AssertionError: it exited or was not ready within ``within`` seconds.
        """
        assert PROMETHEUS is not None, "prometheus not installed"
        labels = target_labels or {}
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": name, "static_configs": _static_configs(targets, labels)}
                for name, targets in jobs.items()
            ],
        }
        _write_config(directory, config)
        port = free_port()
        log = directory / "prometheus.log"
        with _opened(log) as out:
            process = await asyncio.create_subprocess_exec(
                PROMETHEUS,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        prometheus = cls(process, port, aiohttp.ClientSession(), log)
        try:
            await prometheus._wait_ready(within)
        except BaseException:
            await prometheus.stop()
            raise
        return prometheus

    async def _wait_ready(self, within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            if self.process.returncode is not None:
                raise AssertionError(f"prometheus exited: {self.tail()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with self.client.get(self.url + "/-/ready") as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready within {within:g}s: {self.tail()}")
            await asyncio.sleep(0.1)

    def tail(self, lines: int = 10) -> str:
        """The end of Prometheus's log."""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result (vector or scalar as a one-element list).

        Raises:
            PromQLError: Prometheus refused the expression (its message says why).
        """
        async with self.client.get(self.url + "/api/v1/query", params={"query": promql}) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise PromQLError(f"{promql!r}: {body.get('errorType')}: {body.get('error')}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    async def label_values(self, label: str, match: str | None = None) -> list[str]:
        """Values of ``label`` over series matching ``match``, as Grafana's label_values()."""
        params = {"match[]": match} if match else {}
        async with self.client.get(f"{self.url}/api/v1/label/{label}/values", params=params) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise PromQLError(f"label_values({match}, {label}): {body.get('error')}")
        return list(body["data"])

    async def wait_for(self, promql: str, within: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``promql`` until its result is non-empty.

        Raises:
            AssertionError: still empty after ``within`` seconds (the last result named).
        """
        deadline = time.monotonic() + within
        while not (result := await self.query(promql)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{promql!r} returned no data within {within:g}s")
            await asyncio.sleep(0.25)
        return result

    async def stop(self) -> None:
        """Terminate the process (kill after 10 s) and close the client."""
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        await self.client.close()


def _static_configs(
    targets: Sequence[str], labels: Mapping[str, Mapping[str, str]]
) -> list[dict[str, Any]]:
    """One group for the unlabelled targets, one for each labelled target."""
    plain = [t for t in targets if t not in labels]
    groups: list[dict[str, Any]] = [{"targets": plain}] if plain else []
    groups.extend({"targets": [t], "labels": dict(labels[t])} for t in targets if t in labels)
    return groups


def _write_config(directory: Path, config: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")


def _opened(log: Path) -> BinaryIO:
    return log.open("wb")


def scaled_object_ref() -> keda.ScaledObjectRef:
    """The ScaledObject the stack's KEDA stand-in asks about."""
    return keda.ScaledObjectRef(
        name=DEPLOYMENT,
        namespace=NAMESPACE,
        scalerMetadata={
            "scalerAddress": "unitscale-scaler.keda:9090",
            "deployment": DEPLOYMENT,
            "maxReplicas": "4",
        },
    )


@dataclass
class ServingStack:
    """The whole serving path in process, under load until ``stop()``."""

    ports: list[int]
    speedup: float
    replicas: list[SimReplicaServer]
    gateway: GatewayServer
    exporter: ExporterServer
    scaler: ScalerServer
    exporter_port: int
    dead_target: str
    standbys: list[tuple[ExporterServer, int]] = field(default_factory=list)
    """More exporters scraping the same replicas (the ha overlay runs two), and their
    metrics ports: every series of theirs is the first's again, on another target."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    outcomes: dict[int, int] = field(default_factory=dict)
    """Client-side status counts (0: a client error)."""

    @classmethod
    async def start(
        cls, replicas: int = 2, speedup: float = 50.0, exporters: int = 1
    ) -> ServingStack:
        """Start the gateway, the exporter(s) and the scaler, at zero replicas and no traffic.

        The replicas' ports are chosen now (``scrape_jobs`` names them); ``serve()``
        starts them and the load. The scaler watches the first exporter.
        """
        ports = [free_port() for _ in range(replicas)]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        settings = GatewaySettings(
            namespace=NAMESPACE, deployment=DEPLOYMENT, health_interval=0.1, rate_window=2.0
        )
        gateway = GatewayServer(urls, settings, "127.0.0.1:0", "127.0.0.1:0")
        _, gateway_grpc = await gateway.start()
        dead_target = f"http://127.0.0.1:{free_port()}/metrics"
        exporter_config = ExporterConfig.model_validate(_exporter_config(urls, dead_target))
        exporter = ExporterServer(exporter_config)
        exporter_port, exporter_grpc = await exporter.start()
        scaler = ScalerServer(
            ScalerConfig.model_validate(_scaler_config([exporter_grpc, gateway_grpc])),
            metrics_listen="127.0.0.1:0",
        )
        await scaler.start()
        standbys = []
        for _ in range(exporters - 1):
            standby = ExporterServer(exporter_config)
            standbys.append((standby, (await standby.start())[0]))
        return cls(
            ports, speedup, [], gateway, exporter, scaler, exporter_port, dead_target, standbys
        )

    async def serve(self) -> None:
        """Come up from zero, leave one of each incident, then keep clients sending.

        Requests wait in the gateway's buffer until the replicas start and serve them;
        then ``incidents()``; then four clients send completions until ``stop()``.
        """
        self.tasks.append(asyncio.create_task(self._keda()))
        waiting = [asyncio.create_task(self._send(max_tokens=8)) for _ in range(3)]
        await _until(lambda: self.gateway.gateway.stats.buffered == 3, "3 requests buffered")
        for port in self.ports:
            replica = SimReplicaServer(LLAMA3_8B_H200, f"127.0.0.1:{port}", MODEL, self.speedup)
            await replica.start()
            self.replicas.append(replica)
        await asyncio.gather(*waiting)
        await self.incidents()
        self.tasks.extend(asyncio.create_task(self._client(i)) for i in range(4))

    async def incidents(self) -> None:
        """Requests buffered at zero replicas, a wake from sleep, a 404 and an upstream error.

        A ``rate()`` shows them when Prometheus scraped their series before: the
        gateway's exist from its start (``serving.gateway_metrics``).
        """
        gateway = self.gateway.gateway
        healthy = [r.url for r in self.replicas]
        gateway.reconfigure([], gateway.settings)  # the gateway sees zero replicas
        waiting = [asyncio.create_task(self._send(max_tokens=4)) for _ in range(2)]
        try:
            await _until(lambda: gateway.stats.buffered >= 2, "2 requests buffered")
        finally:
            gateway.reconfigure(healthy, gateway.settings)
        await asyncio.gather(*waiting)
        await self._one_wake()
        await self._send(model="no-such-model")  # the gateway answers 404 itself
        await self._one_upstream_error()

    async def _one_wake(self) -> None:
        """Every replica put to sleep (vLLM sleep mode); a request makes the gateway wake one."""
        pool = self.gateway.gateway.pool
        async with aiohttp.ClientSession() as client:
            for replica in self.replicas:
                async with client.post(f"{replica.url}/sleep?level=1") as r:
                    assert r.status == 200, await r.text()
            await _until(
                lambda: all(pool.find(r.url).sleeping for r in self.replicas), "all seen asleep"
            )
            await asyncio.gather(*(self._send(max_tokens=4) for _ in range(2)))
            for replica in self.replicas:  # the ones the gateway left asleep
                if replica.replica.engine.is_sleeping:
                    async with client.post(f"{replica.url}/wake_up") as r:
                        assert r.status == 200, await r.text()
        await _until(
            lambda: not any(pool.find(r.url).sleeping for r in self.replicas), "all seen awake"
        )

    async def _one_upstream_error(self) -> None:
        """A replica that drops the connection takes requests until one fails (502)."""
        broken = await Fake(close_before_headers).start()
        gateway = self.gateway.gateway
        healthy = [r.url for r in self.replicas]
        try:
            gateway.reconfigure([*healthy, broken.url], gateway.settings)
            ready = len(healthy) + 1
            await _until(lambda: sum(r.ready for r in gateway.replicas) == ready, "all ready")
            deadline = time.monotonic() + 20
            while broken.received == 0 and time.monotonic() < deadline:
                await asyncio.gather(*(self._send(max_tokens=4) for _ in range(4)))
            assert broken.received, "no request reached the broken replica"
        finally:
            gateway.reconfigure(healthy, gateway.settings)
            await broken.stop()

    def scrape_jobs(self) -> dict[str, list[str]]:
        """Prometheus jobs: the exporter, the gateway, the scaler and the replicas' vLLM metrics."""
        return {
            "unitscale-exporter": [
                f"127.0.0.1:{port}" for port in (self.exporter_port, *(p for _, p in self.standbys))
            ],
            "unitscale-gateway": [f"127.0.0.1:{self.gateway.port}"],
            "unitscale-scaler": [f"127.0.0.1:{self.scaler.metrics_port}"],
            "vllm": [f"127.0.0.1:{port}" for port in self.ports],
        }

    async def _keda(self) -> None:
        """KEDA's operator and HPA: GetMetricSpec, GetMetrics and IsActive twice a second."""
        ref = scaled_object_ref()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.scaler.port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):  # UNAVAILABLE until signals
                    spec = (await stub.GetMetricSpec(ref)).metricSpecs[0]
                    await stub.IsActive(ref)
                    metric = keda.GetMetricsRequest(scaledObjectRef=ref, metricName=spec.metricName)
                    await stub.GetMetrics(metric)
                await asyncio.sleep(0.5)

    async def _client(self, index: int) -> None:
        """One client: a completion after another, every fourth streamed."""
        count = 0
        while True:
            count += 1
            await self._send(max_tokens=24, stream=count % 4 == index % 4)
            await asyncio.sleep(0.02)  # leave the 2 cores some air between requests

    async def _send(self, *, max_tokens: int = 8, stream: bool = False, model: str = MODEL) -> None:
        body = {"model": model, "prompt": [100] * 64, "max_tokens": max_tokens, "stream": stream}
        url = f"http://127.0.0.1:{self.gateway.port}/v1/completions"
        status = 0
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
                await r.read()
                status = r.status
        self.outcomes[status] = self.outcomes.get(status, 0) + 1

    async def stop(self) -> None:
        """Stop the clients, then every server."""
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.scaler.stop(grace=0)
        await self.exporter.stop(grace=0)
        for standby, _ in self.standbys:
            await standby.stop(grace=0)
        await self.gateway.stop()
        for replica in self.replicas:
            await replica.stop()


def _exporter_config(urls: list[str], dead_target: str) -> dict[str, Any]:
    return {
        "interval": "500ms",
        "timeout": "400ms",
        "panic-window": "2s",
        "stable-window": "6s",
        "deployments": [
            {
                "namespace": NAMESPACE,
                "deployment": DEPLOYMENT,
                "engine": "vllm",
                "targets": [f"{u}/metrics" for u in urls],
                "accelerator": {"price-per-hour": 3.5},
            },
            {"namespace": NAMESPACE, "deployment": DEAD_DEPLOYMENT, "targets": [dead_target]},
        ],
    }


def _scaler_config(sources: list[int]) -> dict[str, Any]:
    return {
        "signal-sources": [
            {"address": f"127.0.0.1:{port}", "reconnect-min": "50ms", "reconnect-max": "1s"}
            for port in sources
        ],
        "max-signal-age": "5s",
    }


async def _until(predicate: Any, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {within:g}s")
        await asyncio.sleep(0.02)
