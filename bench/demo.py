"""The README's demo, measured: how close the live run comes to the replay's prediction.

Runs ``unitscale demo`` (defaults unless flags are passed through) as a user would,
then records the report's live-vs-predicted table. The live run is real processes on
this machine's cores; the prediction is the replay simulator on the same trace and
settings. The gap is what the replay misses of the real system (and of this machine).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append

ROWS = (
    ("accelerator-hours", "gpu_hours", "{:.3f}"),
    ("cost per 1M tokens (US$)", "cost_per_million_tokens", "{:.3f}"),
    ("SLO attainment", "slo_attainment", "{:.1%}"),
    ("TTFT p50 (s)", "ttft_p50_seconds", "{:.2f}"),
    ("TTFT p95 (s)", "ttft_p95_seconds", "{:.2f}"),
    ("end-to-end p95 (s)", "e2e_p95_seconds", "{:.2f}"),
    ("most replicas awake", "max_awake_replicas", "{:d}"),
    ("replica starts", "cold_starts", "{:d}"),
    ("sleeping replica-hours", "sleeping_hours", "{:.3f}"),
    ("wakes", "wakes", "{:d}"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-record", dest="record", action="store_false")
    args, demo_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "unitscale.cli", "demo", "--plain", "--report", str(report),
             *demo_args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        wall = time.monotonic() - started
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            return done.returncode
        results = json.loads((report / "results.json").read_text())
    live, predicted = results["live"], results["predicted"]
    lines = ["| metric | live | predicted | gap |", "|---|---:|---:|---:|"]
    for label, key, spec in ROWS:
        a, b = live[key], predicted[key]
        if key == "slo_attainment":
            gap = f"{(a - b) * 100:+.1f} pp"
        else:
            gap = f"{(a - b) / b:+.0%}" if b else "n/a"
        lines.append(f"| {label} | {spec.format(a)} | {spec.format(b)} | {gap} |")
    table = "\n".join(lines)
    notes = (
        f"{live['requests']} requests; the demo took {wall:.0f} s of wall time in all (start-up,"
        f" {results['compression']:g}x compressed trace, drain, prediction, report). Live TTFT"
        f" from the {live['ttft_sample']} streamed requests (every 8th)."
    )
    print(table)
    print(notes)
    if args.record:
        append("Demo: live run vs replay prediction (bench/demo.py)", table, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
