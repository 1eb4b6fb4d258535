"""The deployment dashboard's Fluid prewarm row, on a real Prometheus and a real API server.

The scaler's prewarm runs against the test API server with Fluid v1.0.8's CRDs (the
stand-ins of ``tests/k8s/test_prewarm.py`` write the Dataset's and the DataLoad's status
as Fluid's controllers would); its ``/metrics`` is scraped by Debian's Prometheus. Once a
scale-from-zero's warm-up has gone from loading to warm, every query of the row, with the
dashboard's variables substituted as Grafana does, must return data.
"""

from __future__ import annotations

import pytest
from aiohttp import web

from scaler.telemetry import metrics_app
from tests.k8s import test_prewarm
from tests.k8s.test_prewarm import Cluster, Scaler, eventually, running
from tests.prometheus_stack import Prometheus, needs_prometheus
from tests.test_dashboards import data, substitute, targets, values_for

pytestmark = [pytest.mark.k8s, needs_prometheus]

fluid_crds = test_prewarm.fluid_crds
"""Fluid's Dataset and DataLoad CRDs on the session's API server (a fixture)."""


@pytest.mark.usefixtures("fluid_crds")
async def test_every_prewarm_panel_query_returns_data(
    control_plane, kube_access, namespace, tmp_path
):
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("0.0%")
    scaler = Scaler(kube_access, namespace, prewarmPaths="/llama-3-8b")
    runner = web.AppRunner(metrics_app(scaler.registry, None, scaler.prewarm))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    prometheus = await Prometheus.start(tmp_path / "prometheus", {"scaler": [f"127.0.0.1:{port}"]})
    try:
        async with running(scaler):
            await eventually("Fluid's objects listed", lambda: scaler.prewarm.listed)
            scaler.arrive()  # a buffered request: a scale-from-zero, which warms first
            (load,) = await eventually("one DataLoad", cluster.dataloads)
            await eventually("loading", lambda: scaler.state() == "loading")
            # Seen loading first, so that the counters' increase is seen too.
            await prometheus.wait_for('unitscale_scaler_prewarm_state{state="loading"} == 1')
            cluster.complete(load["metadata"]["name"])
            cluster.set_cached("100.0%")
            await eventually("warm", lambda: scaler.state() == "warm")
            values = values_for(
                "unitscale-deployment.json", namespace=namespace, scaled_object="llama"
            )
            missing = []
            for _, title, ref, expr in targets(prewarm=True):
                try:
                    await data(prometheus, substitute(expr, values), within=20)
                except AssertionError as err:
                    missing.append(f"{title} ({ref}): {err}")
            assert not missing, "\n".join(missing)
    finally:
        await prometheus.stop()
        await runner.cleanup()
