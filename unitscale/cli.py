"""``unitscale``: one command, a subcommand per role (``unitscale.commands``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from foundation.errors import UnitscaleError
from unitscale import __version__, tune
from unitscale.commands import (
    admission,
    demo,
    exporter,
    gateway,
    replay,
    scaler,
    sim_replica,
)
from unitscale.flags import Parser, fail

log = logging.getLogger("unitscale")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``unitscale`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, (args.log_level or args.default_log_level).upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.run(args))
    except BrokenPipeError:
        # The reader of our output left (``| head``): as ``yes | head`` does, end quietly
        # with the status of a writer SIGPIPE stopped. Python ignores SIGPIPE, so the
        # write raised; stdout points at nothing now, or the last flush raises again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (UnitscaleError, OSError) as err:
        # The one error path for what the user gave: a flag, a config or trace file, a
        # report directory or a port. One line, status 2; the traceback at debug.
        log.debug("unitscale %s failed", args.command, exc_info=True)
        return fail(args.command, err)
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's flags; each parsed ``args.run`` is the subcommand's ``run``."""
    parser = Parser(prog="unitscale", description="Autoscaling and admission for LLM inference.")
    parser.add_argument("--version", action="version", version=f"unitscale {__version__}")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="default: info for servers, warning for the demo (its table is the output)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (scaler, exporter, gateway, sim_replica, admission, replay, tune, demo):
        command.add_command(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
