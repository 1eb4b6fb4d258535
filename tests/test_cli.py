"""The ``unitscale`` command as users and Kubernetes run it: a real process."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys

import grpc
import pytest

from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from tests.conftest import ref

UNITSCALE = [sys.executable, "-m", "unitscale.cli"]


def test_a_bad_config_at_startup_exits_non_zero_naming_the_key(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("max-signal-age: -5s\n")
    result = subprocess.run(
        [*UNITSCALE, "scaler", "--listen", "127.0.0.1:0", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "max-signal-age" in result.stderr
    assert str(config) in result.stderr


@pytest.mark.parametrize(
    ("command", "poll"),
    [
        pytest.param("scaler", "soon", id="the scaler refuses a poll interval that is no duration"),
        pytest.param("exporter", "0s", id="the exporter refuses a zero poll interval"),
        pytest.param("gateway", "-1s", id="the gateway refuses a negative poll interval"),
        pytest.param(
            "gateway", "1ns", id="the gateway refuses a 1ns poll interval (5,000 checks a second)"
        ),
        pytest.param("scaler", "9ms", id="the scaler refuses a poll interval under 10ms"),
    ],
)
def test_a_bad_config_poll_interval_exits_2_naming_the_flag(tmp_path, command, poll):
    config = tmp_path / "config.yaml"
    config.write_text("")
    result = subprocess.run(
        [*UNITSCALE, command, "--config", str(config), f"--config-poll={poll}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert f"--config-poll {poll!r}" in result.stderr


def test_tls_key_without_cert_is_refused(tmp_path):
    result = subprocess.run(
        [*UNITSCALE, "scaler", "--listen", "127.0.0.1:0", "--tls-key", str(tmp_path / "k")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--tls-cert and --tls-key go together" in result.stderr


async def test_the_scaler_serves_and_stops_cleanly_on_sigterm(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("demo-source:\n  namespace: team-a\n  deployments: [llama]\n")
    process = await asyncio.create_subprocess_exec(
        *UNITSCALE,
        "scaler",
        "--listen",
        "127.0.0.1:0",
        "--config",
        str(config),
        stderr=asyncio.subprocess.PIPE,
    )
    stderr = process.stderr
    assert stderr is not None
    try:
        port = None
        async with asyncio.timeout(30):
            while port is None:
                line = (await stderr.readline()).decode()
                assert line, "scaler exited before serving"
                if match := re.search(r"scaler serving on port (\d+)", line):
                    port = int(match.group(1))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            assert (await stub.GetMetricSpec(ref(), timeout=5)).metricSpecs
            await asyncio.sleep(0.3)  # the demo source publishes at once; be generous
            assert (await stub.IsActive(ref(), timeout=5)).result is False  # cycle starts idle
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await process.wait() == 0
        assert b"shutting down" in await stderr.read()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_replay_writes_results_report_and_plots(tmp_path):
    trace = tmp_path / "tiny.csv"
    rows = [f"2023-11-16 18:17:{s:02d}.0000000,512,16" for s in range(0, 60, 2)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    result = subprocess.run(
        [
            *UNITSCALE,
            "replay",
            "--trace",
            str(trace),
            "--policy",
            "all",
            "--rate-multiplier",
            "2",
            "--max-replicas",
            "8",
            "--report",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    import json

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results) == {
        "static-peak",
        "production-stack",
        "kpa",
        "aibrix-kv",
        "oracle",
        "unitscale",
    }
    for metrics in results.values():
        assert metrics["requests"] == 60
        for key in (
            "gpu_hours",
            "cost_per_million_tokens",
            "cost_per_million_output_tokens",
            "slo_attainment",
            "ttft_p50_seconds",
            "ttft_p95_seconds",
            "ttft_p99_seconds",
            "e2e_p95_seconds",
            "mean_utilization",
            "dropped",
            "cold_starts",
        ):
            assert key in metrics
    assert "| oracle |" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "replicas.png").stat().st_size > 0
    assert (tmp_path / "out" / "latency_cdf.png").stat().st_size > 0


def test_replay_refuses_an_unknown_policy(tmp_path):
    result = subprocess.run(
        [
            *UNITSCALE,
            "replay",
            "--trace",
            str(tmp_path / "x.csv"),
            "--policy",
            "hpa-cpu",
            "--report",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--policy 'hpa-cpu'" in result.stderr


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        pytest.param(
            "builtin:weekend",
            "unknown built-in trace 'builtin:weekend'; one of builtin:business-day",
            id="an-unknown-builtin-trace-is-refused-naming-the-builtins",
        ),
        pytest.param(
            "{tmp}/missing.csv", "cannot read trace", id="a-missing-trace-file-is-refused"
        ),
    ],
)
def test_replay_refuses_a_trace_it_cannot_read(tmp_path, trace, message):
    result = subprocess.run(
        [
            *UNITSCALE,
            "replay",
            "--trace",
            trace.format(tmp=tmp_path),
            "--policy",
            "unitscale",
            "--report",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_replay_runs_the_builtin_business_day(tmp_path):
    # 5% of the day's requests, 20x faster: three minutes of trace, about 9,000 requests.
    result = subprocess.run(
        [
            *UNITSCALE,
            "replay",
            "--trace",
            "builtin:business-day",
            "--policy",
            "unitscale",
            "--rate-multiplier",
            "0.05",
            "--time-compression",
            "20",
            "--report",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    import json

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert 8_000 < results["unitscale"]["requests"] < 10_000
    assert "# Replay of `builtin:business-day`" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize(
    ("command", "text", "key"),
    [
        pytest.param("scaler", "max-signal-age: null\n", "max-signal-age", id="scaler-null"),
        pytest.param("scaler", "max-signal-age: 2024-01-01\n", "max-signal-age", id="scaler-date"),
        pytest.param("exporter", "interval: [1]\n", "interval", id="exporter-a-list"),
        pytest.param("gateway", "buffer-timeout: {a: 1}\n", "buffer-timeout", id="gateway-a-map"),
    ],
)
def test_a_value_of_the_wrong_type_at_startup_exits_2_naming_the_key(tmp_path, command, text, key):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    listen = ["--listen", "127.0.0.1:0"] + (
        ["--grpc-listen", "127.0.0.1:0"] if command != "scaler" else []
    )
    result = subprocess.run(
        [*UNITSCALE, command, *listen, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert f"key '{key}'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_certificate_and_key_that_do_not_match_exit_2_naming_both(tmp_path):
    import trustme

    ca = trustme.CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue_cert("a.example").cert_chain_pems[0].write_to_path(str(cert))
    ca.issue_cert("b.example").private_key_pem.write_to_path(str(key))
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    result = subprocess.run(
        [*UNITSCALE, "scaler", "--listen", "127.0.0.1:0", *tls],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert str(cert) in result.stderr and str(key) in result.stderr
    assert "Traceback" not in result.stderr and "Failed to bind" not in result.stderr
