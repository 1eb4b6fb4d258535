"""The `unitscale` commands under the eighth hostile pass (issue 27).

``unitscale replay --pool`` takes ``--trace`` repeatedly, one inference deployment each,
and read and held every trace before the run with no bound on their count or on their
requests together: ten built-in days at ``--rate-multiplier 50`` held 2.4 GB after 18 s
(each within one replay's bound), so a hundred would have asked for 24 GB before the
kernel killed the process. Now at most ``MAX_DEPLOYMENTS`` traces, counted before any
file is read, and their requests together at most one replay's (``MAX_TRACE_REQUESTS``),
checked as each is read: one line naming the flag, status 2, nothing run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_cli_flags import AZURE, write
from unitscale import cli
from unitscale.commands import replay_pool

NODES = b"sn,cpu_milli,memory_mib,gpu,model\nnode-0,64000,262144,4,T4\n"
PODS = (
    b"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    b"creation_time,deletion_time,scheduled_time\npod-0,4000,16384,1,500,,BE,Running,0,400,0\n"
)
THIRTY_ROWS = AZURE + b"".join(
    f"2023-11-16 18:17:{s:02d}.0,512,16\n".encode() for s in range(0, 60, 2)
)


class _RanError(Exception):
    """The joint replay started (raised in place of it)."""


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The joint replays started, each stopped as it starts: its deployments' count."""
    import replay.pool.joint

    started: list[int] = []

    def stand_in(nodes: object, tasks: object, deployments: list[object], *_: object) -> None:
        started.append(len(deployments))
        raise _RanError

    monkeypatch.setattr(replay.pool.joint, "run_all", stand_in)
    return started


def _joint(tmp_path: Path, traces: int) -> list[str]:
    trace = write(tmp_path / "t.csv", THIRTY_ROWS)
    nodes, pods = write(tmp_path / "n.csv", NODES), write(tmp_path / "p.csv", PODS)
    args = ["replay", "--pool", nodes, "--tasks", pods, "--pool-fraction", "1"]
    args += ["--report", str(tmp_path / "out")]
    return args + ["--trace", trace] * traces


def _bound(limit: int) -> Callable[[pytest.MonkeyPatch], None]:
    def apply(monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(replay_pool, "MAX_TRACE_REQUESTS", limit)

    return apply


@pytest.mark.parametrize(
    ("traces", "bound", "refused"),
    [
        pytest.param(
            replay_pool.MAX_DEPLOYMENTS,
            None,
            None,
            id="as many traces as the deployments bound are replayed",
        ),
        pytest.param(
            replay_pool.MAX_DEPLOYMENTS + 1,
            None,
            f"--trace: 17 given; at most {replay_pool.MAX_DEPLOYMENTS} deployments",
            id="one trace more is refused before any is read",
        ),
        pytest.param(
            1_000,
            None,
            "--trace: 1000 given",
            id="a thousand traces are refused before any is read",
        ),
        pytest.param(
            2,
            _bound(59),
            "60 requests with the traces before it; a joint replay holds at most 59 in all",
            id="traces holding more requests together than one replay are refused",
        ),
        pytest.param(2, _bound(60), None, id="traces holding one replay's requests are replayed"),
    ],
)
def test_a_joint_replay_s_traces_are_bounded_in_count_and_requests_together(
    tmp_path: Path,
    runs: list[int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    traces: int,
    bound: Callable[[pytest.MonkeyPatch], None] | None,
    refused: str | None,
) -> None:
    if bound is not None:
        bound(monkeypatch)
    args = _joint(tmp_path, traces)
    if refused is None:
        with pytest.raises(_RanError):
            cli.main(args)
        assert runs == [traces]
        return
    assert cli.main(args) == 2
    assert runs == []
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("unitscale replay: --trace") and refused in err, err
    assert not (tmp_path / "out").exists()
