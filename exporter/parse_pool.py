"""Threads that parse scraped bodies, the smallest waiting body first.

A body's parse costs time in proportion to its bytes: an honest vLLM ``/metrics`` is about
50 kB an engine and parses in a millisecond, while a hostile replica may send the 4 MiB
cap in a shape that takes half a second. First come, first served, five such replicas kept
every thread busy past each honest scrape's deadline; smallest first, an honest body
waits at most for the bodies already being parsed when it arrived. A body whose scrape
gave up before a thread took it is never parsed (its future is cancelled).

Not a ``ThreadPoolExecutor``: its queue is first in, first out.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class ParsePool:
    """``workers`` daemon threads, started as work arrives, taking the smallest job first."""

    def __init__(self, workers: int, name: str = "exporter-parse") -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self.name = name
        self._jobs: list[tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._lock = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, size: int, work: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``work(*args)`` on a thread, before any waiting job of a larger ``size``."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the parse pool is shut down")
            heapq.heappush(self._jobs, (size, next(self._order), future, work, args))
            if self._idle:
                self._lock.notify()
            elif len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    async def run(self, size: int, work: Callable[..., T], *args: Any) -> T:
        """``submit``, awaited; cancelling the await cancels a job not yet started."""
        return await asyncio.wrap_future(self.submit(size, work, *args))

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._closed:
                    self._idle += 1
                    self._lock.wait()
                    self._idle -= 1
                if not self._jobs:
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
