"""The shell that writes the gateway's arrivals (``serving.arrivals``) to rotated files.

Serving never waits on the disk: ``record`` appends a tuple to a list on the event loop
(past ``MAX_PENDING`` rows the newest are dropped and counted), and every
``FLUSH_SECONDS`` the rows so far are formatted and written by one worker thread, so
writes are serialised and the loop only awaits their end. A failed write (a full disk,
a directory that cannot be made) drops that batch, counts it in
``unitscale_gateway_arrivals_write_errors_total`` and is logged once, until a write
succeeds again; the next batch tries a fresh file. Nothing here raises into a request.

Whatever else sits in the directory, rotation goes on: only regular files are deleted, and
a file that cannot be deleted (a directory of a recorded file's name, a file the gateway
may not remove) is counted in ``unitscale_gateway_arrivals_delete_errors_total`` and
logged once per file, while the rows keep going to the new file.

Rows are written in the order requests end, each file's rows a batch at a time and
flushed after each, so a crash loses at most the last second; the reader sorts by
arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry, Counter

from serving.arrivals import (
    ArrivalSettings,
    file_name,
    format_row,
    is_another_day,
    next_sequence,
    plan_writes,
    to_delete,
)

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0
"""How often the rows so far are written: a crash loses at most this much."""
MAX_PENDING = 200_000
"""Rows waiting for the writer: 40 s at 5,000 requests a second, about 20 MB."""

MAX_LOGGED = 100
"""Undeletable files whose names are remembered, so that each is logged once."""

Row = tuple[float, int, int]


class _Files:
    """The file being written; used only on the writer thread."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.handle: IO[bytes] | None = None
        self.size = 0
        self.opened = 0.0
        """When the file was opened (Unix seconds)."""
        self.on_delete_error: Callable[[], None] = lambda: None
        """Hears every old file that could not be deleted (counted by the recorder)."""
        self._undeletable: set[str] = set()
        """Old files that could not be deleted, each logged once (at most ``MAX_LOGGED``)."""

    def write(self, settings: ArrivalSettings, rows: list[Row], now: float) -> None:
        assert settings.directory is not None
        directory = Path(settings.directory)
        if directory != self.directory:
            self.close()
            directory.mkdir(parents=True, exist_ok=True)
            self.directory = directory
        if is_another_day(self.opened, now):
            self.close()  # a file holds one UTC day at most
        texts = [format_row(*row) for row in rows]
        try:
            for rotate, text in plan_writes(texts, self.size, settings.max_file_bytes):
                if rotate:
                    self._open_next(directory, settings.max_files, now)
                assert self.handle is not None
                self.handle.write(text.encode("ascii"))
                self.size += len(text)
            if self.handle is not None:
                self.handle.flush()
        except BaseException:
            self.close()  # the next batch starts a fresh file
            raise

    def _open_next(self, directory: Path, max_files: int, now: float) -> None:
        self.close()
        with os.scandir(directory) as scan:
            entries = [(entry.name, _is_file(entry)) for entry in scan]
        # Every name counts for the sequence (so the new one is free); only regular files
        # count for the bound and may be deleted.
        path = directory / file_name(next_sequence([name for name, _ in entries]), now)
        self.handle = path.open("xb")
        self.size, self.opened = 0, now
        files = [name for name, regular in entries if regular]
        for old in to_delete([*files, path.name], max_files, keep=path.name):
            self._delete(directory / old)

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
        handle, self.handle, self.size = self.handle, None, 0
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()

    def reset(self) -> None:
        self.close()
        self.directory = None


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


class ArrivalRecorder:
    """Collects rows on the event loop; ``run`` writes them off it (module docstring)."""

    def __init__(
        self, settings: ArrivalSettings, registry: CollectorRegistry, labels: tuple[str, str]
    ) -> None:
        self.settings = settings
        self._pending: list[Row] = []
        self._files = _Files()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="arrivals")
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

    async def flush(self) -> None:
        """Write the rows recorded so far on the writer thread.

        A failure is counted, logged once until a write succeeds, and drops the batch.
        """
        rows, self._pending = self._pending, []
        settings = self.settings
        loop = asyncio.get_running_loop()
        if settings.directory is None:
            await loop.run_in_executor(self._executor, self._files.reset)
            return
        if not rows:
            return
        try:
            await loop.run_in_executor(
                self._executor, self._files.write, settings, rows, time.time()
            )
        except Exception as err:
            self._errors.inc()
            self._dropped.inc(len(rows))
            if not self._failing:
                log.warning(
                    "recording arrivals in %s failed (%s: %s); rows are dropped until a write"
                    " succeeds, counted in unitscale_gateway_arrivals_dropped_total",
                    settings.directory,
                    type(err).__name__,
                    err,
                )
            self._failing = True
            return
        self._recorded.inc(len(rows))
        if self._failing:
            log.info("recording arrivals in %s again", settings.directory)
        self._failing = False

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self.flush()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            await loop.run_in_executor(self._executor, self._files.reset)
        self._executor.shutdown(wait=False)
