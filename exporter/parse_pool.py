"""Threads that parse scraped bodies, the smallest first, one kept for small bodies alone.

A body's parse costs time in proportion to its bytes: an honest vLLM ``/metrics`` is about
50 kB an engine and parses in a millisecond, while a hostile replica may send the 4 MiB
cap in a shape that takes a second. First come, first served, a few such replicas kept
every thread busy past each honest scrape's deadline. Now the smallest waiting body goes
first, and one thread takes only bodies of at most ``SMALL_BODY`` bytes: however many
large bodies are being parsed, a small one starts at once and shares the interpreter
with them. A body whose scrape gave up before a thread took it is never parsed (its
future is cancelled).

Not a ``ThreadPoolExecutor``: its queue is first in, first out, for any thread.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

SMALL_BODY = 256 * 1024
"""Bodies the kept thread takes: five vLLM engines' worth, parsed in tens of milliseconds
whatever their shape."""

_Job = tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...]]

log = logging.getLogger(__name__)


class ParsePool:
    """``workers`` daemon threads taking the smallest job first, and one more for small ones.

    The threads start with the first job. One that cannot start (a brief limit on the
    process's threads) is tried again with each later job; until then ``problem`` says so.
    """

    def __init__(self, workers: int, name: str = "exporter-parse") -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self.name = name
        self._jobs: list[_Job] = []
        self._order = itertools.count()
        self._lock = threading.Condition()
        self._threads: list[threading.Thread | None] = [None] * (workers + 1)
        self.failed_starts = 0
        """Threads that could not start (``Thread.start`` raised), counted."""
        self._asked = False
        self._closed = False

    def submit(self, size: int, work: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``work(*args)`` on a thread, before any waiting job of a larger ``size``."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the parse pool is shut down")
            heapq.heappush(self._jobs, (size, next(self._order), future, work, args))
            self._asked = True
            self._start_missing()
            self._lock.notify_all()  # the kept thread may not take it: wake every one
        return future

    def _start_missing(self) -> None:
        """Start each thread not running; one that cannot start is tried at the next job."""
        for i, thread in enumerate(self._threads):
            if thread is not None and thread.is_alive():
                continue
            limit = SMALL_BODY if i == self.workers else None
            thread = threading.Thread(
                target=self._work, args=(limit,), name=f"{self.name}-{i}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as err:  # "can't start new thread"
                self.failed_starts += 1
                log.warning("parse thread %s could not start: %s", thread.name, err)
                continue
            self._threads[i] = thread

    def problem(self) -> str | None:
        """Why bodies may wait for good (a thread that could not start), or None."""
        with self._lock:
            if self._closed or not self._asked:
                return None  # shut down, or no job yet
            missing = sum(1 for t in self._threads if t is None or not t.is_alive())
        if missing == 0:
            return None
        return (
            f"{missing} of {len(self._threads)} parse threads not running"
            f" ({self.failed_starts} failed to start)"
        )

    async def run(self, size: int, work: Callable[..., T], *args: Any) -> T:
        """``submit``, awaited; cancelling the await cancels a job not yet started."""
        return await asyncio.wrap_future(self.submit(size, work, *args))

    def _work(self, limit: int | None) -> None:
        """Take jobs, smallest first; with a ``limit``, only jobs of at most that size."""
        while True:
            with self._lock:
                while not self._closed and not (
                    self._jobs and (limit is None or self._jobs[0][0] <= limit)
                ):
                    self._lock.wait()
                if self._closed:
                    return
                _, _, future, work, args = heapq.heappop(self._jobs)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = work(*args)
            except BaseException as err:  # handed to the awaiting side
                future.set_exception(err)
            else:
                future.set_result(result)

    def shutdown(self) -> None:
        """Cancel the waiting jobs; threads end after the job they hold."""
        with self._lock:
            self._closed = True
            jobs, self._jobs = self._jobs, []
            self._lock.notify_all()
        for _, _, future, _, _ in jobs:
            future.cancel()
