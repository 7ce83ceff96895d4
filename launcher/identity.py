"""The environment every job starts with: who it is (for attribution) and the preemption
protocol it follows (for the checkpoint helper). Built by the engine, applied by the
executor on top of the user's own `env` (the launcher's names win: a job cannot claim
another job's identity through its spec)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from launcher import constants as c
from launcher.gpustate import GpuInfo
from launcher.spec import JobSpec


def job_environment(*, job_id: int, attempt: int, user: str, spec: JobSpec,
                    gpus: Sequence[GpuInfo], grace_seconds: float,
                    memory_limit_bytes: int | None = None, mps: bool = False,
                    base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment: `base` (the daemon's clean environment), the spec's `env`,
    then the identity and protocol variables."""
    env = dict(base or {})
    env.update(spec.env)
    # CUDA enumerates by PCI bus id under this order, so the indexes we hand out match
    # NVML's; UUIDs are given too, and CUDA accepts them in CUDA_VISIBLE_DEVICES.
    ordered = sorted(gpus, key=lambda g: (g.pci_bus_id, g.index))
    env.update({
        c.ENV_JOB_ID: str(job_id),
        c.ENV_USER: user,
        c.ENV_PROJECT: spec.project,
        c.ENV_JOB_NAME: spec.name,
        c.ENV_RUN_ATTEMPT: str(attempt),
        c.ENV_GPU_UUIDS: ",".join(g.uuid for g in ordered),
        c.ENV_CUDA_DEVICE_ORDER: "PCI_BUS_ID",
        c.ENV_CUDA_VISIBLE_DEVICES: ",".join(g.uuid for g in ordered),
        c.ENV_PREEMPT_SIGNAL: spec.preempt_signal,
        c.ENV_PREEMPT_GRACE_SECONDS: f"{grace_seconds:g}",
    })
    if spec.department:
        env[c.ENV_DEPARTMENT] = spec.department
    if spec.checkpoint_dir:
        env[c.ENV_CHECKPOINT_DIR] = spec.checkpoint_dir
    if memory_limit_bytes is not None:
        env[c.ENV_GPU_MEMORY_LIMIT] = str(memory_limit_bytes)
    if mps and spec.gpu_fraction is not None and memory_limit_bytes is not None:
        env[c.ENV_MPS_THREAD_PERCENTAGE] = str(max(1, round(spec.gpu_fraction * 100)))
        # per visible device (index within CUDA_VISIBLE_DEVICES), in MB
        env[c.ENV_MPS_MEMORY_LIMIT] = ",".join(
            f"{i}={max(1, memory_limit_bytes // 2**20)}M" for i in range(len(ordered)))
    if not gpus:
        env[c.ENV_CUDA_VISIBLE_DEVICES] = ""  # a CPU-only step sees no GPU
    return env
