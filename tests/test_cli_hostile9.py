"""Flags and config keys under the fifty-first hostile pass (issue 27).

``unitscale replay`` ran a plain replay when given a flag only the joint replay
(``--pool``) or ``--compare-tiers`` reads: the user's ``--headroom 0.5`` was dropped
without a word. The exporter's config took a 1 ns scrape interval and the scaler's demo
source a 1 ns round: each loop spun a whole core. Each is now one line, status 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.config import parse_config as parse_exporter_config
from foundation.errors import ConfigError
from scaler.config import parse_config as parse_scaler_config
from tests.stand_ins import RanError
from tests.test_cli_flags import TWO_ROWS, write
from tests.test_cli_hostile7 import NODES, PODS
from unitscale import cli


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        pytest.param(["--headroom", "0.5"], "--headroom is the joint replay's",
                     id="a manager's headroom without a pool"),
        pytest.param(["--placement", "spread"], "--placement is the joint replay's",
                     id="a placement without a pool"),
        pytest.param(["--pool-fraction", "0.5"], "--pool-fraction is the joint replay's",
                     id="a share of a pool without one"),
        pytest.param(["--training-load", "2"], "--training-load is the joint replay's",
                     id="a training load without a pool"),
        pytest.param(["--fgd-mix", "training"], "--fgd-mix is the joint replay's",
                     id="FGD's mix without a pool"),
        pytest.param(["--inference-gpu-type", "V100"], "--inference-gpu-type is the joint",
                     id="an inference GPU type without a pool"),
        pytest.param(["--max-task-seconds", "5"], "--max-task-seconds is the joint replay's",
                     id="a task cap without a pool"),
        pytest.param(["--warm-start"], "--warm-start is the joint replay's",
                     id="a joint warm start without a pool"),
        pytest.param(["--idle-grace", "5"], "--idle-grace applies with --compare-tiers",
                     id="an idle grace without the tiers"),
        pytest.param(["--max-sleeping", "3"], "--max-sleeping applies with --compare-tiers",
                     id="sleepers without the tiers"),
    ],
)  # fmt: skip
def test_a_flag_another_mode_reads_is_refused_not_dropped(
    tmp_path: Path,
    runs: list[str],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    why: str,
) -> None:
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    argv = ["replay", "--trace", trace, "--report", str(tmp_path / "r"), "--policy", "kpa"]
    assert cli.main([*argv, *extra]) == 2
    assert runs == []
    err = capsys.readouterr().err
    assert err.startswith(f"unitscale replay: {why}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(["--idle-grace", "5"], id="an idle grace with a pool"),
        pytest.param(["--max-sleeping", "3"], id="sleepers with a pool"),
    ],
)
def test_a_tier_flag_with_a_pool_is_refused(
    tmp_path: Path, runs: list[str], capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    nodes, pods = write(tmp_path / "n.csv", NODES), write(tmp_path / "p.csv", PODS)
    argv = ["replay", "--report", str(tmp_path / "r"), "--pool", nodes, "--tasks", pods]
    assert cli.main([*argv, *extra]) == 2
    assert runs == []
    assert capsys.readouterr().err == (
        "unitscale replay: --idle-grace and --max-sleeping are --compare-tiers': drop them\n"
    )


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="the defaults"),
        pytest.param(["--compare-tiers", "--max-sleeping", "3", "--idle-grace", "5"],
                     id="the tiers' flags with the tiers"),
        pytest.param(["--fgd-mix", "joint"], id="a joint flag at its default says nothing"),
    ],
)  # fmt: skip
def test_a_replay_with_its_own_flags_runs(
    tmp_path: Path, runs: list[str], extra: list[str]
) -> None:
    tiers = "--compare-tiers" in extra
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    argv = ["replay", "--trace", trace, "--report", str(tmp_path / "r")]
    policy = [] if tiers else ["--policy", "kpa"]
    with pytest.raises(RanError):
        cli.main([*argv, *policy, *extra])
    assert runs == ["tiers" if tiers else "replay"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param("interval: 1ns\n", "interval", id="a scrape every nanosecond"),
        pytest.param("interval: 99ms\n", "interval", id="just under the demo's 100 ms"),
        pytest.param("timeout: 1e-7ns\n", "timeout", id="a timeout no connect meets"),
        pytest.param("panic-window: 1ns\n", "panic-window", id="a panic window of 1 ns"),
        pytest.param("stable-window: 1ns\n", "stable-window", id="a stable window of 1 ns"),
    ],
)
def test_an_exporter_loop_period_below_its_floor_is_refused(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_exporter_config(text)


def test_the_floors_themselves_are_taken() -> None:
    """The demo compresses the exporter's 5 s scrape 50 times and its 2 s timeout to 40 ms;
    tests run sources at 10-20 ms."""
    exporter = parse_exporter_config("interval: 100ms\ntimeout: 10ms\npanic-window: 100ms\n")
    assert (exporter.interval, exporter.timeout, exporter.panic_window) == (0.1, 0.01, 0.1)
    scaler = parse_scaler_config("demo-source: {interval: 10ms, period: 10ms}\n")
    assert scaler.demo_source is not None and scaler.demo_source.interval == 0.01
