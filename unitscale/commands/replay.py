"""``unitscale replay``: simulate a vLLM fleet under KEDA for every policy.

With ``--pool`` it is the joint replay instead (``replay_pool``): one pool shared by
training and inference.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from foundation.errors import ConfigError, quote
from unitscale import flags
from unitscale.commands import replay_pool
from unitscale.commands.common import cold_start_argument
from unitscale.outputs import given_inputs, report_directory

if TYPE_CHECKING:
    from replay.run import ReplayOptions
    from replay.simulate import SimConfig
    from scaler.core.model import Policy as CorePolicy
    from scaler.core.tiers import StandbyPolicy
    from unitscale.flags import Commands


def add_command(commands: Commands) -> None:
    """Register ``unitscale replay``, its flags and the joint replay's."""
    replay = commands.add_parser("replay", help="simulate a vLLM fleet under KEDA for every policy")
    replay.add_argument(
        "--trace",
        action="append",
        type=flags.trace_source,
        help="Azure LLM CSV, Mooncake JSONL, builtin:business-day|business-days|business-week,"
        " or servegen:DIR?scale=X&days=A-B (replay.workloads);"
        " with --pool repeatable, one inference deployment each, at most 16"
        " (default builtin:business-day)",
    )
    replay.add_argument("--policy", default="all", help="a policy name or 'all'")
    replay.add_argument("--rate-multiplier", type=flags.RATE_MULTIPLIER, default=1.0)
    replay.add_argument("--time-compression", type=flags.TIME_COMPRESSION, default=1.0)
    replay.add_argument("--profile", default="llama3-8b-h200")
    replay.add_argument(
        "--price", type=flags.PRICE, help="US$ per accelerator-hour (default: the profile's)"
    )
    replay.add_argument(
        "--slo-ttft", type=flags.SLO_SECONDS, default=2.0, help="seconds (default 2)"
    )
    replay.add_argument(
        "--slo-itl",
        type=flags.SLO_SECONDS,
        default=0.1,
        help="mean inter-token seconds (default 0.1)",
    )
    cold_start_argument(replay)
    replay.add_argument(
        "--prewarm", action="store_true", help="Fluid prewarm: every start is cached"
    )
    _tier_arguments(replay)
    flags.standby_arguments(replay)
    replay.add_argument("--max-replicas", type=flags.REPLICAS, default=64)
    replay.add_argument(
        "--target-concurrency",
        type=flags.CONCURRENCY,
        default=flags.TARGET_CONCURRENCY,
        help="the unitscale policy's targetConcurrency (default %(default)s)",
    )
    replay.add_argument("--seed", type=flags.SEED, default=0)
    replay.add_argument(
        "--scaler-config",
        type=flags.path,
        help="the scaler's ConfigMap YAML to try: its policy section drives the unitscale policy",
    )
    replay.add_argument("--report", type=flags.path, required=True, help="output directory")
    replay_pool.add_arguments(replay)
    replay.set_defaults(run=run, default_log_level="warning")


def _tier_arguments(replay: argparse.ArgumentParser) -> None:
    """``--compare-tiers`` and its knobs."""
    replay.add_argument(
        "--compare-tiers",
        action="store_true",
        help="unitscale from cold, cache-warm and sleeping replicas, and always on (1)",
    )
    replay.add_argument(
        "--max-sleeping",
        type=flags.SLEEPING,
        default=flags.TIER_SLEEPING,
        help="with --compare-tiers (default %(default)s)",
    )
    replay.add_argument(
        "--idle-grace",
        type=flags.IDLE_GRACE,
        help="with --compare-tiers: seconds without a request before unitscale scales to zero",
    )


def run(args: argparse.Namespace) -> int:
    """Replay every policy (or the tiers) on one trace; print and write the report."""
    from rich.progress import Progress

    from replay.run import (
        REPORT_FILES,
        TIER_COLUMNS,
        compare_tiers,
        run_policies,
        tier_notes,
        write_report,
    )
    from replay.trace import scale
    from replay.workloads import load_trace

    if args.pool is not None or args.tasks is not None:
        return replay_pool.run(args, scaler_policy(args))
    joint = replay_pool.given(args)
    if joint:  # the run would be a plain replay, the flag's meaning silently dropped
        raise ConfigError(f"{joint[0]} is the joint replay's: add --pool and --tasks, or drop it")
    if not args.compare_tiers and (
        args.idle_grace is not None or args.max_sleeping != flags.TIER_SLEEPING
    ):
        which = "--idle-grace" if args.idle_grace is not None else "--max-sleeping"
        raise ConfigError(f"{which} applies with --compare-tiers: add it, or drop {which}")
    if not args.trace or len(args.trace) > 1:
        raise ConfigError("--trace: give exactly one (several only with --pool)")
    flags.unitscale_only(args, args.policy)
    if args.compare_tiers and args.standby_max_sleeping:
        raise ConfigError("--compare-tiers sets each row's sleepers: drop --standby-max-sleeping")
    config, names = fleet_and_policies(args)
    trace = scale(
        load_trace(args.trace[0], args.seed), args.rate_multiplier, args.time_compression, args.seed
    )
    options = _options(args)
    standby = _standby(args) if args.compare_tiers else None
    # Every input read: now the report's directory, before the run, never after it.
    report_directory(args.report, outputs=REPORT_FILES, inputs=given_inputs(args))
    with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("replay", total=trace.duration)

        def progress(name: str, now: float) -> None:
            bar.update(task, completed=now, description=name)

        if standby is not None:
            grace = {} if args.idle_grace is None else {"idleGrace": f"{args.idle_grace:g}s"}
            results = compare_tiers(trace, config, options, standby, progress, grace)
        else:
            results = run_policies(trace, names, config, options, progress)
    if args.compare_tiers:
        notes = tuple(tier_notes(config))
        write_report(results, config, options, args.report, TIER_COLUMNS, notes)
    else:
        write_report(results, config, options, args.report)
    print((args.report / "report.md").read_text())
    return 0


def fleet_and_policies(args: argparse.Namespace) -> tuple[SimConfig, list[str]]:
    """The simulated fleet and the policies to replay, from checked flags."""
    from replay.run import POLICIES

    names = list(POLICIES) if args.policy == "all" else [args.policy]
    config = flags.fleet_of(args)
    if any(n not in POLICIES for n in names):
        raise ConfigError(f"--policy {quote(args.policy)}: one of {', '.join(POLICIES)} or all")
    return config, names


def scaler_policy(args: argparse.Namespace) -> CorePolicy:
    """The unitscale policy section of ``--scaler-config`` (defaults without one)."""
    from scaler.config import load_config as load_scaler_config

    return load_scaler_config(args.scaler_config).policy_defaults()


def _standby(args: argparse.Namespace) -> StandbyPolicy:
    """The standby plan's knobs for ``--compare-tiers``."""
    from scaler.core.tiers import StandbyPolicy

    if args.policy != "all":
        raise ConfigError("--compare-tiers runs the unitscale policy in every row: drop --policy")
    return StandbyPolicy(max_sleeping=args.max_sleeping)


def _options(args: argparse.Namespace) -> ReplayOptions:
    """The run's settings, the unitscale policy's from ``--scaler-config``."""
    from replay.run import ReplayOptions

    return ReplayOptions(
        str(args.trace[0]),
        args.rate_multiplier,
        args.time_compression,
        args.seed,
        args.target_concurrency,
        policy=scaler_policy(args),
    )
