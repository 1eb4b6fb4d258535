"""vLLM 0.32's histogram bucket bounds (shared/reference/vllm-metrics.md §4).

Shared by the simulated replica (which exposes them) and the replay's simulated
``/metrics`` (which the real exporter math reads), so both look like vLLM.
"""

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
"""vllm:time_to_first_token_seconds"""
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
       20.0, 40.0, 80.0)  # fmt: skip
"""vllm:inter_token_latency_seconds"""
E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
       240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
"""vllm:e2e_request_latency_seconds and the request phase histograms"""


def request_tokens(max_model_len: int) -> tuple[int, ...]:
    """Buckets 1, 2, 5, 10, ... up to ``max_model_len``: vLLM's ``build_1_2_5_buckets``.

    The buckets of ``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens``;
    ``request_tokens(100)`` is ``(1, 2, 5, 10, 20, 50, 100)``.
    """
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10
