"""Replica physics: how long a vLLM engine step takes, and how many tokens fit in KV cache.

Calibrated from ``shared/calibration/h200-step-times.json`` (kernel timings of one H200,
bf16, CUDA graphs). Each profile keeps a least-squares fit of those tables, not the
tables themselves:

- decode step (ms) = ``a + b * batch + c * batch_context_tokens``: the weights are read
  once per step (``a``), each sequence adds sampling and MLP work (``b``), each cached
  token is read once (``c``). Llama-3-8B fit: every measured point within 6% (mean 2.3%).
- prefill (ms) of T tokens = ``p0 + p1 * T + p2 * T**2`` (attention is quadratic).
  Llama-3-8B: within 10% of every point.
- a real engine adds scheduling and sampling on top of the kernels: ``overhead`` (1.10,
  the middle of the calibration notes' 5-15%).

Pure: plain numbers in, plain numbers out; shared by the replay simulator and the
simulated replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import numpy.typing as npt

GIB = 1024**3
N = TypeVar("N", float, npt.NDArray[np.float64])

CHUNK_ALIGN = 256
"""Chunk budgets are multiples of this (vLLM's block and CUDA-graph sizes are powers of 2)."""
MIN_CHUNK_BUDGET = 512
"""vLLM's practical floor: the first chunked-prefill default (vllm PR #4580, the best ITL
on an A100); smaller chunks re-read the weights for too little work."""
ITL_MARGIN = 0.9
"""Share of the ITL SLO a mixed step may take: the fits are within 6-10% of the kernels."""
SLEEP_WAKE_GB_PER_S = 25.0
"""Weights copied back to the accelerator on a level-1 wake. PCIe Gen5 x16 moves ~55 GB/s
in one pinned transfer, but vLLM's cumem allocator restores allocation by allocation;
25 GB/s with ``WAKE_REINIT_SECONDS`` gives 3.6 s for a 65 GB 32B model, where llm-d's
fast model actuation measures ~4 s for Qwen3-32B on an H100 (a cold pod: ~85 s)."""
WAKE_REINIT_SECONDS = 1.0
"""A wake's fixed part: the KV cache remapped, the scheduler resumed, a first step."""
LOCAL_DISK_GB_PER_S = 1.19
"""Weights read from the calibration node's local disk (a level-2 wake reloads them)."""
FULL_BATCH_CONTEXT = 2048
"""Default mean context of a full decode batch when sizing the chunk budget: above the
Azure conversation mix's 1,260 (1,155 prompt + 211/2 output), the calibration's middle."""


MAX_PRICE_PER_HOUR = 1_000_000.0
"""US$ per accelerator-hour at most, wherever a price is given (a config, ``--price``):
an H200 rents for a few dollars an hour, so more is a typo, not a price."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One model on one accelerator, served by vLLM."""

    name: str
    model: str
    decode_ms: tuple[float, float, float]
    """(a, b, c) of ``a + b*B + c*sum(context)`` for one decode step, in ms."""
    prefill_ms: tuple[float, float, float]
    """(p0, p1, p2) of ``p0 + p1*T + p2*T**2`` for a T-token prefill, in ms."""
    weights_gb: float
    kv_bytes_per_token: int
    accelerator_memory_bytes: int
    price_per_hour: float
    """US$ per accelerator-hour (configurable); replicas hold one accelerator each."""
    gpu_memory_utilization: float = 0.90
    activation_reserve_bytes: int = 2 * GIB
    overhead: float = 1.10
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    """Chunked-prefill budget per step: decode tokens plus prefill chunks."""
    engine_init_seconds: float = 25.0
    """Engine start after weights are loaded: KV profiling, warm-up, CUDA graph capture
    (vllm PR #11005: init 14.2 s + capture 10 s for Llama-3-8B)."""

    def wake_seconds(self, level: int) -> float:
        """From ``POST /wake_up`` to serving, for a replica asleep at vLLM sleep ``level``.

        Level 1 kept the weights in pinned host memory: they are copied back at
        ``SLEEP_WAKE_GB_PER_S``, then the KV cache is mapped again (``WAKE_REINIT_SECONDS``).
        Level 2 discarded them: they are read again from local disk (the calibration
        disk's ``LOCAL_DISK_GB_PER_S``). Level 0 only paused scheduling. Neither pays the
        engine init (``engine_init_seconds``): the process, its allocator and its CUDA
        graphs stay. Llama-3-8B: 16.06 GB / 25 GB/s + 1 s = 1.6 s at level 1, 14.5 s at
        level 2; Qwen2.5-32B: 3.6 s at level 1, against llm-d's ~4 s for Qwen3-32B.
        """
        if level == 0:
            return 0.0
        if level == 1:
            return self.weights_gb / SLEEP_WAKE_GB_PER_S + WAKE_REINIT_SECONDS
        if level == 2:
            return self.weights_gb / LOCAL_DISK_GB_PER_S + WAKE_REINIT_SECONDS
        raise ValueError(f"vLLM sleep levels are 0, 1 and 2, not {level}")

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache left after weights and activations at 90% memory use."""
        usable = self.accelerator_memory_bytes * self.gpu_memory_utilization
        free = usable - self.weights_gb * 1e9 - self.activation_reserve_bytes
        return max(0, int(free // self.kv_bytes_per_token))

    # The step formulas take plain numbers or numpy arrays alike: the simulated replica
    # calls them per step, the replay's fleet once per tick for every replica at once.

    def decode_step_seconds(self, batch: N, context_tokens: N) -> N:
        """One decode step for ``batch`` sequences holding ``context_tokens`` in all."""
        a, b, c = self.decode_ms
        return self.overhead * (a + b * batch + c * context_tokens) / 1000.0

    def prefill_seconds(self, tokens: N) -> N:
        """A prefill of ``tokens`` prompt tokens on its own."""
        p0, _, _ = self.prefill_ms
        return self.overhead * p0 / 1000.0 + self.prefill_marginal_seconds(tokens)

    def prefill_marginal_seconds(self, tokens: N) -> N:
        """What ``tokens`` of prefill add to a step that reads the weights anyway."""
        _, p1, p2 = self.prefill_ms
        return self.overhead * (p1 * tokens + p2 * tokens * tokens) / 1000.0

    def mixed_step_seconds(
        self, batch: float, context_tokens: float, prefill_tokens: float
    ) -> float:
        """A chunked-prefill step: ``batch`` decodes plus ``prefill_tokens`` of prompts.

        The weights are read once per step, so the prefill adds only its marginal cost
        (``p1*T + p2*T**2``) to the decode step; with no decode the step is a prefill.
        """
        if batch <= 0:
            return self.prefill_seconds(prefill_tokens) if prefill_tokens > 0 else 0.0
        decode = self.decode_step_seconds(batch, context_tokens)
        return decode + self.prefill_marginal_seconds(prefill_tokens)

    def decode_capacity(self, mean_context: float, itl_slo_seconds: float) -> int:
        """Largest decode batch whose step stays within ``itl_slo_seconds``.

        Example (llama3-8b-h200, 2,300-token contexts, 100 ms): 256 sequences step in
        about 57 ms, so the batch cap (``max_num_seqs``) binds first.
        """
        a, b, c = self.decode_ms
        per_seq = b + c * mean_context
        budget_ms = itl_slo_seconds * 1000.0 / self.overhead - a
        if budget_ms <= 0:
            return 0
        by_kv = self.kv_capacity_tokens // max(1, int(mean_context))
        return int(min(self.max_num_seqs, by_kv, math.floor(budget_ms / per_seq)))

    def for_itl_slo(
        self,
        slo_itl_seconds: float,
        *,
        mean_context_tokens: float = FULL_BATCH_CONTEXT,
        margin: float = ITL_MARGIN,
    ) -> Profile:
        """This profile with the chunk budget that keeps every step within the ITL SLO.

        ``max_num_batched_tokens`` becomes ``chunk_budget_for_itl(self, slo_itl_seconds)``,
        the flag ``serving.vllm_profile.for_itl_slo`` launches vLLM with.
        """
        budget = chunk_budget_for_itl(
            self, slo_itl_seconds, mean_context_tokens=mean_context_tokens, margin=margin
        )
        return replace(self, max_num_batched_tokens=budget)


def chunk_budget_for_itl(
    profile: Profile,
    slo_itl_seconds: float,
    *,
    mean_context_tokens: float = FULL_BATCH_CONTEXT,
    margin: float = ITL_MARGIN,
) -> int:
    """The largest ``max_num_batched_tokens`` whose steps stay within the ITL SLO.

    A step carries the decode batch plus a prefill chunk, and the budget counts both (one
    token per decode). With a full decode batch ``B`` (``decode_capacity`` at the SLO:
    ``max_num_seqs``, the KV cache or the SLO itself, whichever is smallest) the chunk
    ``c`` may add ``margin * slo - decode_step(B)``, so ``p1*c + p2*c**2`` solves for
    ``c``; the budget is ``B + c``, rounded down to a multiple of 256, and at least
    512 and ``max_num_seqs`` (vLLM refuses a budget below ``max_num_seqs``). When the decode
    step alone takes the margin, the floor is all that is left.

    Example (llama3-8b-h200, 100 ms, 2,048-token contexts): 256 decodes step in 27.3 ms,
    leaving 62.7 ms for 2,569 prompt tokens: 256 + 2,569 = 2,825, so 2,816. Today's 8,192
    would step in 255 ms with that batch.
    """
    if slo_itl_seconds <= 0 or not 0 < margin <= 1:
        raise ValueError(
            f"the ITL SLO must be positive and the margin in (0, 1]: {slo_itl_seconds}, {margin}"
        )
    floor = max(MIN_CHUNK_BUDGET, -(-profile.max_num_seqs // CHUNK_ALIGN) * CHUNK_ALIGN)
    batch = profile.decode_capacity(mean_context_tokens, slo_itl_seconds)
    decode = profile.decode_step_seconds(float(batch), float(batch) * mean_context_tokens)
    room_ms = (margin * slo_itl_seconds - decode) * 1000.0 / profile.overhead
    if room_ms <= 0:
        return floor
    _, p1, p2 = profile.prefill_ms
    chunk = room_ms / p1 if p2 <= 0 else (math.sqrt(p1 * p1 + 4 * p2 * room_ms) - p1) / (2 * p2)
    budget = int((batch + chunk) // CHUNK_ALIGN) * CHUNK_ALIGN
    return max(floor, budget)


LLAMA3_8B_H200 = Profile(
    name="llama3-8b-h200",
    model="Llama-3-8B (hidden 4096, 32 layers, 8 KV heads x 128)",
    decode_ms=(5.747346, 0.017222, 0.000028),
    prefill_ms=(4.835232, 0.020292325, 7.32367e-07),
    weights_gb=16.06,
    kv_bytes_per_token=2 * 32 * 8 * 128 * 2,
    accelerator_memory_bytes=143_771 * 1024**2,
    price_per_hour=3.50,
)

QWEN25_32B_H200 = Profile(
    name="qwen2.5-32b-h200",
    model="Qwen2.5-32B (hidden 5120, 64 layers, 8 KV heads x 128)",
    decode_ms=(19.245129, 0.062207, 0.000056),
    prefill_ms=(15.118741, 0.084622736, 2.401704e-06),
    weights_gb=65.53,
    kv_bytes_per_token=2 * 64 * 8 * 128 * 2,
    accelerator_memory_bytes=143_771 * 1024**2,
    price_per_hour=3.50,
    engine_init_seconds=40.0,
)

PROFILES = {p.name: p for p in (LLAMA3_8B_H200, QWEN25_32B_H200)}


# --- Warm tiers: how fast a replica becomes ready, and what holding it costs --------------
# One place for every tier's figures; the scaler's standby plan (scaler.core.tiers) and the
# replay's fleet both read them, so a figure changed here changes both.

COLD_START_TIERS = ("cached", "local-disk", "remote", "new-node")

HOST_MEMORY_PRICE_PER_GB_HOUR = 0.0045
"""US$ per GB-hour of node memory: about a cloud's on-demand price of memory alone
(e.g. a custom machine type's per-GB rate). Assumed, not measured; configurable."""


def cold_start_seconds(
    profile: Profile, tier: str, remote_gbps: float = 0.5, node_seconds: float = 210.0
) -> float:
    """Pod start to ready for a cold-start tier.

    cached: weights in the node's page cache or a warm Fluid memory cache (host-to-device
    55 GB/s) + engine init; local-disk: weights read at the calibration disk's 1.19 GB/s +
    engine init (8B: 13.5 + 25 = 38.5 s); remote: at ``remote_gbps`` (0.5 GB/s default,
    unverified); new-node: a node and image pull first (``node_seconds``, 3.5 min
    default; the reference gives 2-8 min).
    """
    weights = profile.weights_gb
    if tier == "cached":
        load = weights / 55.0
    elif tier == "local-disk":
        load = weights / LOCAL_DISK_GB_PER_S
    elif tier == "remote":
        load = weights / remote_gbps
    elif tier == "new-node":
        load = node_seconds + weights / remote_gbps
    else:
        raise ValueError(f"unknown cold-start tier {tier!r}; one of {', '.join(COLD_START_TIERS)}")
    return load + profile.engine_init_seconds


@dataclass(frozen=True, slots=True)
class WarmTiers:
    """Seconds from asking to ready, and US$ per hour of holding, for each tier of a replica.

    =========== ====================================== =========================================
    tier        ready after                            costs per hour
    =========== ====================================== =========================================
    running     0                                      the accelerator (``running_per_hour``)
    sleeping    ``sleeping_wake_seconds`` (level-1     its weights in host memory, per replica
                wake_up: ``Profile.wake_seconds(1)``)
    cache-warm  ``cache_warm_wake_seconds`` (a start   one cached copy of the weights on the
                reading the Fluid cache)               node, shared by every start
    cold        ``cold_wake_seconds``                  nothing
    =========== ====================================== =========================================
    """

    running_per_hour: float
    sleeping_wake_seconds: float
    sleeping_per_hour: float
    cache_warm_wake_seconds: float
    cache_per_hour: float
    cold_wake_seconds: float

    def __post_init__(self) -> None:
        values = (
            self.running_per_hour,
            self.sleeping_wake_seconds,
            self.sleeping_per_hour,
            self.cache_warm_wake_seconds,
            self.cache_per_hour,
            self.cold_wake_seconds,
        )
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"warm tier figures must be finite and not negative: {self}")


def warm_tiers(
    profile: Profile,
    cold_wake_seconds: float,
    *,
    memory_price_per_gb_hour: float = HOST_MEMORY_PRICE_PER_GB_HOUR,
) -> WarmTiers:
    """Every tier's figures for ``profile`` whose cold start takes ``cold_wake_seconds``.

    A sleeper holds its weights in host memory (Llama-3-8B: 16 GB, $0.072 per hour at
    $0.0045 per GB-hour, 2% of a $3.50 accelerator); a warm Fluid cache holds one copy for
    every start and starts as the ``cached`` tier (8B: 25.3 s, the engine init is most
    of it).
    """
    memory = profile.weights_gb * memory_price_per_gb_hour
    return WarmTiers(
        running_per_hour=profile.price_per_hour,
        sleeping_wake_seconds=profile.wake_seconds(1),
        sleeping_per_hour=memory,
        cache_warm_wake_seconds=cold_start_seconds(profile, "cached"),
        cache_per_hour=memory,
        cold_wake_seconds=cold_wake_seconds,
    )
