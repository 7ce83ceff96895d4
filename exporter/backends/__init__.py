"""GPU backends. `create_backend` picks one by name; only the chosen one is imported, so
a machine without NVIDIA libraries can still run the simulator."""

from __future__ import annotations

from exporter.backends.base import BackendUnavailable, GpuBackend
from exporter.config import ExporterConfig

__all__ = ["BackendUnavailable", "GpuBackend", "create_backend"]


def create_backend(config: ExporterConfig) -> GpuBackend:
    """The backend the configuration names. Never substitutes another one."""
    if config.backend == "nvml":
        from exporter.backends import nvml

        return nvml.create(config)
    if config.backend == "dcgm":
        from exporter.backends import dcgm

        return dcgm.create(config)
    from exporter.sim import backend as sim

    return sim.create(config)
