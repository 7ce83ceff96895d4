"""One sampling cycle's complete result: what every consumer reads.

The sampler loop builds a `Snapshot` (backend samples + attribution) once per cycle;
the Prometheus renderer, the audit record builder and `/status` read it. Nothing here
does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_audit.model.attribution import UNKNOWN, AttributedProcess
from gpu_audit.model.samples import BackendInfo, GpuSample


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The latest view of every GPU on this host."""

    timestamp: float  # unix seconds when the cycle started (scenario time under the sim)
    host: str
    backend: BackendInfo
    gpus: tuple[GpuSample, ...]
    # gpu uuid -> processes on it with their owners (same order as GpuSample.processes)
    processes: Mapping[str, tuple[AttributedProcess, ...]] = field(default_factory=dict)
    interval_seconds: float = 0.0  # nominal sampling interval
    elapsed_seconds: float = 0.0  # time since the previous snapshot (0 for the first)
    sample_duration_seconds: float = 0.0  # wall time the cycle took
    cycle: int = 0
    slow_cycle: bool = False
    error_counts: Mapping[str, int] = field(default_factory=dict)  # cumulative, by kind
    # gpu uuid -> the (user, project, job, slurm_job) owners a GPU that is down had when
    # it was last read (kept by the exporter's GPU inventory, across restarts); a GPU that
    # is up has its owners in `processes`
    last_owners: Mapping[str, tuple[tuple[str, str, str, str], ...]] = field(
        default_factory=dict)

    def processes_of(self, gpu: GpuSample) -> tuple[AttributedProcess, ...]:
        """The GPU's processes with their owners (unknown owner when attribution is absent)."""
        attributed = self.processes.get(gpu.info.uuid)
        if attributed is not None:
            return attributed
        return tuple(AttributedProcess(gpu.info.uuid, p, UNKNOWN) for p in gpu.processes)
