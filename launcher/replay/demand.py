"""What a trace's jobs allow at best, independent of any policy: the yardsticks the replay
metrics are read against.

- `demand_ceiling(trace)`: the most busy GPU-time any scheduler could get out of the
  jobs within the trace's window, as a share of the window's GPU-time. A fluid model:
  each job keeps its GPUs busy at its own rate (gpus x util) from its earliest start
  (its arrival, after its pipeline's earlier steps could have finished) until its work
  is done, the node never more than `gpus` busy; crashes add the work they throw away
  (since the last checkpoint, once per crashing attempt). Capacity goes first to the
  jobs with the most time left at full speed, which is what lets the most work finish
  by the window's end. It is a ceiling, not a schedule: it packs utilisation as finely
  as fluid allows (a whole-GPU job at 90 % leaves 10 % no real job could take).
- `earliest_finish(trace)`: when each job could end on an empty node (its arrival, or
  when its pipeline's earlier steps could have ended, plus its own undisturbed run).
- `night_deadline(...)`: for a job submitted in the night (17:00-09:00 in its owner's
  time zone), the 09:00 after its submission; None for a day job.

Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.replay.people import parse_hhmm
from launcher.replay.trace import Trace, TraceJob

NIGHT_FROM = parse_hhmm("17:00")
NIGHT_UNTIL = parse_hhmm("09:00")


def earliest_finish(trace: Trace) -> dict[str, float]:
    """Trace job name -> the soonest it could end on an empty node."""
    out: dict[str, float] = {}
    for job in trace.jobs:  # arrival order, pipeline steps after the ones they follow
        start = max([job.arrival, *(out.get(d, job.arrival) for d in job.after)])
        out[job.name] = start + job.wall_seconds()
    return out


def _busy_work(job: TraceJob) -> tuple[float, float]:
    """(busy GPU-seconds the job's runs must do at least, its busy rate). A run keeps its
    GPUs busy while it writes its checkpoints too, so the time is its wall time."""
    rate = job.util * (1.0 if job.gpu_fraction is not None else job.gpus)
    wall = job.wall_seconds()
    if job.fails_at is not None:
        done = job.fails_at * job.runtime
        saved = 0.0
        if job.checkpoint_interval:
            saved = math.floor(done / job.checkpoint_interval) * job.checkpoint_interval
        # the launcher's default budget when the trace leaves it (config.EngineConfig)
        retries = job.max_retries if job.max_retries is not None else 3
        attempts = min(job.fail_attempts, retries + 1)
        wall += attempts * max(0.0, job.wall_seconds(done) - job.wall_seconds(saved))
    return wall * rate, rate


@dataclass
class _Fluid:
    release: float
    left: float  # busy GPU-seconds still to do
    rate: float


def demand_ceiling(trace: Trace) -> float:
    """The share (0..1) of the window's GPU-time a perfect scheduler could keep busy."""
    window = trace.header.window_seconds
    gpus = float(trace.header.gpus)
    finish = earliest_finish(trace)
    jobs: list[_Fluid] = []
    for job in trace.jobs:
        start = max([job.arrival, *(finish.get(d, job.arrival) for d in job.after)])
        work, rate = _busy_work(job)
        if start < window and work > 0 and rate > 0:
            jobs.append(_Fluid(start, work, rate))
    jobs.sort(key=lambda f: f.release)
    t, busy, nxt = 0.0, 0.0, 0
    active: list[_Fluid] = []
    while t < window:
        while nxt < len(jobs) and jobs[nxt].release <= t:
            active.append(jobs[nxt])
            nxt += 1
        active = [f for f in active if f.left > 1e-9]
        if not active:
            if nxt >= len(jobs):
                break
            t = jobs[nxt].release
            continue
        # most time left at full speed first; each at most its own rate
        active.sort(key=lambda f: -f.left / f.rate)
        room = gpus
        rates: list[tuple[_Fluid, float]] = []
        for f in active:
            give = min(f.rate, room)
            if give <= 0:
                break
            rates.append((f, give))
            room -= give
        until = window
        if nxt < len(jobs):
            until = min(until, jobs[nxt].release)
        for f, give in rates:
            until = min(until, t + f.left / give)
        step = until - t
        for f, give in rates:
            f.left -= give * step
            busy += give * step
        t = until
    return min(1.0, busy / (gpus * window))


def night_deadline(trace: Trace, job: TraceJob) -> float | None:
    """The 09:00 (owner's time) ending the night the job was submitted in; None when it
    was submitted between 09:00 and 17:00."""
    zone = trace.zone_of(job.user)
    calendar = trace.calendar()
    local = calendar.local(job.arrival, zone)
    of_day = local.hour * 3600 + local.minute * 60 + local.second
    if NIGHT_UNTIL <= of_day < NIGHT_FROM:
        return None
    return calendar.next_local(job.arrival, NIGHT_UNTIL, zone)
