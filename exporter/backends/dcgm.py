"""The DCGM backend: NVML for every device field, DCGM for the profiling fields.

`DcgmBackend` wraps an `NvmlBackend` and merges DCGM's profiling fields (catalogue keys
`prof_*`, DCGM field ids 1001..1010) onto the same GPUs, matched by UUID. DCGM's
Python bindings ship with DCGM, not on PyPI, so they are imported only in `open()`:
- NVML unavailable -> BackendUnavailable (nothing to sample at all);
- DCGM bindings or host engine unavailable -> one warning, then NVML-only with every
  `prof_*` key listed as unsupported ("absent DCGM is not an error").
Blank DCGM values (the DCGM_FT_*_BLANK sentinels) are treated as unsupported and never
exported. All DCGM calls sit behind the small `DcgmAdapter` protocol so tests can fake
it; `PyDcgmAdapter` is the one implementation that talks to real DCGM.

This module must never raise from `sample()` because DCGM hiccupped, and never let a
DCGM sentinel reach `GpuSample.values`.
"""

from __future__ import annotations

import importlib
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from exporter.backends.base import BackendUnavailable
from exporter.backends.nvml import NvmlBackend
from exporter.config import ExporterConfig
from gpu_audit.model.samples import BackendInfo, FieldValues, GpuSample

log = logging.getLogger("gpu_audit.dcgm")

# Catalogue key -> DCGM field id (dcgm_fields.DCGM_FI_PROF_*).
PROF_FIELDS: dict[str, int] = {
    "prof_gr_engine_active": 1001,
    "prof_sm_active": 1002,
    "prof_sm_occupancy": 1003,
    "prof_pipe_tensor_active": 1004,
    "prof_dram_active": 1005,
    "prof_pipe_fp64_active": 1006,
    "prof_pipe_fp32_active": 1007,
    "prof_pipe_fp16_active": 1008,
    "prof_pcie_tx_bytes": 1009,
    "prof_pcie_rx_bytes": 1010,
}
PROF_KEYS: frozenset[str] = frozenset(PROF_FIELDS)

# dcgm_fields: DCGM_FT_INT64_BLANK = 0x7ffffff0 and the values above it are "not
# supported", "not watched", "permission denied"...; DCGM_FT_FP64_BLANK = 140737488355328.0
# and above likewise. A value at or past either threshold is not a measurement.
INT64_BLANK = 0x7FFFFFF0
FP64_BLANK = 140737488355328.0

BINDING_PATHS: tuple[str, ...] = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
)
DCGM_HINT = (
    "install datacenter-gpu-manager and put its Python bindings on PYTHONPATH "
    "(/usr/share/datacenter-gpu-manager-4/bindings/python3 or "
    "/usr/local/dcgm/bindings/python3)"
)


def is_blank(value: float | int | None) -> bool:
    """True for a missing value or one of DCGM's blank sentinels."""
    if value is None:
        return True
    if isinstance(value, int):
        return value >= INT64_BLANK
    return math.isnan(value) or value >= FP64_BLANK  # NaN is never a measurement


class DcgmAdapter(Protocol):
    """The few DCGM operations the backend needs."""

    def connect(self, host: str | None) -> None:
        """Connect to `host` (HOST[:PORT]) or start an embedded host engine when None."""
        ...

    def watch(self, field_ids: Sequence[int], interval_seconds: float) -> None:
        """Watch the fields on every GPU at the sampling interval."""
        ...

    def latest(self) -> Mapping[str, Mapping[int, float | int | None]]:
        """The latest value of each watched field, by GPU UUID then field id."""
        ...

    def close(self) -> None:
        ...


class PyDcgmAdapter:
    """DCGM through NVIDIA's bindings (DcgmReader over pydcgm)."""

    def __init__(self) -> None:
        self._host: str | None = None
        self._reader: Any = None
        self._module: Any = None

    def connect(self, host: str | None) -> None:
        for path in BINDING_PATHS:
            if Path(path).is_dir() and path not in sys.path:
                sys.path.append(path)
        try:
            self._module = importlib.import_module("DcgmReader")
        except ImportError as err:
            raise BackendUnavailable("DCGM Python bindings not importable", DCGM_HINT) from err
        self._host = host

    def watch(self, field_ids: Sequence[int], interval_seconds: float) -> None:
        # hostname=None makes pydcgm start an embedded host engine in this process.
        reader = self._module.DcgmReader(
            hostname=self._host,
            fieldIds=list(field_ids),
            updateFrequency=max(1, int(interval_seconds * 1_000_000)),
            maxKeepAge=max(60.0, interval_seconds * 4),
            fieldGroupName="gpu_audit_prof",
        )
        reader.Init()
        if reader.m_dcgmHandle is None:  # Init() swallows "cannot connect" and logs it
            raise BackendUnavailable(
                f"cannot connect to the DCGM host engine at {self._host or 'embedded'}",
                "is nv-hostengine running (or DCGM installed for an embedded engine)?",
            )
        self._reader = reader

    def latest(self) -> Mapping[str, Mapping[int, float | int | None]]:
        reader = self._reader
        by_id: dict[int, dict[int, Any]] = reader.GetLatestGpuValuesAsFieldIdDict()
        uuids: dict[int, str] = reader.m_gpuIdToUUId
        return {uuids[gpu]: values for gpu, values in by_id.items() if gpu in uuids}

    def close(self) -> None:
        if self._reader is not None:
            self._reader.Shutdown()
            self._reader = None


class DcgmBackend:
    """NVML samples with DCGM profiling fields merged on by UUID."""

    name = "dcgm"

    def __init__(
        self,
        config: ExporterConfig,
        nvml_backend: NvmlBackend | None = None,
        adapter_factory: Callable[[], DcgmAdapter] = PyDcgmAdapter,
    ) -> None:
        self._config = config
        self._nvml = nvml_backend if nvml_backend is not None else NvmlBackend(config)
        self._adapter_factory = adapter_factory
        self._adapter: DcgmAdapter | None = None
        self._errors: dict[str, int] = {}

    @property
    def dcgm_active(self) -> bool:
        """True when DCGM is connected and profiling fields are being merged."""
        return self._adapter is not None

    def open(self) -> BackendInfo:
        info = self._nvml.open()  # BackendUnavailable propagates: nothing to sample
        adapter = self._adapter_factory()
        try:
            adapter.connect(self._config.dcgm_host)
            adapter.watch(sorted(PROF_FIELDS.values()), self._config.interval_seconds)
        except Exception as err:  # noqa: BLE001 - any DCGM failure means "run NVML-only"
            log.warning("DCGM unavailable (%s); running NVML-only, profiling fields "
                        "(%s) are not exported", err, ", ".join(sorted(PROF_KEYS)))
            try:
                adapter.close()
            except Exception:  # best effort on a half-open adapter
                log.debug("closing the failed DCGM adapter raised", exc_info=True)
            return replace(info, name=self.name, detail=f"{info.detail}; DCGM unavailable")
        self._adapter = adapter
        where = self._config.dcgm_host or "embedded host engine"
        log.info("DCGM connected (%s): profiling fields merged onto NVML samples", where)
        return replace(info, name=self.name, detail=f"{info.detail}; DCGM {where}")

    def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
        samples = self._nvml.sample(now, slow)
        latest = self._latest()
        return [self._merge(s, latest) for s in samples]

    def _latest(self) -> Mapping[str, Mapping[int, float | int | None]] | None:
        if self._adapter is None:
            return None
        try:
            return self._adapter.latest()
        except Exception as err:  # noqa: BLE001 - DCGM trouble must not stop NVML samples
            self._errors["dcgm_error"] = self._errors.get("dcgm_error", 0) + 1
            log.warning("DCGM read failed (%s); profiling fields omitted this cycle", err)
            return None

    @staticmethod
    def _merge(
        sample: GpuSample, latest: Mapping[str, Mapping[int, float | int | None]] | None
    ) -> GpuSample:
        if not sample.up:
            return sample
        fields = latest.get(sample.uuid, {}) if latest is not None else {}
        values: dict[str, FieldValues] = dict(sample.values)
        unsupported = set(sample.unsupported)
        for key, field_id in PROF_FIELDS.items():
            value = fields.get(field_id)
            if is_blank(value):
                unsupported.add(key)
                continue
            assert value is not None
            values[key] = {(): float(value)}
        return replace(sample, values=values, unsupported=frozenset(unsupported))

    def error_counts(self) -> Mapping[str, int]:
        counts = dict(self._nvml.error_counts())
        for kind, n in self._errors.items():
            counts[kind] = counts.get(kind, 0) + n
        return counts

    def close(self) -> None:
        if self._adapter is not None:
            try:
                self._adapter.close()
            except Exception:  # closing must not fail shutdown
                log.debug("DCGM close raised", exc_info=True)
            self._adapter = None
        self._nvml.close()


def create(config: ExporterConfig) -> DcgmBackend:
    """The DCGM backend for this configuration (not opened yet)."""
    return DcgmBackend(config)
