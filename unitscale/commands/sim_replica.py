"""``unitscale sim-replica``: a vLLM-compatible simulated replica."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from foundation.errors import ConfigError, quote
from serving.replica_answers import MAX_MODEL_ID_CHARS
from unitscale import flags
from unitscale.commands.common import listen_argument, profile, serve_until_signal

if TYPE_CHECKING:
    from serving.server import SimReplicaServer
    from unitscale.flags import Commands


def add_command(commands: Commands) -> None:
    """Register ``unitscale sim-replica`` and its flags."""
    sim = commands.add_parser("sim-replica", help="a vLLM-compatible simulated replica")
    listen_argument(sim, "--listen", "127.0.0.1:8000", "HTTP")
    sim.add_argument("--profile", default="llama3-8b-h200")
    sim.add_argument("--model", type=served_model, default="sim-llama", help="served model name")
    sim.add_argument(
        "--speedup",
        type=flags.SPEEDUP,
        default=1.0,
        help="run engine steps this much faster",
    )
    sim.add_argument(
        "--max-num-batched-tokens",
        type=flags.BATCHED_TOKENS,
        help="chunked-prefill budget per step, as vLLM's flag (default: the profile's)",
    )
    sim.set_defaults(run=run, default_log_level="info")


def served_model(text: str) -> str:
    """An argparse ``type=``: the name the replica lists, as a gateway can take it.

    Not blank and at most ``MAX_MODEL_ID_CHARS``: ``--model ''`` started a replica whose
    every ``/v1/models`` answer a gateway refused, so it was never routed to.
    """
    if not text.strip() or len(text) > MAX_MODEL_ID_CHARS:
        raise argparse.ArgumentTypeError(
            f"{quote(text, 40)} is not a model name of 1-{MAX_MODEL_ID_CHARS} characters, not blank"
        )
    return text


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; a budget below the profile's batch is status 2."""
    from serving.server import SimReplicaServer

    model = profile(args.profile)
    if args.max_num_batched_tokens is not None:
        if args.max_num_batched_tokens < model.max_num_seqs:
            raise ConfigError(
                f"--max-num-batched-tokens {args.max_num_batched_tokens}: at least"
                f" max_num_seqs ({model.max_num_seqs}), as vLLM requires"
            )
        model = dataclasses.replace(model, max_num_batched_tokens=args.max_num_batched_tokens)

    async def build() -> SimReplicaServer:
        return SimReplicaServer(model, args.listen, args.model, args.speedup)

    return serve_until_signal(build)
