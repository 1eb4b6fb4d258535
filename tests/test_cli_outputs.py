"""The files a `unitscale` command writes, under the forty-eighth hostile pass (issue 27).

A run wrote its report files by opening each path where it stood: a FIFO there held a
finished run forever, a directory there failed it after the whole run, and an output
that was one of its own inputs was replaced, or removed (``tune`` with no trial meeting
the target removes a stale proposal: it removed the ``--scaler-config`` it was given).
Now each output is checked before the run (``unitscale.outputs.report_directory``)
and written beside its path, then renamed over it (``foundation.files.write_file``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from foundation.files import write_file
from tests.stand_ins import RanError, stop_runs
from tests.test_cli_flags import TWO_ROWS, write
from tests.test_cli_hostile7 import NODES, PODS
from unitscale import cli

CONFIG = (
    "# an SRE's config, with its comments\npolicy:\n  profile: llama3-8b-h200\n"
    "  headroom-step: 0.05\n"
)
SCALED_OBJECT = (Path(__file__).parents[1] / "deploy/scaledobjects/recommended.yaml").read_text()


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs started, each stopped as it starts: which one, by name."""
    import replay.pool.joint
    import replay.run
    import unitscale.demo.run
    import unitscale.tune

    return stop_runs(
        monkeypatch,
        {
            "replay": (replay.run, "run_policies"),
            "joint replay": (replay.pool.joint, "run_all"),
            "tune": (unitscale.tune, "worker_pool"),
            "demo": (unitscale.demo.run, "Conductor"),  # the fleet, once the checks are done
        },
    )


def _command(tmp_path: Path, command: str, out: Path) -> list[str]:
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    if command == "tune":
        return ["tune", "--trace", trace, "--out", str(out)]
    if command == "demo":
        return ["demo", "--report", str(out), "--duration", "3", "--plain"]
    args = ["replay", "--trace", trace, "--report", str(out)]
    if command == "replay --pool":
        nodes, pods = write(tmp_path / "n.csv", NODES), write(tmp_path / "p.csv", PODS)
        return [*args, "--pool", nodes, "--tasks", pods, "--pool-fraction", "1"]
    return [*args, "--policy", "unitscale"]


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("command", "name", "flag"),
    [
        pytest.param("replay", "report.md", "--report", id="replay's report"),
        pytest.param("replay --pool", "pool.png", "--report", id="the joint replay's plot"),
        pytest.param("tune", "trials.csv", "--out", id="tune's trials"),
        pytest.param("demo", "results.json", "--report", id="the demo's results"),
    ],
)
@pytest.mark.parametrize(
    ("make", "kind"),
    [
        pytest.param(os.mkfifo, "a FIFO", id="a FIFO there would hold the run for good"),
        pytest.param(os.mkdir, "a directory", id="a directory there failed it after the run"),
    ],
)
def test_an_output_that_is_no_regular_file_is_refused_before_the_run(
    tmp_path: Path,
    runs: list[str],
    capsys: pytest.CaptureFixture[str],
    command: str,
    name: str,
    flag: str,
    make: Callable[[Path], None],
    kind: str,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    make(out / name)
    code, err = _main(_command(tmp_path, command, out), capsys)
    assert (code, runs) == (2, [])
    verb = command.split()[0]
    assert err == f"unitscale {verb}: {flag} '{out}': {name} is {kind}; the run writes a file there"


@pytest.mark.parametrize(
    ("command", "name", "flag", "content"),
    [
        pytest.param("tune", "scaler-config.yaml", "--scaler-config", CONFIG,
                     id="tune, last night's proposal fed back"),
        pytest.param("replay", "report.md", "--scaler-config", CONFIG,
                     id="replay, an odd place for a config"),
        pytest.param("demo", "config/scaler.yaml", "--scaler-config", CONFIG,
                     id="the demo, its own config directory"),
        pytest.param("demo", "config/gateway.yaml", "--scaled-object", SCALED_OBJECT,
                     id="the demo, a ScaledObject where it writes the gateway's config"),
    ],
)  # fmt: skip
def test_an_input_the_run_would_replace_is_refused_and_kept(
    tmp_path: Path,
    runs: list[str],
    capsys: pytest.CaptureFixture[str],
    command: str,
    name: str,
    flag: str,
    content: str,
) -> None:
    out = tmp_path / "out"
    given = out / name
    given.parent.mkdir(parents=True)
    given.write_text(content)
    code, err = _main([*_command(tmp_path, command, out), flag, str(given)], capsys)
    assert (code, runs) == (2, [])
    assert err.endswith(
        f"{name} is the {flag} given, which the run replaces: copy it elsewhere first"
    )
    assert given.read_text() == content


def test_a_recording_directory_as_tunes_out_is_refused(
    tmp_path: Path, runs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Its trials.csv would be read as a trace of the recording next time."""
    recording = tmp_path / "recording"
    recording.mkdir()
    write(recording / "arrivals-1.csv", TWO_ROWS)
    code, err = _main(["tune", "--trace", str(recording), "--out", str(recording)], capsys)
    assert (code, runs) == (2, [])
    assert err == (
        f"unitscale tune: --out '{recording}' is the --trace directory: the files written"
        " would be read with it next time"
    )
    assert sorted(p.name for p in recording.iterdir()) == ["arrivals-1.csv"]


def test_a_file_is_written_beside_its_path_and_renamed_over_what_stood_there(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "report.md"
    os.mkfifo(fifo)  # opened for writing, it waits for a reader for good
    write_file(fifo, "# report\n")
    assert fifo.read_text() == "# report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no partial left


def test_a_file_that_cannot_be_written_leaves_nothing_beside_it(tmp_path: Path) -> None:
    (tmp_path / "report.md").mkdir()
    with pytest.raises(IsADirectoryError):
        write_file(tmp_path / "report.md", "# report\n")
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


@pytest.mark.parametrize(
    ("flag", "name", "content", "column"),
    [
        pytest.param(
            "--trace",
            "t.csv",
            b"TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
            b"2023-11-16 18:17:03.9,374,44,99999\n",
            "ContextTokens",
            id="a trace naming a column twice: which is meant is unknowable",
        ),
        pytest.param(
            "--pool",
            "n.csv",
            b"sn,cpu_milli,memory_mib,gpu,model,gpu\nnode-0,64000,262144,4,T4,0\n",
            "gpu",
            id="a node list naming a column twice: the csv module kept the last",
        ),
    ],
)
def test_a_csv_header_naming_a_column_twice_is_refused(
    tmp_path: Path,
    runs: list[str],
    capsys: pytest.CaptureFixture[str],
    flag: str,
    name: str,
    content: bytes,
    column: str,
) -> None:
    argv = _command(tmp_path, "replay --pool" if flag == "--pool" else "replay", tmp_path / "r")
    path = write(tmp_path / name, content)
    code, err = _main(argv, capsys)
    assert (code, runs) == (2, [])
    assert err == f"unitscale replay: {path}:1: column {column} is named twice in the header"


def test_a_replaced_file_keeps_its_permissions_and_a_symlink_its_target(tmp_path: Path) -> None:
    private = tmp_path / "report.md"
    private.write_text("old\n")
    private.chmod(0o600)
    write_file(private, "new\n")
    assert (private.read_text(), private.stat().st_mode & 0o777) == ("new\n", 0o600)
    elsewhere = tmp_path / "kept" / "results.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text("{}\n")
    (tmp_path / "results.json").symlink_to(elsewhere)
    write_file(tmp_path / "results.json", '{"a": 1}\n')
    assert (tmp_path / "results.json").is_symlink()
    assert elsewhere.read_text() == '{"a": 1}\n'


def test_a_replay_may_report_into_the_recording_it_reads(
    tmp_path: Path, runs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A recording reads its CSVs only; a replay writes none (tune's trials.csv is one)."""
    recording = tmp_path / "recording"
    recording.mkdir()
    write(recording / "arrivals-1.csv", TWO_ROWS)
    argv = ["replay", "--trace", str(recording), "--report", str(recording), "--policy", "kpa"]
    with pytest.raises(RanError):
        cli.main(argv)
    assert runs == ["replay"]
