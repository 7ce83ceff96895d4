"""Configuration of process attribution (who owns each GPU process)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from gpu_audit.config_section import Section
from gpu_audit.model.attribution import ALL_SOURCES, IDENTITY_FIELDS

DEFAULT_ENVIRON_KEYS: tuple[str, ...] = (
    "JOB_ID",
    "USER",
    "PROJECT_NAME",
    "SLURM_JOB_ID",
    "SLURM_JOB_USER",
    "SLURM_JOB_ACCOUNT",
    "SLURM_JOB_PARTITION",
)


class KubeletConfig(Section):
    enabled: bool = Field(
        default=False,
        description="Ask the kubelet's pod-resources API which pod holds each GPU (the "
        "`kubelet` source answers only when this is on).",
    )
    socket: Path = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="The kubelet's pod-resources socket (mount it into the exporter's pod).",
    )
    refresh_seconds: float = Field(
        default=30.0, gt=0,
        description="How often the pod list is fetched; older than three periods it is "
        "not used.",
    )
    timeout_seconds: float = Field(
        default=5.0, gt=0, description="Deadline of one pod-resources call."
    )
    resource_prefixes: tuple[str, ...] = Field(
        default=("nvidia.com/gpu", "nvidia.com/mig-"),
        description="Extended-resource names (prefixes) whose device ids are GPU UUIDs.",
    )


class AttributionConfig(Section):
    procfs_root: Path = Field(
        default=Path("/proc"),
        description="The host's /proc. NVML reports host pids, so in a container mount the "
        "host's /proc here (or run with hostPID).",
    )
    sources: tuple[str, ...] = Field(
        default=("jobmap", "environ", "cgroup", "owner", "kubelet"),
        description="Sources in order of precedence: the first that knows a field wins.",
    )
    jobmap_dir: Path = Field(
        default=Path("/run/gpu-audit/jobs"),
        description="Job-mapping directory written by the launcher and Slurm prologs.",
    )
    environ_keys: tuple[str, ...] = Field(
        default=DEFAULT_ENVIRON_KEYS,
        description="The only environment keys read from other processes.",
    )
    environ_value_max_length: int = Field(
        default=128, ge=1, le=4096,
        description="Identity values (from environ, job-mapping files and pod metadata) "
        "are cut to this many characters.",
    )
    environ_fields: dict[str, str] = Field(
        default_factory=dict,
        description="Extra meanings for allow-listed keys: environment key -> identity "
        "field (e.g. {TEAM: project}). Overrides the built-in meaning of a key.",
    )
    environ_max_bytes: int = Field(
        default=256 * 1024,
        ge=4096,
        description="Read at most this much of a process's environ; the rest is ignored.",
    )
    jobmap_max_file_bytes: int = Field(
        default=64 * 1024, ge=256, description="Job-mapping files larger than this are skipped."
    )
    software: bool = Field(
        default=True,
        description="Read each new GPU process's /proc/<pid>/maps once and record the CUDA "
        "and framework libraries it has loaded (and their versions), and the container "
        "image its environment names (APPTAINER_NAME, SINGULARITY_NAME, CONTAINER_IMAGE; "
        "needs the environ source), in its process_start audit event.",
    )
    maps_max_bytes: int = Field(
        default=4 * 1024 * 1024, ge=4096, le=64 * 1024 * 1024,
        description="Read at most this much of a process's maps file (a process with "
        "very many mappings has a huge one); libraries listed past it are not seen.",
    )
    passwd_file: Path | None = Field(
        default=None,
        description="Map uids to names from this passwd-format file instead of the "
        "system's user database (for simulated runs and fake /proc trees).",
    )
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

    @model_validator(mode="after")
    def _environ_fields_allowed(self) -> AttributionConfig:
        problems = []
        for key, name in self.environ_fields.items():
            if key not in self.environ_keys:
                problems.append(f"environ_fields key {key!r} is not in environ_keys")
            if name not in IDENTITY_FIELDS:
                problems.append(
                    f"environ_fields[{key!r}] = {name!r} is not an identity field "
                    f"({', '.join(IDENTITY_FIELDS)})"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self
