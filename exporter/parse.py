"""A fast reader of Prometheus text and OpenMetrics exposition that keeps only wanted names.

vLLM's ``/metrics`` is mostly families the exporter never reads (Python GC, process,
HTTP histograms); this parser looks at a line's metric name first and parses labels
and value only for the wanted ones. It returns exactly what ``prometheus_client``'s
parsers return for those samples (names, labels, values, timestamps), which the tests
check on real captures.

Errors raise ``ExpositionError`` naming the line number and the offending text, quoted
in a bounded excerpt (``excerpt``): a hostile replica's megabyte line never reaches a log
whole. ``Limits`` bound what one target may send: its size (``TooLargeError``) and its
count of wanted samples (``TooManySeriesError``, raised as soon as the cap is passed).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}

EXCERPT = 200
"""Characters of an offending line or value quoted in an error message."""


class ExpositionError(ValueError):
    """The text is not valid Prometheus or OpenMetrics exposition."""


class TooLargeError(ValueError):
    """The body is larger than ``Limits.max_bytes``: it is never parsed."""


class TooManySeriesError(ValueError):
    """The body holds more wanted samples than ``Limits.max_series``."""


MAX_BYTES = 4 << 20
"""Default body cap: 4 MiB; vLLM sends about 50 kB per engine."""
MAX_SERIES = 10_000
"""Default cap on wanted samples; one vLLM engine exposes about 120."""
MAX_LABELS = 64
"""Labels one wanted sample may carry: vLLM's carry at most five; a hostile line of half a
million would take half a second to read."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one target may send in one scrape."""

    max_bytes: int = MAX_BYTES
    """Body size in bytes (characters for text)."""
    max_series: int = MAX_SERIES
    """Wanted samples."""


DEFAULT_LIMITS = Limits()


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """``text`` quoted (``repr``), cut to ``limit`` characters with its length when longer."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposed sample: ``name{labels} value [timestamp]``."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


def parse_samples(
    text: str,
    wanted: Collection[str] | None = None,
    openmetrics: bool | None = None,
    max_samples: int | None = None,
) -> list[Sample]:
    """Samples whose exposed name is in ``wanted`` (every sample if None), in text order.

    Accepts the classic text format (``version=0.0.4``/``1.0.0``, timestamps in
    milliseconds) and OpenMetrics (``# EOF``, exemplars after `` # ``, timestamps in
    seconds); ``openmetrics=None`` tells them apart by the ``# EOF`` line. Timestamps
    come back in seconds either way. Comment and metadata lines are skipped: callers
    match on sample names.

    Raises:
        ExpositionError: a wanted line is malformed; other lines are not examined.
        TooManySeriesError: more than ``max_samples`` wanted samples (None: no cap).
    """
    if openmetrics is None:
        openmetrics = text.rstrip().endswith("# EOF")
    samples: list[Sample] = []
    append = samples.append
    room = -1 if max_samples is None else max_samples
    # Lines end at "\n" alone, as Prometheus reads them: ``str.splitlines`` also broke at
    # "\r", "\x0b", "\x85", U+2028 and more, which a label value may hold unescaped (a
    # LoRA adapter's name): a sample hidden in it was read as the replica's own.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]  # a body written with CRLF line ends
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = _first_blank(line)
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if wanted is not None and name not in wanted:
                continue
            labels, position = _parse_labels(line, brace + 1, number)
        else:
            if space == -1:
                raise ExpositionError(f"line {number}: no value in {excerpt(line)}")
            name = line[:space]
            if wanted is not None and name not in wanted:
                continue
            labels, position = {}, space
        if not name:
            raise ExpositionError(f"line {number}: no metric name in {excerpt(line)}")
        value, timestamp = _parse_value(line, position, number)
        if timestamp is not None and not openmetrics:
            timestamp /= 1000.0  # the text format counts milliseconds
        if room == 0:
            raise TooManySeriesError(
                f"line {number}: more than {max_samples:,} wanted samples in one scrape"
            )
        room -= 1
        append(Sample(name, labels, value, timestamp))
    return samples


def _first_blank(line: str) -> int:
    space = line.find(" ")
    tab = line.find("\t")
    if tab != -1 and (space == -1 or tab < space):
        return tab
    return space


def _parse_labels(line: str, position: int, number: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    end, count = len(line), 0  # labels read, a name repeated counted each time
    while True:
        while position < end and line[position] in " \t":
            position += 1
        if position < end and line[position] == "}":
            return labels, position + 1
        equals = line.find("=", position)
        if equals == -1:
            raise ExpositionError(f"line {number}: unterminated labels in {excerpt(line)}")
        label = line[position:equals].strip()
        if not label or line[equals + 1 : equals + 2] != '"':
            raise ExpositionError(f"line {number}: bad label near {excerpt(line[position:])}")
        start = equals + 2
        close = line.find('"', start)
        if close == -1:
            raise ExpositionError(f"line {number}: unterminated label value in {excerpt(line)}")
        if line.find("\\", start, close) == -1:
            value = line[start:close]
        else:
            value, close = _unescape(line, start, number)
        labels[label] = value
        count += 1
        if count > MAX_LABELS:
            raise ExpositionError(
                f"line {number}: more than {MAX_LABELS} labels in {excerpt(line)}"
            )
        position = close + 1
        while position < end and line[position] in " \t":
            position += 1
        if position < end and line[position] == ",":
            position += 1
        elif position < end and line[position] == "}":
            return labels, position + 1
        else:
            raise ExpositionError(f"line {number}: expected ',' or '}}' in {excerpt(line)}")


_QUOTED = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""A label value's text up to its closing quote, escapes included (matched in C, a few times
faster than a loop over its characters)."""


def _unescape(line: str, start: int, number: int) -> tuple[str, int]:
    found = _QUOTED.match(line, start)
    if found is None:
        raise ExpositionError(f"line {number}: unterminated label value in {excerpt(line)}")
    close = found.end() - 1
    # Escapes read left to right: a pair of backslashes is one, so split on pairs first.
    parts = line[start:close].split("\\\\")
    return "\\".join(part.replace('\\"', '"').replace("\\n", "\n") for part in parts), close


def _parse_value(line: str, position: int, number: int) -> tuple[float, float | None]:
    rest = line[position:]
    exemplar = rest.find(" # ")
    if exemplar != -1:
        rest = rest[:exemplar]
    parts = rest.split()
    if not parts or len(parts) > 2:
        raise ExpositionError(f"line {number}: expected 'value [timestamp]' in {excerpt(line)}")
    try:
        value = _float(parts[0])
        timestamp = _float(parts[1]) if len(parts) == 2 else None
    except ValueError:
        raise ExpositionError(f"line {number}: bad number in {excerpt(line)}") from None
    return value, timestamp


def _float(text: str) -> float:
    # As prometheus_client does: float() reads "+Inf", "-Inf" and "NaN" too. Its digit
    # separators ("1_000") are no number to Prometheus, which refuses the scrape.
    if "_" in text:
        raise ValueError(text)
    return float(text)
