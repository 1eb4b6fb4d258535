"""The shell that writes the gateway's arrivals (``serving.arrivals``) to rotated files.

Serving never waits on the disk: ``record`` appends a tuple to a list on the event loop
(past ``MAX_PENDING`` rows the newest are dropped and counted), and every
``FLUSH_SECONDS`` the rows so far are formatted and written by one worker thread, so
writes are serialised and the loop only awaits their end. A failed write (a full disk,
a directory that cannot be made) drops that batch, counts it in
``unitscale_gateway_arrivals_write_errors_total`` and is logged once, until a write
succeeds again; the next batch resumes the same file (``_Files``). A file deleted or
moved, or its directory removed, is noticed at the next batch (the path no longer names
the file written): the rows go to a new file, the directory made again. Nothing here
raises into a request.

Whatever else sits in the directory, rotation goes on: only regular files are deleted, and
a file that cannot be deleted (a directory of a recorded file's name, a file the gateway
may not remove) is counted in ``unitscale_gateway_arrivals_delete_errors_total`` and
logged once per file, while the rows keep going to the new file.

Rows are written in the order requests end, each file's rows a batch at a time and
flushed after each, so a crash loses at most the last second; the reader sorts by
arrival.

A write that never returns (a hard-mounted network volume whose server is gone) holds
only the writer thread: past ``WRITE_TIMEOUT`` it counts as a failed write (logged once),
its rows are counted when it ends, and while it hangs every new batch is dropped and
counted instead of queued behind it. Shutdown waits for the writer at most
``WRITE_TIMEOUT``; the thread is a daemon, so a hung write never holds the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from prometheus_client import CollectorRegistry, Counter

from serving.arrivals import (
    ArrivalSettings,
    file_name,
    format_row,
    is_a_later_day,
    next_sequence,
    plan_writes,
    to_delete,
)

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0
"""How often the rows so far are written: a crash loses at most this much."""
MAX_PENDING = 200_000
"""Rows waiting for the writer: 40 s at 5,000 requests a second, about 20 MB."""

WRITE_TIMEOUT = 10 * FLUSH_SECONDS
"""Seconds a write may take before it counts as failed: a local disk takes milliseconds."""

DAY_SECONDS = 86_400.0
"""A step back of the wall clock past this is a correction: the file ends."""

MAX_LOGGED = 100
"""Undeletable files whose names are remembered, so that each is logged once."""

Row = tuple[float, int, int]


class _Files:
    """The file being written; used only on the writer thread.

    A batch that fails (a full disk) leaves its file to be resumed: the next batch cuts it
    back to its last flushed byte and writes there, so a failing disk never opens file
    after file. Old files past ``max_files`` are deleted only once the file that displaces
    them holds a flushed batch, so a failing disk never deletes the history either. A file
    left after a failed batch (a shutdown, a new day) is cut back the same way. A failed
    batch that rotated keeps the rows it wrote before the rotation, though all of it is
    counted dropped: the count errs towards loss, never towards rows that are not there.
    """

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.path: Path | None = None
        """The file being written (None: the next batch opens a new one)."""
        self.handle: IO[bytes] | None = None
        self.size = 0
        """Bytes in the open file, this batch's included."""
        self.kept = 0
        """Bytes of ``path`` flushed by batches that succeeded: where a retry resumes."""
        self.opened = 0.0
        """When the file was opened (Unix seconds)."""
        self.on_delete_error: Callable[[], None] = lambda: None
        """Hears every old file that could not be deleted (counted by the recorder)."""
        self._doomed: dict[Path, None] = {}
        """Old files past the bound, deleted once the new file holds a flushed batch."""
        self._failed = False
        """A batch failed on ``path``: bytes past ``kept`` may be a part of it."""
        self._identity: tuple[int, int] | None = None
        """The device and inode of the file opened as ``path``."""
        self._undeletable: set[str] = set()
        """Old files that could not be deleted, each logged once (at most ``MAX_LOGGED``)."""

    def write(self, settings: ArrivalSettings, rows: list[Row], now: float) -> None:
        assert settings.directory is not None
        directory = Path(settings.directory)
        if self.path is not None and not self._still_there():
            self._failed = False  # whatever the path names now is not ours to cut back
            self.reset()  # moved or deleted under us (the directory too, maybe): start again
        if directory != self.directory:
            self.reset()
            self.directory = directory
        if self.path is not None and (
            is_a_later_day(self.opened, now) or now < self.opened - DAY_SECONDS
        ):
            # A file ends with its UTC day, and when the clock is set back more than a
            # day (opened on a clock far ahead, it would never see a later day).
            self._leave()
        texts = [format_row(*row) for row in rows]
        try:
            if self.path is not None and self.handle is None and self.kept:
                self._resume()
            for rotate, text in plan_writes(texts, self.size, settings.max_file_bytes):
                if rotate:
                    self._open_next(directory, settings.max_files, now)
                assert self.handle is not None
                self.handle.write(text.encode("ascii"))
                self.size += len(text)
            if self.handle is not None:
                self.handle.flush()
        except BaseException:
            self.close()  # the next batch resumes this file from ``kept``
            self._failed = True
            raise
        self.kept, self._failed = self.size, False
        doomed, self._doomed = list(self._doomed), {}
        for old in doomed:
            self._delete(old)

    def _still_there(self) -> bool:
        """Whether ``path`` still names the file written, with every byte flushed to it.

        Not when it was replaced by another file of its name, or cut short in place (a
        ``copytruncate`` rotation): resuming would fill the gap with zeros.
        """
        assert self.path is not None
        try:
            found = os.stat(self.path)
        except OSError:
            return False
        return (found.st_dev, found.st_ino) == self._identity and found.st_size >= self.kept

    def _ours(self) -> bool:
        """Whether ``path`` still names the file opened as it, whatever its length."""
        assert self.path is not None
        try:
            found = os.stat(self.path)
        except OSError:
            return False
        return (found.st_dev, found.st_ino) == self._identity

    def _resume(self) -> None:
        """Reopen a failed batch's file, cut back to what earlier batches flushed."""
        assert self.path is not None
        handle = self.path.open("r+b")
        try:
            handle.truncate(self.kept)
            handle.seek(self.kept)
        except BaseException:
            handle.close()
            raise
        self.handle, self.size = handle, self.kept

    def _open_next(self, directory: Path, max_files: int, now: float) -> None:
        if self.path is not None and self.handle is None and not self.kept:
            # a failed batch's new file, nothing flushed in it yet: retried, not replaced
            self.handle, self.size, self.opened = self.path.open("wb"), 0, now
            return
        if self.handle is not None:
            self.handle.flush()  # a full disk fails this batch here, not silently at close
            self.kept, self._failed = self.size, False  # the file holds its rows whole
            # It holds a flushed batch now: the files it displaced go at once. Kept to the
            # batch's end, a burst over 1 KiB files left 5,370 of a bound of 16, and each
            # rotation listed them all (hostile pass 29).
            displaced, self._doomed = list(self._doomed), {}
            for old in displaced:
                self._delete(old)
        self._leave()
        directory.mkdir(parents=True, exist_ok=True)  # made again, were it removed
        with os.scandir(directory) as scan:
            entries = [(entry.name, _is_file(entry)) for entry in scan]
        # Every name counts for the sequence (so the new one is free); only regular files
        # count for the bound and may be deleted.
        path = directory / file_name(next_sequence([name for name, _ in entries]), now)
        self.handle = path.open("xb")
        found = os.fstat(self.handle.fileno())
        self._identity = (found.st_dev, found.st_ino)
        self.path, self.size, self.kept, self.opened = path, 0, 0, now
        files = [name for name, regular in entries if regular]
        doomed = to_delete([*files, path.name], max_files, keep=path.name)
        self._doomed.update(dict.fromkeys(directory / old for old in doomed))

    def _delete(self, path: Path) -> None:
        """Delete an old file; a failure is counted and logged once, never the batch's."""
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as err:
            self.on_delete_error()
            if path.name not in self._undeletable and len(self._undeletable) < MAX_LOGGED:
                self._undeletable.add(path.name)
                log.warning(
                    "cannot delete the old arrivals file %s (%s: %s); recording goes on,"
                    " counted in unitscale_gateway_arrivals_delete_errors_total",
                    path,
                    type(err).__name__,
                    err,
                )
            return
        self._undeletable.discard(path.name)

    def close(self) -> None:
        """Close the open file; ``path`` stays, to be resumed."""
        handle, self.handle, self.size = self.handle, None, 0
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()

    def _leave(self) -> None:
        """Close the file for good: the next batch opens a new one.

        A file left after a failed batch is cut back to what earlier batches flushed (or
        deleted, if they flushed nothing): a part row would make the replay refuse the
        whole recording.
        """
        self.close()
        if self.path is not None and self._failed:
            with contextlib.suppress(OSError):
                # A file cut shorter than what was flushed (a ``copytruncate`` rotation)
                # is not ours to cut: truncating "back" would fill it with zeros.
                if self.kept and self._still_there():
                    os.truncate(self.path, self.kept)
                elif not self.kept and self._ours():
                    self.path.unlink()
        self.path, self.kept, self._failed = None, 0, False

    def reset(self) -> None:
        self._leave()
        self.directory = None
        self._doomed = {}


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


class _Writer:
    """One daemon thread that runs the file work in order, each job's end an asyncio future.

    Not a ``ThreadPoolExecutor``: its threads are joined at the interpreter's exit, so a
    write that never returns would hold the process for good.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, work: Callable[..., None], *args: object) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="arrivals", daemon=True)
            self._thread.start()
        self._jobs.put((loop, future, work, args))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, work, args = job
            error: BaseException | None = None
            try:
                work(*args)
            except BaseException as err:  # handed to the awaiting side, never lost here
                error = err
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, future, error)

    def shutdown(self) -> None:
        """The thread ends after the jobs queued (at once, unless one hangs)."""
        self._jobs.put(None)
        self._thread = None


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class ArrivalRecorder:
    """Collects rows on the event loop; ``run`` writes them off it (module docstring)."""

    def __init__(
        self,
        settings: ArrivalSettings,
        registry: CollectorRegistry,
        labels: tuple[str, str],
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        self.settings = settings
        self.write_timeout = write_timeout
        self._pending: list[Row] = []
        self._files = _Files()
        self._writer = _Writer()
        self._busy: asyncio.Future[None] | None = None
        """A write that passed ``write_timeout`` and has not ended yet."""
        self._failing = False
        names = ["namespace", "deployment"]
        self._recorded = Counter(
            "unitscale_gateway_arrivals_recorded",
            "Requests written to the arrivals record.",
            names,
            registry=registry,
        ).labels(*labels)
        self._dropped = Counter(
            "unitscale_gateway_arrivals_dropped",
            "Requests left out of the arrivals record (writer behind, or a write failed).",
            names,
            registry=registry,
        ).labels(*labels)
        self._errors = Counter(
            "unitscale_gateway_arrivals_write_errors",
            "Writes of the arrivals record that failed.",
            names,
            registry=registry,
        ).labels(*labels)
        self._files.on_delete_error = (
            Counter(
                "unitscale_gateway_arrivals_delete_errors",
                "Old arrivals files that could not be deleted (recording goes on).",
                names,
                registry=registry,
            )
            .labels(*labels)
            .inc
        )

    def configure(self, settings: ArrivalSettings) -> None:
        """A reloaded config: the next write goes where it says (None: stop recording)."""
        self.settings = settings

    def record(self, arrival: float, prompt_tokens: int, output_tokens: int) -> None:
        """One request that ended; never blocks, never raises."""
        if self.settings.directory is None:
            return
        if len(self._pending) >= MAX_PENDING:
            self._dropped.inc()
            return
        self._pending.append((arrival, prompt_tokens, output_tokens))

    async def run(self) -> None:
        """Write what was recorded every ``FLUSH_SECONDS``, forever; the last rows at cancel."""
        try:
            while True:
                await asyncio.sleep(FLUSH_SECONDS)
                try:
                    await self.flush()
                except Exception:  # a bug here must never stop the recording for good
                    log.warning("writing the arrivals record failed", exc_info=True)
        finally:
            await asyncio.shield(self._close())

    @property
    def stuck(self) -> bool:
        """Whether a write has hung past ``write_timeout`` and not ended yet."""
        return self._busy is not None and not self._busy.done()

    async def flush(self) -> None:
        """Write the rows recorded so far on the writer thread.

        A failure is counted, logged once until a write succeeds, and drops the batch;
        while a write hangs, each batch is dropped at once (module docstring).
        """
        rows, self._pending = self._pending, []
        settings = self.settings
        if self.stuck:
            self._dropped.inc(len(rows))
            return
        if settings.directory is None:
            await self._within(self._writer.submit(self._files.reset), 0)
            return
        if not rows:
            return
        try:
            written = await self._within(
                self._writer.submit(self._files.write, settings, rows, time.time()), len(rows)
            )
        except Exception as err:
            self._errors.inc()
            self._dropped.inc(len(rows))
            self._failed(settings.directory, f"{type(err).__name__}: {err}")
            return
        if not written:
            self._errors.inc()
            self._failed(settings.directory, f"no write ended within {self.write_timeout:g}s")
            return
        self._recorded.inc(len(rows))
        if self._failing:
            log.info("recording arrivals in %s again", settings.directory)
        self._failing = False

    async def _within(self, job: asyncio.Future[None], rows: int) -> bool:
        """Whether ``job`` ended within ``write_timeout``; if not, its rows count when it does."""
        try:
            await asyncio.wait_for(asyncio.shield(job), self.write_timeout)
        except TimeoutError:
            self._busy = job
            job.add_done_callback(lambda done: self._ended_late(done, rows))
            return False
        return True

    def _ended_late(self, job: asyncio.Future[None], rows: int) -> None:
        if job.cancelled() or job.exception() is not None:
            self._dropped.inc(rows)
        else:
            self._recorded.inc(rows)

    def _failed(self, directory: str, problem: str) -> None:
        if not self._failing:
            log.warning(
                "recording arrivals in %s failed (%s); rows are dropped until a write"
                " succeeds, counted in unitscale_gateway_arrivals_dropped_total",
                directory,
                problem,
            )
        self._failing = True

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self.flush()
        # Queued even behind a hung write: the file is closed should it ever end.
        reset = self._writer.submit(self._files.reset)
        if not self.stuck:
            with contextlib.suppress(Exception):
                await self._within(reset, 0)
        self._writer.shutdown()
