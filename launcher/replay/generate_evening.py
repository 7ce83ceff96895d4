"""A second, independently shaped lab week: people who launch their trainings before they
go home. Written from the description of the lab the seed articles speak of (10
people, 8 GPUs, overnight trainings submitted 16-19 h, debugging, idle notebooks), not
from `generate.py`'s week, and with its own seed, so the replay's claims are checked on
a second mix (docs/REPLAY.md says what each kind of job is).

- 4 students who train overnight: most working days, between 16:00 and 19:00, a pipeline
  `prep` (a quarter GPU, 15-40 min) -> `train` (1-4 GPUs, 4-13 h, checkpointing every
  30 min) -> `eval` (half a GPU, 20-45 min); now and then a second training; on some
  weekend afternoons one more.
- 4 people who debug during the day: 4-9 runs each working day, 5-40 min, half of them on
  a share of a GPU, none checkpointing.
- 2 collaborators abroad (+01:00 against the lab's +08:00) who do both in their own
  hours: their evening trainings start in the lab's night.
- notebooks opened in the morning by 4 of them, held 3-7 h at 1-3 %;
- one urgent evaluation a working day;
- failures: 2 trainings killed once by a signal (exit 137), 1 out of memory, 1 debugging
  run that crashes, 1 debugging run that leaks its GPU memory.

Each person is at the desk on working days from 08:30-10:30 to 18:00-21:00 in their own
time zone (later than their evening submission), and some weekend afternoons; every job
is submitted while its owner is there. The same seed always gives the same trace.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from launcher.replay.generate import Generated, presence_days
from launcher.replay.people import Person, TraceCalendar, parse_timezone
from launcher.replay.trace import GIB, TraceHeader, TraceJob

DAY = 86400.0
HOUR = 3600.0


@dataclass(frozen=True)
class EveningLabShape:
    gpus: int = 8
    gpu_memory_bytes: int = 80 * GIB
    trainers: tuple[str, ...] = ("mei", "tao", "yan", "rui")
    debuggers: tuple[str, ...] = ("lin", "hao", "qing", "jie")
    remote: tuple[str, ...] = ("lena", "marc")  # train and debug, in their own hours
    notebook_users: tuple[str, ...] = ("lin", "qing", "tao", "lena")
    lab_timezone: str = "+08:00"
    remote_timezone: str = "+01:00"
    start: dt.date = dt.date(2025, 3, 3)  # a Monday


def generate_evening(seed: int = 2024, days: int = 7, shape: EveningLabShape | None = None,
                     name: str = "lab-evening-week") -> Generated:
    shape = shape or EveningLabShape()
    rng = random.Random(seed)  # noqa: S311 (a reproducible workload, not a secret)
    calendar = TraceCalendar(shape.start, parse_timezone(shape.lab_timezone))
    jobs: list[TraceJob] = []
    people: list[Person] = []
    counter = 0

    def add(kind: str, **kw: object) -> str:
        nonlocal counter
        counter += 1
        job_name = f"{kind}-{counter:04d}"
        jobs.append(TraceJob.model_validate({"name": job_name, **kw}))
        return job_name

    everyone = sorted({*shape.trainers, *shape.debuggers, *shape.remote})
    for user in everyone:
        zone = parse_timezone(shape.remote_timezone if user in shape.remote
                              else shape.lab_timezone)

        def at(day: int, hour: float, zone: dt.tzinfo = zone) -> float:
            """Trace seconds of `hour` (local to the person) on lab day `day`."""
            local = dt.datetime(shape.start.year, shape.start.month, shape.start.day,
                                tzinfo=zone) + dt.timedelta(days=day, hours=hour)
            return round(calendar.seconds(local), 1)

        windows: list[tuple[float, float]] = []
        trains = user in shape.trainers or user in shape.remote
        debugs = user in shape.debuggers or user in shape.remote
        for day in range(presence_days(days)):
            weekday = (shape.start.weekday() + day) % 7
            working = weekday < 5
            if working:
                came, left = rng.uniform(8.5, 10.5), rng.uniform(18.0, 21.0)
            elif rng.random() < 0.3:
                came = rng.uniform(12.0, 15.0)
                left = came + rng.uniform(2.0, 4.0)
            else:
                continue
            in_window = day < days
            if in_window and trains and ((working and rng.random() < 0.85)
                                         or (not working and rng.random() < 0.5)):
                submit = rng.uniform(16.0, 19.0) if working else rng.uniform(came, left - 0.3)
                left = max(left, submit + rng.uniform(0.2, 0.8))
                t = at(day, submit)
                gpus = rng.choice((1, 2, 2, 4))
                prep = add("prep", arrival=t, user=user, project=f"{user}-thesis",
                           gpus=1, gpu_fraction=0.25, memory_bytes=int(rng.uniform(6, 16) * GIB),
                           runtime=round(rng.uniform(15, 40) * 60, 1),
                           util=round(rng.uniform(0.2, 0.4), 2), step_seconds=0.5,
                           max_retries=None)
                train = add("train", arrival=t, user=user, project=f"{user}-thesis",
                            after=[prep], gpus=gpus,
                            memory_bytes=int(rng.uniform(40, 75) * GIB),
                            runtime=round(rng.uniform(4, 13) * HOUR, 1),
                            util=round(rng.uniform(0.85, 0.97), 2), step_seconds=2.0,
                            checkpoint_interval=1800.0, checkpoint_seconds=30.0,
                            max_retries=None)
                add("eval", arrival=t, user=user, project=f"{user}-thesis", after=[train],
                    gpus=1, gpu_fraction=0.5, memory_bytes=int(rng.uniform(20, 38) * GIB),
                    runtime=round(rng.uniform(20, 45) * 60, 1),
                    util=round(rng.uniform(0.5, 0.8), 2), step_seconds=0.5, max_retries=None)
                if working and rng.random() < 0.3:
                    add("train", arrival=round(t + rng.uniform(60, 900), 1), user=user,
                        project=f"{user}-thesis", gpus=rng.choice((1, 1, 2)),
                        memory_bytes=int(rng.uniform(30, 70) * GIB),
                        runtime=round(rng.uniform(3, 9) * HOUR, 1),
                        util=round(rng.uniform(0.8, 0.95), 2), step_seconds=2.0,
                        checkpoint_interval=1800.0, checkpoint_seconds=30.0,
                        max_retries=None)
            if in_window and working and debugs:
                for _ in range(rng.randint(4, 9) if user in shape.debuggers
                               else rng.randint(1, 3)):
                    hour = rng.uniform(came + 0.2, left - 0.7)
                    fraction = rng.choice((0.25, 0.5, None, None))
                    mem = rng.uniform(8, 18) if fraction == 0.25 else \
                        rng.uniform(18, 38) if fraction == 0.5 else rng.uniform(20, 70)
                    add("debug", arrival=at(day, hour), user=user, project=f"{user}-dev",
                        urgency=rng.choice(("normal", "normal", "low")), gpus=1,
                        gpu_fraction=fraction, memory_bytes=int(mem * GIB),
                        runtime=round(rng.uniform(5, 40) * 60, 1),
                        util=round(rng.uniform(0.3, 0.8), 2), step_seconds=0.5,
                        max_retries=0)
            if in_window and working and user in shape.notebook_users \
                    and rng.random() < 0.7:
                add("nb", arrival=at(day, came + rng.uniform(0.1, 1.0)), user=user,
                    project=f"{user}-dev", gpus=1,
                    memory_bytes=int(rng.uniform(4, 16) * GIB),
                    runtime=round(rng.uniform(3, 7) * HOUR, 1),
                    util=round(rng.uniform(0.01, 0.03), 2), interactive=True, max_retries=0)
            windows.append((at(day, came), at(day, left)))
        people.append(Person(person=user, timezone=shape.remote_timezone
                             if user in shape.remote else None, present=tuple(windows)))

    # one urgent evaluation a working day, by someone at the desk at the time
    by_user = {p.person: p for p in people}
    for day in range(days):
        if (shape.start.weekday() + day) % 7 >= 5:
            continue
        user = rng.choice(everyone)
        window = next((w for w in by_user[user].present if day * DAY <= w[0] < (day + 1) * DAY
                       or w[0] <= day * DAY + 12 * HOUR < w[1]), None)
        if window is None:
            continue
        add("urgent", arrival=round(rng.uniform(window[0] + 600, window[1] - 1800), 1),
            user=user, project=f"{user}-dev", urgency="urgent", gpus=1,
            memory_bytes=int(rng.uniform(10, 30) * GIB),
            runtime=round(rng.uniform(10, 30) * 60, 1),
            util=round(rng.uniform(0.6, 0.95), 2), step_seconds=0.5, max_retries=0)

    # failures: two trainings killed once (exit 137), one out of memory; a debugging run
    # crashes, another leaks its GPU memory after it exits
    trainings = [j for j in jobs if j.name.startswith("train")]
    debugging = [j for j in jobs if j.name.startswith("debug")]
    rng.shuffle(trainings)
    rng.shuffle(debugging)
    changes: dict[str, dict[str, object]] = {
        trainings[0].name: {"fails_at": round(rng.uniform(0.2, 0.8), 2), "exit_code": 137},
        trainings[1].name: {"fails_at": round(rng.uniform(0.2, 0.8), 2), "exit_code": 137},
        trainings[2].name: {"fails_at": round(rng.uniform(0.2, 0.8), 2), "oom": True},
        debugging[0].name: {"fails_at": round(rng.uniform(0.2, 0.8), 2)},
        debugging[1].name: {"leaks": True},
    }
    out = [j.model_copy(update=changes[j.name]) if j.name in changes else j for j in jobs]
    out.sort(key=lambda j: (j.arrival, j.name))
    header = TraceHeader(trace=name, gpus=shape.gpus, gpu_memory_bytes=shape.gpu_memory_bytes,
                         window_seconds=days * DAY, seed=seed,
                         generator="launcher.replay.generate_evening",
                         timezone=shape.lab_timezone, start=shape.start)
    return Generated(header, out, people)
