"""A lab week whose people say when they need their work: the evening lab's shape
(launcher/replay/generate_evening.py) on a seed of its own, with deadlines as its people
would write them, drawn from a random stream of their own so the jobs are exactly those
of `generate_evening(seed)`.

- every training and its pipeline's eval: `09:00` (the next morning in the owner's time:
  the results are read at the morning meeting); a training submitted on a Friday or
  Saturday evening is due Monday 09:00 instead with a probability of one half;
- a third of the debugging runs: due 2 h after they are submitted (someone waits);
- notebooks and the rest: none.

Pure: it returns the trace; bench/bench_replay.py --write-traces writes it.
"""

from __future__ import annotations

import random

from launcher.replay.generate import Generated
from launcher.replay.generate_evening import generate_evening
from launcher.replay.people import parse_hhmm
from launcher.replay.trace import Trace, TraceJob

MORNING = parse_hhmm("09:00")


def generate_deadlines(seed: int = 2031, days: int = 7,
                       name: str = "lab-deadline-week") -> Generated:
    header, jobs, people = generate_evening(seed=seed, days=days, name=name)
    header = header.model_copy(update={"generator": "launcher.replay.generate_deadlines"})
    trace = Trace(header=header, jobs=tuple(jobs), people=tuple(people))
    calendar = trace.calendar()
    rng = random.Random(seed * 7919 + 1)  # noqa: S311 (a reproducible workload)
    by_name = {j.name: j for j in jobs}
    due: dict[str, float] = {}
    for job in jobs:
        if job.interactive:
            continue
        if job.name.startswith("train"):
            zone = trace.zone_of(job.user)
            t = calendar.next_local(job.arrival, MORNING, zone)
            weekday = calendar.local(job.arrival, zone).weekday()
            if weekday in (4, 5) and rng.random() < 0.5:  # Fri/Sat evening: Monday
                while calendar.local(t, zone).weekday() != 0:
                    t = calendar.next_local(t, MORNING, zone)
            due[job.name] = t
        elif job.name.startswith("debug") and rng.random() < 1 / 3:
            due[job.name] = job.arrival + 2 * 3600.0
    for job in jobs:  # an eval is due with the training it follows
        if job.name.startswith("eval"):
            trains = [d for d in job.after if d in due and by_name[d].name.startswith("train")]
            if trains:
                due[job.name] = max(due[d] for d in trains)
    out: list[TraceJob] = [j.model_copy(update={"deadline": due[j.name]}) if j.name in due
                           else j for j in jobs]
    return Generated(header, out, people)
