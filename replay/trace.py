"""Request traces: the Azure LLM CSV and Mooncake JSONL formats, scaled for replay.

The readers are the boundary for trace files: every row is checked (UTF-8, a finite
timestamp, whole token counts 0 to ``MAX_TOKENS``) and the sizes a file or a flag
controls are bounded (``replay.limits``) before anything they size is allocated. A row
outside that is a ``TraceError`` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import re
from array import array
from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from foundation.errors import UnitscaleError, quote
from foundation.files import open_regular
from replay.limits import (
    MAX_LINE_BYTES,
    MAX_RATE_MULTIPLIER,
    MAX_TOKENS,
    MAX_TRACE_REQUESTS,
    MAX_TRACE_SPAN_SECONDS,
)

log = logging.getLogger(__name__)

MAX_RECORDING_FILES = 10_000
"""``.csv`` files of a recording directory: the gateway's ``arrivals.max-files`` bound.
Reading one costs about 0.5 ms; 20,000 header-only files took 10 s and had no bound."""


class TraceError(UnitscaleError):
    """A trace cannot be read or replayed; the message names the file and line, or the flag."""


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests sorted by arrival: seconds from the start, prompt and output tokens."""

    name: str
    arrival: npt.NDArray[np.float64]
    prompt: npt.NDArray[np.int64]
    output: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def duration(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.arrival[-1]) if len(self.arrival) else 0.0


class _Rows:
    """What a reader collected: per row its arrival (s), tokens and line number."""

    def __init__(self, path: Path, before: int = 0) -> None:
        self.path = path
        self.before = before
        """Requests already read from other files of the same trace (``read_recording``)."""
        self.arrival = array("d")
        self.prompt = array("q")
        self.output = array("q")
        self.line = array("q")
        self.part_row = 0
        """The line of a last row cut short (no line end) that was left out; 0: none."""

    def add(self, line: int, arrival: float, prompt: int, output: int) -> None:
        if self.before + len(self.line) >= MAX_TRACE_REQUESTS:
            raise TraceError(
                f"{self.path}:{line}: more than {MAX_TRACE_REQUESTS:,} requests;"
                " replay a part of the trace"
            )
        self.arrival.append(arrival)
        self.prompt.append(prompt)
        self.output.append(output)
        self.line.append(line)


def read_trace(path: Path) -> Trace:
    """Read an Azure CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``) or Mooncake JSONL.

    A token count of 0 replays as 1 (a request has at least one token).

    Raises:
        TraceError: unknown format, a bad row (named by line and column), more than
            ``MAX_TRACE_REQUESTS`` rows, a span over ``MAX_TRACE_SPAN_SECONDS``, or no
            requests.
    """
    with closing(_lines(path)) as lines:
        first = next(lines, (1, ""))[1]
    if first.lstrip().startswith("{"):
        rows = _mooncake(path)
    elif "TIMESTAMP" in first and "ContextTokens" in first:
        rows = _azure(path)
    else:
        raise TraceError(
            f"{path}: neither an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens)"
            " nor a Mooncake JSONL (timestamp, input_length, output_length)"
        )
    if not rows.line:
        raise TraceError(f"{path}: no requests")
    arrival = np.frombuffer(rows.arrival, dtype=np.float64)
    _check_span(rows, arrival)
    order = np.argsort(arrival, kind="stable")
    times = arrival[order]
    return Trace(
        path.stem,
        times - times[0],
        np.maximum(np.frombuffer(rows.prompt, dtype=np.int64)[order], 1),
        np.maximum(np.frombuffer(rows.output, dtype=np.int64)[order], 1),
    )


def read_recording(directory: Path) -> Trace:
    """Every ``*.csv`` in ``directory`` as one trace: the gateway's rotated arrivals.

    The files are Azure CSVs with wall-clock timestamps (``serving.arrivals``), so their
    rows merge on one clock whatever order the files were written in; a file holding only
    its header, or nothing (just opened), adds nothing. The trace is named after the directory.

    Raises:
        TraceError: no ``.csv`` file, one that is not an Azure CSV, a bad row (named by
            file, line and column), more than ``MAX_TRACE_REQUESTS`` rows in all, a span
            over ``MAX_TRACE_SPAN_SECONDS`` (naming both files), or no requests.
    """
    files: list[Path] = []
    try:
        for entry in directory.iterdir():
            if entry.suffix == ".csv" and entry.is_file():
                files.append(entry)
            if len(files) > MAX_RECORDING_FILES:  # before any is opened: ~0.5 ms each
                raise TraceError(
                    f"{directory}: more than {MAX_RECORDING_FILES:,} .csv files; the gateway"
                    f" keeps at most {MAX_RECORDING_FILES:,} (arrivals max-files)"
                )
    except OSError as err:
        raise TraceError(f"cannot read trace directory {directory}: {err.strerror}") from err
    files.sort()
    if not files:
        raise TraceError(f"{directory}: no .csv files (the gateway's arrivals are arrivals-*.csv)")
    parts: list[_Rows] = []
    for path in files:
        with closing(_lines(path)) as lines:
            header = next(lines, (1, ""))[1]
        if not header and path.stat().st_size == 0:
            continue  # opened, its header not yet written (a crash between): nothing
        if not header.endswith("\n"):
            # Its first write cut short (a full disk, then a kill): no row, and it made the
            # whole recording unreadable (issue 27, hostile pass 30).
            log.warning("%s: a header cut short and no row: the file is left out", path)
            continue
        if not ("TIMESTAMP" in header and "ContextTokens" in header):
            raise TraceError(f"{path}: not an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens)")
        parts.append(_azure(path, sum(len(p.line) for p in parts), recording=True))
    for part in parts:
        if part.part_row:
            log.warning(
                "%s:%d: a row cut short (no line end: the gateway was stopped or its disk"
                " filled while writing it) is left out",
                part.path,
                part.part_row,
            )
    kept = [p for p in parts if p.line]
    if not kept:
        raise TraceError(f"{directory}: no requests in {len(files)} files")
    arrival = np.concatenate([np.frombuffer(p.arrival, dtype=np.float64) for p in kept])
    prompt = np.concatenate([np.frombuffer(p.prompt, dtype=np.int64) for p in kept])
    output = np.concatenate([np.frombuffer(p.output, dtype=np.int64) for p in kept])
    order = np.argsort(arrival, kind="stable")
    times, prompt, output = arrival[order], prompt[order], output[order]
    start, end = busiest_window(times, MAX_TRACE_SPAN_SECONDS)
    if end - start < len(times):
        # A run left from weeks before, or one flush on a clock far ahead, made the whole
        # recording unreadable until its file rotated out (hostile pass 29).
        log.warning(
            "%s: %d of %d requests lie outside the 31 days holding the most of them"
            " (%s to %s UTC) and are left out",
            directory,
            len(times) - (end - start),
            len(times),
            datetime.fromtimestamp(times[start], UTC).isoformat(timespec="seconds"),
            datetime.fromtimestamp(times[end - 1], UTC).isoformat(timespec="seconds"),
        )
        times, prompt, output = times[start:end], prompt[start:end], output[start:end]
    return Trace(
        directory.name,
        times - times[0],
        np.maximum(prompt, 1),
        np.maximum(output, 1),
    )


def busiest_window(times: npt.NDArray[np.float64], span: float) -> tuple[int, int]:
    """The slice ``[start, end)`` of sorted ``times`` within ``span`` holding the most.

    Of equals the latest. Example: ``[0, 1, 2, 100]`` within 10: ``(0, 3)``.
    """
    ends = np.searchsorted(times, times + span, side="right")
    counts = ends - np.arange(len(times))
    start = len(counts) - 1 - int(np.argmax(counts[::-1]))
    return start, int(ends[start])


def _check_span(rows: _Rows, arrival: npt.NDArray[np.float64]) -> None:
    """Refuse a trace whose first and last requests are too far apart, naming both rows."""
    first, last = int(np.argmin(arrival)), int(np.argmax(arrival))
    span = float(arrival[last]) - float(arrival[first])
    if not span <= MAX_TRACE_SPAN_SECONDS:
        # A span of 1e308 s printed 309 digits: past a million days, three significant ones.
        seconds, days = (
            (f"{span:,.0f}", f"{span / 86_400:,.1f}")
            if span < 1e11
            else (f"{span:.3g}", f"{span / 86_400:.3g}")
        )
        raise TraceError(
            f"{rows.path}: lines {rows.line[first]} and {rows.line[last]} are {seconds} s"
            f" ({days} days) apart; a trace may span at most"
            f" {MAX_TRACE_SPAN_SECONDS:,} s (31 days)"
        )


def _lines(path: Path, what: str = "trace") -> Generator[tuple[int, str]]:
    """``path``'s lines numbered from 1, each at most ``MAX_LINE_BYTES`` and UTF-8."""
    # A regular file only: a FIFO blocked in open() forever, /dev/zero ran to the line cap.
    with open_regular(path, what, TraceError) as handle:
        for number in itertools.count(1):
            try:
                raw = handle.readline(MAX_LINE_BYTES + 1)
            except OSError as err:
                raise TraceError(f"cannot read {what} {path}: {err.strerror}") from err
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(f"{path}:{number}: a line over {MAX_LINE_BYTES:,} bytes")
            try:
                # utf-8-sig: a byte-order mark (as Excel writes) is not part of the header
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise TraceError(
                    f"{path}:{number}: not UTF-8 (byte {err.start + 1} of the line)"
                ) from err
            yield number, text


_INTEGER = re.compile(r"\s*([+-]?)([0-9]+)\s*")
"""A token count as text: an optional sign and digits (no fraction, exponent or ``_``)."""


def token_count(value: object, column: str) -> int:
    """A whole number of tokens, 0 to ``MAX_TOKENS``, from a CSV field or a JSON value.

    Raises:
        ValueError: naming ``column`` and what it holds.
    """
    count: int | None = None
    if isinstance(value, str) and (match := _INTEGER.fullmatch(value)):
        sign, digits = match.groups()
        digits = digits.lstrip("0") or "0"
        # more digits than MAX_TOKENS has is out of range; int() of thousands is slow
        count = int(sign + digits) if len(digits) <= len(str(MAX_TOKENS)) else -1
    elif isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        count = int(value)
    if count is None:
        raise ValueError(f"column {column}: {quote(value)} is not a whole number of tokens")
    if not 0 <= count <= MAX_TOKENS:
        raise ValueError(f"column {column}: {quote(value)} is not 0 to {MAX_TOKENS:,} tokens")
    return count


def _azure(path: Path, before: int = 0, recording: bool = False) -> _Rows:
    """``path``'s rows.

    ``recording``: a last line with no line end is a row the gateway was cut off writing
    (a full disk, a kill); it is left out (``_Rows.part_row``).
    """
    rows = _Rows(path, before)
    number = 0  # the line the csv module read last: a row's last, or the one it refused

    def texts() -> Iterator[str]:
        nonlocal number
        for number, text in _lines(path):  # the loop sets the reader's line
            if recording and number > 1 and not text.endswith("\n"):
                rows.part_row = number  # only the last line can lack its end
                return
            yield text

    try:
        reader = csv.reader(texts())
        header = next(reader, [])
        if len(header) > MAX_COLUMNS:
            # Each row was matched against every column of the header: a 1 MiB header
            # made every short row cost 15 ms (hostile pass 12).
            raise TraceError(
                f"{path}:{number}: a header of {len(header):,} columns, at most {MAX_COLUMNS}"
            )
        twice = [column for column in _AZURE if header.count(column) > 1]
        if twice:  # which copy the file means is unknowable (hostile pass 48)
            raise TraceError(f"{path}:{number}: column {twice[0]} is named twice in the header")
        at = {column: header.index(column) for column in _AZURE if column in header}
        offsets: tuple[bool, int] | None = None  # the first row's kind, and its line
        for row in reader:
            if not row:
                continue  # a blank line, as csv.DictReader skips it
            try:
                if len(row) > len(header):
                    # A comma inside a field ("1,000") shifts every column after it.
                    raise ValueError(f"{len(row)} fields where the header names {len(header)}")
                arrival, zoned = _azure_time(_field(row, at, "TIMESTAMP"))
                offsets = offsets or (zoned, number)
                if zoned != offsets[0]:
                    # Mixed, the rows without an offset (UTC) and those with one were
                    # hours apart that the file meant a second apart.
                    has = "has a UTC offset" if zoned else "has no UTC offset"
                    raise ValueError(
                        f"column TIMESTAMP: {has}, and line {offsets[1]}'s"
                        f" {'does not' if zoned else 'does'}: one kind in a file"
                    )
                prompt = token_count(_field(row, at, "ContextTokens"), "ContextTokens")
                output = token_count(_field(row, at, "GeneratedTokens"), "GeneratedTokens")
            except ValueError as err:
                raise TraceError(f"{path}:{number}: {err}") from err
            rows.add(number, arrival, prompt, output)
    except csv.Error as err:
        raise TraceError(f"{path}:{number}: not CSV: {err}") from err
    return rows


MAX_COLUMNS = 64
"""Columns an Azure-shaped CSV trace may have (it needs three; the traces have three)."""
_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _field(row: list[str], at: dict[str, int], column: str) -> object:
    index = at.get(column)
    if index is None or index >= len(row):
        raise ValueError(f"column {column}: missing")
    return row[index]


def _azure_time(value: object) -> tuple[float, bool]:
    """A wall-clock timestamp, and whether it names its UTC offset.

    Python 3.11 reads the 7-digit fractions these files use. One without an offset (the
    Azure traces have none) is UTC: read in the host's zone, a trace crossing a daylight
    saving change gained or lost an hour, and a replay's cost depended on ``TZ``.
    """
    try:
        stamp = datetime.fromisoformat(str(value).strip())
        zoned = stamp.tzinfo is not None
        return (stamp if zoned else stamp.replace(tzinfo=UTC)).timestamp(), zoned
    except (ValueError, OverflowError, OSError) as err:
        raise ValueError(f"column TIMESTAMP: {quote(value)} is not a date and time") from err


def _mooncake(path: Path) -> _Rows:
    rows = _Rows(path)
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as err:
            raise TraceError(f"{path}:{number}: not a JSON record") from err
        if not isinstance(record, dict):
            raise TraceError(f"{path}:{number}: not a JSON object")
        try:
            arrival = _mooncake_time(record.get("timestamp"))
            prompt = token_count(record.get("input_length"), "input_length")
            output = token_count(record.get("output_length"), "output_length")
        except ValueError as err:
            raise TraceError(f"{path}:{number}: {err}") from err
        rows.add(number, arrival, prompt, output)
    return rows


def _mooncake_time(value: object) -> float:
    """Milliseconds from the trace's start, as seconds: a finite JSON number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value) / 1000.0
        except OverflowError:
            seconds = math.inf
        if math.isfinite(seconds):
            return seconds
    raise ValueError(f"column timestamp: {quote(value)} is not a finite number of milliseconds")


def scale(trace: Trace, rate_multiplier: float, time_compression: float, seed: int) -> Trace:
    """More traffic with the same shape, and/or the same traffic faster.

    ``rate_multiplier`` X keeps each request and adds copies: floor(X) - 1 more, plus one
    with probability frac(X); each copy arrives uniformly within one second after its
    original (seeded), so per-second shape and token mix stay the trace's.
    ``time_compression`` Y divides every arrival time by Y (an hour in 1/Y hours).

    Raises:
        TraceError: X not above 0 and at most ``MAX_RATE_MULTIPLIER``, Y not above 0,
            no request or more than ``MAX_TRACE_REQUESTS`` after X, or a span over
            ``MAX_TRACE_SPAN_SECONDS`` after Y; each checked before the copies exist.
    """
    if not 0 < rate_multiplier <= MAX_RATE_MULTIPLIER:
        raise TraceError(
            f"--rate-multiplier {rate_multiplier:g}: must be above 0, at most"
            f" {MAX_RATE_MULTIPLIER:,g}"
        )
    # + 1: a copy arrives up to a second after its original
    span = (trace.duration + 1.0) / time_compression if time_compression > 0 else math.inf
    if not span <= MAX_TRACE_SPAN_SECONDS:
        raise TraceError(
            f"--time-compression {time_compression:g}: must be above 0, and the"
            f" {trace.duration:,.3g} s trace would span {span:,.3g} s; a replay spans at"
            f" most {MAX_TRACE_SPAN_SECONDS:,} s (31 days)"
        )
    rng = np.random.default_rng(seed)
    whole = int(np.floor(rate_multiplier))
    copies = np.full(len(trace), whole, dtype=np.int64)
    copies += rng.random(len(trace)) < (rate_multiplier - whole)
    total = int(copies.sum())
    if not 0 < total <= MAX_TRACE_REQUESTS:
        raise TraceError(
            f"--rate-multiplier {rate_multiplier:g}: {total:,} requests from {len(trace):,};"
            f" a replay needs at least one and holds at most {MAX_TRACE_REQUESTS:,}"
        )
    index = np.repeat(np.arange(len(trace)), copies)
    first = np.r_[True, index[1:] != index[:-1]]
    jitter = np.where(first, 0.0, rng.random(len(index)))
    arrival = (trace.arrival[index] + jitter) / time_compression
    order = np.argsort(arrival, kind="stable")
    return Trace(trace.name, arrival[order], trace.prompt[index][order], trace.output[index][order])
