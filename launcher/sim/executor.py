"""A simulated executor for tests and replay: jobs are behaviours in virtual time whose
processes appear on a SimGpuSource, so the engine's measured-state code paths (placement,
fair share, release barrier) run unchanged.

A job needs `work_seconds` of work. It commits a checkpoint every
`checkpoint_interval_seconds` of work (when it has a checkpoint directory), and on the
preemption signal commits one after `checkpoint_seconds` and exits EXIT_PREEMPTED; a
resumed attempt starts from its newest checkpoint. It may fail (`fail_after_seconds`,
`exit_code`, `oom`), ignore the signal (then only the kill after the grace ends it), or
leave a process holding GPU memory after it exits (`leak`).
"""

from __future__ import annotations

import itertools
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.constants import EXIT_PREEMPTED, EXIT_SIGKILL
from launcher.engine import Exit, Report
from launcher.gpustate import GIB, GpuInfo
from launcher.sim.gpus import SimGpuSource
from launcher.spec import JobSpec


@dataclass(frozen=True)
class SimBehaviour:
    work_seconds: float = 3600.0
    memory_bytes: int = 10 * GIB  # used on each of its GPUs
    utilization: float = 1.0
    checkpoint_interval_seconds: float | None = None  # None: never periodically
    checkpoint_seconds: float = 5.0  # signal -> commit
    exit_after_commit_seconds: float = 1.0  # commit -> exit
    fail_after_seconds: float | None = None  # of this attempt's run time
    exit_code: int = 1  # the code of that failure
    oom: bool = False
    fail_attempts: int = 1_000_000  # fail only on the first N attempts
    ignores_signal: bool = False
    leak: bool = False  # one process keeps its memory after the job exits
    leak_attempts: int = 1  # ... on the first N attempts


@dataclass
class _Run:
    job_id: int
    attempt: int
    spec: JobSpec
    behaviour: SimBehaviour
    gpus: list[str]
    env: dict[str, str]
    start: float
    progress0: float  # work done before this attempt (from its checkpoint)
    pids: list[int]
    last_ckpt_work: float
    signal_at: float | None = None
    killed_at: float | None = None
    reported_until: float = 0.0


@dataclass
class _Saved:
    work: float = 0.0
    time: float | None = None


@dataclass
class SimExecutor:
    """Runs `SimBehaviour`s on `sim`. `behaviour(job_id, spec)` says what a job does."""

    sim: SimGpuSource
    clock: Callable[[], float]
    behaviour: Callable[[int, JobSpec], SimBehaviour] = field(
        default=lambda _id, _spec: SimBehaviour())
    runs: dict[int, _Run] = field(default_factory=dict)
    started: list[tuple[float, int, int, list[str], dict[str, str]]] = field(
        default_factory=list)
    signals: list[tuple[float, int, int]] = field(default_factory=list)
    _saved: dict[int, _Saved] = field(default_factory=dict)
    _all_pids: dict[int, set[int]] = field(default_factory=dict)
    _leaked: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    _reports: list[Report] = field(default_factory=list)
    _exits: list[Exit] = field(default_factory=list)
    _pid_counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    def start(self, job_id: int, attempt: int, spec: JobSpec,  # noqa: PLR0917 - Executor
              gpus: list[GpuInfo], env: dict[str, str], uid: int) -> None:
        if job_id in self.runs:
            raise RuntimeError(f"job {job_id} is already running")
        now = self.clock()
        b = self.behaviour(job_id, spec)
        saved = self._saved.setdefault(job_id, _Saved())
        main, worker = next(self._pid_counter), next(self._pid_counter)
        uuids = [g.uuid for g in gpus]
        for uuid in uuids:
            self.sim.add_process(uuid, main, max(0, b.memory_bytes - 256 * 2**20),
                                 b.utilization)
            self.sim.add_process(uuid, worker, min(b.memory_bytes, 256 * 2**20), 0.0)
        self._all_pids.setdefault(job_id, set()).update((main, worker))
        self.runs[job_id] = _Run(job_id, attempt, spec, b, uuids, env, now, saved.work,
                                 [main, worker], saved.work, reported_until=now)
        self.started.append((now, job_id, attempt, uuids, env))

    def signal(self, job_id: int, signum: int) -> None:
        run = self.runs.get(job_id)
        self.signals.append((self.clock(), job_id, signum))
        if run is None or run.signal_at is not None:
            return
        if signum == int(_signal.Signals[run.spec.preempt_signal]):
            run.signal_at = self.clock()

    def kill_group(self, job_id: int) -> None:
        now = self.clock()
        run = self.runs.get(job_id)
        if run is not None and run.killed_at is None:
            run.killed_at = now
        for uuid, pid in self._leaked.pop(job_id, []):  # reaping takes leftovers too
            self.sim.remove_process(uuid, pid)

    def pids(self, job_id: int) -> set[int]:
        return set(self._all_pids.get(job_id, ()))

    def reports(self) -> list[Report]:
        self._advance()
        out, self._reports = self._reports, []
        return out

    def poll(self) -> list[Exit]:
        self._advance()
        out, self._exits = sorted(self._exits, key=lambda e: e.time), []
        return out

    # ---------------------------------------------------------------------- internals

    def _end(self, run: _Run) -> tuple[float, int, bool]:
        """When and how this attempt ends if nothing else happens: (time, code, oom)."""
        b = run.behaviour
        candidates: list[tuple[float, int, bool]] = [
            (run.start + (b.work_seconds - run.progress0), 0, False)]
        if b.fail_after_seconds is not None and run.attempt <= b.fail_attempts:
            candidates.append((run.start + b.fail_after_seconds, b.exit_code, b.oom))
        if run.signal_at is not None and not b.ignores_signal and run.spec.checkpoint_dir:
            commit = run.signal_at + b.checkpoint_seconds
            candidates.append((commit + b.exit_after_commit_seconds, EXIT_PREEMPTED, False))
        if run.killed_at is not None:
            candidates.append((run.killed_at, EXIT_SIGKILL, False))
        return min(candidates, key=lambda c: c[0])

    def _checkpoints(self, run: _Run, until: float) -> None:
        """Commit periodic checkpoints and the signalled one up to time `until`."""
        b = run.behaviour
        if not run.spec.checkpoint_dir:
            return
        times: list[float] = []
        if b.checkpoint_interval_seconds:
            k = int(run.last_ckpt_work // b.checkpoint_interval_seconds) + 1
            while True:
                t = run.start + (k * b.checkpoint_interval_seconds - run.progress0)
                if t > until or k * b.checkpoint_interval_seconds >= b.work_seconds:
                    break
                if t > run.reported_until:
                    times.append(t)
                k += 1
        if run.signal_at is not None and not b.ignores_signal:
            t = run.signal_at + b.checkpoint_seconds
            if run.reported_until < t <= until:
                times.append(t)
        for t in sorted(times):
            work = run.progress0 + (t - run.start)
            if work <= run.last_ckpt_work:
                continue
            run.last_ckpt_work = work
            saved = self._saved[run.job_id]
            saved.work, saved.time = work, t
            self._reports.append(Report(run.job_id, t, "checkpoint",
                                        {"step": int(work), "attempt": run.attempt}))
        run.reported_until = max(run.reported_until, until)

    def _advance(self) -> None:
        now = self.clock()
        exits = self._exits
        for job_id in list(self.runs):
            run = self.runs[job_id]
            end, code, oom = self._end(run)
            self._checkpoints(run, min(now, end))
            if end > now:
                continue
            del self.runs[job_id]
            b = run.behaviour
            leaving = run.pids
            if b.leak and run.attempt <= b.leak_attempts and code != EXIT_SIGKILL:
                # the worker stays behind holding memory on the first GPU
                self._leaked.setdefault(job_id, []).append((run.gpus[0], run.pids[1]))
                leaving = [run.pids[0]]
                for uuid in run.gpus[1:]:
                    self.sim.remove_process(uuid, run.pids[1])
            self.sim.remove_pids(leaving)
            saved = self._saved[job_id]
            exits.append(Exit(job_id, code, end, oom=oom, last_checkpoint_time=saved.time,
                              last_checkpoint_step=int(saved.work) if saved.time else None))
