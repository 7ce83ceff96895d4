"""Replay a trace through the launcher's own Engine and Scheduler in virtual time.

A discrete-event loop: the virtual clock jumps to the next thing that happens (a job's
arrival, a run's exit or commit-and-exit, an engine timer such as a backoff end or a
preemption grace deadline) and, while jobs wait or GPUs await release, at least every
`tick_seconds` (the daemon's tick: it lets waiting jobs age and preemption thresholds
pass). Each stop is one `Engine.tick()`, exactly as the daemon does it; nothing here
schedules, places or preempts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from launcher.config import LauncherCoreConfig, PolicyName
from launcher.engine import Engine
from launcher.replay.executor import VirtualExecutor
from launcher.replay.metrics import ReplayMetrics, compute
from launcher.replay.trace import Trace, TraceJob
from launcher.scheduler import Scheduler
from launcher.sim.gpus import SimGpuSource
from launcher.spec import JobSpec
from launcher.store import ACTIVE, WAITING, Store

POLICIES: tuple[PolicyName, ...] = ("priority", "fifo-exclusive", "first-fit")
BASE_UID = 20_000


class VirtualClock:
    """The replay's clock: the engine and the executor read it, the loop moves it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class ReplayRun:
    metrics: ReplayMetrics
    engine: Engine
    executor: VirtualExecutor
    wall_seconds: float


def job_spec(job: TraceJob) -> JobSpec:
    """The launcher job a trace entry is submitted as (what its user would write)."""
    return JobSpec(
        name=job.name, command=["replay", job.name], gpus=job.gpus,
        gpu_fraction=job.gpu_fraction, gpu_memory_bytes=job.memory_bytes,
        urgency=job.urgency, user=job.user, project=job.project,
        checkpoint_dir=f"/replay/ckpt/{job.name}" if job.checkpoint_interval else None,
        max_retries=job.max_retries)


def config_for(policy: PolicyName, base: LauncherCoreConfig | None = None
               ) -> LauncherCoreConfig:
    base = base or LauncherCoreConfig()
    return base.model_copy(update={"policy": base.policy.model_copy(update={"name": policy})})


def replay(trace: Trace, policy: PolicyName = "priority", *,
           config: LauncherCoreConfig | None = None, tick_seconds: float = 60.0,
           horizon_windows: float = 4.0) -> ReplayRun:
    """Replay `trace` under `policy` (the rest of `config` the same for every policy).
    Stops when every job has ended and no GPU awaits release, or at
    `horizon_windows` x the trace's window."""
    wall0 = time.perf_counter()
    cfg = config_for(policy, config)
    header = trace.header
    clock = VirtualClock(0.0)
    sim = SimGpuSource(header.gpus, memory_total_bytes=header.gpu_memory_bytes)
    executor = VirtualExecutor({j.name: j for j in trace.jobs}, sim, clock,
                               cfg.engine.preempt_grace_seconds)
    engine = Engine(Store(":memory:"), Scheduler(cfg.policy), sim, executor, clock, cfg)
    users = sorted({j.user for j in trace.jobs})
    uids = {u: BASE_UID + i for i, u in enumerate(users)}
    jobs = sorted(trace.jobs, key=lambda j: (j.arrival, j.name))
    names: dict[int, str] = {}
    horizon = header.window_seconds * horizon_windows
    nxt = 0
    ticks = 0
    while True:
        now = clock.now
        while nxt < len(jobs) and jobs[nxt].arrival <= now:
            job = jobs[nxt]
            (job_id,) = engine.submit([job_spec(job)], uids[job.user], job.user)
            names[job_id] = job.name
            nxt += 1
        executor.advance()
        engine.tick()
        ticks += 1
        waiting = bool(engine.store.jobs(WAITING))
        active = bool(engine.store.jobs(ACTIVE))
        if nxt == len(jobs) and not waiting and not active and not engine.barriers:
            break
        candidates = []
        if nxt < len(jobs):
            candidates.append(jobs[nxt].arrival)
        for t in (executor.next_event(), engine.next_deadline()):
            if t is not None:
                candidates.append(t)
        if executor.pending_exits():
            candidates.append(now + 1.0)  # the kill's exit, seen a moment later
        if waiting or engine.barriers:
            candidates.append(now + tick_seconds)
        future = [t for t in candidates if t > now]
        if not future or min(future) > horizon:
            break
        clock.now = min(future)
    end = clock.now
    executor.close(end)
    started: dict[str, float | None] = {j.name: None for j in trace.jobs}
    for job_id, truth in executor.truth.items():
        if truth.starts:
            started[names[job_id]] = truth.starts[0]
    metrics = compute(policy, trace, executor.truth, intervals=executor.intervals,
                      started=started, end=end, ticks=ticks)
    return ReplayRun(metrics, engine, executor, time.perf_counter() - wall0)
