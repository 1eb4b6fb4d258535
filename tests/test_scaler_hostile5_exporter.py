"""A deployment's discovery naming more replicas than the exporter scrapes is refused alone.

Issue 27, hostile pass 5, S5-H3: the exporter scraped every replica discovery named, all
at once each cycle; a Service's EndpointSlices naming 30,000 endpoints ran it out of file
descriptors, and 5,000 starved the deployment beside it (its one healthy replica timed
out every cycle). Past ``MAX_TARGETS`` the list is not taken: the last one within it is
scraped, no signals are published for that deployment (never "0 replicas"), and the
deployments beside it go on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from exporter import runtime
from exporter.config import ExporterConfig
from exporter.runtime import Exporter
from tests.conftest import FakeClock
from tests.fake_engines import FakeReplicaServer

CAP = 5
"""``MAX_TARGETS`` in these tests: a handful of refused loopback targets, quick."""


@pytest.fixture
async def replicas() -> AsyncIterator[FakeReplicaServer]:
    server = await FakeReplicaServer(1).start()
    yield server
    await server.stop()


def unreachable(count: int) -> list[str]:
    """Loopback targets nothing listens on (refused at once)."""
    return [f"http://127.3.0.{i + 1}:9/metrics" for i in range(count)]


def config(good: str, flood: list[str]) -> ExporterConfig:
    return ExporterConfig.model_validate(
        {
            "timeout": "1s",
            "deployments": [
                {"namespace": "team-a", "deployment": "good", "targets": [good]},
                {"namespace": "team-b", "deployment": "flood", "targets": flood},
            ],
        }
    )


@pytest.mark.parametrize(
    ("count", "taken"),
    [
        pytest.param(CAP, True, id="as many replicas as the bound are scraped"),
        pytest.param(CAP + 1, False, id="one more than the bound is not taken"),
        pytest.param(100 * CAP, False, id="a hundred times the bound is not taken"),
    ],
)
async def test_a_discovery_past_the_bound_publishes_nothing_and_the_others_go_on(
    replicas: FakeReplicaServer, monkeypatch: pytest.MonkeyPatch, count: int, taken: bool
) -> None:
    monkeypatch.setattr(runtime, "MAX_TARGETS", CAP)
    exporter = Exporter(config(replicas.url(0), unreachable(count)), FakeClock())
    async with aiohttp.ClientSession() as session:
        await exporter.cycle(session)
    good, flood = exporter.deployments
    assert good.signals is not None and good.signals.replicas_up == 1
    if taken:
        assert flood.signals is not None and flood.signals.replicas == count
    else:
        assert flood.signals is None and flood.targets == [] and not flood.histories


async def test_the_last_list_within_the_bound_stays_and_signals_come_back_once_within(
    replicas: FakeReplicaServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(runtime, "MAX_TARGETS", CAP)
    exporter = Exporter(config(replicas.url(0), unreachable(2)), FakeClock())
    flood = exporter.deployments[1]
    async with aiohttp.ClientSession() as session:
        await exporter.cycle(session)
        before = list(flood.targets)
        with caplog.at_level(logging.ERROR, logger="exporter.runtime"):
            for count in (CAP + 1, CAP + 2, CAP + 3):  # a count that churns is one line
                flood.config = flood.config.model_copy(update={"targets": unreachable(count)})
                await exporter.cycle(session)
                assert flood.targets == before and flood.signals is None
        assert sum("more than the 5 scraped" in r.getMessage() for r in caplog.records) == 1
        flood.config = flood.config.model_copy(update={"targets": unreachable(3)})
        await exporter.cycle(session)
    assert flood.signals is not None and flood.signals.replicas == 3


def three_floods(counts: tuple[int, int, int]) -> ExporterConfig:
    return ExporterConfig.model_validate(
        {
            "timeout": "1s",
            "deployments": [
                {"namespace": "team-b", "deployment": f"flood-{i}", "targets": unreachable(n)}
                for i, n in enumerate(counts)
            ],
        }
    )


@pytest.mark.parametrize(
    ("counts", "taken"),
    [
        pytest.param((3, 3, 3), [3, 3, 3], id="within both bounds every list is taken"),
        pytest.param(
            (4, 4, 4), [4, 4, 0], id="the third past what the first two leave of all is not"
        ),
        pytest.param((5, 0, 5), [5, 0, 5], id="lists adding up to the total are taken"),
        pytest.param((6, 4, 4), [0, 4, 4], id="one past its own bound leaves the total"),
    ],
)
async def test_discoveries_past_the_total_bound_publish_nothing_for_the_last(
    monkeypatch: pytest.MonkeyPatch, counts: tuple[int, int, int], taken: list[int]
) -> None:
    """256 deployments discovering 1,000 replicas each were 256,000 scrapes a cycle: the
    bound over all of them held only for targets configured (hostile pass 65)."""
    monkeypatch.setattr(runtime, "MAX_TARGETS", CAP)
    monkeypatch.setattr(runtime, "MAX_TOTAL_TARGETS", 2 * CAP)
    exporter = Exporter(three_floods(counts), FakeClock())
    async with aiohttp.ClientSession() as session:
        await exporter.cycle(session)
    assert [len(s.targets) for s in exporter.deployments] == taken
    assert [s.signals is not None for s in exporter.deployments] == [
        n == c for n, c in zip(taken, counts, strict=True)
    ]
