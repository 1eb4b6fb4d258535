"""The `unitscale` commands under the seventh hostile pass (issue 27).

``unitscale replay`` (and ``replay --pool``) made its ``--report`` directory only when the
run was over: a report that was a file, or under one, or where nothing may be written,
failed after the whole run (74 s for one policy on the built-in day, over an hour for
every policy on 31 days of trace), the results lost. The directory is now made and
checked before any replay: one line naming the flag, status 2, nothing run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stand_ins import RanError, stop_runs
from tests.test_cli_flags import TWO_ROWS, write
from unitscale import cli

NODES = b"sn,cpu_milli,memory_mib,gpu,model\nnode-0,64000,262144,4,T4\n"
PODS = (
    b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    b"creation_time,deletion_time,scheduled_time\npod-0,4000,16384,1,500,,BE,Running,0,400,0\n"
)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The replays started, each stopped as it starts: which one, by name."""
    import replay.pool.joint
    import replay.run

    return stop_runs(
        monkeypatch,
        {"replay": (replay.run, "run_policies"), "joint replay": (replay.pool.joint, "run_all")},
    )


def _replay(tmp_path: Path, report: str, *, pool: bool) -> list[str]:
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    args = ["replay", "--trace", trace, "--report", report]
    if pool:
        nodes, pods = write(tmp_path / "n.csv", NODES), write(tmp_path / "p.csv", PODS)
        return [*args, "--pool", nodes, "--tasks", pods, "--pool-fraction", "1"]
    return [*args, "--policy", "kpa"]


REPORTS = [
    pytest.param("{tmp}/a-file", "File exists", id="a report that is a regular file"),
    pytest.param("{tmp}/a-file/report", "Not a directory", id="a report under a regular file"),
    pytest.param("/proc/unitscale-report", "No such file", id="a report where nothing is made"),
    pytest.param("/proc", "no file can be made in it", id="a directory taking no file, for root"),
]


@pytest.mark.parametrize("pool", [False, True], ids=["replay", "replay --pool"])
@pytest.mark.parametrize(("report", "why"), REPORTS)
def test_a_report_directory_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path,
    runs: list[str],
    capsys: pytest.CaptureFixture[str],
    report: str,
    why: str,
    pool: bool,
) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    target = report.format(tmp=tmp_path)
    assert cli.main(_replay(tmp_path, target, pool=pool)) == 2
    assert runs == []  # refused before any replay, not after it
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"unitscale replay: --report '{target}': {why}"), err


@pytest.mark.parametrize("pool", [False, True], ids=["replay", "replay --pool"])
def test_a_report_directory_is_made_before_the_run(
    tmp_path: Path, runs: list[str], pool: bool
) -> None:
    report = tmp_path / "new" / "report"
    with pytest.raises(RanError):
        cli.main(_replay(tmp_path, str(report), pool=pool))
    assert runs == ["joint replay" if pool else "replay"]
    assert report.is_dir()


# --- --config-poll ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["scaler", "exporter", "gateway"])
@pytest.mark.parametrize(
    ("poll", "refused"),
    [
        pytest.param("10m", False, id="ten minutes is the longest poll taken"),
        pytest.param("10m0.001s", True, id="past ten minutes is refused"),
        pytest.param("2562047h", True, id="Go's longest duration (292 years) is refused"),
    ],
)
def test_a_config_poll_is_at_most_ten_minutes(
    tmp_path: Path, command: str, poll: str, refused: bool
) -> None:
    """A server polling its --config file every 292 years started, and never saw a change."""
    from foundation.errors import ConfigError
    from unitscale.commands.common import MAX_CONFIG_POLL, config_source

    config = write(tmp_path / "c.yaml", b"")
    args = cli.build_parser().parse_args([command, "--config", config, "--config-poll", poll])
    if refused:
        with pytest.raises(ConfigError, match=r"--config-poll '.*': must be at most 10m"):
            config_source(args)
    else:
        assert config_source(args).poll_interval == MAX_CONFIG_POLL
