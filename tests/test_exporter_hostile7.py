"""The exporter's ``/metrics`` takes at most a tenth of its event loop, however often scraped.

Issue 27, hostile pass 7, XS-M1: the exporter made its ``/metrics`` body afresh for every
scrape on the event loop that also runs the scrape cycle and the signal streams: 0.5 s
and 5.8 MB at 3,000 replicas, so a few clients scraping in a loop delayed every cycle
(its replicas' scrapes timing out, the deployment partial) and the scaler's signals.
It now answers through ``foundation.loop_share.LoopShare``: a new body only once the
last is older than its CPU cost over a tenth. The cost is faked (a second of CPU a body).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client.core import Metric

import exporter.collector
from exporter.app import ExporterServer
from exporter.config import ExporterConfig

ASKS = 20


@pytest.mark.parametrize(
    ("path", "bodies"),
    [
        pytest.param("/metrics", 1, id="scrapes of /metrics in a loop make one body"),
        pytest.param(
            "/metrics?name[]=unitscale_target_up",
            1,
            id="scrapes asking for one family in a loop make one body too",
        ),
    ],
)
async def test_a_body_costing_a_second_is_made_once_for_scrapes_within_ten_seconds(
    monkeypatch: pytest.MonkeyPatch, path: str, bodies: int
) -> None:
    spent = iter(range(10**9))
    monkeypatch.setattr(time, "thread_time", lambda: float(next(spent)))
    made: list[int] = []
    collect = exporter.collector.SignalsCollector.collect

    def counted(self: exporter.collector.SignalsCollector) -> Iterator[Metric]:
        made.append(1)
        return collect(self)

    monkeypatch.setattr(exporter.collector.SignalsCollector, "collect", counted)
    server = ExporterServer(ExporterConfig(), "127.0.0.1:0", "127.0.0.1:0")
    http_port, _ = await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(ASKS):
                async with session.get(f"http://127.0.0.1:{http_port}{path}") as response:
                    await response.read()
                    assert response.status == 200
    finally:
        await server.stop(0)
    assert len(made) == bodies  # was one a scrape: 20 seconds of the loop for 20 scrapes
