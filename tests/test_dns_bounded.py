"""Hung DNS lookups cannot starve the others (issue 27, hostile pass M10).

glibc blocks a thread while a DNS server does not answer; ``socket.getaddrinfo`` is
replaced by one that blocks for one name until the test lets it go, as such a resolver
would, and answers the others at once. No real DNS is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

import pytest

from foundation import dns
from foundation.dns import MAX_LOOKUPS, resolve_addresses


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Any:
    release = threading.Event()
    calls: list[str] = []

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        calls.append(host)
        if host.startswith("hang"):
            release.wait(30)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield release, calls
    release.set()


async def test_callers_of_a_hung_name_share_one_lookup_and_others_still_resolve(hung):
    release, calls = hung
    waiting = [asyncio.create_task(resolve_addresses("hang.invalid:80")) for _ in range(50)]
    others = [asyncio.create_task(resolve_addresses(f"hang{n}.invalid:80")) for n in range(3)]
    async with asyncio.timeout(30):  # a cap against hangs: it answers at once
        assert await resolve_addresses("llama.serving:8000") == (["10.0.0.7"], 8000)
    assert calls.count("hang.invalid") == 1  # fifty callers, one thread held
    release.set()
    async with asyncio.timeout(30):
        answers = await asyncio.gather(*waiting, *others)
    assert all(a == (["10.0.0.7"], 80) for a in answers)


async def test_a_caller_that_gives_up_leaves_the_lookup_to_the_others(hung):
    release, calls = hung
    first = asyncio.create_task(resolve_addresses("hang.invalid:80"))
    second = asyncio.create_task(resolve_addresses("hang.invalid:80"))
    await asyncio.sleep(0)  # both are waiting on the one lookup
    first.cancel()  # as asyncio.timeout would
    with contextlib.suppress(asyncio.CancelledError):
        await first
    release.set()
    async with asyncio.timeout(30):
        assert await second == (["10.0.0.7"], 80)
    assert calls.count("hang.invalid") == 1


async def test_more_hung_names_than_threads_still_never_touch_the_default_executor(hung):
    release, _ = hung
    tasks = [
        asyncio.create_task(resolve_addresses(f"hang-{n}.invalid:80"))
        for n in range(MAX_LOOKUPS + 4)
    ]
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(30):  # aiohttp's resolver's executor stays free
        assert await loop.run_in_executor(None, lambda: "free") == "free"
    release.set()
    async with asyncio.timeout(30):
        await asyncio.gather(*tasks)
    assert not dns._IN_FLIGHT
