"""``replay.trace`` as the boundary for trace files: every row checked, every size bounded.

Issue 27, classes 5 and 7: a row outside the domain (a token count that is negative,
fractional, boolean or above int64; a NaN timestamp; bytes that are not UTF-8) is a
``TraceError`` naming the file, the line and the column, never a traceback or a silent
1; the span, the row count and the rate multiplier are bounded before anything they
size is allocated.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay import trace as trace_module
from replay.limits import (
    MAX_LINE_BYTES,
    MAX_RATE_MULTIPLIER,
    MAX_TOKENS,
    MAX_TRACE_REQUESTS,
    MAX_TRACE_SPAN_SECONDS,
)
from replay.trace import Trace, TraceError, read_recording, read_trace, scale

AZURE_HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_AZURE_ROW = b"2023-11-16 18:17:03.9799600,100,5\n"


def azure(tmp_path: Path, *rows: bytes) -> Path:
    path = tmp_path / "t.csv"
    path.write_bytes(AZURE_HEADER + GOOD_AZURE_ROW + b"".join(rows))
    return path


def mooncake(tmp_path: Path, *lines: bytes) -> Path:
    path = tmp_path / "t.jsonl"
    good = b'{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
    path.write_bytes(good + b"".join(lines))
    return path


@pytest.mark.parametrize(
    ("row", "message"),
    [
        pytest.param(
            b"2023-11-16 18:17:04,-5,5\n",
            "t.csv:3: column ContextTokens: '-5' is not 0 to 10,000,000 tokens",
            id="a negative prompt is refused by line and column, not replayed as 1",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,5,1.5\n",
            "t.csv:3: column GeneratedTokens: '1.5' is not a whole number of tokens",
            id="a fractional output is refused by line and column",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,99999999999999999999999,5\n",
            "t.csv:3: column ContextTokens: '99999999999999999999999' is not 0 to 10,000,000",
            id="a count above int64 is refused, not an OverflowError in numpy",
        ),
        pytest.param(
            b"2023-11-16 18:17:04," + b"9" * 5000 + b",5\n",
            "t.csv:3: column ContextTokens:",
            id="a 5,000-digit count is refused by its column",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,1_000,5\n",
            "t.csv:3: column ContextTokens: '1_000' is not a whole number",
            id="a count with an underscore is refused although int() reads it",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,True,5\n",
            "t.csv:3: column ContextTokens: 'True' is not a whole number",
            id="a boolean count in a CSV is refused",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,1,000,5\n",
            "t.csv:3: 4 fields where the header names 3",
            id="a thousands comma shifting the columns is refused, not 1 prompt token",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,10\n",
            "t.csv:3: column GeneratedTokens: missing",
            id="a short row names the missing column",
        ),
        pytest.param(
            b"not a time,10,5\n",
            "t.csv:3: column TIMESTAMP: 'not a time' is not a date and time",
            id="a timestamp that is no date is refused by column",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,1\xff0,5\n",
            "t.csv:3: not UTF-8",
            id="bytes that are not UTF-8 are refused by line, not a UnicodeDecodeError",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,10,\x005\n",
            "t.csv:3: column GeneratedTokens: '\\x005' is not a whole number",
            id="a NUL byte is refused by its column",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,10,5," + b"x" * 200_000 + b"\n",
            "t.csv:3: not CSV: field larger than field limit",
            id="a field past the csv module's limit is refused by line, not a csv.Error",
        ),
        pytest.param(
            b"2023-11-16 18:17:04,10," + b"5" * (MAX_LINE_BYTES + 1) + b"\n",
            f"t.csv:3: a line over {MAX_LINE_BYTES:,} bytes",
            id="an endless line is refused before it is read whole",
        ),
        pytest.param(
            b"2100-01-01 00:00:00,10,5\n",
            f"days) apart; a trace may span at most {MAX_TRACE_SPAN_SECONDS:,} s (31 days)",
            id="a row dated a century later is refused naming both rows, not 23.5 GiB asked",
        ),
    ],
)
def test_an_azure_row_outside_the_domain_is_refused_naming_line_and_column(
    tmp_path: Path, row: bytes, message: str
) -> None:
    with pytest.raises(TraceError) as refused:
        read_trace(azure(tmp_path, row))
    assert message in str(refused.value)
    assert re.search(r"t\.csv:3: |t\.csv: lines 2 and 3 ", str(refused.value))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param(
            b'{"timestamp": NaN, "input_length": 1, "output_length": 1}\n',
            "t.jsonl:2: column timestamp: nan is not a finite number of milliseconds",
            id="a NaN timestamp is refused, not a ValueError deep in the replay",
        ),
        pytest.param(
            b'{"timestamp": Infinity, "input_length": 1, "output_length": 1}\n',
            "t.jsonl:2: column timestamp: inf",
            id="an infinite timestamp is refused",
        ),
        pytest.param(
            b'{"timestamp": 1' + b"0" * 400 + b', "input_length": 1, "output_length": 1}\n',
            "t.jsonl:2: column timestamp:",
            id="a timestamp too large for a float is refused, not an OverflowError",
        ),
        pytest.param(
            b'{"timestamp": 1.7e308, "input_length": 1, "output_length": 1}\n',
            "t.jsonl: lines 1 and 2 are 1.7e+305 s (1.97e+300 days) apart",
            id="a span of 1e305 s is said in three digits, not 306",
        ),
        pytest.param(
            b'{"timestamp": "250", "input_length": 1, "output_length": 1}\n',
            "t.jsonl:2: column timestamp: '250' is not a finite number",
            id="a timestamp as a string is refused",
        ),
        pytest.param(
            b'{"timestamp": 5, "input_length": -3, "output_length": 1}\n',
            "t.jsonl:2: column input_length: -3 is not 0 to 10,000,000 tokens",
            id="a negative prompt is refused, not replayed as 1",
        ),
        pytest.param(
            b'{"timestamp": 5, "input_length": 1.5, "output_length": 1}\n',
            "t.jsonl:2: column input_length: 1.5 is not a whole number of tokens",
            id="a fractional prompt is refused, not truncated to 1",
        ),
        pytest.param(
            b'{"timestamp": 5, "input_length": 10, "output_length": true}\n',
            "t.jsonl:2: column output_length: True is not a whole number of tokens",
            id="a boolean output is refused, not read as 1",
        ),
        pytest.param(
            b'{"timestamp": 5, "input_length": 9223372036854775808, "output_length": 1}\n',
            "t.jsonl:2: column input_length:",
            id="a count above int64 is refused",
        ),
        pytest.param(
            b'{"timestamp": 5, "output_length": 1}\n',
            "t.jsonl:2: column input_length: None is not a whole number",
            id="a missing count names its column",
        ),
        pytest.param(
            b"[1, 2, 3]\n", "t.jsonl:2: not a JSON object", id="a JSON list is refused by line"
        ),
        pytest.param(
            b'{"timestamp": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
            "t.jsonl:2: not a JSON record",
            id="deeply nested JSON is refused, not a RecursionError",
        ),
        pytest.param(
            b'{"timestamp": 5, "input_length": 1, "output_length": 1, "x": "\xc3"}\n',
            "t.jsonl:2: not UTF-8",
            id="a record that is not UTF-8 is refused by line",
        ),
    ],
)
def test_a_mooncake_record_outside_the_domain_is_refused_naming_line_and_column(
    tmp_path: Path, line: bytes, message: str
) -> None:
    with pytest.raises(TraceError) as refused:
        read_trace(mooncake(tmp_path, line))
    assert message in str(refused.value)


def test_counts_of_zero_and_integral_floats_are_read_and_zero_replays_as_one(
    tmp_path: Path,
) -> None:
    trace = read_trace(
        mooncake(tmp_path, b'{"timestamp": 250, "input_length": 12.0, "output_length": 0}\n')
    )
    assert trace.prompt.tolist() == [10, 12] and trace.output.tolist() == [2, 1]


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + AZURE_HEADER + GOOD_AZURE_ROW)
    assert len(read_trace(path)) == 1


def test_a_trace_past_the_request_limit_is_refused_at_the_first_row_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("replay.trace.MAX_TRACE_REQUESTS", 3)
    path = azure(tmp_path, GOOD_AZURE_ROW, GOOD_AZURE_ROW, GOOD_AZURE_ROW)
    with pytest.raises(TraceError, match=r"t\.csv:5: more than 3 requests"):
        read_trace(path)


def test_the_limits_hold_the_public_traces() -> None:
    # the largest prompt in the shared traces is 191,378 tokens; their spans are an hour
    assert MAX_TOKENS > 191_378
    assert MAX_TRACE_SPAN_SECONDS >= 14 * 86_400  # ServeGen's two weeks
    assert MAX_TRACE_REQUESTS >= 50 * 19_366  # the Azure conversation trace x50


TWO = Trace("two", np.array([0.0, 1.0]), np.array([10, 10]), np.array([2, 2]))


@pytest.mark.parametrize(
    ("multiplier", "compression", "message"),
    [
        pytest.param(
            1e9,
            1.0,
            "--rate-multiplier 1e+09: must be above 0, at most 1,000",
            id="a multiplier of 1e9 is refused before 298 GiB is asked",
        ),
        pytest.param(math.nan, 1.0, "--rate-multiplier nan", id="a NaN multiplier is refused"),
        pytest.param(-1.0, 1.0, "--rate-multiplier -1", id="a negative multiplier is refused"),
        pytest.param(
            1e-9,
            1.0,
            "0 requests from 2; a replay needs at least one",
            id="a multiplier that leaves no request is refused, not a NaN in the replay",
        ),
        pytest.param(
            1.0,
            1e-9,
            "--time-compression 1e-09: must be above 0, and the 1 s trace would span",
            id="a compression below 1 that stretches the trace past a month is refused",
        ),
        pytest.param(
            1.0,
            1e-300,
            "the 1 s trace would span 2e+300 s;",
            id="a tiny compression is refused in a short line, not a 300-digit span",
        ),
        pytest.param(0.5, math.nan, "--time-compression nan", id="a NaN compression is refused"),
        pytest.param(1.0, 0.0, "--time-compression 0", id="a compression of 0 is refused"),
    ],
)
def test_scaling_refuses_sizes_out_of_bounds_naming_the_flag(
    multiplier: float, compression: float, message: str
) -> None:
    with pytest.raises(TraceError) as refused:
        scale(TWO, multiplier, compression, seed=0)
    assert message in str(refused.value)


def test_the_request_count_after_the_multiplier_is_bounded_before_the_copies_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("replay.trace.MAX_TRACE_REQUESTS", 1_000)

    def no_copies(*args: object, **kwargs: object) -> None:
        raise AssertionError("the copies were made before the count was checked")

    monkeypatch.setattr("replay.trace.np.repeat", no_copies)
    with pytest.raises(TraceError, match=r"--rate-multiplier 600: 1,200 requests from 2"):
        scale(TWO, 600.0, 1.0, seed=0)
    assert MAX_RATE_MULTIPLIER >= 600


# --- properties --------------------------------------------------------------------------

FIELD = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "True", "nan", "-0", "+7", "1e3", "0x10", "½", "٣", "1_0"]),
    st.text(max_size=12),
)
"""Anything a CSV field may hold, biased to the numbers' edges."""
TIME = st.one_of(
    st.sampled_from(["2023-11-16 18:17:04", "0001-01-01 00:00:00", "9999-12-31 23:59:59"]),
    st.datetimes().map(str),
    st.text(max_size=30),
)


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(st.tuples(TIME, FIELD, FIELD), min_size=1, max_size=5))
def test_any_azure_rows_are_read_in_domain_or_refused_naming_a_line(
    tmp_path: Path, rows: list[tuple[str, str, str]]
) -> None:
    path = tmp_path / "p.csv"
    body = "".join(",".join(_csv_field(f) for f in row) + "\n" for row in rows)
    path.write_bytes(AZURE_HEADER + body.encode("utf-8", "surrogatepass"))
    _read_in_domain_or_refused(path)


JSON_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    records=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "timestamp": JSON_VALUE,
                "input_length": JSON_VALUE,
                "output_length": JSON_VALUE,
            },
        ),
        min_size=1,
        max_size=5,
    )
)
def test_any_mooncake_records_are_read_in_domain_or_refused_naming_a_line(
    tmp_path: Path, records: list[dict[str, object]]
) -> None:
    path = tmp_path / "p.jsonl"
    # a first record that is one, so the file is taken as Mooncake whatever follows
    lines = ['{"timestamp": 0, "input_length": 1, "output_length": 1}']
    lines += [json.dumps(r, allow_nan=True) for r in records]
    path.write_text("\n".join(lines) + "\n")
    _read_in_domain_or_refused(path)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.binary(max_size=200))
def test_any_bytes_after_a_header_are_read_in_domain_or_refused(
    tmp_path: Path, body: bytes
) -> None:
    path = tmp_path / "b.csv"
    path.write_bytes(AZURE_HEADER + body)
    _read_in_domain_or_refused(path)


def _read_in_domain_or_refused(path: Path) -> None:
    """``read_trace(path)`` is a trace in domain, or a one-line error naming the file."""
    try:
        trace = read_trace(path)
    except TraceError as err:
        assert re.match(re.escape(str(path)) + r"(:\d+)?: ", str(err)), str(err)
        assert "\n" not in str(err) and len(str(err)) < 400
        return
    assert np.all(np.isfinite(trace.arrival)) and np.all(np.diff(trace.arrival) >= 0)
    assert trace.duration <= MAX_TRACE_SPAN_SECONDS
    for counts in (trace.prompt, trace.output):
        assert counts.dtype == np.int64 and np.all((counts >= 1) & (counts <= MAX_TOKENS))


HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(
    ("files", "refused"),
    [
        pytest.param(3, False, id="as many files as the gateway keeps are read"),
        pytest.param(4, True, id="one file more is refused before any is opened"),
    ],
)
def test_a_recording_directory_holds_at_most_the_files_the_gateway_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, refused: bool
) -> None:
    """20,000 header-only files took 10 s with no bound (issue 27, hostile pass 3, L3)."""
    monkeypatch.setattr(trace_module, "MAX_RECORDING_FILES", 3)
    for i in range(files):
        (tmp_path / f"arrivals-{i:08d}.csv").write_bytes(
            HEADER + f"2025-01-02 03:04:0{i}.000000+00:00,10,5\n".encode()
        )
    if refused:
        with pytest.raises(TraceError, match=r"more than 3 \.csv files; the gateway keeps"):
            read_recording(tmp_path)
    else:
        assert len(read_recording(tmp_path)) == files


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Australia/Lord_Howe"])
def test_timestamps_without_an_offset_are_utc_whatever_the_hosts_zone(tmp_path, monkeypatch, zone):
    """Read in the host's zone, two rows an hour apart across New York's spring change
    were 1 s apart there: the same trace cost 1.0004 GPU-hours under UTC, 0.0004 there."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        path = tmp_path / "dst.csv"
        path.write_bytes(AZURE_HEADER + b"2023-03-12 01:59:59,5,10\n2023-03-12 03:00:00,5,10\n")
        assert read_trace(path).arrival.tolist() == [0.0, 3601.0]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        pytest.param(
            b"2023-11-16 18:17:05+05:00,5,10\n",
            "t.csv:3: column TIMESTAMP: has a UTC offset, and line 2's does not",
            id="a row with an offset after rows without is refused naming both lines",
        ),
    ],
)
def test_a_trace_mixing_timestamps_with_and_without_an_offset_is_refused(tmp_path, rows, words):
    with pytest.raises(TraceError, match=re.escape(words)):
        read_trace(azure(tmp_path, rows))
