"""``python -m unitscale.dashboards [--out DIR] [--check]``: write or check the dashboards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unitscale.dashboards import DIRECTORY, stale, write


def main(argv: list[str] | None = None) -> int:
    """Write the dashboards into ``--out``; with ``--check``, exit 1 if they differ."""
    parser = argparse.ArgumentParser(
        prog="python -m unitscale.dashboards", description="Generate the Grafana dashboards."
    )
    parser.add_argument("--out", type=Path, default=DIRECTORY, help=f"default: {DIRECTORY}")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the files differ"
    )
    args = parser.parse_args(argv)
    if args.check:
        try:
            differ = stale(args.out)
        except OSError as err:
            parser.exit(2, f"{parser.prog}: cannot read --out {args.out}: {err.strerror or err}\n")
        for name in differ:
            sys.stderr.write(f"{args.out / name}: not what unitscale.dashboards generates\n")
        return 1 if differ else 0
    try:
        written = write(args.out)
    except OSError as err:
        why = err.strerror or err
        parser.exit(2, f"{parser.prog}: cannot write into --out {args.out}: {why}\n")
    for path in written:
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
