"""The `unitscale` commands under the eighth hostile pass (issue 27).

``unitscale replay --pool`` (one inference deployment a trace) and ``unitscale tune``
(every trial replays each) take ``--trace`` repeatedly, and read and held every trace
before the run with no bound on their count or on their requests together: ten built-in
days at ``--rate-multiplier 50`` held 2.4 GB after 18 s (each within one replay's bound),
so a hundred would have asked for 24 GB before the kernel killed the process, and tune's
workers each hold the whole problem. Now at most ``MAX_TRACES``, counted before any file
is read, and their requests together at most one replay's (``MAX_TRACE_REQUESTS``),
checked as each is read: one line naming the flag, status 2, nothing run.

The joint replay copies the pod list's tasks until they offer ``--training-load`` times
the cards inference leaves: the copies were asked for by that load, not by the file's
size, so one task of a second on four cards became 2.2M tasks at ``--training-load
1000``. They are now counted before they exist (``replay.pool.joint.MAX_TASKS``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_cli_flags import AZURE, write
from unitscale import cli
from unitscale.commands.common import MAX_TRACES

NODES = b"sn,cpu_milli,memory_mib,gpu,model\nnode-0,64000,262144,4,T4\n"
PODS = (
    b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    b"creation_time,deletion_time,scheduled_time\npod-0,4000,16384,1,500,,BE,Running,0,400,0\n"
)
THIRTY_ROWS = AZURE + b"".join(
    f"2023-11-16 18:17:{s:02d}.0,512,16\n".encode() for s in range(0, 60, 2)
)


class _RanError(Exception):
    """The run started (raised in place of it)."""


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The runs started, each stopped as it starts: how many traces it was given."""
    import replay.pool.joint
    import unitscale.tune

    started: list[int] = []

    def joint(nodes: object, tasks: object, deployments: list[object], *_: object) -> None:
        started.append(len(deployments))
        raise _RanError

    @contextlib.contextmanager
    def tune(
        problem: unitscale.tune.Problem, workers: int, ray: str | None = None
    ) -> Iterator[None]:
        started.append(len(problem.traces))
        raise _RanError
        yield

    monkeypatch.setattr(replay.pool.joint, "run_all", joint)
    monkeypatch.setattr(unitscale.tune, "worker_pool", tune)
    return started


def _command(tmp_path: Path, command: str, traces: int) -> list[str]:
    trace = write(tmp_path / "t.csv", THIRTY_ROWS)
    if command == "tune":
        args = ["tune", "--out", str(tmp_path / "out"), "--workers", "1", "--budget", "1"]
    else:
        nodes, pods = write(tmp_path / "n.csv", NODES), write(tmp_path / "p.csv", PODS)
        args = ["replay", "--pool", nodes, "--tasks", pods, "--pool-fraction", "1"]
        args += ["--report", str(tmp_path / "out")]
    return args + ["--trace", trace] * traces


@pytest.mark.parametrize("command", ["replay --pool", "tune"])
@pytest.mark.parametrize(
    ("traces", "bound", "refused"),
    [
        pytest.param(MAX_TRACES, None, None, id="as many traces as the bound are run"),
        pytest.param(
            MAX_TRACES + 1,
            None,
            f"--trace: 17 given; at most {MAX_TRACES}",
            id="one trace more is refused before any is read",
        ),
        pytest.param(
            1_000, None, "--trace: 1000 given", id="a thousand traces are refused at once"
        ),
        pytest.param(
            2,
            59,
            "60 requests with the traces before it; the traces hold at most 59 in all",
            id="traces holding more requests together than one replay are refused",
        ),
        pytest.param(2, 60, None, id="traces holding one replay's requests together are run"),
    ],
)
def test_the_traces_a_run_reads_are_bounded_in_count_and_requests_together(
    tmp_path: Path,
    runs: list[int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    traces: int,
    bound: int | None,
    refused: str | None,
) -> None:
    import replay.limits

    if bound is not None:
        monkeypatch.setattr(replay.limits, "MAX_TRACE_REQUESTS", bound)
    args = _command(tmp_path, command, traces)
    if refused is None:
        with pytest.raises(_RanError):
            cli.main(args)
        assert runs == [traces]
        return
    assert cli.main(args) == 2
    assert runs == []
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"unitscale {command.split()[0]}: --trace") and refused in err, err
    assert not (tmp_path / "out").exists()


# --- the training load's copies ----------------------------------------------------------------

SHORT_TASK = (
    b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    b"creation_time,deletion_time,scheduled_time\npod-0,4000,16384,1,1000,,BE,Running,0,1,0\n"
)
TEN_MINUTES = AZURE + b"2023-11-16 18:17:00.0,512,16\n2023-11-16 18:27:00.0,512,16\n"


@pytest.mark.parametrize(
    ("load", "refused"),
    [
        pytest.param(
            "1000",
            r"training would need (2,2\d\d,\d{3}) tasks \(\1x the 1 the pod list holds\)",
            id="a one-second task copied to offer a thousand times the cards is refused",
        ),
        pytest.param("0.01", None, id="a one-second task copied a few times is replayed"),
    ],
)
def test_the_training_load_s_copies_are_counted_before_they_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], load: str, refused: str | None
) -> None:
    """One task of a second on four cards became 2.2M tasks at --training-load 1000
    (16.8 s and 709 MB to make them, then every baseline replayed over them)."""
    from replay.pool.joint import MAX_TASKS

    nodes, pods = write(tmp_path / "n.csv", NODES), write(tmp_path / "p.csv", SHORT_TASK)
    args = ["replay", "--pool", nodes, "--tasks", pods, "--pool-fraction", "1"]
    args += ["--trace", write(tmp_path / "t.csv", TEN_MINUTES), "--placement", "binpack"]
    args += ["--training-load", load, "--report", str(tmp_path / "out")]
    code = cli.main(args)
    err = capsys.readouterr().err.strip()
    if refused is None:
        assert code == 0, err
        return
    assert code == 2
    assert len(err.splitlines()) == 1, err
    # How many cards it takes rests on the inference replay's own use: its order is the point.
    assert re.search(refused, err) and f"a replay holds at most {MAX_TASKS:,}" in err, err
