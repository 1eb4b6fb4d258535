"""Admission under the eighth hostile pass (issue 27): the scaler's answer.

The controller asks the scaler what inference needs of one pool
(``admission.demand.fetch_demand``) and parses the answer on its event loop, the one that
also serves ``/metrics``, ``/healthz`` and the watches. A scaler listing 380,000 other
pools without figures (4 MiB, gRPC's default bound) held that loop 1.5 s an answer: a
problem was written for each pool, asked or not. Now only the pool asked is read, and an
answer is at most ``MAX_ANSWER_BYTES``: a larger one is that ask's error (the pool
unknown, ``whenUnavailable`` applies), never a stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from admission.cluster import PoolDemand
from admission.demand import MAX_ANSWER_BYTES, DemandResult, fetch_demand
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc

STALL = 0.3
"""The longest an answer may hold the event loop here (it was 1.5 s); about a tenth of
that is the answer's cost, the rest a margin for shared test machines."""


class Scaler(capacity_pb2_grpc.CapacityServiceServicer):
    """A scaler stand-in answering every ask with ``answer``."""

    def __init__(self, answer: capacity_pb2.GetInferenceDemandResponse) -> None:
        self.answer = answer

    async def GetInferenceDemand(
        self, request: object, context: object
    ) -> capacity_pb2.GetInferenceDemandResponse:
        return self.answer


@contextlib.asynccontextmanager
async def scaler(answer: capacity_pb2.GetInferenceDemandResponse) -> AsyncIterator[str]:
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
    capacity_pb2_grpc.add_CapacityServiceServicer_to_server(Scaler(answer), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def pools(
    size: int, *, figures: bool, first: bool = False
) -> capacity_pb2.GetInferenceDemandResponse:
    """Pools named ``p0``, ``p1``, ... up to about ``size`` bytes; ``first``: h200 leads."""
    answer = capacity_pb2.GetInferenceDemandResponse()
    if first:
        answer.pools.add(pool="h200", accelerators_held=8.0, accelerators_needed=16.0)
    n = 0
    while answer.ByteSize() < size - 100_000:
        for _ in range(5_000):
            entry = answer.pools.add(pool=f"p{n}")
            if figures:
                entry.accelerators_held, entry.accelerators_needed = 1.0, 2.0
            n += 1
    return answer


async def longest_stall(ask: asyncio.Task[DemandResult]) -> float:
    """The longest the event loop went without running a 1 ms ticker while ``ask`` ran."""
    worst, last = 0.0, time.perf_counter()
    while not ask.done():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst


@pytest.mark.parametrize(
    ("answer", "wanted"),
    [
        pytest.param(
            pools(MAX_ANSWER_BYTES - 1024, figures=False),
            "not in the scaler's answer",
            id="a million bytes of other pools without figures is read at once",
        ),
        pytest.param(
            pools(MAX_ANSWER_BYTES - 1024, figures=True, first=True),
            None,
            id="the pool asked among a million bytes of others is read at once",
        ),
        pytest.param(
            pools(4 << 20, figures=False),
            "RESOURCE_EXHAUSTED",
            id="4 MiB of pools is that ask's error, never parsed",
        ),
    ],
)
async def test_a_scaler_s_answer_never_holds_the_controller_s_loop(
    answer: capacity_pb2.GetInferenceDemandResponse, wanted: str | None
) -> None:
    async with scaler(answer) as address:
        ask = asyncio.create_task(fetch_demand(address, "h200", 600, timeout=10))
        stall = await longest_stall(ask)
        result = ask.result()
    assert stall < STALL
    if wanted is None:
        assert result == DemandResult({"h200": PoolDemand("h200", 8.0, 16.0)})
    else:
        assert result.demand is None and wanted in result.error
        assert len(result.error) < 1_100


@pytest.mark.parametrize(
    "others",
    [
        pytest.param(10, id="ten other pools without figures are not named"),
        pytest.param(1_000, id="a thousand other pools named twice are not named"),
    ],
)
async def test_only_the_pool_asked_is_read_from_an_answer(others: int) -> None:
    answer = capacity_pb2.GetInferenceDemandResponse()
    for n in range(others):
        answer.pools.add(pool=f"other-{n}")
        if others > 10:
            answer.pools.add(pool=f"other-{n}")
    answer.pools.add(pool="h200", accelerators_held=1.0, accelerators_needed=3.0)
    async with scaler(answer) as address:
        result = await fetch_demand(address, "h200", 600, timeout=10)
    assert result == DemandResult({"h200": PoolDemand("h200", 1.0, 3.0)})
