"""The exporter's parse threads under replicas whose bodies are costly to read (issue 27's
eighteenth hostile pass).

A replica may send the 4 MiB cap in a shape that takes half a second to read. Parsed first
come, first served on the two parse threads, five such replicas held every honest scrape
past its deadline (pass 19: two, when each held a thread a second). The smallest waiting
body now goes first, and one thread is kept for small bodies.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError

import aiohttp
import pytest
from aiohttp import web

from exporter.parse import DEFAULT_LIMITS
from exporter.parse_pool import SMALL_BODY, ParsePool
from exporter.runtime import PARSE_WORKERS
from exporter.scrape import scrape
from tests.conftest import served_app

COSTLY = b"a 1\n" * (DEFAULT_LIMITS.max_bytes // 4 - 1)
"""4 MiB of short unwanted lines: about half a second to read on this machine."""
HONEST = (
    b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 0\n'
)


LARGE = SMALL_BODY + 1
"""A body too large for the thread kept for small ones."""


def held(pool: ParsePool, threads: int = 1) -> threading.Event:
    """Hold ``threads`` of the pool's threads for large bodies until the event is set."""
    release, started = threading.Event(), threading.Semaphore(0)

    def hold() -> None:
        started.release()
        release.wait(60)

    for _ in range(threads):
        pool.submit(4 * LARGE, hold)
    for _ in range(threads):
        assert started.acquire(timeout=10)
    return release


def test_the_smallest_waiting_body_is_parsed_first() -> None:
    pool, order = ParsePool(1), list[int]()
    release = held(pool)
    sizes = (4_000_000, 2 * LARGE, LARGE, 2 * LARGE)
    futures = [pool.submit(size, order.append, size) for size in sizes]
    release.set()
    for future in futures:
        future.result(10)
    assert order == [LARGE, 2 * LARGE, 2 * LARGE, 4_000_000]
    pool.shutdown()


def test_a_small_body_starts_while_every_other_thread_parses_a_large_one() -> None:
    pool = ParsePool(PARSE_WORKERS)
    release = held(pool, PARSE_WORKERS)
    try:
        assert pool.submit(SMALL_BODY, len, "honest").result(5) == 6
        waiting = pool.submit(LARGE, len, "large")
        assert not waiting.done()  # no thread of its size is free
    finally:
        release.set()
    assert waiting.result(10) == 5
    pool.shutdown()


def test_a_body_whose_scrape_gave_up_before_a_thread_took_it_is_never_parsed() -> None:
    pool, ran = ParsePool(1), list[str]()
    release = held(pool)
    gave_up = pool.submit(LARGE, ran.append, "gave up")
    kept = pool.submit(2 * LARGE, ran.append, "kept")
    assert gave_up.cancel()
    release.set()
    kept.result(10)
    assert ran == ["kept"]
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(1, ran.append, "after")


def test_shutdown_cancels_the_bodies_still_waiting() -> None:
    pool = ParsePool(1)
    release = held(pool)
    waiting = pool.submit(LARGE, len, "waiting")
    pool.shutdown()
    release.set()
    with pytest.raises(CancelledError):
        waiting.result(10)


def test_a_parse_that_raises_hands_its_error_to_the_scrape() -> None:
    pool = ParsePool(PARSE_WORKERS)
    with pytest.raises(ValueError, match="bad body"):
        pool.submit(1, int, "bad body").result(10)
    assert pool.submit(1, int, "7").result(10) == 7
    pool.shutdown()


def test_a_thread_that_could_not_start_is_started_with_the_next_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One failed ``Thread.start`` (a brief limit on threads) once stopped every parse."""
    start, refusals = threading.Thread.start, [3]

    def refusing(thread: threading.Thread) -> None:
        if thread.name.startswith("exporter-parse") and refusals[0] > 0:
            refusals[0] -= 1
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refusing)
    pool = ParsePool(2)
    assert pool.problem() is None  # no body yet
    first = pool.submit(LARGE, len, "first")
    assert pool.failed_starts == 3
    assert pool.problem() == "3 of 3 parse threads not running (3 failed to start)"
    assert not first.done()
    assert pool.submit(1, len, "second").result(10) == 6  # every thread starts now
    assert first.result(10) == 5
    assert pool.problem() is None
    pool.shutdown()
    assert pool.problem() is None


SIXTY_FOUR = (
    "vllm:num_requests_running{" + ",".join(f'l{i}="\\\\n"' for i in range(64)) + "} 1\n"
).encode()
"""A line of 64 labels, each value an escape: at the label cap, about a second per 4 MiB."""


@pytest.mark.parametrize(
    ("body", "replicas", "limit"),
    [
        pytest.param(COSTLY, 12, 3.0, id="twelve replicas of short unwanted lines"),
        pytest.param(
            SIXTY_FOUR * (DEFAULT_LIMITS.max_bytes // len(SIXTY_FOUR)),
            3,
            2.0,
            id="three replicas of lines at the label cap",
        ),
    ],
)
async def test_replicas_sending_costly_bodies_never_hold_an_honest_scrape_past_its_deadline(
    body: bytes, replicas: int, limit: float
) -> None:
    """Costly 4 MiB bodies beside five honest replicas answering in 50 ms: every honest
    scrape ends within its deadline, its body parsed on the thread kept for small ones."""

    async def costly(request: web.Request) -> web.Response:
        return web.Response(body=body)

    async def honest(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)
        return web.Response(body=HONEST)

    app = web.Application()
    app.router.add_get("/costly", costly)
    app.router.add_get("/honest", honest)
    pool = ParsePool(PARSE_WORKERS)
    try:
        async with served_app(app) as url, aiohttp.ClientSession() as session:
            targets = [f"{url}/costly"] * replicas + [f"{url}/honest"] * 5
            results = await asyncio.gather(
                *(scrape(session, t, limit, "vllm", DEFAULT_LIMITS, pool) for t in targets)
            )
    finally:
        pool.shutdown()
    assert [(r.error, r.detail) for r in results[replicas:]] == [(None, "")] * 5
    assert all(r.stats is not None and r.stats.gauges["running"] == 1 for r in results[replicas:])
