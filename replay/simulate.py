"""The replay loop: arrivals, gateway, fleet, exporter, and the policy's controller.

Time advances in ticks of ``dt``; everything happens at tick boundaries in a fixed
order (replicas become ready, arrivals are routed, the fleet runs, the exporter
scrapes, controllers act), so a run is a pure function of trace, policy and config.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from exporter.engines import EngineStats, Histogram
from exporter.signals import Accelerator, ReplicaHistory, derive, history_horizon
from foundation.signals import EngineSignals
from replay.fleet import DONE, DROPPED, WAITING, Fleet, Requests
from replay.policies import GatewayView, Policy, View
from replay.trace import Trace
from serving import vllm_buckets
from serving.replica_model import Profile

OFF, STARTING, READY, DRAINING = range(4)

# vLLM's bucket bounds, so that the exporter's own quantile math runs on what a real
# engine would expose (+Inf closes each histogram).
TTFT_BUCKETS = (*vllm_buckets.TTFT, math.inf)
ITL_BUCKETS = (*vllm_buckets.ITL, math.inf)
E2E_BUCKETS = (*vllm_buckets.E2E, math.inf)

COLD_START_TIERS = ("cached", "local-disk", "remote", "new-node")


def cold_start_seconds(
    profile: Profile, tier: str, remote_gbps: float = 0.5, node_seconds: float = 210.0
) -> float:
    """Pod start to ready for a cold-start tier.

    cached: weights in the node's page cache (host-to-device 55 GB/s) + engine init;
    local-disk: weights read at the calibration disk's 1.19 GB/s + engine init (8B: 13.5
    + 25 = 38.5 s); remote: at ``remote_gbps`` (0.5 GB/s default, unverified);
    new-node: a node and image pull first (``node_seconds``, 3.5 min default; the
    reference gives 2-8 min).
    """
    weights = profile.weights_gb
    if tier == "cached":
        load = weights / 55.0
    elif tier == "local-disk":
        load = weights / 1.19
    elif tier == "remote":
        load = weights / remote_gbps
    elif tier == "new-node":
        load = node_seconds + weights / remote_gbps
    else:
        raise ValueError(f"unknown cold-start tier {tier!r}; one of {', '.join(COLD_START_TIERS)}")
    return load + profile.engine_init_seconds


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Run settings; every default documented in README's replay section."""

    profile: Profile
    dt: float = 0.2
    slo_ttft: float = 2.0
    slo_itl: float = 0.1
    scrape_interval: float = 5.0
    panic_window: float = 10.0
    stable_window: float = 60.0
    cold_start_tier: str = "local-disk"
    prewarm: bool = False
    """Fluid prewarm: every start is in the ``cached`` tier."""
    cold_start_override: float | None = None
    """Seconds from start to ready, replacing the tier's (a start measured elsewhere)."""
    gateway_buffer: int = 5000
    gateway_timeout: float = 120.0
    max_replicas: int = 64
    tail: float = 900.0
    """Seconds after the last arrival before unfinished requests count as dropped."""


@dataclass(slots=True)
class Result:
    """One policy's run."""

    policy: str
    metrics: dict[str, float | int]
    series: dict[str, list[float]]
    ttft: npt.NDArray[np.float64]
    e2e: npt.NDArray[np.float64]
    decisions: list[tuple[float, int, str]] = field(default_factory=list)


def simulate(
    trace: Trace,
    policy: Policy,
    config: SimConfig,
    progress: Callable[[float], None] | None = None,
    initial_replicas: int = 0,
) -> Result:
    """Replay ``trace`` under ``policy``'s controller.

    ``initial_replicas`` start ready (a warm start, as if earlier traffic had sized the
    fleet); 0 starts cold, every replica paying its cold start.
    """
    profile = config.profile
    slots = config.max_replicas
    requests = Requests(trace.arrival.copy(), trace.prompt.copy(), trace.output.copy())
    fleet = Fleet(profile, requests, slots)
    slot = np.full(slots, OFF, dtype=np.int64)
    ready_at = np.zeros(slots)
    created = np.zeros(slots)
    cold = (
        config.cold_start_override
        if config.cold_start_override is not None
        else cold_start_seconds(profile, "cached" if config.prewarm else config.cold_start_tier)
    )
    counters = np.zeros((slots, 3))  # prompt tokens, output tokens, finished requests
    hist = {
        "ttft": (TTFT_BUCKETS, np.zeros((slots, len(TTFT_BUCKETS))), np.zeros(slots)),
        "itl": (ITL_BUCKETS, np.zeros((slots, len(ITL_BUCKETS))), np.zeros(slots)),
        "e2e": (E2E_BUCKETS, np.zeros((slots, len(E2E_BUCKETS))), np.zeros(slots)),
    }
    histories: dict[int, ReplicaHistory] = {}
    accelerator = Accelerator(profile.price_per_hour, 1.0)
    buffer: deque[int] = deque()
    arrivals_seen: deque[float] = deque()
    signals: EngineSignals | None = None
    decisions: list[tuple[float, int, str]] = []
    series: dict[str, list[float]] = {
        k: [] for k in ("t", "arrivals", "replicas", "ready", "queue")
    }
    replica_seconds = busy_seconds = 0.0
    cold_starts = 0
    next_arrival = 0
    too_big = float(profile.kv_capacity_tokens)
    end = trace.duration + config.tail
    next_scrape = next_series = 0.0
    arrivals_in_series = 0
    now = 0.0

    def running_count() -> int:
        return int(np.count_nonzero((slot == STARTING) | (slot == READY)))

    def scale_to(n: int, reason: str, instant: bool = False) -> None:
        nonlocal cold_starts
        n = max(0, min(n, slots))
        current = running_count()
        if n == current:
            return
        decisions.append((now, n, reason))
        if n > current:
            free = np.flatnonzero(slot == OFF)[: n - current]
            slot[free] = READY if instant else STARTING
            ready_at[free] = now if instant else now + cold
            created[free] = now
            if not instant:
                cold_starts += len(free)
            return
        surplus = current - n
        starting = np.flatnonzero(slot == STARTING)[::-1][:surplus]
        slot[starting] = OFF
        surplus -= len(starting)
        if surplus:
            ready = np.flatnonzero(slot == READY)
            drain = ready[np.argsort(fleet.outstanding[ready], kind="stable")][:surplus]
            slot[drain] = DRAINING

    controller = policy.controller()
    actuator = _Actuator(scale_to, running_count)
    controller.start(actuator, initial_replicas)

    def route(index: int) -> bool:
        ready = np.flatnonzero(slot == READY)
        if len(ready) == 0:
            return False
        target = ready[np.argmin(fleet.outstanding[ready])]
        fleet.assign(index, int(target), now)
        return True

    dt = config.dt
    while now <= end:
        # 1. Replicas whose cold start is over become ready.
        starting = (slot == STARTING) & (ready_at <= now)
        slot[starting] = READY
        # 2. Arrivals and the gateway buffer.
        # Arrivals up to half a tick ahead join this tick: no bias on average.
        while next_arrival < len(trace) and trace.arrival[next_arrival] <= now + dt / 2:
            i = next_arrival
            next_arrival += 1
            arrivals_seen.append(now)
            arrivals_in_series += 1
            if requests.prompt[i] + requests.output[i] > too_big:
                requests.state[i] = DROPPED
            elif buffer or not route(i):
                if len(buffer) >= config.gateway_buffer:
                    requests.state[i] = DROPPED
                else:
                    buffer.append(i)
        while buffer and requests.arrival[buffer[0]] + config.gateway_timeout < now:
            requests.state[buffer.popleft()] = DROPPED
        while buffer and route(buffer[0]):
            buffer.popleft()
        while arrivals_seen and now - arrivals_seen[0] > config.panic_window:
            arrivals_seen.popleft()
        # 3. The fleet runs one tick.
        tick = fleet.advance(now, dt)
        _record(requests, tick.first_tokens, tick.finished, counters, hist)
        holding = (slot == STARTING) | (slot == READY) | (slot == DRAINING)
        replica_seconds += dt * int(np.count_nonzero(holding))
        busy_seconds += float(tick.busy[holding].sum())
        drained = (slot == DRAINING) & (fleet.outstanding == 0)
        slot[drained] = OFF
        for s in np.flatnonzero(drained):
            histories.pop(int(s), None)
        gateway = GatewayView(
            len(arrivals_seen) / config.panic_window, len(buffer), int(fleet.outstanding.sum())
        )
        # 4. The exporter scrapes every replica with endpoints.
        if now >= next_scrape:
            next_scrape += config.scrape_interval
            serving = np.flatnonzero((slot == READY) | (slot == DRAINING))
            latest = []
            for s in serving:
                stats = _engine_stats(int(s), fleet, counters, hist, created[s])
                histories.setdefault(
                    int(s),
                    ReplicaHistory(history_horizon(config.stable_window, config.scrape_interval)),
                ).add(now, stats)
                latest.append(stats)
            signals = derive(
                now,
                len(serving),
                latest,
                [histories[int(s)] for s in serving],
                config.panic_window,
                config.stable_window,
                accelerator,
            )
        view = View(now, signals, gateway, running_count(), int(np.count_nonzero(slot == READY)))
        # 5. The controller acts.
        controller.tick(view, actuator)
        if now >= next_series:
            next_series += 10.0
            series["t"].append(now)
            series["arrivals"].append(arrivals_in_series / 10.0)
            series["replicas"].append(float(running_count()))
            series["ready"].append(float(np.count_nonzero(slot == READY)))
            series["queue"].append(float(len(buffer) + fleet.queue_depth().sum()))
            arrivals_in_series = 0
            if progress is not None:
                progress(min(now, trace.duration))
        if next_arrival >= len(trace) and not buffer and len(fleet.active) == 0:
            break
        now += dt
    unfinished = (requests.state != DONE) & (requests.state != DROPPED)
    requests.state[unfinished] = DROPPED
    return _result(
        policy.name, requests, config, replica_seconds, busy_seconds, cold_starts, series, decisions
    )


@dataclass(frozen=True, slots=True)
class _Actuator:
    """The simulated Deployment, as a controller sees it."""

    scale: Callable[[int, str, bool], None]
    count: Callable[[], int]

    def scale_to(self, replicas: int, reason: str, instant: bool = False) -> None:
        self.scale(replicas, reason, instant)

    def running(self) -> int:
        return self.count()


def _record(
    requests: Requests,
    first: npt.NDArray[np.int64],
    finished: npt.NDArray[np.int64],
    counters: npt.NDArray[np.float64],
    hist: dict[str, tuple[tuple[float, ...], npt.NDArray[np.float64], npt.NDArray[np.float64]]],
) -> None:
    # The engine measures from when it got the request, not from the gateway's arrival.
    if len(first):
        ttft = requests.first_token[first] - requests.routed[first]
        _observe(hist["ttft"], requests.replica[first], ttft)
    if len(finished):
        slots = requests.replica[finished]
        np.add.at(counters[:, 0], slots, requests.prompt[finished])
        np.add.at(counters[:, 1], slots, requests.output[finished])
        np.add.at(counters[:, 2], slots, 1.0)
        _observe(hist["e2e"], slots, requests.finished[finished] - requests.routed[finished])
        gaps = np.maximum(requests.output[finished] - 1, 1)
        _observe(hist["itl"], slots, requests.decode_time[finished] / gaps)


def _observe(
    entry: tuple[tuple[float, ...], npt.NDArray[np.float64], npt.NDArray[np.float64]],
    slots: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
) -> None:
    bounds, counts, sums = entry
    index = np.searchsorted(np.array(bounds), values, side="left")
    np.add.at(counts, (slots, index), 1.0)
    np.add.at(sums, slots, values)


def _engine_stats(
    s: int,
    fleet: Fleet,
    counters: npt.NDArray[np.float64],
    hist: dict[str, tuple[tuple[float, ...], npt.NDArray[np.float64], npt.NDArray[np.float64]]],
    created: float,
) -> EngineStats:
    histograms = {}
    for name, (bounds, counts, sums) in hist.items():
        cumulative = np.cumsum(counts[s])
        histograms[name] = Histogram(
            bounds, tuple(cumulative.tolist()), float(cumulative[-1]), float(sums[s])
        )
    return EngineStats(
        "vllm",
        "replay",
        gauges={
            "running": float(fleet.running[s]),
            "waiting": float(fleet.outstanding[s] - fleet.running[s]),
            "kv_usage": float(fleet.kv_reserved[s] / fleet.kv_capacity),
        },
        counters={
            "prompt_tokens": float(counters[s, 0]),
            "generation_tokens": float(counters[s, 1]),
            "requests": float(counters[s, 2]),
            "preemptions": 0.0,
        },
        histograms=histograms,
        created=created,
    )


def _result(
    name: str,
    requests: Requests,
    config: SimConfig,
    replica_seconds: float,
    busy_seconds: float,
    cold_starts: int,
    series: dict[str, list[float]],
    decisions: list[tuple[float, int, str]],
) -> Result:
    served = requests.state == DONE
    ttft = (requests.first_token - requests.arrival)[served]
    e2e = (requests.finished - requests.arrival)[served]
    gaps = np.maximum(requests.output - 1, 1)
    itl = requests.decode_time / gaps
    ok = (
        served
        & (requests.first_token - requests.arrival <= config.slo_ttft)
        & (itl <= config.slo_itl)
    )
    gpu_hours = replica_seconds / 3600.0
    cost = gpu_hours * config.profile.price_per_hour
    tokens = float((requests.prompt + requests.output)[served].sum())
    output_tokens = float(requests.output[served].sum())

    metrics: dict[str, float | int] = {
        "gpu_hours": gpu_hours,
        "cost": cost,
        "cost_per_million_tokens": cost / tokens * 1e6 if tokens else math.inf,
        "cost_per_million_output_tokens": cost / output_tokens * 1e6 if output_tokens else math.inf,
        "slo_attainment": float(ok.sum() / len(ok)) if len(ok) else math.nan,
        "ttft_p50_seconds": percentile(ttft, 50),
        "ttft_p95_seconds": percentile(ttft, 95),
        "ttft_p99_seconds": percentile(ttft, 99),
        "e2e_p95_seconds": percentile(e2e, 95),
        "itl_mean_p95_seconds": percentile(itl[served], 95),
        "mean_utilization": busy_seconds / replica_seconds if replica_seconds else 0.0,
        "requests": len(requests.arrival),
        "dropped": int((requests.state == DROPPED).sum()),
        "cold_starts": cold_starts,
        "max_replicas": int(max(series["replicas"], default=0)),
    }
    assert not ((requests.state == WAITING).any()), "a request was neither served nor dropped"
    return Result(name, metrics, series, ttft, e2e, decisions)


def percentile(values: npt.NDArray[np.float64], q: float) -> float:
    """The ``q``-th percentile, NaN (not 0) when there are no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan
