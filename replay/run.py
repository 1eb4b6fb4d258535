"""Run policies over a trace and write ``results.json``, ``report.md`` and plots."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from foundation.errors import quote
from foundation.files import write_file, write_png
from foundation.replica_model import PROFILES, warm_tiers
from replay.anatomy import CAUSES, TTFT_CAUSES
from replay.oracle import (
    REACHED,
    OracleSchedule,
    find_clairvoyant,
    find_instant_bound,
    smallest_static,
)
from replay.policies import (
    AibrixKv,
    Kpa,
    Policy,
    ProductionStack,
    StaticPeak,
    Unitscale,
    unitscale_policy,
)
from replay.simulate import COLD_START_TIERS, Result, SimConfig, cold_start_of, simulate
from replay.trace import Trace
from scaler.core.model import Policy as CorePolicy
from scaler.core.tiers import StandbyPolicy
from serving.gateway_settings import RECOMMENDED_WAKE_AT_OUTSTANDING
from serving.routing import WakePressure

POLICIES = ("static-peak", "production-stack", "kpa", "aibrix-kv", "oracle", "unitscale")
"""What ``--policy all`` runs; ``oracle`` is the clairvoyant bound."""
BOUNDS = ("oracle", "instant-bound")
"""Found by search over full simulations (``replay.oracle``), not made by ``make_policy``."""
ALL_POLICIES = (*POLICIES, "instant-bound")
"""Every name ``run_policies`` knows, the looser ``instant-bound`` reference row included."""
KNOBS: dict[str, tuple[str, ...]] = {
    "static-peak": ("replicas",),
    "production-stack": ("threshold",),
    "kpa": ("target", "scale_down_delay", "target_utilization", "min_scale"),
    "aibrix-kv": ("target",),
    "unitscale": ("metadata",),
}
"""Each policy's knobs, as ``make_policy`` keywords (its constructor's parameters)."""
COLUMNS = (
    "gpu_hours",
    "cost_per_million_tokens",
    "cost_per_million_output_tokens",
    "slo_attainment",
    "ttft_p50_seconds",
    "ttft_p95_seconds",
    "ttft_p99_seconds",
    "e2e_p95_seconds",
    "mean_utilization",
    "requests",
    "dropped",
    "cold_starts",
)
TIERS = ("cold", "cache-warm", "sleeping", "always-on-1")
"""The rows of ``compare_tiers``: unitscale's scale-from-zero from each warm tier, and a
fleet that never scales below one replica."""
TIER_COLUMNS = (
    "after_idle_ttft_max_seconds",
    "after_idle_ttft_mean_seconds",
    "after_idle_requests",
    "slo_attainment",
    "cost_per_million_tokens",
    "gpu_hours",
    "standby_cost",
    "cold_starts",
    "cache_starts",
    "wakes",
    "dropped",
)


def fleet_config(
    profile: str,
    *,
    slo_ttft: float,
    slo_itl: float,
    cold_start: str,
    max_replicas: int,
    price: float | None = None,
    prewarm: bool = False,
    standby: StandbyPolicy | None = None,
) -> SimConfig:
    """The fleet ``unitscale replay`` (and ``tune``) simulates, from checked flag values.

    The replicas run as the launch profile starts vLLM: with the chunked-prefill budget
    whose steps keep the ITL SLO (``serving.vllm_profile.for_itl_slo``), which the
    scaler's capacity assumes too; vLLM's 8,192-token default breaks a 100 ms ITL at a
    full batch. ``standby`` (with sleepers): unitscale's fleet holds them, as the
    trigger's ``standby: true`` does, and the gateway wakes them under pressure at its
    recommended ``wake-at-outstanding`` (docs/gateway.md); the other policies and the
    references run without (``without_standby``).

    Raises:
        ValueError: an unknown profile or cold-start tier, naming the known ones.
    """
    if profile not in PROFILES:
        raise ValueError(f"--profile {quote(profile)}: one of {', '.join(PROFILES)}")
    if cold_start not in COLD_START_TIERS:
        raise ValueError(f"--cold-start {quote(cold_start)}: one of {', '.join(COLD_START_TIERS)}")
    model = PROFILES[profile]
    if price is not None:
        model = replace(model, price_per_hour=price)
    fleet = SimConfig(
        model.for_itl_slo(slo_itl),
        slo_ttft=slo_ttft,
        slo_itl=slo_itl,
        cold_start_tier=cold_start,
        prewarm=prewarm,
        max_replicas=max_replicas,
    )
    return fleet if standby is None else with_standby(fleet, standby)


def with_standby(config: SimConfig, standby: StandbyPolicy) -> SimConfig:
    """``config``'s fleet holding ``standby``'s sleepers, as unitscale's trigger holds them.

    As with ``standby: true``, and a gateway waking them at its recommended
    ``wake-at-outstanding``; a plan of no sleepers is ``config`` without any.
    """
    if standby.max_sleeping == 0:
        return without_standby(config)
    pressure = WakePressure(RECOMMENDED_WAKE_AT_OUTSTANDING)
    return replace(config, standby=standby, wake_pressure=pressure)


def without_standby(config: SimConfig) -> SimConfig:
    """``config``'s fleet with no sleepers: the references' and the baselines'.

    They hold no warm tier, so the gateway's pressure wakes have nothing to wake.
    """
    return replace(config, standby=None, wake_pressure=None)


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """What ``unitscale replay`` was asked for."""

    trace_path: str
    rate_multiplier: float
    time_compression: float
    seed: int
    target_concurrency: float = 32.0
    slo_target: float = 0.99
    warm_start: bool = True
    """Start every policy with the oracle's first-interval replicas ready."""
    policy: CorePolicy = field(default_factory=CorePolicy)
    """The scaler config's policy section, for the unitscale policy."""


def run_policies(
    trace: Trace,
    names: list[str],
    config: SimConfig,
    options: ReplayOptions,
    progress: Callable[[str, float], None] | None = None,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Result]:
    """Every named policy over ``trace``, in the order named.

    The instant bound is fitted first: every policy starts warm with the replicas its
    first interval needs, and it seeds the clairvoyant's search. ``static-peak`` is the
    smallest static fleet meeting ``options.slo_target`` (unless ``knobs`` give it
    ``replicas``), and a candidate schedule of the clairvoyant (``oracle``).
    ``knobs[name]`` are ``make_policy`` keywords for that policy.

    Raises:
        ValueError: an unknown name or knob.
    """
    knobs = knobs or {}
    for name in names:
        if name not in ALL_POLICIES:
            raise ValueError(f"unknown policy {quote(name)}; one of {', '.join(ALL_POLICIES)}")
    target, own = options.slo_target, config
    config = without_standby(config)  # unitscale's sleepers are its own (``fleet_config``)
    instant, schedule = find_instant_bound(trace, config, target)
    warm = warm_replicas(schedule, config, options)
    static: tuple[Result, int] | None = None
    sized = "static-peak" in names and "replicas" not in knobs.get("static-peak", {})
    if sized or "oracle" in names:
        static = smallest_static(trace, config, target, hint=static_hint(schedule, config))
    results: dict[str, Result] = {}
    for name in names:
        if name == "oracle":
            results[name] = find_clairvoyant(
                trace, config, target, seed=schedule.replicas(), static=static
            )[0]
        elif name == "instant-bound":
            results[name] = instant
        elif name == "static-peak" and sized and static is not None:
            results[name] = static[0]
        else:
            fleet = own if name == "unitscale" else config
            policy = make_policy(name, fleet, options, **knobs.get(name, {}))
            callback = (lambda t, n=name: progress(n, t)) if progress else None
            results[name] = simulate(trace, policy, fleet, progress=callback, initial_replicas=warm)
    return results


def tier_configs(
    config: SimConfig, standby: StandbyPolicy
) -> dict[str, tuple[SimConfig, dict[str, str]]]:
    """Each ``TIERS`` row's fleet and the trigger metadata it adds to unitscale's.

    cold: no standby (``config``'s cold start); cache-warm: the Fluid cache held, no
    sleepers; sleeping: sleepers and the cache (``standby``); always-on-1: cold
    scale-out above ``minReplicas: 1``.
    """
    return {
        "cold": (replace(config, standby=None), {}),
        "cache-warm": (replace(config, standby=replace(standby, sleeping=False, cache=True)), {}),
        "sleeping": (replace(config, standby=standby), {}),
        "always-on-1": (replace(config, standby=None), {"minReplicas": "1"}),
    }


def compare_tiers(
    trace: Trace,
    config: SimConfig,
    options: ReplayOptions,
    standby: StandbyPolicy | None = None,
    progress: Callable[[str, float], None] | None = None,
    metadata: Mapping[str, str] | None = None,
    base: Unitscale | None = None,
) -> dict[str, Result]:
    """The unitscale policy over ``trace`` once per ``TIERS`` row (``tier_configs``).

    Every row starts with one replica ready (none without ``options.warm_start``) and
    the trigger ``metadata`` given; the rows differ only in what the fleet holds besides
    its running replicas, so the after-idle TTFT, SLO and cost columns compare the tiers.
    ``base`` is the unitscale policy every row runs (its metadata, policy defaults, push
    and ScaledObject spec; the demo's own), else ``make_policy``'s for ``options``.
    """
    results: dict[str, Result] = {}
    initial = 1 if options.warm_start else 0
    for name, (row, extra) in tier_configs(config, standby or StandbyPolicy()).items():
        knobs = {**(metadata or {}), **extra}
        policy = (
            make_policy("unitscale", row, options, metadata=knobs)
            if base is None
            else replace(base, metadata={**base.metadata, **knobs})  # a fresh scaler per row
        )
        callback = (lambda t, n=name: progress(n, t)) if progress else None
        results[name] = simulate(trace, policy, row, progress=callback, initial_replicas=initial)
    return results


def tier_notes(config: SimConfig) -> list[str]:
    """The report's lines on each tier's figures (``foundation.replica_model.warm_tiers``)."""
    tiers = warm_tiers(
        config.profile,
        cold_start_of(config),
        memory_price_per_gb_hour=config.memory_price_per_gb_hour,
    )
    price = config.profile.price_per_hour
    return [
        f"- tiers: running ${price:.2f}/h; sleeping (vLLM level 1) wakes in"
        f" {tiers.sleeping_wake_seconds:.1f} s, ${tiers.sleeping_per_hour:.3f}/h each"
        f" (its weights in host memory); cache-warm (Fluid) starts in"
        f" {tiers.cache_warm_wake_seconds:.1f} s, ${tiers.cache_per_hour:.3f}/h for the cache;"
        f" cold starts in {tiers.cold_wake_seconds:.1f} s",
        f"- after idle: the requests arriving {config.idle_gap:g} s or more after the one"
        " before (TTFT from arrival; a dropped one makes max and mean n/a)",
    ]


def warm_replicas(schedule: OracleSchedule, config: SimConfig, options: ReplayOptions) -> int:
    """The replicas every policy starts with: the instant bound's first interval's (or 0)."""
    planned = np.minimum(schedule.replicas(), config.max_replicas)
    return int(planned[0]) if options.warm_start and len(planned) else 0


def static_hint(schedule: OracleSchedule, config: SimConfig) -> int:
    """The static fleet size ``smallest_static`` tries first: the instant bound's peak."""
    return int(np.minimum(schedule.replicas(), config.max_replicas).max(initial=1))


def make_policy(name: str, config: SimConfig, options: ReplayOptions, **knobs: Any) -> Policy:
    """A policy by name, sized for ``config``'s replicas, its knobs set for a sweep.

    Knobs (``KNOBS``; defaults and sources in docs/replay.md): ``static-peak``:
    ``replicas`` (required); ``production-stack``: ``threshold`` (waiting requests per
    replica); ``kpa``: ``target`` (in-flight requests per replica),
    ``scale_down_delay`` (seconds), ``target_utilization`` (0-1], ``min_scale``;
    ``aibrix-kv``: ``target`` (KV use per replica, 0-1]; ``unitscale``: ``metadata``
    (trigger metadata merged over what ``options`` give, e.g. ``targetConcurrency``).

    Raises:
        ValueError: an unknown policy or knob, or a knob out of range (named).
    """
    if name in BOUNDS:
        raise ValueError(f"{name} is a bound found by search: run_policies([{name!r}], ...)")
    if name not in KNOBS:
        raise ValueError(f"unknown policy {quote(name)}; one of {', '.join(ALL_POLICIES)}")
    unknown = sorted(set(knobs) - set(KNOBS[name]))
    if unknown:
        raise ValueError(
            f"{name} has no knob {quote(unknown[0])}; its knobs: {', '.join(KNOBS[name])}"
        )
    top = config.max_replicas
    if name == "static-peak":
        if "replicas" not in knobs:
            raise ValueError("static-peak needs its size: replicas=N (run_policies sizes it)")
        return StaticPeak(_count(name, "replicas", knobs["replicas"], 1, top))
    if name == "production-stack":
        threshold = _positive(name, "threshold", knobs.get("threshold", ProductionStack.threshold))
        return ProductionStack(
            threshold=threshold, spec=replace(ProductionStack().spec, max_replicas=top)
        )
    if name == "aibrix-kv":
        target = _positive(name, "target", knobs.get("target", AibrixKv.target), at_most=1.0)
        return AibrixKv(target=target, spec=replace(AibrixKv().spec, max_replicas=top))
    if name == "kpa":
        defaults = Kpa()
        return Kpa(
            target=_positive(name, "target", knobs.get("target", defaults.target)),
            target_utilization=_positive(
                name,
                "target_utilization",
                knobs.get("target_utilization", defaults.target_utilization),
                at_most=1.0,
            ),
            scale_down_delay=_seconds(
                name, "scale_down_delay", knobs.get("scale_down_delay", defaults.scale_down_delay)
            ),
            min_scale=_count(name, "min_scale", knobs.get("min_scale", defaults.min_scale), 0, top),
            spec=replace(defaults.spec, max_replicas=top),
        )
    # The replay knows the model it simulates, as an operator knows the model they serve:
    # unitscale plans with that profile unless the scaler config names one.
    profile = config.profile.name if options.policy.profile is None else None
    core = options.policy
    if config.standby is not None and config.standby.burst_tier and config.wake_pressure:
        # The replay holds the plan itself (``StandbyController``) and wakes its sleepers
        # under pressure, as the trigger's standby keys and the gateway would: the
        # scaler knows the tier is there.
        core = replace(core, burst_tier=True)
    base = unitscale_policy(options.target_concurrency, top, core, profile)
    metadata = knobs.get("metadata")
    if metadata is None:
        return base
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError(f"unitscale: metadata must map strings to strings, got {metadata!r}")
    return Unitscale(metadata={**base.metadata, **metadata}, defaults=base.defaults, spec=base.spec)


def _positive(name: str, key: str, value: Any, at_most: float = math.inf) -> float:
    number = _number(name, key, value)
    if not 0 < number <= at_most:
        bound = "" if math.isinf(at_most) else f" and at most {at_most:g}"
        raise ValueError(f"{name}: {key}={number:g} must be above 0{bound}")
    return number


def _seconds(name: str, key: str, value: Any) -> float:
    number = _number(name, key, value)
    if not 0 <= number <= 3600:  # Knative: 0s <= scale-down-delay <= 1h
        raise ValueError(f"{name}: {key}={number:g} must be 0 to 3600 seconds")
    return number


def _count(name: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}: {key}={value!r} must be a whole number {low} to {high}")
    return value


def _number(name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: {key}={value!r} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}: {key}={number:g} is not finite")
    return number


REPORT_FILES = ("results.json", "report.md", "replicas.png", "latency_cdf.png")
"""What ``write_report`` writes in its directory."""


def write_report(
    results: dict[str, Result],
    config: SimConfig,
    options: ReplayOptions,
    out: Path,
    columns: tuple[str, ...] = COLUMNS,
    notes: tuple[str, ...] = (),
) -> None:
    """``REPORT_FILES`` in ``out``.

    ``columns`` are the table's (``TIER_COLUMNS`` for ``compare_tiers``), ``notes`` extra
    lines above it.
    """
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        name: {k: json_number(v) for k, v in r.metrics.items()} for name, r in results.items()
    }
    write_file(out / "results.json", json.dumps(payload, indent=2, sort_keys=True) + "\n")
    header = "| policy | " + " | ".join(columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    rows = [
        f"| {name} | " + " | ".join(_cell(r.metrics[c]) for c in columns) + " |"
        for name, r in results.items()
    ]
    lines = [
        f"# Replay of `{Path(options.trace_path).name}`",
        "",
        f"- profile: {config.profile.name}"
        f" (${config.profile.price_per_hour:.2f} per accelerator-hour)",
        f"- rate multiplier {options.rate_multiplier:g},"
        f" time compression {options.time_compression:g}, seed {options.seed}",
        f"- SLO: TTFT <= the larger of {config.slo_ttft:g} s and"
        f" {config.slo_prefill_multiple:g}x the request's own prefill on an idle replica,"
        f" and mean inter-token latency <= {config.slo_itl * 1000:g} ms;"
        f" dropped requests count as misses",
        f"- cold start: {config.cold_start_tier}"
        + (" (Fluid prewarm: cached)" if config.prewarm else ""),
        *_unreached(results, options.slo_target),
        *notes,
        "",
        header,
        rule,
        *rows,
        "",
        *miss_table(results),
        "![replicas and load](replicas.png)",
        "",
        "![latency CDF](latency_cdf.png)",
        "",
    ]
    write_file(out / "report.md", "\n".join(lines))
    _plots(results, out)


MISS_HEADERS = {
    "dropped": "dropped",
    "unreachable": "unreachable",
    "cold_start": "cold start",
    "queued_for_seat": "queued for a seat",
    "queued_behind_prompts": "behind other prompts",
    "decode_interference": "decode interference",
}
"""The "Why requests missed" table's column per ``replay.anatomy`` cause."""


def miss_table(results: Mapping[str, Result]) -> list[str]:
    """The report's "Why requests missed" section: per policy, each cause's share.

    A TTFT cause's share carries its median TTFT over target, e.g. ``1.20% (+3.1 s)``.
    Results without the anatomy's metrics (none of ``simulate``'s) get no row.
    """
    shown = {
        name: r.metrics
        for name, r in results.items()
        if all(f"miss_{c}" in r.metrics for c in CAUSES)
    }
    if not shown:
        return []
    if all(float(m[f"miss_{c}"]) == 0 for m in shown.values() for c in CAUSES):
        return ["## Why requests missed", "", "No request missed the SLO.", ""]
    rows = [
        f"| {name} | " + " | ".join(_miss_cell(m, c) for c in CAUSES) + " |"
        for name, m in shown.items()
    ]
    return [
        "## Why requests missed",
        "",
        "Each miss counted once, by its first failure (docs/replay.md, the miss anatomy);"
        " shares of all requests, adding up to 1 - slo_attainment; in brackets the median"
        " TTFT over target.",
        "",
        "| policy | " + " | ".join(MISS_HEADERS[c] for c in CAUSES) + " |",
        "|---|" + "---:|" * len(CAUSES),
        *rows,
        "",
    ]


def _miss_cell(metrics: Mapping[str, float | int], cause: str) -> str:
    share = float(metrics[f"miss_{cause}"])
    if not math.isfinite(share):
        return "n/a"
    text = "0" if share == 0 else "<0.01%" if share < 0.0001 else f"{share:.2%}"
    excess = float(metrics.get(f"{cause}_excess_p50_seconds", math.nan))
    if cause in TTFT_CAUSES and math.isfinite(excess):
        text += f" (+{excess:.2f} s)" if excess < 10 else f" (+{excess:,.0f} s)"
    return text


def _unreached(results: dict[str, Result], slo_target: float) -> list[str]:
    """A line for each bound (or sized static fleet) that did not reach the SLO target."""
    return [
        f"- `{name}` did not reach the SLO target of {slo_target:.0%}: the closest it came"
        f" is {r.metrics['slo_attainment']:.2%} (at most {r.metrics['max_replicas']} replicas),"
        " so its cost is no bound"
        for name, r in results.items()
        if r.metrics.get(REACHED) is False
    ]


def _plots(results: dict[str, Result], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load, reps) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    first = next(iter(results.values()))
    load.plot(np.array(first.series["t"]) / 60, first.series["arrivals"], color="black", lw=0.8)
    load.set_ylabel("arrivals / s")
    for name, result in results.items():
        reps.step(
            np.array(result.series["t"]) / 60,
            result.series["replicas"],
            where="post",
            label=name,
            lw=1,
        )
    reps.set_ylabel("replicas")
    reps.set_xlabel("minutes")
    reps.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    write_png(out / "replicas.png", fig, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, result in results.items():
        values = np.sort(result.ttft)
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=name, lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of served requests")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_png(out / "latency_cdf.png", fig, dpi=100)
    plt.close(fig)


def json_number(value: float | int) -> float | int | None:
    """``value``, or None where JSON has no number (NaN, infinities)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: float | int) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:,.2f}"
