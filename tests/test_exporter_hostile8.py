"""The exporter under hostile pass 8 (issue 27).

XU-1: a replica's history, and the windows its rates are read over, ran on the wall
clock. A step back (NTP correcting a clock a day ahead) kept every scrape until the
clock caught up (a day of them a replica) with every rate unknown meanwhile; a step an
hour ahead published a 720th of each rate for a window. The histories now run on the
monotonic clock; the signals are still dated by the wall clock.
"""

from __future__ import annotations

import aiohttp
import pytest

from exporter.config import ExporterConfig
from exporter.runtime import Exporter
from tests.conftest import FakeClock
from tests.fake_engines import FakeReplicaServer

INTERVAL = 5.0


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(-86_400.0, id="the wall clock set back a day keeps the rates and the bound"),
        pytest.param(3_600.0, id="the wall clock set an hour ahead never dilutes the rates"),
        pytest.param(-30.0, id="the wall clock set back half a minute keeps the rates"),
    ],
)
async def test_a_step_of_the_wall_clock_moves_no_rate(step: float) -> None:
    replicas = await FakeReplicaServer(2).start()
    wall, steady = FakeClock(1_000_000.0), FakeClock(50.0)
    config = ExporterConfig.model_validate(
        {
            "interval": "5s",
            "timeout": "2s",
            "deployments": [
                {"namespace": "team-a", "deployment": "llama", "targets": [
                    replicas.url(0), replicas.url(1)
                ]}
            ],
        }
    )  # fmt: skip
    exporter = Exporter(config, wall, steady=steady)
    rates: list[tuple[float | None, float | None]] = []
    try:
        async with aiohttp.ClientSession() as session:
            for cycle in range(40):
                if cycle == 20:
                    wall.now += step
                for replica in replicas.replicas:  # 20 requests a second each
                    replica.finish(100, prompt=100, output=50, ttft=0.1, itl=0.02, e2e=1.0)
                await exporter.cycle(session)
                signals = exporter.deployments[0].signals
                assert signals is not None
                assert signals.time == wall.now  # dated by the wall clock, as before
                if cycle >= 20:
                    rates.append((signals.stable.request_rate, signals.panic.request_rate))
                wall.now += INTERVAL
                steady.now += INTERVAL
    finally:
        exporter.close()
        await replicas.stop()
    # Was None for the day back, 0.014 a second after the hour ahead.
    assert all(v is not None and abs(v - 40.0) < 1e-6 for pair in rates for v in pair), rates
    kept = max(len(h.times) for h in exporter.deployments[0].histories.values())
    assert kept <= config.stable_window / INTERVAL + 4  # was a scrape a cycle for the day
