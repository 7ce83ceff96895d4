"""Configuration of process attribution (who owns each GPU process)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from exporter.attribution.model import ALL_SOURCES
from gpu_audit.model_base import Section

DEFAULT_ENVIRON_KEYS: tuple[str, ...] = (
    "JOB_ID",
    "USER",
    "PROJECT_NAME",
    "SLURM_JOB_ID",
    "SLURM_JOB_USER",
    "SLURM_JOB_ACCOUNT",
)


class KubeletConfig(Section):
    enabled: bool = False
    socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    refresh_seconds: float = Field(30.0, gt=0)
    timeout_seconds: float = Field(5.0, gt=0)


class AttributionConfig(Section):
    procfs_root: Path = Field(
        Path("/proc"),
        description="The host's /proc. NVML reports host pids, so in a container mount the "
        "host's /proc here (or run with hostPID).",
    )
    sources: tuple[str, ...] = Field(
        ("jobmap", "environ", "cgroup", "owner", "kubelet"),
        description="Sources in order of precedence: the first that knows a field wins.",
    )
    jobmap_dir: Path = Field(
        Path("/run/gpu-audit/jobs"),
        description="Job-mapping directory written by the launcher and Slurm prologs.",
    )
    environ_keys: tuple[str, ...] = Field(
        DEFAULT_ENVIRON_KEYS, description="The only environment keys read from other processes."
    )
    environ_value_max_length: int = Field(128, ge=1, le=4096)
    kubelet: KubeletConfig = KubeletConfig()

    @field_validator("sources")
    @classmethod
    def _known_sources(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [s for s in v if s not in ALL_SOURCES]
        if unknown:
            raise ValueError(f"unknown source(s) {unknown}; known: {list(ALL_SOURCES)}")
        if len(set(v)) != len(v):
            raise ValueError("a source is listed twice")
        return v
