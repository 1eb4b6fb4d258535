"""`unitscale tune` over one day of production traffic: wall and CPU time to a proposal.

Goal (issue 26): budget 50 on one ServeGen day (day 1 at scale 0.01, about 0.8M
requests) in at most 15 minutes on 2 cores. The command is run as a user runs it; its
CPU time is its workers' too. Takes about a quarter of an hour.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DAY = f"servegen:{TRACES / 'servegen-m-small'}?scale=0.01&days=1-1"
GOAL_MINUTES = 15.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default=DAY, help="the traffic (default ServeGen M day 1)")
    parser.add_argument("--policy", default="unitscale")
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-record", dest="record", action="store_false")
    args = parser.parse_args()
    unitscale = Path(sys.executable).with_name("unitscale")
    with tempfile.TemporaryDirectory() as out:
        command = [
            str(unitscale),
            "tune",
            "--trace",
            args.trace,
            "--policy",
            args.policy,
            "--budget",
            str(args.budget),
            "--workers",
            str(args.workers),
            "--out",
            out,
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode not in (0, 1):  # 1: no trial met the target, still a search
            sys.stderr.write(done.stderr)
            return done.returncode
        with open(Path(out) / "trials.csv", newline="") as trials_file:
            trials = list(csv.DictReader(trials_file))
        proposal = next(
            line
            for line in (Path(out) / "report.md").read_text().splitlines()
            if line.startswith("**Proposal")
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    met = sum(row["feasible"] == "True" for row in trials)
    stopped = sum(bool(row["stopped_early"]) for row in trials)
    table = "\n".join(
        [
            "| traffic | policy | budget | workers | trials met | stopped early | wall time"
            " | CPU time | CPU per trial |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
            f"| `{args.trace.replace(str(TRACES), '../shared/traces')}` | {args.policy}"
            f" | {args.budget} | {args.workers} | {met} | {stopped} | {wall / 60:.1f} min"
            f" | {cpu:,.0f} s | {cpu / max(len(trials), 1):.1f} s |",
        ]
    )
    verdict = "met" if wall <= GOAL_MINUTES * 60 else "MISSED"
    notes = (
        f"Goal: budget 50 on one day in at most {GOAL_MINUTES:g} min on 2 cores: {verdict}"
        f" ({wall / 60:.1f} min). {proposal.replace('*', '').split(';')[0]}."
    )
    print(table)
    print(notes)
    if args.record:
        append("unitscale tune on a day of traffic (bench/tune_speed.py)", table, notes)
    print(
        json.dumps(
            {
                "wall_seconds": round(wall, 1),
                "cpu_seconds": round(cpu, 1),
                "trials": len(trials),
                "met": met,
                "goal_met": wall <= GOAL_MINUTES * 60,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
