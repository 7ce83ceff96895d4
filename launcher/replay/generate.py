"""A seeded generator for a realistic week (or day) of a small lab's GPU jobs.

The shape follows what shared lab nodes see (docs/REPLAY.md): a few heavy users with
long multi-GPU training runs that checkpoint, many short experiments during working
hours (often a fraction of a GPU, data-loader bound, so low utilisation), interactive
notebooks that hold a GPU for hours at near-zero utilisation, a burst of urgent and high
jobs before a deadline, a few crashes (one out of memory) and one job that leaks its GPU
memory after exit. The same seed always gives the same trace.

Version 2 adds the people (launcher/replay/people.py), drawn from their own random
stream so the jobs stay exactly those of the first version: each user is at the desk on
working days from 08:30-10:30 to 17:30-20:00 (lab time, +01:00), and for a quarter of an
hour around every submission outside those hours (someone who submits at 03:00 was
there, or logged in, to do it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

from launcher.replay.people import Person
from launcher.replay.trace import GIB, TraceHeader, TraceJob

DAY = 86400.0
HOUR = 3600.0
LAB_TIMEZONE = "+01:00"


def presence_days(days: int) -> int:
    """Days of presence a trace of `days` days carries: past its window too, so a lab
    without a launcher can work through the backlog the window leaves."""
    return 2 * days + 7


class Generated(NamedTuple):
    header: TraceHeader
    jobs: list[TraceJob]
    people: list[Person]


@dataclass(frozen=True)
class LabShape:
    """Knobs of the generated lab (defaults: an 8 x 80 GiB node, 12 people)."""

    gpus: int = 8
    gpu_memory_bytes: int = 80 * GIB
    heavy_users: tuple[str, ...] = ("alice", "bruno", "chen")
    light_users: tuple[str, ...] = ("dana", "emil", "farah", "goran", "hana", "ivo")
    notebook_users: tuple[str, ...] = ("jun", "kira", "dana", "hana")
    deadline_project: str = "neurips"
    deadline_users: tuple[str, ...] = ("emil", "farah", "chen")
    training_per_heavy_user_per_day: float = 1.4
    experiments_per_workday: int = 26
    failures: int = 5


def _workday(day: int) -> bool:
    return day % 7 < 5  # the trace starts on a Monday


def _work_hours_arrival(rng: random.Random, day: int) -> float:
    """A time of day weighted towards working hours (9-19), some evening stragglers."""
    hour = rng.uniform(9.0, 19.0) if rng.random() < 0.85 else rng.uniform(19.0, 24.0)
    return day * DAY + hour * HOUR


def office_hours(rng: random.Random, days: int, *, arrive: tuple[float, float] = (8.5, 10.5),
                 leave: tuple[float, float] = (17.5, 20.0), weekend: float = 0.0,
                 ) -> list[tuple[float, float]]:
    """One person's presence windows (trace seconds, lab time) over `days` days: working
    days from `arrive` to `leave` (hours, drawn per day), weekend days with probability
    `weekend` for 2-5 afternoon hours."""
    out = []
    for day in range(days):
        if _workday(day):
            a, b = rng.uniform(*arrive), rng.uniform(*leave)
        elif rng.random() < weekend:
            a = rng.uniform(12.0, 15.0)
            b = a + rng.uniform(2.0, 5.0)
        else:
            continue
        out.append((round(day * DAY + a * HOUR, 1), round(day * DAY + b * HOUR, 1)))
    return out


def cover(windows: list[tuple[float, float]], arrivals: list[float],
          ) -> list[tuple[float, float]]:
    """`windows` plus a quarter of an hour from each arrival none of them covers."""
    extra = [(t, round(t + 900.0, 1)) for t in arrivals
             if not any(a <= t < b for a, b in windows)]
    return sorted(windows + extra)


def generate(seed: int = 7, days: int = 7, shape: LabShape | None = None,
             name: str | None = None) -> Generated:
    """The header and jobs of a `days`-long lab trace (the deadline falls on day 4 of a
    week, on the last day of shorter traces)."""
    shape = shape or LabShape()
    rng = random.Random(seed)  # noqa: S311 (a reproducible workload, not a secret)
    jobs: list[TraceJob] = []
    counter = 0

    def add(**kw: object) -> None:
        nonlocal counter
        counter += 1
        kw.setdefault("project", "default")
        kw["name"] = f"{kw.pop('kind')}-{counter:04d}"
        jobs.append(TraceJob.model_validate(kw))

    deadline_day = min(4, days - 1)
    for day in range(days):
        work = _workday(day)
        # Heavy users: long training runs, 1-4 GPUs (now and then all 8), checkpointing.
        for user in shape.heavy_users:
            n = rng.random() * 2 * shape.training_per_heavy_user_per_day
            for _ in range(int(n + 0.5)):
                gpus = rng.choice((1, 2, 2, 4, 4, 8) if rng.random() < 0.15 else (1, 2, 2, 4))
                add(kind="train", arrival=round(day * DAY + rng.uniform(0, DAY), 1),
                    user=user, project=f"{user}-thesis", urgency="normal", gpus=gpus,
                    memory_bytes=int(rng.uniform(40, 75) * GIB),
                    runtime=round(rng.uniform(5, 18) * HOUR, 1),
                    util=round(rng.uniform(0.85, 0.98), 2), step_seconds=2.0,
                    checkpoint_interval=1800.0, checkpoint_seconds=30.0, max_retries=3)
        # Short experiments, working hours, mostly a fraction of one GPU.
        count = shape.experiments_per_workday if work else shape.experiments_per_workday // 5
        for _ in range(count):
            user = rng.choice(shape.light_users + shape.heavy_users[:1])
            fraction = rng.choice((0.25, 0.25, 0.5, None))
            mem_gib = rng.uniform(6, 18) if fraction == 0.25 else rng.uniform(18, 38)
            if fraction is None:
                mem_gib = rng.uniform(30, 70)
            add(kind="exp", arrival=round(_work_hours_arrival(rng, day), 1), user=user,
                project=f"{user}-exp", urgency=rng.choice(("low", "normal", "normal")),
                gpus=1, gpu_fraction=fraction, memory_bytes=int(mem_gib * GIB),
                runtime=round(rng.uniform(10, 120) * 60, 1),
                util=round(rng.uniform(0.15, 0.45) if fraction else rng.uniform(0.5, 0.9), 2),
                step_seconds=0.5,
                checkpoint_interval=600.0 if rng.random() < 0.5 else None,
                checkpoint_seconds=5.0)
        # Interactive notebooks: a whole GPU held for hours at ~2 % utilisation.
        if work:
            for user in shape.notebook_users:
                if rng.random() < 0.75:
                    add(kind="nb", arrival=round(day * DAY + rng.uniform(9, 14) * HOUR, 1),
                        user=user, project=f"{user}-exp", urgency="high", gpus=1,
                        memory_bytes=int(rng.uniform(4, 12) * GIB),
                        runtime=round(rng.uniform(2, 5) * HOUR, 1), util=0.02,
                        interactive=True, max_retries=0)
        # Urgent one-offs: an evaluation someone needs before a meeting.
        if work:
            for _ in range(rng.choice((1, 2, 2, 3))):
                user = rng.choice(shape.light_users + shape.heavy_users)
                add(kind="urgent", arrival=round(_work_hours_arrival(rng, day), 1),
                    user=user, project=f"{user}-exp", urgency="urgent", gpus=1,
                    memory_bytes=int(rng.uniform(10, 30) * GIB),
                    runtime=round(rng.uniform(5, 30) * 60, 1),
                    util=round(rng.uniform(0.6, 0.95), 2), step_seconds=0.5)
        # The deadline burst: the two days before it, many high/urgent 1-2 GPU runs.
        if deadline_day - 1 <= day <= deadline_day:
            for _ in range(18):
                user = rng.choice(shape.deadline_users)
                add(kind="deadline", arrival=round(_work_hours_arrival(rng, day), 1),
                    user=user, project=shape.deadline_project,
                    urgency=rng.choice(("high", "high", "urgent")),
                    gpus=rng.choice((1, 1, 2)), memory_bytes=int(rng.uniform(20, 60) * GIB),
                    runtime=round(rng.uniform(30, 150) * 60, 1),
                    util=round(rng.uniform(0.7, 0.95), 2), step_seconds=1.0,
                    checkpoint_interval=900.0, checkpoint_seconds=10.0)

    # Failures: crash a few jobs part-way (one out of memory, one twice); one job leaks.
    candidates = [j for j in jobs if not j.interactive and j.urgency != "urgent"]
    rng.shuffle(candidates)
    picked = {j.name: i for i, j in enumerate(candidates[: shape.failures])}
    leak = next(j.name for j in candidates[shape.failures:] if j.name.startswith("exp"))
    out: list[TraceJob] = []
    for job in jobs:
        if job.name in picked:
            i = picked[job.name]
            out.append(job.model_copy(update={
                "fails_at": round(rng.uniform(0.1, 0.8), 2), "oom": i == 0,
                "fail_attempts": 2 if i == 1 else 1}))
        elif job.name == leak:
            out.append(job.model_copy(update={"leaks": True}))
        else:
            out.append(job)
    out.sort(key=lambda j: (j.arrival, j.name))
    header = TraceHeader(trace=name or ("lab-week" if days == 7 else f"lab-{days}d"),
                         gpus=shape.gpus, gpu_memory_bytes=shape.gpu_memory_bytes,
                         window_seconds=days * DAY, seed=seed,
                         generator="launcher.replay.generate", timezone=LAB_TIMEZONE)
    # the people from a stream of their own: the jobs above are those of version 1
    people_rng = random.Random(seed * 7919 + 1)  # noqa: S311 (a reproducible workload)
    people = []
    for user in sorted({j.user for j in out}):
        mine = [j.arrival for j in out if j.user == user]
        people.append(Person(person=user, present=tuple(
            cover(office_hours(people_rng, presence_days(days)), mine))))
    return Generated(header, out, people)
