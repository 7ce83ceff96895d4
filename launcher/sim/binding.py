"""Real jobs on simulated GPUs: what a `gpus: sim:N` daemon runs (the demo, the tests).

`SimGpuBinding` is a ProcessExecutor whose started attempts show up on a SimGpuSource:
each attempt's leader appears on its GPUs with its admitted memory (default 1 GiB) and
disappears when it exits, so placement, fair share and the release barrier see the
launched jobs' usage without a GPU. `SimGpuView` is the daemon's GpuStateSource then.

Only the app layer wires these in, and only when the configuration names `sim:N`; no
production module imports this package (an import-linter contract).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.constants import ENV_GPU_MEMORY_LIMIT
from launcher.engine import Exit
from launcher.executor import ProcessExecutor
from launcher.gpustate import GpuInfo
from launcher.sim.gpus import SimGpuSource
from launcher.spec import JobSpec


class SimGpuBinding(ProcessExecutor):
    """See the module docstring; `default_bytes` is the memory a job without a memory
    limit in its environment is shown holding."""

    def __init__(self, state_dir: Path, sim: SimGpuSource, *, default_bytes: int = 1 << 30,
                 **kw: Any) -> None:
        super().__init__(state_dir, **kw)
        self._sim = sim
        self._default = default_bytes

    def start(  # noqa: PLR0917 - the engine's Executor protocol
        self, job_id: int, attempt: int, spec: JobSpec, gpus: list[GpuInfo],
        env: dict[str, str], uid: int,
    ) -> None:
        super().start(job_id, attempt, spec, gpus, env, uid)
        pid = self.pid_of(job_id)
        limit = env.get(ENV_GPU_MEMORY_LIMIT)
        used = int(limit) if limit and limit.isdigit() else self._default
        for g in gpus:
            if pid is not None:
                self._sim.add_process(g.uuid, pid, used)

    def poll(self) -> list[Exit]:
        # Every pid the attempt had, dead or alive: `pids()` of an ended job lists only
        # the live ones (what the release barrier needs on a real GPU), and a process that
        # exited between the engine's GPU read and this poll is already dead here. Asking
        # `pids()` left it on its simulated GPU for good.
        attempts = {job: set(a.pids) for job, a in self._running.items()}
        exits = super().poll()
        for e in exits:
            self._sim.remove_pids(attempts.get(e.job_id, set())
                                  | self._ended_pids.get(e.job_id, set()))
        return exits

    def sync(self) -> None:
        """Take the processes of attempts that already exited (not yet polled) off the
        simulated GPUs, as a real GPU would show them gone."""
        for a in self._running.values():
            if a.proc is not None and a.proc.poll() is not None:
                self._sim.remove_pids(a.pids)


class SimGpuView:
    """The GpuStateSource of a `sim:N` daemon: the simulated GPUs as they are now."""

    def __init__(self, sim: SimGpuSource, binding: SimGpuBinding) -> None:
        self.sim = sim
        self._binding = binding

    def read(self, now: float) -> list[GpuInfo]:
        self._binding.sync()
        return self.sim.read(now)
