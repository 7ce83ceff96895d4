"""The launcher's simulator: GPUs, and jobs as behaviours in virtual time.

- `gpus.py`: `SimGpuSource`, N simulated GPUs (a GpuStateSource).
- `executor.py`: `SimExecutor`, jobs as `SimBehaviour`s whose processes appear on a
  SimGpuSource (tests, replay).
- `binding.py`: `SimGpuBinding`/`SimGpuView`, real processes shown on simulated GPUs
  (the `gpus: sim:N` daemon). Imported by name, not from here (it pulls in the real
  executor).

Used only when asked for by name (tests, replay, `gpus: sim:N`); the daemon's production
modules never import this package (import-linter contract `sim-out-of-production`).
"""

from launcher.sim.executor import SimBehaviour, SimExecutor
from launcher.sim.gpus import SimGpu, SimGpuSource, SimProcess

__all__ = ["SimBehaviour", "SimExecutor", "SimGpu", "SimGpuSource", "SimProcess"]
