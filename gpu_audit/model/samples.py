"""The sample data model: what a backend measures in one cycle, in base units.

Everything above the backends (rendering, attribution, audit records) consumes these
immutable values and nothing else. A value is present only when the device supports the
field and the read succeeded: an absent key means "not measured", never 0 or NaN.

ProcessSample is the one class here that is not frozen (see its docstring); treat it as
immutable all the same.

This module must never import a vendor library or touch the filesystem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# One labelled value: label values in the order the catalogue declares for the metric,
# () for a metric that has no labels beyond the GPU identity.
LabelValues = tuple[str, ...]
FieldValues = Mapping[LabelValues, float]

ProcessType = Literal["compute", "graphics", "mps"]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Slow-changing identity of one physical GPU (or MIG parent)."""

    uuid: str
    index: int
    name: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    vbios_version: str = ""
    minor_number: int | None = None
    mig_mode: bool = False


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance with its memory, as NVML reports it on the parent GPU.

    `values` holds the catalogue fields measured per instance rather than per GPU: the
    DCGM profiling fields (`prof_*`), which DCGM reports per GPU instance on a GPU in
    MIG mode (the parent then has none). Absent key: not measured.
    """

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    values: Mapping[str, float] = field(default_factory=dict)
    # the site's weight for this instance (exporter.mig_weights), over the table
    # of gpu_audit.model.mig; None: the table's
    weight: float | None = None


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """What the host knows about a process, for attribution (from NVML and /proc).

    NVML reports host pids; the simulator fills `environ`/`cgroup` so tests can build a
    fake /proc from them. Real backends leave them empty: attribution reads /proc.
    """

    pid: int
    uid: int | None = None
    start_time_ticks: int | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    cgroup: str = ""
    # Simulator only: library short name -> version ("" for none) for its fake maps file.
    software: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ProcessSample:
    """One process on one GPU, as measured this cycle.

    Utilisation ratios come from NVML's process-utilisation samples taken since the
    previous cycle; they are None when the driver had no sample for the process.

    Read-only by convention, not frozen: a backend builds one per process per cycle
    (512 at 8 GPUs x 64 processes) and a frozen dataclass sets each of its 12 fields
    through object.__setattr__, ~6x the cost of a plain slotted one. Nothing
    hashes it or keeps it as a key; nothing may assign to it after the backend built it.
    """

    pid: int
    name: str = ""
    uid: int | None = None
    type: ProcessType = "compute"
    used_memory_bytes: int | None = None
    sm_util_ratio: float | None = None
    memory_util_ratio: float | None = None
    encoder_util_ratio: float | None = None
    decoder_util_ratio: float | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    identity: ProcessIdentity | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID error seen through NVML's event API (or DCGM / the simulator)."""

    uuid: str
    xid: int
    timestamp: float  # unix seconds


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one moment.

    `values` maps catalogue keys (see gpu_audit.model.fields) to labelled values in base
    units. `unsupported` names catalogue keys the device said it does not support; they
    are never put in `values`. When `up` is False the GPU could not be read this cycle:
    `error` holds the error kind (e.g. "gpu_lost", "timeout") and `values` is empty.
    """

    info: GpuInfo
    up: bool = True
    error: str | None = None
    values: Mapping[str, FieldValues] = field(default_factory=dict)
    unsupported: frozenset[str] = frozenset()
    processes: tuple[ProcessSample, ...] = ()
    mig: tuple[MigInstance, ...] = ()
    xid_totals: Mapping[int, int] = field(default_factory=dict)
    xid_last_timestamp: float | None = None
    new_xids: tuple[XidEvent, ...] = ()

    @property
    def uuid(self) -> str:
        return self.info.uuid

    def scalar(self, key: str) -> float | None:
        """The unlabelled value of `key`, or None when it was not measured."""
        series = self.values.get(key)
        if series is None:
            return None
        return series.get(())


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What a backend says about itself once it is open."""

    name: str
    driver_version: str = ""
    cuda_version: str = ""
    library_version: str = ""
    simulated: bool = False
    detail: str = ""
