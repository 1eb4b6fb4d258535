"""``unitscale replay --pool``: one pool shared by training and inference, every baseline."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from foundation.errors import ConfigError
from unitscale import flags
from unitscale.commands.common import MAX_TRACES, read_traces
from unitscale.outputs import given_inputs, report_directory

if TYPE_CHECKING:
    from replay.pool.cluster import Node, Task
    from replay.pool.joint import Inference, JointOptions
    from replay.simulate import SimConfig
    from replay.trace import Trace
    from scaler.core.model import Policy as CorePolicy


MAX_HEADROOMS = 8
"""Distinct ``--headroom`` values one joint replay compares."""


DEFAULTS: dict[str, object] = {
    "pool_fraction": 0.03,
    "training_load": 1.0,
    "placement": None,
    "inference_gpu_type": None,
    "headroom": None,
    "fgd_mix": "joint",
    "warm_start": False,
    "max_task_seconds": 1800.0,
}
"""The joint replay's flags (by their ``argparse`` names) and their defaults."""


def given(args: argparse.Namespace) -> list[str]:
    """The joint replay's flags ``args`` sets to other than their defaults."""
    return [
        "--" + name.replace("_", "-")
        for name, default in DEFAULTS.items()
        if getattr(args, name, default) != default
    ]


def add_arguments(replay: argparse.ArgumentParser) -> None:
    """The joint replay's flags, a group of ``unitscale replay``'s."""
    joint = replay.add_argument_group("joint replay (one pool, training and inference)")
    joint.add_argument(
        "--pool",
        type=flags.path,
        metavar="NODES_CSV",
        help="Alibaba openb node list: run the joint replay",
    )
    joint.add_argument(
        "--tasks", type=flags.path, metavar="PODS_CSV", help="openb pod list (with --pool)"
    )
    joint.add_argument(
        "--pool-fraction",
        type=flags.SHARE,
        default=DEFAULTS["pool_fraction"],
        help="share of the nodes and tasks kept, stratified by model (default %(default)s; 1: all)",
    )
    joint.add_argument(
        "--training-load",
        type=flags.TRAINING_LOAD,
        default=DEFAULTS["training_load"],
        help="offered training load as a share of the cards inference leaves on average"
        " (default %(default)s)",
    )
    joint.add_argument(
        "--placement",
        action="append",
        choices=["binpack", "spread", "fgd"],
        help="repeatable; the manager runs with each, static and kueue with the first"
        " (default binpack, spread, fgd)",
    )
    joint.add_argument(
        "--inference-gpu-type", help="node model inference replicas need (default any)"
    )
    joint.add_argument(
        "--headroom",
        type=flags.HEADROOM,
        action="append",
        metavar="FRACTION",
        help="repeatable: the manager runs with each burst headroom, a share of inference's"
        " forecast its allowance keeps free (ManagerPolicy.headroom_fraction; default 0)",
    )
    joint.add_argument(
        "--fgd-mix",
        choices=["joint", "training"],
        default=DEFAULTS["fgd_mix"],
        help="FGD's target workload: training's tasks and inference's replicas by arrivals,"
        " or training's alone (default %(default)s)",
    )
    joint.add_argument(
        "--warm-start",
        action="store_true",
        help="start each Deployment with the replicas its first interval needs, as"
        " unitscale replay does (fits the instant bound per trace first; default cold)",
    )
    joint.add_argument(
        "--max-task-seconds",
        type=flags.TASK_SECONDS,
        default=DEFAULTS["max_task_seconds"],
        help="training durations are capped at this (default %(default)s)",
    )


def run(args: argparse.Namespace, policy: CorePolicy) -> int:
    """Every baseline on one pool, one progress bar over simulated time; print the report.

    ``policy`` is the unitscale policy every deployment's scaler runs (``--scaler-config``).
    """
    from rich.progress import Progress

    from replay.pool.joint import PoolError, run_all
    from replay.pool.report import REPORT_FILES, write_report

    nodes, tasks, deployments, options = inputs(args, policy)
    # Every input read: now the report's directory, before the run, never after it.
    report_directory(args.report, outputs=REPORT_FILES, inputs=given_inputs(args))
    horizon = max(d.horizon for d in deployments)
    total = horizon * (1 + len(options.configs((0,) * len(deployments))))
    with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("joint replay", total=total)

        def progress(name: str, done: float) -> None:
            bar.update(task, completed=done, description=name)

        try:
            result = run_all(nodes, tasks, deployments, options, progress)
        except PoolError as err:  # what the files and flags ask together, found as it runs
            raise ConfigError(str(err)) from err
    profile = deployments[0].config.profile
    notes = (
        f"- inference: {', '.join(d.name for d in deployments)} under the unitscale scaler;"
        f" every replica is the {profile.name} calibration (${profile.price_per_hour:.2f}"
        " per accelerator-hour), whatever GPU model of the trace's nodes it lands on",
        f"- training: `{args.tasks.name}`, durations capped at {options.duration_cap:g} s;"
        f" nodes `{args.pool.name}` at fraction {args.pool_fraction:g}",
    )
    write_report(result, args.report, notes)
    print((args.report / "report.md").read_text())
    return 0


def inputs(
    args: argparse.Namespace, policy: CorePolicy
) -> tuple[tuple[Node, ...], tuple[Task, ...], list[Inference], JointOptions]:
    """The pool's nodes, the tasks, the inference deployments and the options.

    The numbers were checked as flags (``unitscale.flags``); what is left to check here
    is what flags say together, and the files.
    """
    from replay.pool.cluster import read_nodes, read_tasks
    from replay.pool.joint import Inference, JointOptions

    if args.pool is None or args.tasks is None:
        raise ConfigError("--pool NODES_CSV and --tasks PODS_CSV go together")
    # Each value is a manager run per placement: repeats are one run, and the count is
    # bounded (200 --headroom took 44 s on two nodes and overflowed the plot's legend).
    headrooms = tuple(dict.fromkeys(args.headroom or ()))
    if len(headrooms) > MAX_HEADROOMS:
        raise ConfigError(f"--headroom: {len(headrooms)} values; at most {MAX_HEADROOMS}")
    sources = args.trace or ["builtin:business-day"]
    if len(sources) > MAX_TRACES:  # before the pool's files are read too
        raise ConfigError(f"--trace: {len(sources)} given; at most {MAX_TRACES}")
    if args.compare_tiers or args.policy != "all":
        raise ConfigError("--pool runs the unitscale scaler in every deployment: drop --policy")
    if args.standby_max_sleeping:
        raise ConfigError("--pool models no sleeping replicas: drop --standby-max-sleeping")
    if args.idle_grace is not None or args.max_sleeping != flags.TIER_SLEEPING:
        raise ConfigError("--idle-grace and --max-sleeping are --compare-tiers': drop them")
    try:
        nodes = read_nodes(args.pool, args.pool_fraction)
        tasks = read_tasks(args.tasks, args.pool_fraction)
    except (OSError, ValueError) as err:
        raise ConfigError(str(err)) from err
    config = flags.fleet_of(args)
    # as unitscale replay: the scaler plans with the simulated model (--profile) unless
    # the scaler config names one
    profile = config.profile.name if policy.profile is None else None
    deployments: list[Inference] = []
    for source, trace in zip(sources, read_traces(sources, args), strict=True):
        name = f"{trace.name}-{len(deployments)}" if len(args.trace or ()) > 1 else trace.name
        initial = _warm_start(args, source, trace, config) if args.warm_start else 0
        deployments.append(
            Inference(
                name,
                trace,
                config,
                args.target_concurrency,
                args.max_replicas,
                policy,
                profile,
                initial_replicas=initial,
            )
        )
    options = JointOptions(
        placements=tuple(dict.fromkeys(args.placement or ("binpack", "spread", "fgd"))),
        training_load=args.training_load,
        duration_cap=args.max_task_seconds,
        inference_gpu_type=args.inference_gpu_type,
        headrooms=headrooms,
        mix=args.fgd_mix,
    )
    return nodes, tasks, deployments, options


def _warm_start(args: argparse.Namespace, source: str, trace: Trace, config: SimConfig) -> int:
    """The replicas ``unitscale replay`` starts this trace's policies with."""
    from replay.oracle import find_instant_bound
    from replay.run import ReplayOptions, warm_replicas

    _, schedule = find_instant_bound(trace, config)
    options = ReplayOptions(source, args.rate_multiplier, args.time_compression, args.seed)
    return warm_replicas(schedule, config, options)
