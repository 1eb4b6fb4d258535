"""The scaler under hostile pass 8 (issue 27).

SU-1: the Prometheus source followed any redirect its URL answered (aiohttp's default):
a ``302`` to another host had that host asked every query with the configured headers
(a tenant's ``X-Scope-OrgID``, an API key; only ``Authorization`` is dropped across
hosts), and its answers stored as the deployment's signals. A redirect now fails the
query's round, the other host never asked.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from scaler.config import PrometheusSourceConfig
from scaler.signals import SignalStore
from scaler.sources import prometheus_source
from tests.test_prometheus_source import TARGET, drain, source_config, until
from tests.test_scaler_hostile_inputs import HostilePrometheus


class Elsewhere(HostilePrometheus):
    """Another host: answers every query as Prometheus would, and notes the headers."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def _query(self, request: web.Request) -> web.Response:
        self.asked.append(request.headers.get("X-Scope-OrgID", ""))
        return await super()._query(request)


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(302, id="a 302 to another host is not followed and its answers not stored"),
        pytest.param(307, id="a 307 to another host is not followed and its answers not stored"),
        pytest.param(308, id="a 308 to another host is not followed and its answers not stored"),
    ],
)
async def test_a_prometheus_redirect_is_never_followed(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scaler.sources")
    elsewhere = await Elsewhere().start()

    async def moved(request: web.Request) -> web.Response:
        where = f"{elsewhere.url}/api/v1/query?{request.query_string}"
        return web.Response(status=status, headers={"Location": where})

    app = web.Application()
    app.router.add_get("/api/v1/query", moved)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    store = SignalStore()
    config = PrometheusSourceConfig.model_validate(
        source_config(url, interval="20ms", headers={"X-Scope-OrgID": "tenant-a"})
    )
    task = asyncio.create_task(prometheus_source(config, store, lambda: [TARGET]))
    try:
        await until(lambda: store.errors[("prometheus", "query")] >= 3, "three failed rounds")
        assert not task.done()
    finally:
        await drain(task)
        await runner.cleanup()
        await elsewhere.stop()
    assert elsewhere.asked == []  # was every query, each with the tenant's header
    assert store.get(TARGET) is None  # was that host's answers as the deployment's signals
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"answered {status}: a redirect" in warnings[0], warnings
