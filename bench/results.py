"""Shared by the benchmarks: append one result table to bench/RESULTS.md."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).parent / "RESULTS.md"


def machine() -> str:
    """CPU model, cores and memory of this machine, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{kib / 1024**2:.0f} GiB"
    except (OSError, ValueError, IndexError):
        memory = "unknown memory"
    return f"{cpu}, {os.cpu_count()} cores, {memory}, Python {platform.python_version()}"


def append(title: str, table: str, notes: str = "") -> None:
    """Append ``table`` under a heading with the machine, date and command."""
    command = "python " + shlex.join(["bench/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    block = [
        f"## {title}",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}",
        f"- command: `{command}`",
        "",
        table.rstrip(),
        "",
    ]
    if notes:
        block += [notes.rstrip(), ""]
    with RESULTS.open("a", encoding="utf-8") as out:
        if out.tell() == 0:
            out.write("# Benchmark results\n\nNewest last. Each block: machine, date, command.\n\n")
        out.write("\n".join(block) + "\n")
