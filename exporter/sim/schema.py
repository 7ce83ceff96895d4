"""The scenario file schema: pydantic models for what a simulator scenario may say.

Only structure and per-field ranges live here; checks that need the whole file (unique
uuids, pids, memory budgets, event targets) are in exporter.sim.scenario. The schema is
documented for people in exporter/sim/README.md; keep the two in step.

This module must never read files or compute samples.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from exporter.attribution.software import SHORT_NAMES, valid_version
from gpu_audit.config_section import Section
from gpu_audit.model.fields import BY_KEY

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_quantity(value: Any) -> Any:
    """Accept a number or a byte size such as "80GiB" / "512 MB"; return a float.

    Sizes are allowed wherever a number is, so memory curves read naturally; a size in a
    ratio curve is then caught by the ratio range check with its location.
    """
    if isinstance(value, bool):
        raise ValueError("expected a number or a size such as 30GiB, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(
                f"{value!r} is not a number or a size (units: B, KB, MB, GB, TB, KiB, MiB, "
                "GiB, TiB)"
            )
        return float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    return value


Quantity = Annotated[float, BeforeValidator(parse_quantity)]
Point = tuple[float, Quantity]


def _scalar_to_constant(value: Any) -> Any:
    # A bare number or size is the common case: `memory: 30GiB`, `sm: 0.9`.
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return {"value": value}
    return value


class CurveSpec(Section):
    """A value over time. Exactly one shape: value, rate (linear), steps or ramp."""

    value: Quantity | None = Field(default=None, description="Constant value.")
    start: Quantity = Field(default=0.0, description="Linear: the value at time 0.")
    rate: Quantity | None = Field(
        default=None, description="Linear: change per `per` unit of time."
    )
    per: Literal["second", "minute", "hour"] = "second"
    max: Quantity | None = Field(default=None, description="Linear: stop growing here.")
    min: Quantity | None = Field(default=None, description="Linear: stop shrinking here.")
    steps: list[Point] | None = Field(
        default=None, description="[time, value] held until the next."
    )
    ramp: list[Point] | None = Field(
        default=None, description="[time, value] joined by straight lines."
    )
    noise: Quantity = Field(
        default=0.0, ge=0, description="Uniform +- noise, seeded, reproducible."
    )

    @model_validator(mode="after")
    def _one_shape(self) -> CurveSpec:
        shapes = [n for n in ("value", "rate", "steps", "ramp") if getattr(self, n) is not None]
        if len(shapes) != 1:
            raise ValueError(
                "a curve needs exactly one of value, rate, steps or ramp"
                + (f" (got {', '.join(shapes)})" if shapes else "")
            )
        for name in ("steps", "ramp"):
            points: list[Point] | None = getattr(self, name)
            if points is not None:
                if not points:
                    raise ValueError(f"{name} needs at least one [time, value] point")
                times = [p[0] for p in points]
                if times != sorted(times):
                    raise ValueError(f"{name} times must be in increasing order")
        return self


Curve = Annotated[CurveSpec, BeforeValidator(_scalar_to_constant)]


class UtilSpec(Section):
    """Per-process utilisation ratios (0..1); the GPU's are the sums, capped at 1."""

    sm: Curve = CurveSpec(value=0.0)
    mem: Curve = CurveSpec(value=0.0)
    enc: Curve = CurveSpec(value=0.0)
    dec: Curve = CurveSpec(value=0.0)


class ThermalSpec(Section):
    idle_celsius: float = Field(default=32.0, ge=0, le=120)
    load_celsius: float = Field(default=62.0, ge=0, le=120)
    curve: Curve | None = Field(
        default=None, description="Explicit temperature over scenario time."
    )
    memory_offset_celsius: float = Field(default=4.0, ge=-20, le=40)
    slowdown_celsius: float = Field(
        default=87.0, description="At or above: sw_thermal_slowdown and a lower SM clock."
    )
    hw_slowdown_celsius: float = Field(
        default=90.0, description="At or above: hw_thermal_slowdown as well, clock lower still."
    )


class ClockSpec(Section):
    sm_max_mhz: float = Field(default=1980.0, gt=0)
    sm_idle_mhz: float = Field(default=345.0, gt=0)
    memory_mhz: float = Field(default=2619.0, gt=0)
    sw_thermal_clock_ratio: float = Field(default=0.75, gt=0, le=1)
    hw_thermal_clock_ratio: float = Field(default=0.5, gt=0, le=1)


class EccSpec(Section):
    corrected_per_hour: float = Field(default=0.0, ge=0)
    uncorrected_per_hour: float = Field(default=0.0, ge=0)
    aggregate_corrected: int = Field(
        default=0, ge=0, description="Lifetime count before the scenario."
    )
    aggregate_uncorrected: int = Field(default=0, ge=0)


class RetiredPagesSpec(Section):
    single_bit_ecc: int = Field(default=0, ge=0)
    double_bit_ecc: int = Field(default=0, ge=0)
    pending: bool = False


class RemappedRowsSpec(Section):
    correctable: int = Field(default=0, ge=0)
    uncorrectable: int = Field(default=0, ge=0)
    pending: bool = False
    failure: bool = False


class NvlinkErrorsSpec(Section):
    replay_per_hour: float = Field(default=0.0, ge=0)
    recovery_per_hour: float = Field(default=0.0, ge=0)
    crc_flit_per_hour: float = Field(default=0.0, ge=0)
    crc_data_per_hour: float = Field(default=0.0, ge=0)


class NvlinkSpec(Section):
    links: int = Field(default=18, ge=1, le=18)
    down_links: list[int] = Field(default_factory=list)
    bytes_per_second: Quantity = Field(
        default=20e9, ge=0, description="Per link and direction at full SM utilisation."
    )
    errors: NvlinkErrorsSpec = NvlinkErrorsSpec()


# Valid MIG GPU-instance profiles of the A100/H100 families (nvidia-smi mig -lgip).
MIG_PROFILES: frozenset[str] = frozenset({
    "1g.5gb", "1g.5gb+me", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
    "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
})


class MigSpec(Section):
    profile: str
    gpu_instance_id: int = Field(ge=0, le=14)
    compute_instance_id: int = Field(default=0, ge=0, le=7)
    uuid: str | None = None
    memory_total: Quantity | None = Field(
        default=None, gt=0, description="Default: from the profile."
    )

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        if v not in MIG_PROFILES:
            raise ValueError(f"unknown MIG profile {v!r}; valid: {', '.join(sorted(MIG_PROFILES))}")
        return v

    @property
    def slices(self) -> int:
        return int(self.profile.split("g.", 1)[0])


class GpuSpec(Section):
    """One GPU, or `count` identical GPUs."""

    count: int = Field(default=1, ge=1, le=64)
    model: str = "NVIDIA H100 80GB HBM3"
    memory_total: Quantity = Field(default=80 * 1024**3, gt=0)
    memory_reserved: Quantity = Field(default=512 * 1024**2, ge=0)
    uuids: list[str] | None = Field(
        default=None, description="One per GPU; default derived from seed."
    )
    serials: list[str] | None = None
    pci_bus_ids: list[str] | None = None
    vbios_version: str = "96.00.89.00.01"
    power_limit_watts: float = Field(default=700.0, gt=0)
    idle_power_watts: float = Field(default=70.0, ge=0)
    max_power_watts: float | None = Field(
        default=None, gt=0, description="Draw at full load; default 95% of the limit."
    )
    thermal: ThermalSpec = ThermalSpec()
    clocks: ClockSpec = ClockSpec()
    fan: bool = Field(default=False, description="Has a fan NVML can read (SXM boards do not).")
    ecc: EccSpec | None = EccSpec()
    retired_pages: RetiredPagesSpec | None = None
    remapped_rows: RemappedRowsSpec | None = RemappedRowsSpec()
    pcie_replay_per_hour: float = Field(default=0.0, ge=0)
    nvlink: NvlinkSpec | None = None
    mig: list[MigSpec] | None = None
    unsupported: list[str] = Field(
        default_factory=list, description="Further catalogue keys this device lacks."
    )

    @field_validator("unsupported")
    @classmethod
    def _catalogue_keys(cls, v: list[str]) -> list[str]:
        unknown = [k for k in v if k not in BY_KEY]
        if unknown:
            raise ValueError(f"not catalogue keys: {unknown}")
        return v


class PodSpec(Section):
    """The Kubernetes container a process runs in. The simulator's kubelet lists it as
    holding the process's GPU (or MIG instance) through the pod-resources API."""

    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    container: str = Field(min_length=1)


class ProcessSpec(Section):
    """A process, or one per listed GPU (times `per_gpu`), with consecutive pids."""

    name: str = Field(min_length=1)
    pid: int = Field(ge=1, le=4_194_304)
    gpu: int | list[int] | Literal["all"]
    per_gpu: int = Field(default=1, ge=1, le=1024)
    uid: int | None = Field(default=1000, ge=0)
    type: Literal["compute", "graphics", "mps"] = "compute"
    start: float = Field(default=0.0, description="Scenario seconds; negative: started before.")
    end: float | None = None
    memory: Curve
    util: UtilSpec = UtilSpec()
    mig: int | None = Field(
        default=None, description="gpu_instance_id of the MIG instance it runs in."
    )
    environ: dict[str, str] = Field(default_factory=dict)
    cgroup: str = Field(default="", description="/proc/<pid>/cgroup text; placeholders allowed.")
    start_time_ticks: int | None = Field(default=None, ge=0)
    pod: PodSpec | None = Field(
        default=None, description="Kubernetes pod/container the simulated kubelet reports."
    )
    software: dict[str, str | None] = Field(
        default_factory=dict,
        description="Libraries it has loaded: short name (cudart, cublas, cudnn, nccl, "
        "torch, ...) -> the version its file name carries, or null for none. Written into "
        "its fake /proc/<pid>/maps, so the exporter reads them as on a real host.",
    )

    @field_validator("software")
    @classmethod
    def _known_libraries(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        problems = []
        known = ", ".join(sorted(SHORT_NAMES))
        for name, version in v.items():
            if name not in SHORT_NAMES:
                problems.append(f"{name!r} is not a known library ({known})")
            if version is not None and not valid_version(version):
                problems.append(f"{name}: version {version!r} is not 1-4 dot-separated numbers")
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @model_validator(mode="after")
    def _ends_after_start(self) -> ProcessSpec:
        if self.end is not None and self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class EventSpec(Section):
    at: float = Field(ge=0, description="Scenario seconds.")
    gpu: int = Field(ge=0)
    kind: Literal["xid", "lost"]
    xid: int | None = Field(default=None, ge=1, le=1000)
    until: float | None = Field(default=None, description="lost: recovery time; default never.")

    @model_validator(mode="after")
    def _fields_for_kind(self) -> EventSpec:
        if self.kind == "xid" and self.xid is None:
            raise ValueError("an xid event needs `xid: CODE`")
        if self.kind == "lost" and self.xid is not None:
            raise ValueError("a lost event takes no xid (add a separate xid event)")
        if self.kind == "xid" and self.until is not None:
            raise ValueError("`until` applies to lost events only")
        if self.until is not None and self.until <= self.at:
            raise ValueError("until must be after at")
        return self


class HostSpec(Section):
    """Ties a scenario to this host (exporter/sim/hostprocs.py): real processes that hold
    a simulated GPU's device file open are that GPU's processes (attributed from the
    host's own /proc), and a file of live events injects faults while it runs."""

    devices: list[str] = Field(
        min_length=1,
        description="One path per GPU, in GPU order: a process with it open runs on it.",
    )
    memory: Quantity = Field(
        default=1024**3, ge=0,
        description="GPU memory each such process uses (GPU_AUDIT_SIM_MEMORY in its "
        "environment overrides it).",
    )
    util: float = Field(
        default=0.5, ge=0, le=1,
        description="Its SM utilisation (GPU_AUDIT_SIM_UTIL in its environment overrides it).",
    )
    memory_util: float = Field(default=0.2, ge=0, le=1, description="Its memory utilisation.")
    events_file: str | None = Field(
        default=None,
        description="JSON lines appended while the exporter runs, each applied when read: "
        '{"gpu": 0, "kind": "xid", "xid": 79}, {"gpu": 0, "kind": "lost"}, '
        '{"gpu": 0, "kind": "recovered"}.',
    )


class DcgmSpec(Section):
    """DCGM profiling data a scenario declares: each field as a fraction of the GPU's
    SM utilisation (engine and pipe activity) or of its memory utilisation (DRAM, PCIe)."""

    gr_engine_active: float = Field(default=0.98, ge=0, le=1)
    sm_active: float = Field(default=0.9, ge=0, le=1)
    sm_occupancy: float = Field(default=0.45, ge=0, le=1)
    pipe_tensor_active: float = Field(default=0.55, ge=0, le=1)
    pipe_fp64_active: float = Field(default=0.01, ge=0, le=1)
    pipe_fp32_active: float = Field(default=0.25, ge=0, le=1)
    pipe_fp16_active: float = Field(default=0.15, ge=0, le=1)
    dram_active: float = Field(default=0.9, ge=0, le=1, description="x memory utilisation")
    pcie_tx_bytes_per_second: float = Field(
        default=2.5e9, ge=0, description="PCIe transmit rate at full memory utilisation.")
    pcie_rx_bytes_per_second: float = Field(
        default=6.0e9, ge=0, description="PCIe receive rate at full memory utilisation.")


def _dcgm_flag(v: Any) -> Any:
    # `dcgm: true` keeps the typical ratios of a mixed-precision training step.
    if v is True:
        return {}
    if v is False:
        return None
    return v


class ScenarioSpec(Section):
    name: str = Field(min_length=1)
    description: str = ""
    seed: int = 0
    dcgm: Annotated[DcgmSpec | None, BeforeValidator(_dcgm_flag)] = Field(
        default=None,
        description="Also simulate the DCGM profiling fields: true for typical ratios, or "
        "a mapping of ratios (see DcgmSpec).",
    )
    duration_seconds: float = Field(default=3600.0, gt=0, description="Span the story plays over.")
    boot_seconds: float = Field(
        default=86400.0, ge=0, description="Driver loaded this long before scenario time 0."
    )
    driver_version: str = "550.54.15"
    cuda_version: str = "12.4"
    gpus: list[GpuSpec] = Field(min_length=1)
    processes: list[ProcessSpec] = Field(default_factory=list)
    events: list[EventSpec] = Field(default_factory=list)
    host: HostSpec | None = Field(
        default=None,
        description="Real processes of this host on the simulated GPUs, and live events "
        "(see HostSpec).",
    )
