"""The exporter's parse threads under replicas whose bodies are costly to read (issue 27's
eighteenth hostile pass).

A replica may send the 4 MiB cap in a shape that takes half a second to read. Parsed first
come, first served on the two parse threads, five such replicas held every honest scrape
past its deadline; the smallest waiting body now goes first.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError

import aiohttp
import pytest
from aiohttp import web

from exporter.parse import DEFAULT_LIMITS
from exporter.parse_pool import ParsePool
from exporter.runtime import PARSE_WORKERS
from exporter.scrape import scrape
from tests.conftest import served_app

COSTLY = b"a 1\n" * (DEFAULT_LIMITS.max_bytes // 4 - 1)
"""4 MiB of short unwanted lines: about half a second to read on this machine."""
HONEST = (
    b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 0\n'
)


def held(pool: ParsePool) -> threading.Event:
    """Hold the pool's only thread until the event is set."""
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    pool.submit(0, hold)
    assert started.wait(10)
    return release


def test_the_smallest_waiting_body_is_parsed_first() -> None:
    pool, order = ParsePool(1), list[int]()
    release = held(pool)
    futures = [pool.submit(size, order.append, size) for size in (4_000_000, 50_000, 90, 50_000)]
    release.set()
    for future in futures:
        future.result(10)
    assert order == [90, 50_000, 50_000, 4_000_000]
    pool.shutdown()


def test_a_body_whose_scrape_gave_up_before_a_thread_took_it_is_never_parsed() -> None:
    pool, ran = ParsePool(1), list[str]()
    release = held(pool)
    gave_up = pool.submit(10, ran.append, "gave up")
    kept = pool.submit(20, ran.append, "kept")
    assert gave_up.cancel()
    release.set()
    kept.result(10)
    assert ran == ["kept"]
    waiting = pool.submit(30, ran.append, "at shutdown")
    pool.shutdown()
    with pytest.raises(CancelledError):
        waiting.result(10)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(1, ran.append, "after")


def test_a_parse_that_raises_hands_its_error_to_the_scrape() -> None:
    pool = ParsePool(PARSE_WORKERS)
    with pytest.raises(ValueError, match="bad body"):
        pool.submit(1, int, "bad body").result(10)
    assert pool.submit(1, int, "7").result(10) == 7
    pool.shutdown()


async def test_replicas_sending_costly_bodies_never_hold_an_honest_scrape_past_its_deadline():
    """Twelve replicas of 4 MiB each (about 6 s of parsing together, on two threads) beside
    five honest ones answering in 50 ms: every honest scrape ends within its 3 s, an honest
    body waiting at most for the two being parsed when it arrived."""

    async def costly(request: web.Request) -> web.Response:
        return web.Response(body=COSTLY)

    async def honest(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)
        return web.Response(body=HONEST)

    app = web.Application()
    app.router.add_get("/costly", costly)
    app.router.add_get("/honest", honest)
    pool = ParsePool(PARSE_WORKERS)
    try:
        async with served_app(app) as url, aiohttp.ClientSession() as session:
            targets = [f"{url}/costly"] * 12 + [f"{url}/honest"] * 5
            results = await asyncio.gather(
                *(scrape(session, t, 3.0, "vllm", DEFAULT_LIMITS, pool) for t in targets)
            )
    finally:
        pool.shutdown()
    assert [(r.error, r.detail) for r in results[12:]] == [(None, "")] * 5
    assert all(r.stats is not None and r.stats.gauges["running"] == 1 for r in results[12:])
