"""Replay a trace through the launcher's own Engine and Scheduler in virtual time.

A discrete-event loop: the virtual clock jumps to the next thing that happens (a job's
arrival, a run's exit or commit-and-exit, an engine timer such as a backoff end or a
preemption grace deadline) and, while jobs wait or GPUs await release, at least every
`tick_seconds` (the daemon's tick: it lets waiting jobs age and preemption thresholds
pass). Each stop is one `Engine.tick()`, exactly as the daemon does it; nothing here
schedules, places or preempts.

Each trace job is submitted at its arrival as its user would submit it (pipeline steps
with `after:` naming the ids of the steps before them). The `hand-launched` baseline is
the same engine with whole GPUs, no preemption, the most urgent level first, and a gate:
a job starts only while its owner is at the desk (the trace's people), as in a lab
without a launcher; a trace without people is refused for it (it would be first-fit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpu_audit.errors import ConfigError
from launcher import reasons as r
from launcher.config import LauncherCoreConfig, PolicyName
from launcher.engine import Engine, LauncherError
from launcher.replay.executor import VirtualExecutor
from launcher.replay.metrics import ReplayMetrics, compute
from launcher.replay.people import Presence
from launcher.replay.trace import Trace, TraceJob
from launcher.scheduler import Scheduler
from launcher.sim.gpus import SimGpuSource
from launcher.spec import JobSpec
from launcher.store import ACTIVE, WAITING, JobRecord, Store
from launcher.waiting import Gate

POLICIES: tuple[PolicyName, ...] = ("priority", "first-fit", "fifo-exclusive", "hand-launched")
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
    refused: dict[str, list[str]]  # trace jobs the engine refused, and why


def job_spec(job: TraceJob, after: list[int] | None = None) -> JobSpec:
    """The launcher job a trace entry is submitted as (what its user would write);
    `after`: the ids its pipeline's earlier steps got."""
    return JobSpec(
        name=job.name, command=["replay", job.name], gpus=job.gpus,
        gpu_fraction=job.gpu_fraction, gpu_memory_bytes=job.memory_bytes,
        urgency=job.urgency, user=job.user, project=job.project,
        checkpoint_dir=f"/replay/ckpt/{job.name}" if job.checkpoint_interval else None,
        max_retries=job.max_retries, after=list(after or []),
        # the owner's estimate: the replay gives the job's true undisturbed wall time (an
        # exact estimate, the best case for slack ordering; docs/REPLAY.md)
        deadline=job.deadline, expected_runtime=job.wall_seconds())


def presence_gate(presence: dict[str, Presence], calendar_note: Callable[[float], str],
                  ) -> Gate:
    """The hand-launched lab: a job starts only while its owner is at the desk (a user
    without a person line is always there)."""
    def gate(job: JobRecord, now: float) -> tuple[str, str] | None:
        p = presence.get(job.user)
        if p is None or p.at(now):
            return None
        back = p.next_arrival(now)
        when = f"until {calendar_note(back)}" if back is not None else "for good"
        return r.OWNER_AWAY, f"{job.user} is away {when}: nobody is there to start it"
    return gate


def presence_assumption(trace: Trace) -> str | None:
    """What the hand-launched baseline would have to assume about presence, said in
    words; None when every user of the trace has a person line (nothing assumed)."""
    users = sorted({j.user for j in trace.jobs})
    known = {p.person for p in trace.people}
    missing = [u for u in users if u not in known]
    if not missing:
        return None
    if len(missing) == len(users):
        return ("the trace has no presence windows (no `person` lines): the hand-launched "
                "baseline would replay everyone as always at the desk, i.e. first-fit on "
                "whole GPUs, not a lab launching by hand")
    return (f"{len(missing)} of {len(users)} users have no `person` line and count as "
            f"always at the desk: {', '.join(missing[:8])}"
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))


def config_for(policy: PolicyName, base: LauncherCoreConfig | None = None
               ) -> LauncherCoreConfig:
    base = base or LauncherCoreConfig()
    return base.model_copy(update={"policy": base.policy.model_copy(update={"name": policy})})


def replay(trace: Trace, policy: PolicyName = "priority", *,
           config: LauncherCoreConfig | None = None, tick_seconds: float = 60.0,
           horizon_windows: float = 4.0, assume_present: bool = False) -> ReplayRun:
    """Replay `trace` under `policy` (the rest of `config` the same for every policy).
    Stops when every job has ended and no GPU awaits release, or at
    `horizon_windows` x the trace's window.

    The hand-launched baseline needs to know when people are in: a trace without any
    presence windows is refused for it (ConfigError) unless `assume_present`, because
    replaying everyone as always present silently turns the baseline into first-fit."""
    if policy == "hand-launched" and not trace.people and not assume_present:
        raise ConfigError(trace.header.trace, [
            (presence_assumption(trace) or "") + "; add `person` lines (docs/REPLAY.md) "
            "or pass --assume-present to replay it anyway"])
    wall0 = time.perf_counter()
    cfg = config_for(policy, config)
    header = trace.header
    clock = VirtualClock(0.0)
    sim = SimGpuSource(header.gpus, memory_total_bytes=header.gpu_memory_bytes)
    executor = VirtualExecutor({j.name: j for j in trace.jobs}, sim, clock,
                               cfg.engine.preempt_grace_seconds)
    horizon = header.window_seconds * horizon_windows
    gate = None
    if policy == "hand-launched":
        calendar = trace.calendar()
        gate = presence_gate(trace.presence(horizon + 2 * 86400),
                             lambda t: calendar.local(t).strftime("%a %H:%M"))
    engine = Engine(Store(":memory:"), Scheduler(cfg.policy), sim, executor, clock, cfg,
                    gate=gate)
    days = trace.calendar()
    zones = {u: trace.zone_of(u) for u in {j.user for j in trace.jobs}}
    engine.local_time = lambda user, t: days.local(t, zones.get(user))
    users = sorted({j.user for j in trace.jobs})
    uids = {u: BASE_UID + i for i, u in enumerate(users)}
    jobs = list(trace.jobs)  # arrival order, pipeline steps after the steps they follow
    names: dict[int, str] = {}
    ids: dict[str, int] = {}
    refused: dict[str, list[str]] = {}
    nxt = 0
    ticks = 0
    while True:
        now = clock.now
        while nxt < len(jobs) and jobs[nxt].arrival <= now:
            job = jobs[nxt]
            nxt += 1
            try:
                (job_id,) = engine.submit(
                    [job_spec(job, [ids[d] for d in job.after if d in ids])],
                    uids[job.user], job.user)
            except LauncherError as exc:  # e.g. its pipeline's previous step failed
                refused[job.name] = exc.problems or [str(exc)]
                continue
            names[job_id] = job.name
            ids[job.name] = job_id
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
    failed = {names[j.id] for j in engine.store.jobs(("failed", "cancelled", "timed_out"))}
    deadlines = {names[j.id]: j.spec.deadline for j in engine.store.jobs()
                 if isinstance(j.spec.deadline, float)}
    metrics = compute(policy, trace, executor.truth, intervals=executor.intervals,
                      started=started, end=end, ticks=ticks, refused=len(refused),
                      failed=failed, deadlines=deadlines)
    return ReplayRun(metrics, engine, executor, time.perf_counter() - wall0, refused)
