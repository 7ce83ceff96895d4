"""VirtualExecutor: the launcher's Executor for replay. Jobs are trace entries that
progress in virtual time on simulated GPUs (launcher.sim.gpus.SimGpuSource).

A run works in cycles of `checkpoint_interval` seconds of work followed by
`checkpoint_seconds` of writing (no checkpoints: work only). It resumes from the work its
newest committed checkpoint holds. On the preemption signal a checkpointing job commits at
its next step boundary (or finishes the commit it is writing) and exits with the
"preempted" code; a job that cannot commit within the grace period, or never
checkpoints, is killed by the engine and loses everything since its last commit. A
failing job exits with its `exit_code` (1 unless the trace says, e.g. 137 for a job the
kernel killed; an out-of-memory one with `oom`) when its work reaches `fails_at`.
A leaking job's processes stay on the GPUs, holding memory, after it exits, until the
engine reaps its process group.

The executor also keeps the ground truth the metrics are computed from: every interval
a process of a job held a GPU (with its utilisation), every start, and the work lost.
It never decides anything: the engine does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from launcher.constants import EXIT_PREEMPTED, EXIT_SIGKILL
from launcher.engine import Exit, Report
from launcher.gpustate import GpuInfo
from launcher.replay.trace import TraceJob
from launcher.sim.gpus import SimGpuSource
from launcher.spec import JobSpec


@dataclass(frozen=True)
class Interval:
    """A process of a job on one GPU from t0 to t1 at `util` (leak: after the job exited)."""

    gpu: str
    job_id: int
    t0: float
    t1: float
    util: float
    leak: bool = False


@dataclass
class JobTruth:
    """What really happened to one trace job across its attempts."""

    trace: TraceJob
    committed_work: float = 0.0  # work seconds held by the newest committed checkpoint
    failures: int = 0
    starts: list[float] = field(default_factory=list)
    exits: list[tuple[float, int]] = field(default_factory=list)
    preemptions: int = 0  # runs ended by the preemption protocol (commit or kill)
    lost_preempt: float = 0.0  # GPU-seconds of work thrown away by preemption kills
    lost_failure: float = 0.0  # ... by crashes
    held: float = 0.0  # GPU-seconds this job's runs held GPUs
    finished_at: float | None = None


@dataclass
class _Run:
    job_id: int
    attempt: int
    gpus: list[str]
    pids: list[int]
    started: float
    base: float  # committed work when this run started
    signal_at: float | None = None
    reported: float = 0.0  # work of the newest commit already reported


class VirtualExecutor:
    """Executor Protocol (start / signal / kill_group / poll) in virtual time.

    `jobs` maps a job's name (the JobSpec name the replay submitted) to its trace entry;
    `clock` returns the virtual now; `grace_seconds` is the engine's preemption grace.
    """

    def __init__(self, jobs: Mapping[str, TraceJob], gpus: SimGpuSource,
                 clock: Callable[[], float], grace_seconds: float) -> None:
        self.trace = dict(jobs)
        self.sim = gpus
        self.clock = clock
        self.grace = grace_seconds
        self.truth: dict[int, JobTruth] = {}
        self.intervals: list[Interval] = []
        self._runs: dict[int, _Run] = {}
        self._due: list[Exit] = []
        self._leaks: dict[int, tuple[list[str], list[int], float, int]] = {}
        self._reports: list[Report] = []
        self._all_pids: dict[int, set[int]] = {}
        self._next_pid = 10_000

    # ------------------------------------------------------------------ Executor Protocol

    def start(self, job_id: int, attempt: int, spec: JobSpec,  # noqa: PLR0917 (the Protocol)
              gpus: list[GpuInfo], env: dict[str, str], uid: int) -> None:
        if job_id in self._runs:
            raise RuntimeError(f"job {job_id} is already running")
        now = self.clock()
        uuids = [g.uuid for g in gpus]
        tj = self.trace[spec.name]
        truth = self.truth.setdefault(job_id, JobTruth(trace=tj))
        truth.starts.append(now)
        if job_id in self._leaks:  # a new attempt while the old one still leaks: reap it
            self._reap_leak(job_id, now)
        pids = []
        for uuid in uuids:  # one process per GPU, as a DDP job has
            pid = self._next_pid
            self._next_pid += 1
            pids.append(pid)
            self.sim.add_process(uuid, pid, tj.memory_bytes, utilization=tj.util)
        self._all_pids.setdefault(job_id, set()).update(pids)
        self._runs[job_id] = _Run(job_id, attempt, uuids, pids, now, truth.committed_work,
                                  reported=truth.committed_work)

    def pids(self, job_id: int) -> set[int]:
        """Every pid the job has had: the release barrier looks for them on the GPUs."""
        return set(self._all_pids.get(job_id, ()))

    def reports(self) -> list[Report]:
        """Checkpoints committed since the last call (the helper's reports)."""
        self.advance()
        out, self._reports = self._reports, []
        return out

    def signal(self, job_id: int, signum: int) -> None:
        self.advance()
        run = self._runs.get(job_id)
        if run is not None and run.signal_at is None:
            run.signal_at = self.clock()

    def kill_group(self, job_id: int) -> None:
        self.advance()
        now = self.clock()
        if job_id in self._leaks:
            self._reap_leak(job_id, now)
        run = self._runs.get(job_id)
        if run is None:
            return
        self._end(run, now, EXIT_SIGKILL, killed=True)

    def poll(self) -> list[Exit]:
        self.advance()
        due, self._due = sorted(self._due, key=lambda e: e.time), []
        return due

    def pending_exits(self) -> bool:
        return bool(self._due)

    def advance(self) -> None:
        """Play every run forward to now: commits reported, ended runs' processes gone
        from the GPUs (the replay calls this before each tick, so the engine reads GPU
        state after the processes exited, as it would on a real node)."""
        now = self.clock()
        for run in list(self._runs.values()):
            end = self._natural_end(run)
            self._report_commits(run, min(now, end[0]))
            if end[0] <= now:
                self._end(run, end[0], end[1], oom=end[2], crashed=end[3])

    def _report_commits(self, run: _Run, until: float) -> None:
        tj = self.truth[run.job_id].trace
        if tj.checkpoint_interval is None:
            return
        interval, pause = self._cycle(tj)
        n = math.floor((until - run.started) / (interval + pause))
        for k in range(1, n + 1):
            work = run.base + k * interval
            if work <= run.reported or work >= tj.runtime:
                continue
            run.reported = work
            at = run.started + k * (interval + pause)
            self.truth[run.job_id].committed_work = work
            self._reports.append(Report(run.job_id, at, "checkpoint", {
                "step": int(work / tj.step_seconds), "attempt": run.attempt}))
            # the helper's progress beside each commit (steps, total, throughput over
            # wall time, pauses included), so the engine's estimates for running jobs
            # come from progress in replay as they do on a node
            self._reports.append(Report(run.job_id, at, "telemetry", {
                "step": int(work / tj.step_seconds),
                "total_steps": max(1, int(tj.runtime / tj.step_seconds)),
                "steps_per_second": interval / (interval + pause) / tj.step_seconds}))

    # ------------------------------------------------------------------------ the model

    def next_event(self) -> float | None:
        """The earliest virtual time something happens by itself: an exit, or a grace
        deadline the engine must act on."""
        times = []
        for run in self._runs.values():
            times.append(self._natural_end(run)[0])
            if run.signal_at is not None:
                times.append(run.signal_at + self.grace)
        return min(times) if times else None

    def _cycle(self, tj: TraceJob) -> tuple[float, float]:
        interval = tj.checkpoint_interval
        return (interval, tj.checkpoint_seconds) if interval is not None else (math.inf, 0.0)

    def _elapsed_for(self, tj: TraceJob, work: float) -> float:
        """Wall seconds a run needs to do `work` seconds of work (checkpoint pauses in)."""
        interval, pause = self._cycle(tj)
        if work <= 0:
            return 0.0
        commits = math.ceil(work / interval) - 1 if interval != math.inf else 0
        return work + commits * pause

    def _work_at(self, tj: TraceJob, elapsed: float) -> tuple[float, float, bool]:
        """(work done, work committed, writing a checkpoint now) after `elapsed` wall
        seconds of a run, both counted from the run's start."""
        interval, pause = self._cycle(tj)
        if interval == math.inf:
            return elapsed, 0.0, False
        cycle = interval + pause
        n = math.floor(elapsed / cycle)
        rest = elapsed - n * cycle
        if rest < interval:
            return n * interval + rest, n * interval, False
        return (n + 1) * interval, n * interval, True

    def _natural_end(self, run: _Run) -> tuple[float, int, bool, bool]:
        """(time, exit code, oom, crashed) of the run's next exit if nothing interrupts
        it."""
        truth = self.truth[run.job_id]
        tj = truth.trace
        remaining = tj.runtime - run.base
        end = (run.started + self._elapsed_for(tj, remaining), 0, False, False)
        if tj.fails_at is not None and truth.failures < tj.fail_attempts:
            fail_work = tj.fails_at * tj.runtime - run.base
            if fail_work > 0:
                t = run.started + self._elapsed_for(tj, fail_work)
                if t < end[0]:
                    end = (t, tj.exit_code, tj.oom, True)
        if run.signal_at is not None and tj.checkpoint_interval is not None:
            commit, _ = self._commit_after_signal(run, tj)
            if commit <= run.signal_at + self.grace and commit < end[0]:
                end = (commit, EXIT_PREEMPTED, False, False)
        return end

    def _commit_after_signal(self, run: _Run, tj: TraceJob) -> tuple[float, float]:
        """(time, work of this run) of the commit the helper makes after the signal: at
        the next step boundary, or the periodic commit it is already writing."""
        assert run.signal_at is not None
        elapsed = run.signal_at - run.started
        work, _, writing = self._work_at(tj, elapsed)
        interval, pause = self._cycle(tj)
        if writing:
            n = math.floor(elapsed / (interval + pause))
            return run.started + (n + 1) * (interval + pause), work
        steps = math.ceil(work / tj.step_seconds - 1e-9)
        boundary_work = min(steps * tj.step_seconds, tj.runtime - run.base)
        extra = boundary_work - work  # the rest of the step in progress
        return run.signal_at + extra + tj.checkpoint_seconds, boundary_work

    def _end(self, run: _Run, at: float, code: int, *, killed: bool = False,
             oom: bool = False, crashed: bool = False) -> None:
        truth = self.truth[run.job_id]
        tj = truth.trace
        elapsed = at - run.started
        _, committed, _ = self._work_at(tj, elapsed)
        last_commit: float | None = None
        if committed > 0:  # commit n completes after n whole cycles of work + writing
            last_commit = run.started + self._elapsed_for(tj, committed) + tj.checkpoint_seconds
        if code == EXIT_PREEMPTED:
            _, committed = self._commit_after_signal(run, tj)
            last_commit = at
            self._reports.append(Report(run.job_id, at, "checkpoint", {
                "step": int((run.base + committed) / tj.step_seconds),
                "attempt": run.attempt}))
        elif code == 0:
            committed = tj.runtime - run.base
        lost = 0.0
        if code not in (0, EXIT_PREEMPTED):
            since = last_commit if last_commit is not None else run.started
            lost = max(0.0, at - since) * tj.gpu_share
        truth.committed_work = run.base + committed
        truth.held += elapsed * tj.gpu_share
        if run.signal_at is not None and code in (EXIT_PREEMPTED, EXIT_SIGKILL) \
                and not crashed:
            truth.preemptions += 1
            truth.lost_preempt += lost
        else:
            truth.lost_failure += lost
        if crashed:
            truth.failures += 1
        truth.exits.append((at, code))
        if code == 0:
            truth.finished_at = at
        for uuid in run.gpus:
            self.intervals.append(Interval(uuid, run.job_id, run.started, at, tj.util))
        if tj.leaks and not killed:  # the processes stay, holding memory, doing nothing
            for uuid, pid in zip(run.gpus, run.pids, strict=True):
                self.sim.add_process(uuid, pid, tj.memory_bytes, utilization=0.0)
            self._leaks[run.job_id] = (run.gpus, run.pids, at, run.attempt)
        else:
            self.sim.remove_pids(run.pids)
        del self._runs[run.job_id]
        step = int((run.base + committed) / tj.step_seconds) if last_commit is not None \
            else None
        self._due.append(Exit(job_id=run.job_id, code=code, time=at, oom=oom,
                              last_checkpoint_time=last_commit, last_checkpoint_step=step))

    def _reap_leak(self, job_id: int, now: float) -> None:
        gpus, pids, since, _ = self._leaks.pop(job_id)
        self.sim.remove_pids(pids)
        for uuid in gpus:
            self.intervals.append(Interval(uuid, job_id, since, now, 0.0, leak=True))

    def close(self, now: float) -> None:
        """End of replay: leaks still held count as held up to `now`."""
        for job_id in list(self._leaks):
            gpus, _pids, since, _ = self._leaks.pop(job_id)
            for uuid in gpus:
                self.intervals.append(Interval(uuid, job_id, since, now, 0.0, leak=True))
