"""Shared by the benchmarks: ``unitscale`` subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spawn_unitscale(*args: str) -> subprocess.Popen[bytes]:
    """``unitscale ARGS`` as its own process (warnings only), from this checkout."""
    return subprocess.Popen(
        [sys.executable, "-m", "unitscale.cli", "--log-level", "warning", *args],
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
