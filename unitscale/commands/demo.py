"""``unitscale demo``: the local end-to-end demo (gateway, replicas, exporter, scaler, KEDA)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from unitscale import flags
from unitscale.commands.common import cold_start_argument, run_async

if TYPE_CHECKING:
    from unitscale.flags import Commands


def add_command(commands: Commands) -> None:
    """Register ``unitscale demo`` and its flags."""
    demo = commands.add_parser(
        "demo",
        help="local end-to-end demo: gateway, replicas, exporter, scaler, KEDA, a trace",
    )
    demo.add_argument(
        "--duration",
        type=flags.DEMO_SECONDS,
        default=180.0,
        help="wall seconds of trace (default 180)",
    )
    demo.add_argument(
        "--time-compression",
        type=flags.DEMO_COMPRESSION,
        help="trace seconds per wall second, for every clock (default 10; 1 with --real-vllm)",
    )
    demo.add_argument(
        "--trace",
        type=flags.path,
        help="Azure LLM CSV or Mooncake JSONL (default: built-in workload)",
    )
    demo.add_argument(
        "--rate-multiplier", type=flags.RATE_MULTIPLIER, default=1.0, help="for --trace"
    )
    demo.add_argument(
        "--real-vllm", action="store_true", help="real vLLM for CPUs replicas (tiny model)"
    )
    demo.add_argument("--seed", type=flags.SEED, default=0)
    demo.add_argument("--profile", default="qwen2.5-32b-h200", help="simulated replica model")
    demo.add_argument(
        "--max-replicas",
        type=flags.DEMO_REPLICAS,
        help="default the ScaledObject's, at most 8 simulated or 2 with --real-vllm",
    )
    demo.add_argument(
        "--target-concurrency",
        type=flags.CONCURRENCY,
        help="the trigger's targetConcurrency (default the ScaledObject's, else 16)",
    )
    cold_start_argument(demo)
    demo.add_argument(
        "--no-standby",
        dest="standby",
        action="store_false",
        default=None,
        help="no sleeping replicas: every return from zero waits out a cold start"
        " (by default the ScaledObject's standby, else on; off with --real-vllm)",
    )
    demo.add_argument(
        "--scaled-object",
        type=flags.path,
        help="ScaledObject YAML (default deploy/scaledobjects/recommended.yaml)",
    )
    demo.add_argument("--scaler-config", type=flags.path, help="the scaler's ConfigMap YAML to try")
    demo.add_argument("--plain", action="store_true", help="log lines instead of the live panel")
    demo.add_argument(
        "--report",
        type=flags.path,
        default=Path("demo-report"),
        help="output directory (default %(default)s)",
    )
    demo.set_defaults(run=run, default_log_level="warning")


def run(args: argparse.Namespace) -> int:
    """Play the demo; its status is the report's (``unitscale.demo.run_demo``)."""
    import os

    # Children are exec'd at once: gRPC's fork handlers would only log that they skip.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from unitscale.demo import DemoOptions, run_demo

    options = DemoOptions(
        report=args.report,
        duration=args.duration,
        time_compression=args.time_compression,
        trace=args.trace,
        rate_multiplier=args.rate_multiplier,
        real_vllm=args.real_vllm,
        seed=args.seed,
        profile=args.profile,
        max_replicas=args.max_replicas,
        target_concurrency=args.target_concurrency,
        cold_start=args.cold_start,
        standby=args.standby,
        live_view=False if args.plain else None,
        command="unitscale " + " ".join(sys.argv[1:]),
        **({"scaled_object": args.scaled_object} if args.scaled_object else {}),
        scaler_config=args.scaler_config,
    )
    return run_async(run_demo(options))
