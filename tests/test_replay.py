"""Replay end to end on small traces: conservation, SLO accounting, the oracle bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

from foundation.replica_model import LLAMA3_8B_H200
from replay.oracle import find_instant_bound
from replay.policies import StaticPeak, unitscale_policy
from replay.simulate import SimConfig, cold_start_seconds, simulate
from replay.trace import Trace, TraceError, read_trace, scale

CONFIG = SimConfig(LLAMA3_8B_H200, max_replicas=16, tail=300.0)


def steady(rate, seconds, prompt=1024, output=64, start=0.0):
    n = int(rate * seconds)
    return Trace("steady", start + np.arange(n) / rate, np.full(n, prompt), np.full(n, output))


def bursty():
    """Two minutes of load, an idle minute, then a burst: scale to zero and back."""
    a = steady(4, 120)
    b = steady(12, 40, start=180.0)
    return Trace(
        "bursty",
        np.r_[a.arrival, b.arrival],
        np.r_[a.prompt, b.prompt],
        np.r_[a.output, b.output],
    )


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(StaticPeak(2), id="static"),
        pytest.param(unitscale_policy(16, 16), id="unitscale"),
    ],
)
def test_every_request_is_served_or_dropped(policy):
    trace = bursty()
    result = simulate(trace, policy, CONFIG)
    m = result.metrics
    assert m["requests"] == len(trace)
    served = len(result.ttft)
    assert served + m["dropped"] == len(trace)
    assert 0.0 <= m["slo_attainment"] <= served / len(trace)


def test_one_replica_serves_light_steady_load_within_the_slo():
    result = simulate(steady(2, 120), StaticPeak(1), CONFIG)
    m = result.metrics
    assert m["slo_attainment"] == 1.0 and m["dropped"] == 0
    # a 1,024-token prefill is ~27 ms; half-tick arrival alignment adds at most 0.1 s
    assert m["ttft_p50_seconds"] < 0.2
    assert m["gpu_hours"] == pytest.approx(1 * (120 + 1) / 3600, rel=0.05)


def test_overload_shows_up_as_slo_misses_not_silence():
    result = simulate(steady(40, 60, prompt=2048, output=16), StaticPeak(1), CONFIG)
    assert result.metrics["slo_attainment"] < 0.5


def test_scale_from_zero_pays_a_cold_start_and_counts_it():
    trace = steady(2, 60, start=30.0)
    result = simulate(trace, unitscale_policy(16, 16), CONFIG)
    m = result.metrics
    assert m["cold_starts"] >= 1
    # the first requests waited for a local-disk cold start in the gateway
    assert m["ttft_p99_seconds"] >= cold_start_seconds(LLAMA3_8B_H200, "local-disk") - 5


def test_the_gateway_drops_requests_that_wait_past_its_timeout():
    config = SimConfig(LLAMA3_8B_H200, max_replicas=4, gateway_timeout=5.0, tail=120.0)
    result = simulate(steady(2, 20), unitscale_policy(16, 4), config)
    assert result.metrics["dropped"] > 0  # a 38 s cold start outlasts a 5 s buffer


def test_the_oracle_is_never_more_expensive_than_a_policy_meeting_the_slo():
    trace = bursty()
    oracle, _ = find_instant_bound(trace, CONFIG, iterations=4)
    assert oracle.metrics["slo_attainment"] >= 0.99
    for replicas in range(1, 8):
        static = simulate(trace, StaticPeak(replicas), CONFIG)
        if static.metrics["slo_attainment"] >= 0.99:
            assert oracle.metrics["gpu_hours"] <= static.metrics["gpu_hours"]
            break
    else:
        pytest.fail("no static size met the SLO")


def test_a_run_is_deterministic_for_a_seed(tmp_path):
    trace = scale(bursty(), 1.5, 1.0, seed=7)
    first = simulate(trace, unitscale_policy(16, 16), CONFIG).metrics
    again = simulate(scale(bursty(), 1.5, 1.0, seed=7), unitscale_policy(16, 16), CONFIG).metrics
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)


@pytest.mark.parametrize(
    ("multiplier", "compression", "count", "duration"),
    [
        pytest.param(1.0, 1.0, 480, 119.75, id="identity"),
        pytest.param(3.0, 1.0, 1440, None, id="three-times-the-requests"),
        pytest.param(1.0, 4.0, 480, 119.75 / 4, id="an-hour-in-a-quarter"),
    ],
)
def test_scaling_a_trace(multiplier, compression, count, duration):
    scaled = scale(steady(4, 120), multiplier, compression, seed=1)
    assert len(scaled) == count
    assert np.all(np.diff(scaled.arrival) >= 0)
    if duration is not None:
        assert scaled.duration == pytest.approx(duration)


def test_trace_readers(tmp_path):
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,100,5\n"
        "2023-11-16 18:17:05.4799600,200,7\n"
    )
    trace = read_trace(azure)
    assert trace.arrival.tolist() == pytest.approx([0.0, 1.5])
    assert trace.prompt.tolist() == [100, 200] and trace.output.tolist() == [5, 7]
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 250, "input_length": 20, "output_length": 3, "hash_ids": [1]}\n'
    )
    assert read_trace(mooncake).arrival.tolist() == [0.0, 0.25]
    broken = tmp_path / "b.csv"
    broken.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(TraceError, match=r"b\.csv:2"):
        read_trace(broken)


class Watching:
    """A fixed fleet (static-peak's controller) that keeps what the exporter derived."""

    name = "watching"

    def __init__(self, replicas):
        self.replicas = replicas
        self.seen = {}  # scrape time -> EngineSignals

    def controller(self):
        inner, seen = StaticPeak(self.replicas).controller(), self.seen

        class Controller:
            def start(self, actuator, initial_replicas):
                inner.start(actuator, initial_replicas)

            def tick(self, view, actuator):
                if view.signals is not None:
                    seen[view.signals.time] = view.signals
                inner.tick(view, actuator)

        return Controller()


def stable_mix(watching, start, end):
    return [
        (s.stable.mean_prompt_tokens, s.stable.mean_output_tokens)
        for t, s in sorted(watching.seen.items())
        if start <= t <= end
    ]


def test_the_replay_observes_the_request_mix_a_window_after_it_changes():
    short, long = steady(4, 120, prompt=512, output=32), steady(4, 120, 2048, 128, start=120.0)
    trace = Trace(
        "mix-change",
        np.r_[short.arrival, long.arrival],
        np.r_[short.prompt, long.prompt],
        np.r_[short.output, long.output],
    )
    watching = Watching(2)
    simulate(trace, watching, CONFIG)
    assert stable_mix(watching, 0.0, 0.0) == [(None, None)]  # one scrape: no window yet
    before = stable_mix(watching, 65.0, 120.0)
    after = stable_mix(watching, 125.0 + CONFIG.stable_window, 240.0)
    assert before and set(before) == {(512.0, 32.0)}
    assert after and set(after) == {(2048.0, 128.0)}
    between = stable_mix(watching, 125.0, 120.0 + CONFIG.stable_window)
    assert all(512 < p < 2048 and 32 < o < 128 for p, o in between)


def test_the_replays_observed_mix_is_the_traces_mean_once_the_window_fills():
    # Four request shapes in turn, at 4 per second: a 60 s window holds each about 60 times.
    n = 4 * 300
    prompts, outputs = np.array([256, 512, 1024, 3072]), np.array([16, 64, 128, 256])
    trace = Trace(
        "cycling-mix", np.arange(n) / 4.0, prompts[np.arange(n) % 4], outputs[np.arange(n) % 4]
    )
    watching = Watching(2)
    simulate(trace, watching, CONFIG)
    observed = stable_mix(watching, CONFIG.stable_window + 5.0, 300.0)
    assert len(observed) >= 40
    for prompt, output in observed:
        assert prompt == pytest.approx(trace.prompt.mean(), rel=0.02)
        assert output == pytest.approx(trace.output.mean(), rel=0.02)
