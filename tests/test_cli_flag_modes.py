"""Every command's flags against the modes that read them (issue 27, after hostile pass 52).

A flag given where the run never reads it was dropped without a word: ``replay --policy
kpa --target-concurrency 8`` replayed KPA as if the flag were not there, ``tune --ray
local --workers 1`` used Ray's own placement, the demo's ``--cold-start`` meant nothing
beside ``--real-vllm``, the exporter's ``--namespace`` nothing without ``--target`` or
``--dns``, and ``--config-poll`` nothing without ``--config``. Each is now one line and
status 2, before anything runs; each flag in its own mode still runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stand_ins import RanError
from tests.test_cli_flags import TWO_ROWS, write
from unitscale import cli


def _argv(tmp_path: Path, argv: list[str]) -> list[str]:
    trace = write(tmp_path / "t.csv", TWO_ROWS)
    config = write(tmp_path / "c.yaml", b"{}\n")
    return [
        a.replace("{trace}", trace).replace("{config}", config).replace("{tmp}", str(tmp_path))
        for a in argv
    ]


REPLAY = ["replay", "--trace", "{trace}", "--report", "{tmp}/r"]
TUNE = ["tune", "--trace", "{trace}", "--out", "{tmp}/o"]


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        pytest.param([*REPLAY, "--policy", "kpa", "--target-concurrency", "8"],
                     "unitscale replay: --target-concurrency is the unitscale policy's: drop it"
                     " for kpa", id="a target concurrency for a baseline's replay"),
        pytest.param([*REPLAY, "--policy", "static-peak", "--scaler-config", "{config}"],
                     "unitscale replay: --scaler-config is the unitscale policy's: drop it for"
                     " static-peak", id="a scaler config for a static fleet's replay"),
        pytest.param([*REPLAY, "--policy", "oracle", "--standby-max-sleeping", "2"],
                     "unitscale replay: --standby-max-sleeping is the unitscale policy's",
                     id="sleepers for the clairvoyant's replay"),
        pytest.param([*TUNE, "--policy", "kpa", "--target-concurrency", "8"],
                     "unitscale tune: --target-concurrency is the unitscale policy's: drop it"
                     " for kpa", id="a target concurrency for a baseline's search"),
        pytest.param([*TUNE, "--ray", "local", "--workers", "1"],
                     "unitscale tune: --workers is the local processes' count; Ray places its"
                     " tasks: drop it", id="a worker count Ray would not use"),
        pytest.param(["demo", "--real-vllm", "--cold-start", "new-node", "--report", "{tmp}/d"],
                     "unitscale demo: --cold-start is the simulated replicas': --real-vllm"
                     " starts real ones; drop it", id="a cold start tier for real vLLM"),
        pytest.param(["exporter", "--namespace", "prod"],
                     "unitscale exporter: --namespace names the --target or --dns replicas",
                     id="the exporter's namespace without a target"),
        pytest.param(["exporter", "--config", "{config}", "--deployment", "llama"],
                     "unitscale exporter: --deployment names the --target or --dns replicas",
                     id="the exporter's deployment beside a config file's deployments"),
        pytest.param(["scaler", "--config-poll", "5s"],
                     "unitscale scaler: --config-poll is how often --config is read",
                     id="a poll of no config file"),
        pytest.param(["gateway", "--config-configmap", "ns/gw", "--config-poll", "5s"],
                     "unitscale gateway: --config-poll is how often --config is read",
                     id="a poll of a watched ConfigMap"),
    ],
)  # fmt: skip
def test_a_flag_its_mode_never_reads_is_refused_before_anything_runs(
    tmp_path: Path,
    runs: list[str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    why: str,
) -> None:
    assert cli.main(_argv(tmp_path, argv)) == 2
    assert runs == []
    err = capsys.readouterr().err
    assert err.startswith(why) and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("argv", "ran"),
    [
        pytest.param([*REPLAY, "--policy", "unitscale", "--target-concurrency", "8"], "replay",
                     id="a target concurrency for unitscale's replay"),
        pytest.param([*REPLAY, "--scaler-config", "{config}", "--standby-max-sleeping", "2"],
                     "replay", id="unitscale's flags beside every policy"),
        pytest.param([*REPLAY, "--policy", "kpa", "--target-concurrency", "32"], "replay",
                     id="a target concurrency at its default says nothing"),
        pytest.param([*TUNE, "--target-concurrency", "8"], "tune",
                     id="a target concurrency for unitscale's search"),
        pytest.param([*TUNE, "--workers", "1"], "tune", id="a worker count without Ray"),
        pytest.param(["demo", "--cold-start", "new-node", "--report", "{tmp}/d"], "demo",
                     id="a cold start tier for simulated replicas"),
        pytest.param(["exporter", "--namespace", "prod", "--target", "127.0.0.1:1"], "exporter",
                     id="the exporter's namespace for its targets"),
        pytest.param(["scaler", "--config", "{config}", "--config-poll", "5s"], "scaler",
                     id="a poll of a config file"),
    ],
)  # fmt: skip
def test_a_flag_in_its_own_mode_runs(
    tmp_path: Path, runs: list[str], argv: list[str], ran: str
) -> None:
    with pytest.raises(RanError):
        cli.main(_argv(tmp_path, argv))
    assert runs == [ran]
