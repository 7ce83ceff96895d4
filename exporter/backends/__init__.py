"""GPU backends. `create_backend` picks the hardware backend the configuration names;
only the chosen one is imported, so a machine without NVIDIA libraries never loads them.

The simulator is not among them: it is chosen by name in the app layer
(gpu_audit_app/run.py) and lives in exporter/sim/, which no production start-up module
imports (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

from exporter.backends.base import BackendHooks, BackendUnavailable, GpuBackend
from exporter.config import ExporterConfig

__all__ = ["BackendHooks", "BackendUnavailable", "GpuBackend", "create_backend"]


def create_backend(config: ExporterConfig) -> GpuBackend:
    """The hardware backend the configuration names. Never substitutes another one."""
    if config.backend == "nvml":
        from exporter.backends import nvml

        return nvml.create(config)
    if config.backend == "dcgm":
        from exporter.backends import dcgm

        return dcgm.create(config)
    raise ValueError(f"backend {config.backend!r} is not a hardware backend (the simulator "
                     "is started by the app layer: gpu_audit_app.run.open_backend)")
