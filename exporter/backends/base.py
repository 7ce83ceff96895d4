"""The GPU backend protocol: NVML, DCGM and the simulator implement it.

A backend turns hardware (or a scenario) into `GpuSample`s. It must:
- raise `BackendUnavailable` from `open()` with a hint a person can act on when the
  library or driver is missing, and never fall back to another backend by itself;
- never raise from `sample()` because one GPU failed: that GPU comes back with
  `up=False` and an error kind, the others are still read, and the failed one is retried
  with backoff on later cycles;
- leave unsupported fields out of `values` (listing them in `unsupported`), never NaN,
  0 or a sentinel.
Only modules under exporter/backends import vendor libraries.

A backend may bring `BackendHooks`: what it needs around the sampling loop besides its
samples. The hardware backends bring none; the simulator brings its own /proc, kubelet
and clock (exporter/sim/harness.py), so the exporter's start-up code has no branch for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from exporter.attribution.config import AttributionConfig
from gpu_audit.errors import GpuAuditError
from gpu_audit.model.samples import BackendInfo, GpuSample


class BackendUnavailable(GpuAuditError, RuntimeError):
    """The backend cannot start at all. The message says why and what to check."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}: {self.hint}" if self.hint else base


class GpuBackend(Protocol):
    """One source of GPU samples."""

    name: str

    def open(self) -> BackendInfo:
        """Initialise the library and discover devices. Raises BackendUnavailable."""
        ...

    def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
        """Read every GPU once.

        `now` is the cycle's wall-clock time in unix seconds (scenario time for the
        simulator). `slow` is True on cycles of the slow tier, when inventory, ECC,
        retired pages and other rarely-changing fields are re-read; on other cycles the
        backend reuses its last slow values.
        """
        ...

    def error_counts(self) -> Mapping[str, int]:
        """Cumulative per-kind error counts since open (e.g. {"gpu_lost": 3})."""
        ...

    def close(self) -> None:
        """Release the library. Safe to call twice."""
        ...


class BackendHooks(Protocol):
    """What a backend brings around the sampling loop besides its samples, called by the
    exporter at fixed points (exporter/app.py). The hardware backends bring none."""

    def opened(self, info: BackendInfo, attribution: AttributionConfig) -> AttributionConfig:
        """Once the backend is open: the attribution configuration to resolve with (the
        given one, or one pointed at what the backend provides)."""
        ...

    def clock(self) -> float:
        """The time of a sampling cycle, in unix seconds (the backend's own time)."""
        ...

    def before_attribution(self, gpus: Sequence[GpuSample]) -> None:
        """Each cycle, after sampling and before the resolver reads /proc."""
        ...

    def close(self) -> None:
        """Release what `opened` made. Safe when `opened` was never called."""
        ...
