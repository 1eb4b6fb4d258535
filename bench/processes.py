"""Shared by the benchmarks: free loopback ports and ``unitscale`` subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_unitscale(*args: str) -> subprocess.Popen[bytes]:
    """``unitscale ARGS`` as its own process (warnings only), from this checkout."""
    return subprocess.Popen(
        [sys.executable, "-m", "unitscale.cli", "--log-level", "warning", *args],
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
