"""The replay's warm tiers: sleepers, a Fluid cache, cold starts, and what each costs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from foundation.replica_model import LLAMA3_8B_H200, cold_start_seconds
from replay.run import TIERS, ReplayOptions, compare_tiers, make_policy
from replay.simulate import SLEEPING, STARTING, Result, SimConfig, _Replay, simulate
from replay.trace import Trace
from replay.workloads import BusinessDay, business_days
from scaler.core.model import Policy as CorePolicy
from scaler.core.seasonal import SeasonalPolicy
from scaler.core.tiers import StandbyPolicy

CONFIG = SimConfig(LLAMA3_8B_H200, max_replicas=4, tail=120.0)
OPTIONS = ReplayOptions("two-bursts", 1.0, 1.0, 0, policy=CorePolicy(idle_grace_seconds=30.0))
COLD = cold_start_seconds(LLAMA3_8B_H200, "local-disk")
CACHED = cold_start_seconds(LLAMA3_8B_H200, "cached")
WAKE = LLAMA3_8B_H200.wake_seconds(1)


def two_bursts(gap: float = 400.0) -> Trace:
    """A minute at 1 request/s, ``gap`` seconds of nothing, then 30 s more."""
    first = np.arange(0.0, 60.0)
    second = first[:30] + 60.0 + gap
    arrival = np.concatenate([first, second])
    n = len(arrival)
    return Trace("two-bursts", arrival, np.full(n, 512, np.int64), np.full(n, 16, np.int64))


@pytest.fixture(scope="module")
def tiers() -> dict[str, Result]:
    return compare_tiers(two_bursts(), CONFIG, OPTIONS)


@pytest.mark.parametrize(
    ("row", "low", "high"),
    [
        pytest.param("cold", COLD, COLD + 2.0, id="from cold the first request waits a cold start"),
        pytest.param(
            "cache-warm",
            CACHED,
            CACHED + 2.0,
            id="from a warm cache it waits the engine init, not the weights' download",
        ),
        pytest.param("sleeping", WAKE, WAKE + 2.0, id="from a sleeper it waits a level-1 wake"),
        pytest.param("always-on-1", 0.0, 1.0, id="a replica always on answers at once"),
    ],
)
def test_the_first_request_after_idle_waits_its_tier(
    tiers: dict[str, Result], row: str, low: float, high: float
) -> None:
    metrics = tiers[row].metrics
    assert metrics["after_idle_requests"] == 1
    assert low <= metrics["after_idle_ttft_max_seconds"] <= high


def test_every_row_serves_or_drops_every_request_once(tiers: dict[str, Result]) -> None:
    assert list(tiers) == list(TIERS)
    for result in tiers.values():
        metrics = result.metrics
        assert metrics["requests"] == 90
        assert metrics["dropped"] == 0
        assert len(result.ttft) == 90


def test_each_tier_bills_what_it_holds(tiers: dict[str, Result]) -> None:
    price = LLAMA3_8B_H200.price_per_hour
    memory = LLAMA3_8B_H200.weights_gb * CONFIG.memory_price_per_gb_hour
    for name, result in tiers.items():
        m = result.metrics
        standby = m["sleeping_hours"] * memory + m["cache_hours"] * memory
        assert m["standby_cost"] == pytest.approx(standby), name
        assert m["cost"] == pytest.approx(m["gpu_hours"] * price + standby), name
    assert tiers["cold"].metrics["standby_cost"] == 0
    sleeping = tiers["sleeping"].metrics
    # the sleeper was held through the gap: from the drain after the first minute to the wake
    assert 250 / 3600 < sleeping["sleeping_hours"] < 500 / 3600
    assert sleeping["wakes"] >= 1
    # and scale to zero with a sleeper costs less than one replica always on
    assert sleeping["cost"] < tiers["always-on-1"].metrics["cost"]


def test_idle_past_the_release_time_holds_nothing_and_starts_cold() -> None:
    config = dataclasses.replace(CONFIG, standby=StandbyPolicy(release_after_seconds=100.0))
    result = simulate(two_bursts(), make_policy("unitscale", config, OPTIONS), config, None, 1)
    m = result.metrics
    assert COLD <= m["after_idle_ttft_max_seconds"] <= COLD + 2.0
    assert m["sleeping_hours"] < 100 / 3600
    assert m["wakes"] == 0


@pytest.mark.parametrize(
    ("sleepers", "cache", "wanted", "wakes", "cache_starts", "cold"),
    [
        pytest.param(
            2, True, 3, 2, 1, 0, id="scale-out wakes sleepers first, then reads the cache"
        ),
        pytest.param(2, False, 4, 2, 0, 2, id="without a warm cache the rest start cold"),
        pytest.param(0, True, 2, 0, 2, 0, id="with no sleeper every start reads the warm cache"),
    ],
)
def test_scale_out_order(
    sleepers: int, cache: bool, wanted: int, wakes: int, cache_starts: int, cold: int
) -> None:
    standby = StandbyPolicy(cache=cache)
    run = _Replay(two_bursts(), dataclasses.replace(CONFIG, standby=standby))
    run.slot[:sleepers] = SLEEPING
    run.scale_to(wanted, "test")
    ready_in = sorted(run.ready_at[run.slot == STARTING] - run.now)
    expected = [WAKE] * wakes + [CACHED] * cache_starts + [COLD] * cold
    assert ready_in == pytest.approx(sorted(expected))
    assert (run.standby.wakes, run.standby.cache_starts, run.cold_starts) == (
        wakes,
        cache_starts,
        cold,
    )


def test_fewer_sleepers_wanted_stops_the_surplus() -> None:
    run = _Replay(two_bursts(), dataclasses.replace(CONFIG, standby=StandbyPolicy()))
    run.slot[:3] = SLEEPING
    run.hold_standby(1, True, "test")
    assert int(np.count_nonzero(run.slot == SLEEPING)) == 1


def test_requests_are_conserved_with_sleepers_on_a_busy_trace() -> None:
    rng = np.random.default_rng(3)
    arrival = np.sort(np.concatenate([rng.uniform(0, 120, 600), rng.uniform(400, 460, 900)]))
    n = len(arrival)
    trace = Trace(
        "bursty", arrival, rng.integers(64, 4096, n).astype(np.int64), np.full(n, 64, np.int64)
    )
    config = dataclasses.replace(CONFIG, standby=StandbyPolicy(max_sleeping=3))
    result = simulate(trace, make_policy("unitscale", config, OPTIONS), config, None, 1)
    assert len(result.ttft) + result.metrics["dropped"] == n
    assert len(result.met) == n
    assert result.metrics["wakes"] >= 1


def test_unitscale_replay_compares_the_tiers(tmp_path: Path) -> None:
    trace = tmp_path / "gap.csv"
    times = [*range(0, 40, 2), *range(300, 320, 2)]
    rows = [f"2023-11-16 18:{17 + s // 60:02d}:{s % 60:02d}.0000000,512,16" for s in times]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    command = [sys.executable, "-m", "unitscale.cli", "replay", "--trace", str(trace)]
    flags = ["--compare-tiers", "--idle-grace", "20", "--max-replicas", "4"]
    out = tmp_path / "out"
    result = subprocess.run(
        [*command, *flags, "--report", str(out)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert set(results) == set(TIERS)
    after_idle = {name: m["after_idle_ttft_max_seconds"] for name, m in results.items()}
    assert after_idle["sleeping"] < after_idle["cache-warm"] < after_idle["cold"]
    report = (out / "report.md").read_text()
    assert "| sleeping |" in report and "after_idle_ttft_max_seconds" in report
    assert "wakes in 1.6 s" in report


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(
            ["--max-sleeping", "-1"],
            "argument --max-sleeping: '-1' is not a whole number from 0",
            id="a negative sleeper count is refused",
        ),
        pytest.param(
            ["--idle-grace", "-5"],
            "argument --idle-grace: '-5' is not a number from 0 to 86,400",
            id="a negative idle grace is refused",
        ),
        pytest.param(
            ["--policy", "kpa"],
            "--compare-tiers runs the unitscale policy in every row",
            id="another policy is refused, not silently replaced",
        ),
    ],
)
def test_compare_tiers_refuses_bad_flags(tmp_path: Path, flags: list[str], message: str) -> None:
    command = [sys.executable, "-m", "unitscale.cli", "replay", "--trace", "builtin:business-day"]
    extra = ["--compare-tiers", *flags, "--report", str(tmp_path)]
    result = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr


def test_a_forecast_return_finds_a_sleeper_started_ahead_of_it() -> None:
    # four compressed days (10 min each): the nights outlast the release time, so without
    # a forecast every morning starts cold; with one, days 3 and 4 find sleepers
    day = BusinessDay(length=600.0, base_rate=2.0, lunch_seconds=20.0, spike_seconds=5.0)
    trace = business_days(day, 4, seed=1)
    standby = StandbyPolicy(release_after_seconds=100.0)
    seasonal = SeasonalPolicy(day_seconds=600.0, weekly=False)
    results = {}
    for name, config in {
        "sleeping": dataclasses.replace(CONFIG, standby=standby),
        "predictive": dataclasses.replace(CONFIG, standby=standby, seasonal=seasonal),
    }.items():
        result = simulate(trace, make_policy("unitscale", config, OPTIONS), config, None, 0)
        served = np.isfinite(result.slo_ratio)
        ttft = np.full(len(trace), np.inf)
        ttft[served] = result.ttft
        mornings = [int(np.searchsorted(trace.arrival, d * 600.0)) for d in range(4)]
        results[name] = (ttft[mornings], result.metrics)
    cold_mornings, _ = results["sleeping"]
    assert (cold_mornings >= COLD).all()
    warm_mornings, metrics = results["predictive"]
    assert (warm_mornings[:2] >= COLD).all()  # two earlier days are the least it learns from
    # started one load ahead of the earlier days' return: asleep, or nearly loaded when a
    # morning comes sooner than the days before it (day 4 here: 5.0 s)
    assert (warm_mornings[2:] <= COLD / 4).all()
    assert warm_mornings[2:].min() <= WAKE + 2.0
    assert metrics["standby_loads"] >= 2
