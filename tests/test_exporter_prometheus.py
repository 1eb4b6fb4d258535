"""A real Prometheus (Debian's package) scrapes the exporter; PromQL sees the signals."""

from __future__ import annotations

import asyncio
import os
import shutil

import aiohttp
import pytest

from exporter.app import ExporterServer
from exporter.config import ExporterConfig
from foundation.net import free_port
from tests.fake_engines import FakeReplicaServer

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None and os.environ.get("CI") == "true":
    raise RuntimeError("CI must have Debian's prometheus installed (.ci/run installs it)")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
)


async def query(client, port, promql):
    url = f"http://127.0.0.1:{port}/api/v1/query"
    async with client.get(url, params={"query": promql}) as response:
        body = await response.json()
    assert body["status"] == "success", body
    return {
        tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in body["data"]["result"]
    }


async def test_promql_reads_the_exported_signals(tmp_path):
    replicas = await FakeReplicaServer(2).start()
    replicas.replicas[0].set_load(running=7, waiting=3, kv=0.25)
    replicas.replicas[1].set_load(running=5, waiting=1, kv=0.75)
    exporter = ExporterServer(
        ExporterConfig.model_validate(
            {
                "interval": "500ms",
                "timeout": "300ms",
                "deployments": [
                    {
                        "namespace": "team-a",
                        "deployment": "llama",
                        "targets": [replicas.url(0), replicas.url(1)],
                    }
                ],
            }
        )
    )
    http_port, _ = await exporter.start()
    prometheus_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: unitscale-exporter\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{http_port}']}}]\n"
    )
    assert PROMETHEUS is not None
    process = await asyncio.create_subprocess_exec(
        PROMETHEUS,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{prometheus_port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as client:
            queue: dict[tuple[tuple[str, str], ...], float] = {}
            async with asyncio.timeout(60):
                while not queue:
                    await asyncio.sleep(0.5)
                    try:
                        queue = await query(
                            client, prometheus_port, 'unitscale_queue_depth{deployment="llama"}'
                        )
                    except aiohttp.ClientError:
                        continue  # Prometheus still starting
            assert list(queue.values()) == [4.0]
            running = await query(
                client, prometheus_port, "sum by (deployment) (unitscale_requests_running)"
            )
            assert running == {(("deployment", "llama"),): 12.0}
            kv = await query(
                client, prometheus_port, 'unitscale_kv_cache_usage{namespace="team-a"}'
            )
            assert list(kv.values()) == [0.5]
            up = await query(client, prometheus_port, "sum(unitscale_target_up)")
            assert list(up.values()) == [2.0]
            assert await query(client, prometheus_port, 'up{job="unitscale-exporter"}') != {}
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
        await exporter.stop(grace=0)
        await replicas.stop()
