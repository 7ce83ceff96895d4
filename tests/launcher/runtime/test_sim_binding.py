"""Real jobs on simulated GPUs (`gpus: sim:N`): a job that ends must leave its GPU.

The race of a simulated GPU binding, reproduced deterministically: the engine reads the GPUs
while the job still runs, the job exits before the engine polls, and the poll reaps it.
The GPU source below makes exactly that happen (it ends the job right after its read
and waits until the process has exited, unreaped); the engine's clock is injected, so
nothing here depends on timing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.config import LauncherCoreConfig
from launcher.engine import Engine
from launcher.gpustate import GIB, GpuInfo
from launcher.scheduler import Scheduler
from launcher.sim.binding import SimGpuBinding, SimGpuView
from launcher.sim.gpus import SimGpuSource
from launcher.spec import load_submission
from launcher.store import Store
from tests.launcher.runtime.users import ALICE, job_python, local_user, shared_dir

PY = job_python()


@pytest.fixture
def home() -> Iterator[Path]:
    d = shared_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


class EndsJobAfterRead:
    """The engine's GPU source: the simulated GPUs as they are, and then, once armed,
    the armed job ends (its flag file appears) and exits before the engine polls."""

    def __init__(self, view: SimGpuView, binding: SimGpuBinding) -> None:
        self.view, self.binding = view, binding
        self.armed: tuple[int, Path] | None = None

    def read(self, now: float) -> list[GpuInfo]:
        gpus = self.view.read(now)
        if self.armed is not None:
            job_id, flag = self.armed
            self.armed = None
            pid = self.binding.pid_of(job_id)
            assert pid is not None
            flag.write_text("end")
            # exited, not reaped: the engine's poll() is the one that reaps it
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        return gpus


def test_a_job_that_exits_between_the_gpu_read_and_the_poll_frees_its_gpu(
        home: Path) -> None:
    """Before the fix the exited job's process stayed listed on its simulated GPU (40 GiB
    used) for good: the poll looked only for pids still alive, so the next whole-GPU job
    never started. Now every pid of the ended attempt leaves the GPU."""
    pw = local_user(ALICE)
    now = [1_700_000_000.0]
    sim = SimGpuSource(1, memory_total_bytes=80 * GIB)
    binding = SimGpuBinding(home / "state", sim)
    source = EndsJobAfterRead(SimGpuView(sim, binding), binding)
    engine = Engine(Store(":memory:"), Scheduler(LauncherCoreConfig().policy), source,
                    binding, lambda: now[0])
    flag = home / "end-a"
    wait = f"import os,time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)"
    try:
        (a,) = engine.submit(load_submission(
            f"name: a\ngpu_memory_bytes: 40GiB\ncwd: {home}\n"
            f"command: [{PY!r}, -c, {wait!r}]\n"), pw.pw_uid, ALICE)
        engine.tick()
        assert engine.store.get(a).state == "running"  # type: ignore[union-attr]
        assert sim.gpus[0].processes, "the running job shows on its GPU"
        (b,) = engine.submit(load_submission(
            f"name: b\ngpu_memory_bytes: 40GiB\ncwd: {home}\ncommand: [{PY!r}, -c, '']\n"),
            pw.pw_uid, ALICE)
        source.armed = (a, flag)
        for _ in range(3):
            now[0] += 1.0
            engine.tick()
        assert engine.store.get(a).state == "succeeded"  # type: ignore[union-attr]
        assert b in binding.running() or engine.store.get(b).state != "queued", \
            "the GPU stayed full after job a ended: job b never started"  # type: ignore[union-attr]
        leftover = [p for p in sim.gpus[0].processes if p in binding._ended_pids.get(a, ())]
        assert leftover == [], "job a's process is still listed on the simulated GPU"
    finally:
        for job in binding.running():
            binding.kill_group(job)
        binding.close()
