"""foundation.daemon: work in a daemon thread, awaited."""

from __future__ import annotations

import asyncio
import threading

import pytest

from foundation.daemon import in_daemon_thread


def _raise(err: BaseException):
    def work():
        raise err

    return work


async def test_the_result_comes_back_from_a_daemon_thread():
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 7

    assert await in_daemon_thread(work, "work") == 7
    assert seen[0].daemon and seen[0].name == "work"


@pytest.mark.parametrize(
    ("raised", "caught", "fragment"),
    [
        pytest.param(ValueError("bad"), ValueError, "bad", id="an exception is the awaiter's"),
        pytest.param(SystemExit(3), RuntimeError, "raised SystemExit: 3",
                     id="a SystemExit in the thread does not stop the process"),
        pytest.param(KeyboardInterrupt(), RuntimeError, "raised KeyboardInterrupt",
                     id="a KeyboardInterrupt in the thread does not stop the process"),
    ],
)  # fmt: skip
async def test_what_the_work_raised_is_raised_to_the_awaiter(raised, caught, fragment):
    with pytest.raises(caught, match=fragment):
        await in_daemon_thread(_raise(raised), "work")


async def test_a_wait_cancelled_leaves_the_thread_to_finish_its_result_dropped():
    release, finished = threading.Event(), threading.Event()

    def work() -> int:
        release.wait(30)
        finished.set()
        return 1

    waiting = asyncio.ensure_future(in_daemon_thread(work, "work"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    assert await asyncio.to_thread(finished.wait, 30)
