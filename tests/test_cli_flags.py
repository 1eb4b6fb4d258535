"""The command line as a boundary: any flag or file ends in a result or one line, status 2.

Issue 27, classes 5 and 7. ``unitscale.flags`` states each numeric flag's domain once,
as its ``type=``; ``unitscale.cli.main`` is the one error path for what the user gave
(a ``UnitscaleError`` or an ``OSError``). Tracebacks from ``unitscale replay`` on invalid
UTF-8, counts above int64, NaN timestamps, ``--rate-multiplier nan``,
``--max-replicas 0``, ``--target-concurrency -1`` or ``--price nan`` were the finding;
a two-row trace dated 2000 and 2100 and ``--rate-multiplier 1e9`` asked for 23.5 and
298 GiB.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import UnitscaleError
from unitscale import cli, flags
from unitscale.commands import replay as replay_command

UNITSCALE = [sys.executable, "-m", "unitscale.cli"]
MEMORY = 3 << 30
"""Address space a command here may take: a size that escapes its bound fails the test
instead of asking the machine for 23.5 GiB."""


BOUNDED = [
    sys.executable,
    "-c",
    "import resource, runpy;"
    f" resource.setrlimit(resource.RLIMIT_AS, ({MEMORY}, {MEMORY}));"
    " runpy.run_module('unitscale.cli', run_name='__main__', alter_sys=True)",
]
"""``unitscale`` under the address-space limit, set by the child itself: a ``preexec_fn``
would run this process's at-fork hooks in the child, and gRPC's (servers earlier tests
left threads of) abort it."""


def unitscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BOUNDED, *args], capture_output=True, text=True, timeout=120, check=False
    )


def write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


AZURE = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
TWO_ROWS = AZURE + b"2023-11-16 18:17:03.9,100,5\n2023-11-16 18:17:05.4,200,7\n"


def test_a_report_whose_reader_left_ends_quietly_as_a_writer_sigpipe_stopped(tmp_path):
    """``unitscale replay ... | head``: once head has what it wants, no "Broken pipe" and
    no status 2 (a mistake of the user's); 141, as ``yes | head`` gives."""
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    report = ["--report", str(tmp_path / "report")]
    read, written = os.pipe()
    os.close(read)  # the reader left before a byte was written
    try:
        done = subprocess.run(
            [*BOUNDED, "replay", "--trace", trace, "--policy", "static-peak", *report],
            stdout=written,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(written)
    assert done.returncode == 128 + signal.SIGPIPE, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("trace", "flags", "message"),
    [
        pytest.param(
            AZURE + b"2023-11-16 18:17:03.9,1\xff0,5\n",
            [],
            "t:2: not UTF-8",
            id="a trace that is not UTF-8 names its line",
        ),
        pytest.param(
            AZURE + b"2023-11-16 18:17:03.9,99999999999999999999,5\n",
            [],
            "t:2: column ContextTokens: '99999999999999999999' is not 0 to 10,000,000 tokens",
            id="a token count above int64 names its line and column",
        ),
        pytest.param(
            b'{"timestamp": NaN, "input_length": 1, "output_length": 1}\n',
            [],
            "t:1: column timestamp: nan is not a finite number of milliseconds",
            id="a NaN timestamp names its line and column",
        ),
        pytest.param(
            AZURE + b"2023-11-16 18:17:03.9,-5,5\n",
            [],
            "t:2: column ContextTokens: '-5' is not 0 to 10,000,000 tokens",
            id="a negative token count is refused, not replayed as 1",
        ),
        pytest.param(
            b'{"timestamp": 0, "input_length": 1.5, "output_length": 1}\n',
            [],
            "t:1: column input_length: 1.5 is not a whole number of tokens",
            id="a fractional token count is refused",
        ),
        pytest.param(
            b'{"timestamp": 0, "input_length": 8, "output_length": false}\n',
            [],
            "t:1: column output_length: False is not a whole number of tokens",
            id="a boolean token count is refused",
        ),
        pytest.param(
            b"TIMESTAMP,ContextTokens,GeneratedTokens" + b",x" * 500_000 + b"\n" + TWO_ROWS[40:],
            [],
            "t:1: a header of 500,003 columns, at most 64",
            id="a header of half a million columns is refused before its rows are read",
        ),
        pytest.param(
            AZURE + b"2023-11-16 18:17:03.9,100\n",
            [],
            "t:2: column GeneratedTokens: missing",
            id="a row short of a column names it",
        ),
        pytest.param(
            AZURE + b"2000-01-01 00:00:00,100,5\n2100-01-01 00:00:00,100,5\n",
            [],
            "t: lines 2 and 3 are 3,155,7",  # seconds from 2000 to 2100, named with the limit
            id="a trace dated 2000 and 2100 is refused naming both rows, not 23.5 GiB asked",
        ),
        pytest.param(
            TWO_ROWS,
            ["--rate-multiplier", "1e9"],
            "argument --rate-multiplier: '1e9' is not a number above 0, at most 1,000",
            id="a multiplier of 1e9 is refused naming the limit, not 298 GiB asked",
        ),
        pytest.param(
            TWO_ROWS,
            ["--rate-multiplier", "1e-9"],
            "--rate-multiplier 1e-09: 0 requests from 2; a replay needs at least one",
            id="a multiplier that leaves no request is refused",
        ),
        pytest.param(
            TWO_ROWS,
            ["--time-compression", "1e-9"],
            "--time-compression 1e-09: must be above 0, and the 1.5 s trace would span",
            id="a compression that stretches two seconds past a month is refused",
        ),
        pytest.param(
            TWO_ROWS,
            ["--rate-multiplier", "nan"],
            "argument --rate-multiplier: 'nan' is not a number above 0",
            id="a NaN multiplier is refused as it is parsed",
        ),
        pytest.param(
            TWO_ROWS,
            ["--max-replicas", "0"],
            "argument --max-replicas: '0' is not a whole number from 1 to 10,000",
            id="a fleet of no replicas is refused",
        ),
        pytest.param(
            TWO_ROWS,
            ["--target-concurrency", "-1"],
            "argument --target-concurrency: '-1' is not a number above 0",
            id="a negative target concurrency is refused",
        ),
        pytest.param(
            TWO_ROWS,
            ["--price", "5e-324"],
            "argument --price: '5e-324' is not a number from 1e-06",
            id="a price of nothing is refused: every cost would be nothing (passes 15, 16)",
        ),
        pytest.param(
            TWO_ROWS,
            ["--price", "nan"],
            "argument --price: 'nan' is not a number from 1e-06",
            id="a NaN price is refused, not a ValueError after the replay",
        ),
        pytest.param(
            TWO_ROWS,
            ["--seed", "-1"],
            "argument --seed: '-1' is not a whole number from 0",
            id="a negative seed is refused, not a ValueError inside numpy",
        ),
        pytest.param(
            TWO_ROWS,
            ["--standby-burst-sleepers", "1"],
            "--standby-burst-sleepers holds sleepers: give --standby-max-sleeping",
            id="burst sleepers in a fleet that may hold none are refused",
        ),
        pytest.param(
            TWO_ROWS,
            ["--compare-tiers", "--standby-max-sleeping", "2"],
            "--compare-tiers sets each row's sleepers: drop --standby-max-sleeping",
            id="the tiers' comparison sets its own sleepers",
        ),
    ],
)
def test_replay_refuses_a_bad_file_or_flag_with_one_line_and_status_2(
    tmp_path: Path, trace: bytes, flags: list[str], message: str
) -> None:
    path = write(tmp_path / "t", trace)
    args = ["replay", "--trace", path, "--policy", "unitscale", *flags]
    done = unitscale(*args, "--report", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["demo", "--duration", "nan"], id="the demo refuses a NaN duration"),
        pytest.param(["demo", "--max-replicas", "0"], id="the demo refuses no replicas"),
        pytest.param(
            ["demo", "--max-replicas", "100000"],
            id="the demo refuses more replica processes than a machine runs",
        ),
        pytest.param(["sim-replica", "--speedup", "0"], id="a replica refuses a speedup of 0"),
        pytest.param(
            ["sim-replica", "--max-num-batched-tokens", "-3"],
            id="a replica refuses a negative token budget",
        ),
        pytest.param(
            ["replay", "--report", "x", "--bogus", "a\nb"],
            id="an unknown flag whose value holds a newline is still one line",
        ),
        *(
            pytest.param(
                [
                    "exporter",
                    "--target",
                    "http://127.0.0.1:1",
                    "--listen",
                    "127.0.0.1:0",
                    "--grpc-listen",
                    "127.0.0.1:0",
                    flag,
                    "",
                ],
                id=f"the exporter refuses an empty {flag} rather than ignore it",
            )
            for flag in ("--interval", "--timeout")
        ),
        pytest.param(
            [
                "exporter",
                "--target",
                "http://user:s3cret@127.0.0.1:1",
                "--listen",
                "127.0.0.1:0",
                "--grpc-listen",
                "127.0.0.1:0",
            ],
            id="the exporter refuses a target holding a password",
        ),
    ],
)
def test_other_commands_refuse_a_bad_flag_with_one_line_before_starting(
    args: list[str],
) -> None:
    done = unitscale(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("unitscale"), done.stderr
    assert "s3cret" not in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["replay", "--policy", "static-peak"], id="replay refuses it"),
        pytest.param(["tune", "--budget", "1", "--batch", "1"], id="tune refuses it"),
        pytest.param(
            ["replay", "--pool", "nodes.csv", "--tasks", "tasks.csv"], id="a pool replay refuses it"
        ),
    ],
)
@pytest.mark.parametrize("prefix", ["", "servegen:"], ids=["a file", "a servegen source"])
def test_a_trace_whose_name_is_not_utf8_is_one_line_before_any_run(
    tmp_path: Path, command: list[str], prefix: str
) -> None:
    """Its name goes into the report: a UnicodeEncodeError came after the whole run and left
    the report half-written (issue 27, hostile pass 3, M2). Linux names are bytes."""
    trace = tmp_path / "sur\udcff.csv"  # b"sur\xff.csv" on disk
    write(trace, TWO_ROWS)
    out = tmp_path / "out"
    report = "--out" if command[0] == "tune" else "--report"
    done = unitscale(*command, "--trace", prefix + str(trace), report, str(out))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "argument --trace:" in done.stderr and "is not UTF-8" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        pytest.param("traces/día-1.csv", True, id="a UTF-8 name with an accent is read"),
        pytest.param("servegen:data?scale=0.1", True, id="a servegen source is read"),
        pytest.param("sur\udcff.csv", False, id="a name holding an undecodable byte is refused"),
    ],
)
def test_trace_source_takes_utf8_names_only(text: str, accepted: bool) -> None:
    if accepted:
        assert flags.trace_source(text) == text
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="is not UTF-8"):
            flags.trace_source(text)


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        pytest.param(["replay", "--pool", "P", "--tasks", "t.csv"], "--pool",
                     id="replay refuses a pool file whose name is not UTF-8"),
        pytest.param(["replay", "--pool", "n.csv", "--tasks", "P"], "--tasks",
                     id="replay refuses a task file whose name is not UTF-8"),
        pytest.param(["tune", "--scaler-config", "P", "--out", "o"], "--scaler-config",
                     id="tune refuses a scaler config whose name is not UTF-8"),
        pytest.param(["tune", "--out", "P"], "--out",
                     id="tune refuses an output directory whose name is not UTF-8"),
    ],
)  # fmt: skip
def test_a_path_flag_whose_name_is_not_utf8_is_one_line_before_any_run(
    tmp_path: Path, command: list[str], flag: str
) -> None:
    """Each name goes into a report: a UnicodeEncodeError came after the whole run, the
    report half-written (issue 27, hostile pass 4, M1)."""
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    odd = str(tmp_path / "sur\udcff")  # b"sur\xff" on disk
    args = [odd if a == "P" else a for a in command]
    runs = ["--budget", "1", "--batch", "1"] if command[0] == "tune" else ["--report", "r"]
    done = unitscale(*args, "--trace", trace, *runs)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"argument {flag}:" in done.stderr and "is not UTF-8" in done.stderr


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        pytest.param("reports/día-1", True, id="a UTF-8 path with an accent is taken"),
        pytest.param("sur\udcff.csv", False, id="a path holding an undecodable byte is refused"),
    ],
)
def test_every_path_flag_takes_utf8_names_only(text: str, accepted: bool) -> None:
    if accepted:
        assert flags.path(text) == Path(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="is not UTF-8"):
            flags.path(text)


HUGE = "p" * 100_000


@pytest.mark.parametrize(
    ("args", "names"),
    [
        pytest.param(["replay", "--policy", HUGE], "--policy", id="an unknown policy"),
        pytest.param(["replay", "--profile", HUGE], "--profile", id="an unknown profile"),
        pytest.param(["replay", "--cold-start", HUGE], "--cold-start", id="an unknown cold start"),
        pytest.param(["tune", "--policy", HUGE], "--policy", id="a choice argparse refuses"),
        pytest.param([HUGE], "COMMAND", id="an unknown command"),
        pytest.param(["replay", "--trace", HUGE + ".csv"], "File name too long", id="errno 36"),
        pytest.param(["scaler", "--config-poll", HUGE], "--config-poll", id="a config poll"),
    ],
)
def test_an_error_line_echoing_a_100_kb_value_stays_short(
    tmp_path: Path, args: list[str], names: str
) -> None:
    """Each printed the whole value (issue 27, hostile pass 3, L2)."""
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    extra = ["--report", str(tmp_path / "out")] if args[0] == "replay" else []
    if args[0] == "replay" and "--trace" not in args:
        extra += ["--trace", trace]
    done = unitscale(*args, *extra)
    assert done.returncode == 2, done.stderr[:300]
    assert done.stderr.count("\n") == 1 and len(done.stderr) <= flags.MAX_LINE_CHARS + 1
    assert names in done.stderr


@given(st.text(max_size=5000))
def test_one_line_is_one_bounded_line_and_short_text_is_kept(text: str) -> None:
    line = flags.one_line(text)
    assert "\n" not in line and "\r" not in line
    assert len(line) <= flags.MAX_LINE_CHARS
    escaped = text.replace("\r", "\\r").replace("\n", "\\n")
    assert (
        line == escaped if len(escaped) <= flags.MAX_LINE_CHARS else line.endswith(escaped[-400:])
    )


def test_a_report_path_that_is_a_file_ends_in_one_line_not_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", TWO_ROWS)
    report = write(tmp_path / "report", b"a file, not a directory")
    done = unitscale("replay", "--trace", path, "--policy", "static-peak", "--report", report)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("unitscale replay: ") and "report" in done.stderr


# --- properties: any text for a numeric flag ------------------------------------------------

REPLAY = ["replay", "--report", "out"]
DEMO = ["demo"]
SIM = ["sim-replica"]

# (command, flag, low, high, above): the contract, stated again here on purpose
DOMAINS = [
    (REPLAY, "--rate-multiplier", 0, 1_000, True),
    (REPLAY, "--time-compression", 0, 1e6, True),
    (REPLAY, "--price", 1e-6, 1e6, False),
    (REPLAY, "--slo-ttft", 0, 86_400, True),
    (REPLAY, "--slo-itl", 0, 86_400, True),
    (REPLAY, "--max-sleeping", 0, 10_000, False),
    (REPLAY, "--standby-max-sleeping", 0, 10_000, False),
    (REPLAY, "--standby-burst-sleepers", 0, 10_000, False),
    (REPLAY, "--idle-grace", 0, 86_400, False),
    (REPLAY, "--max-replicas", 1, 10_000, False),
    (REPLAY, "--target-concurrency", 0, 100_000, True),
    (REPLAY, "--seed", 0, 2**63 - 1, False),
    (REPLAY, "--pool-fraction", 0, 1, True),
    (REPLAY, "--training-load", 0, 1_000, True),
    (REPLAY, "--headroom", 0, 10, False),
    (REPLAY, "--max-task-seconds", 0, 31 * 86_400, True),
    (DEMO, "--duration", 0, 86_400, True),
    (DEMO, "--time-compression", 0, 50, True),
    (DEMO, "--rate-multiplier", 0, 1_000, True),
    (DEMO, "--seed", 0, 2**63 - 1, False),
    (DEMO, "--max-replicas", 1, 64, False),
    (DEMO, "--target-concurrency", 0, 100_000, True),
    (SIM, "--speedup", 0, 1e6, True),
    (SIM, "--max-num-batched-tokens", 1, 10_000_000, False),
]

NUMBERISH = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.integers().map(str),
    st.integers(min_value=-(10**40), max_value=10**40).map(lambda n: f" {n:+} "),
    st.sampled_from(
        ["", "nan", "-inf", "Infinity", "1e309", "1_000", "0x10", "٣", "½", "1e-400", "-0"]
    ),
    st.text(),
)


@settings(max_examples=400, deadline=None)
@given(domain=st.sampled_from(DOMAINS), text=NUMBERISH)
def test_any_text_for_a_numeric_flag_is_in_domain_or_one_line_and_status_2(
    domain: tuple[list[str], str, float, float, bool], text: str
) -> None:
    command, flag, low, high, above = domain
    parser = cli.build_parser()
    errors = _Stderr()
    try:
        with errors:
            args = parser.parse_args([*command, f"{flag}={text}"])
    except SystemExit as exit_:
        assert exit_.code == 2
        assert errors.text.count("\n") == 1 and f"argument {flag}:" in errors.text, errors.text
        return
    value = getattr(args, flag.removeprefix("--").replace("-", "_"))
    value = value[0] if isinstance(value, list) else value  # --headroom is repeatable
    assert math.isfinite(value) and (low < value if above else low <= value) and value <= high
    if command is REPLAY:
        _replay_setup_accepts(args)


def _replay_setup_accepts(args: argparse.Namespace) -> None:
    """A replay flag in domain never fails the run's setup with anything but a one-liner."""
    try:
        replay_command.fleet_and_policies(args)
    except UnitscaleError:
        pass


class _Stderr:
    """Capture ``sys.stderr`` inside hypothesis (pytest's capsys is per test, not per example)."""

    text = ""

    def __enter__(self) -> None:
        self._saved, self._buffer = sys.stderr, io.StringIO()
        sys.stderr = self._buffer

    def __exit__(self, *exc: object) -> None:
        sys.stderr = self._saved
        self.text = self._buffer.getvalue()
