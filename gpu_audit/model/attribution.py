"""What attribution answers about one GPU process, and where each answer came from.

Pure data. The resolver (exporter.attribution.resolver) fills it; the renderer, the audit
record builder and the allocation view read it. `Software` (the CUDA and framework
libraries a process has mapped) rides along with the owner but is not part of it: only
the `process_start` event records it, never a usage record or a label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_audit.model.samples import ProcessSample

# Identity fields in the order they appear as labels and in audit records.
IDENTITY_FIELDS: tuple[str, ...] = (
    "user",
    "project",
    "job",
    "container_id",
    "container_runtime",
    "k8s_namespace",
    "k8s_pod",
    "k8s_container",
    "k8s_pod_uid",
    "slurm_job_id",
    "slurm_user",
    "slurm_account",
    "slurm_partition",
)

# Source names, as they appear in `sources` values, labels and records.
SOURCE_JOBMAP = "jobmap"
SOURCE_ENVIRON = "environ"
SOURCE_CGROUP = "cgroup"
SOURCE_OWNER = "owner"
SOURCE_KUBELET = "kubelet"
ALL_SOURCES: tuple[str, ...] = (
    SOURCE_JOBMAP,
    SOURCE_ENVIRON,
    SOURCE_CGROUP,
    SOURCE_OWNER,
    SOURCE_KUBELET,
)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who a process belongs to. Empty string means unknown."""

    user: str = ""
    project: str = ""
    job: str = ""
    container_id: str = ""
    container_runtime: str = ""
    k8s_namespace: str = ""
    k8s_pod: str = ""
    k8s_container: str = ""
    k8s_pod_uid: str = ""
    slurm_job_id: str = ""
    slurm_user: str = ""
    slurm_account: str = ""
    slurm_partition: str = ""
    # identity field -> source name that supplied it
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def attributed(self) -> bool:
        """True when anything beyond nothing is known (any identity field is set)."""
        # Spelled out: this runs for every process in every cycle (render, audit).
        return bool(self.user or self.project or self.job or self.container_id
                    or self.container_runtime or self.k8s_namespace or self.k8s_pod
                    or self.k8s_container or self.k8s_pod_uid or self.slurm_job_id
                    or self.slurm_user or self.slurm_account or self.slurm_partition)

    def as_dict(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in IDENTITY_FIELDS}


UNKNOWN = Attribution()


@dataclass(frozen=True, slots=True)
class Software:
    """What a process runs, read once per process lifetime (exporter.attribution.software).

    `loaded`: every recognised CUDA or framework library it has mapped (short names such
    as `cudart`, `nccl`, `torch`), sorted; `libraries`: name -> version for those whose
    file name carries one (libcudart.so.12.4.127 -> "12.4.127"); `image`: the container
    image its environment names (Apptainer/Singularity), "" when unknown. All hold only
    allow-listed names and charsets, so they are safe in records as they are.
    """

    loaded: tuple[str, ...] = ()
    libraries: Mapping[str, str] = field(default_factory=dict)
    image: str = ""

    def record_part(self) -> dict[str, object]:
        """The `software` object of a process_start record: unknown is absent."""
        part: dict[str, object] = {}
        if self.loaded:
            part["loaded"] = list(self.loaded)
        if self.libraries:
            part["libraries"] = dict(sorted(self.libraries.items()))
        if self.image:
            part["image"] = self.image
        return part


@dataclass(slots=True)
class AttributedProcess:
    """One GPU process with its owner.

    Read-only by convention, not frozen: the resolver builds one per process per cycle,
    and a frozen dataclass's __init__ costs ~3x a plain slotted one's. Nothing
    hashes it; nothing may assign to it after the resolver built it.
    """

    gpu_uuid: str
    process: ProcessSample
    attribution: Attribution
    # What it runs, when /proc/<pid>/maps could be read and named any known library.
    software: Software | None = None
