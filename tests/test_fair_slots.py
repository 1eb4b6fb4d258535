"""Slots shared fairly among targets: a slow target's queued queries never starve a fast one.

``scaler.fair_slots.FairSlots`` in the Prometheus source (issue 27, hostile pass 23): a
freed slot goes to the waiting key holding the fewest, then having used the fewest
slot-seconds; cancelled waiters never keep or lose a slot.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from aiohttp import web

from scaler.config import PrometheusSourceConfig
from scaler.fair_slots import FairSlots
from scaler.signals import SignalStore
from scaler.sources import prometheus_source
from tests.test_prometheus_source import FakePrometheus, drain, source_config, until


async def test_a_freed_slot_goes_to_the_key_that_used_the_least_not_the_next_in_line() -> None:
    slots, order = FairSlots(2), list[str]()
    release = {key: asyncio.Event() for key in ("slow-1", "slow-2")}

    async def hold(key: str, until_set: asyncio.Event | None) -> None:
        async with slots.slot(key):
            order.append(key)
            if until_set is not None:
                await until_set.wait()

    first = [asyncio.create_task(hold(k, release[k])) for k in ("slow-1", "slow-2")]
    await asyncio.sleep(0)  # both slow keys hold their slot
    queued = [asyncio.create_task(hold("slow-1", None)) for _ in range(3)]
    queued += [asyncio.create_task(hold("honest", None)) for _ in range(3)]
    await asyncio.sleep(0)
    release["slow-1"].set()
    await asyncio.gather(*queued, first[0])
    # The honest key queued after slow-1's three, yet ran its three first.
    assert order == ["slow-1", "slow-2", "honest", "honest", "honest", *["slow-1"] * 3]
    release["slow-2"].set()
    await first[1]


@pytest.mark.parametrize("seed", range(20))
async def test_cancelled_waiters_never_keep_a_slot_and_never_exceed_the_size(seed: int) -> None:
    rng, slots = random.Random(seed), FairSlots(3)
    holding, peak, done = [0], [0], [0]

    async def use(key: int, ticks: int) -> None:
        async with slots.slot(key):
            holding[0] += 1
            peak[0] = max(peak[0], holding[0])
            try:
                for _ in range(ticks):
                    await asyncio.sleep(0)
            finally:
                holding[0] -= 1
            done[0] += 1

    tasks = [asyncio.create_task(use(rng.randrange(5), rng.randrange(4))) for _ in range(60)]
    for _ in range(40):
        await asyncio.sleep(0)
        victim = rng.choice(tasks)
        victim.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert peak[0] <= 3 and holding[0] == 0
    assert slots._busy == 0 and not slots._held and not slots._waiting and not slots._used
    survivors = sum(1 for t in tasks if not t.cancelled())
    assert done[0] >= survivors
    async with slots.slot("after"):  # every slot came back
        assert slots._busy == 1


class SlowForSome(FakePrometheus):
    """Queries naming a ``slow`` deployment hang (each holds its slot the whole timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "later"
        self.honest = 0

    async def _query(self, request: web.Request) -> web.StreamResponse:
        if 'pod=~"slow' in request.query["query"]:
            await asyncio.Event().wait()
        self.honest += 1
        return await super()._query(request)


async def test_targets_whose_queries_take_the_whole_timeout_never_stall_another_target() -> None:
    """A round waited for every target: three slow ones held an honest one to one round in 13 s."""
    server = SlowForSome()
    await server.start()
    store = SignalStore()
    config = PrometheusSourceConfig.model_validate(
        source_config(server.url, interval="50ms", timeout="500ms", **{"max-concurrent-queries": 2})
    )
    targets = [*(("team-a", f"slow{n}", "") for n in range(3)), ("team-a", "llama", "")]
    task = asyncio.create_task(prometheus_source(config, store, lambda: targets))
    try:
        # The slow targets' 54 queries take 13.5 s of both slots; three honest rounds
        # (18 queries each) run on slots as they free, one every half second or so.
        await until(lambda: server.honest >= 3 * 18, "three honest rounds", within=6.0)
    finally:
        await drain(task)
        await server.stop()
