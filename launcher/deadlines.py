"""Time in the launcher: deadlines, runtime estimates, slack and the joint feasibility
of a set of deadline jobs.

- `parse_deadline` / `resolve_deadline`: a spec's `deadline:` is absolute (seconds since
  the epoch, or an ISO 8601 time) or a local time of day (`"09:00"`: the next one after
  submission, in the submitter's time zone); the engine resolves it to seconds on its
  clock at submission, so the record always holds an absolute time.
- `evening_deadline`: the site's default for a job submitted in the evening without a
  deadline (`policy.evening_deadline`, off by default).
- `parse_duration`: `expected_runtime: 4h` / `90m` / `3600`.
- `history_estimate`: a runtime learned from the same user's finished runs of the same
  job name or command (the launcher's own store), the median of the newest ones.
- `runtime_estimate`: what a waiting or running job still needs and where that figure
  comes from (its reported progress, the spec, history, its max_runtime, or nothing):
  the one estimate slack, feasibility, reservations, `queue` and `status` use.
- `forecast_starts`: when each waiting job would start if the queue ran in its order,
  from the running jobs' estimated ends (what `submit` prints).
- `jointly_feasible`: which of a set of deadline jobs can ALL finish by their deadlines
  on a node of `capacity` GPUs (a fluid area test: each job at most its own GPU share,
  earliest deadline first; a job that would make the set infeasible is dropped, the
  largest first). Used by the scheduler to defer what cannot make it and by the replay
  for the ceiling its deadline figures are read against.

Pure apart from `history_estimate` (which reads the store it is given): no clock, no I/O
(`now` is always an argument).
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
import re
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.progress import Progress, estimate_remaining

if TYPE_CHECKING:
    from launcher.store import JobRecord, Store

_HHMM = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?$")
_UNIT = {"s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
MAX_SECONDS = 366 * 86400.0
# a local time: (user, clock seconds) -> the aware local time there
LocalTime = Callable[[str, float], dt.datetime]


def system_local_time(user: str, t: float) -> dt.datetime:
    """The daemon's default: the node's own time zone for every user."""
    return dt.datetime.fromtimestamp(t).astimezone()


def is_time_of_day(text: str) -> bool:
    return bool(_HHMM.match(text.strip()))


def parse_deadline(value: object) -> float | str:
    """A spec's `deadline:` as given: seconds since the epoch (a number, or an ISO 8601
    time, naive meaning the node's zone) or `HH:MM` kept as text (resolved at submit)."""
    if isinstance(value, bool):
        raise ValueError("deadline is a time (09:00, 2026-03-04T09:00+01:00 or epoch "
                         "seconds), not a boolean")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError("deadline in epoch seconds must be a positive finite number")
        return float(value)
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.astimezone()).timestamp()
    if isinstance(value, str):
        text = value.strip()
        if is_time_of_day(text):
            h, m = text.split(":")
            return f"{int(h):02d}:{m}"
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"deadline {text[:40]!r} is neither a local time (HH:MM) nor "
                             "an ISO 8601 time (2026-03-04T09:00+01:00)") from None
        return (when if when.tzinfo else when.astimezone()).timestamp()
    raise ValueError(f"deadline must be a time, not {type(value).__name__}")


def parse_duration(value: object) -> float:
    """`expected_runtime:` as seconds: a number, or `90m`, `4h`, `1.5h`, `2d`."""
    if isinstance(value, bool):
        raise ValueError("expected_runtime is a duration (4h, 90m, 3600), not a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION.match(value.strip().lower())
        if not m:
            raise ValueError(f"expected_runtime {value[:40]!r} is not a duration "
                             "(4h, 90m, 3600)")
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    else:
        raise ValueError(f"expected_runtime must be a duration, not {type(value).__name__}")
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_SECONDS:
        raise ValueError("expected_runtime must be more than 0 and at most 366 days")
    return seconds


def next_time_of_day(now: float, hhmm: str, local: dt.datetime) -> float:
    """Clock seconds of the first `hhmm` after `now`, where `local` is `now` in the
    user's zone (zone offsets are applied through UTC, so a DST change is right)."""
    h, m = (int(x) for x in hhmm.split(":"))
    for days in range(3):
        day = (local + dt.timedelta(days=days)).date()
        cand = dt.datetime(day.year, day.month, day.day, h, m, tzinfo=local.tzinfo)
        delta = (cand.astimezone(dt.UTC) - local.astimezone(dt.UTC)).total_seconds()
        if delta > 0:
            return now + delta
    raise AssertionError("unreachable: a time of day recurs within 2 days")


def resolve_deadline(value: float | str, now: float, local: dt.datetime) -> float:
    """A spec's deadline as clock seconds: absolute ones as they are, `HH:MM` the next."""
    return value if isinstance(value, float) else next_time_of_day(now, value, local)


def in_evening(local: dt.datetime, starts: str, until: str) -> bool:
    """Local time-of-day within [starts, until), through midnight when starts > until."""
    of_day = local.hour * 60 + local.minute
    a = int(starts[:2]) * 60 + int(starts[3:])
    b = int(until[:2]) * 60 + int(until[3:])
    return a <= of_day < b if a < b else (of_day >= a or of_day < b)


def evening_deadline(deadline: str | None, starts: str, now: float,
                     local: dt.datetime) -> float | None:
    """The site's default deadline for a job submitted at `now` without its own: the next
    `deadline` when submitted between `starts` and that time (the night); None when the
    policy is off or it is day."""
    if deadline is None or not in_evening(local, starts, deadline):
        return None
    return next_time_of_day(now, deadline, local)


def history_estimate(store: Store, user: str, name: str, command: Sequence[str] | str,
                     newest: int = 10, *, done: Sequence[JobRecord] | None = None,
                     ) -> tuple[float, str, int] | None:
    """(median wall seconds, source, runs) of the user's newest succeeded runs with the
    same job name (source "history:name"), else the same command ("history:command");
    None without history. `done`: the store's succeeded jobs when the caller has read
    them already (one read for a whole submission)."""
    if done is None:
        done = store.jobs(("succeeded",))
    mine = [j for j in done if j.user == user
            and j.started_at is not None and j.finished_at is not None]
    for label, same in (("name", [j for j in mine if j.spec.name == name]),
                        ("command", [j for j in mine if j.spec.command == command])):
        if same:
            runs = [(j.finished_at or 0.0) - (j.started_at or 0.0) for j in same[-newest:]]
            return statistics.median(runs), f"history:{label}", len(runs)
    return None


@dataclass(frozen=True)
class Estimate:
    """A job's runtime as the launcher estimates it. `total`: the whole run's wall
    seconds; `remaining`: what is left from the time asked (a waiting job: `total`);
    either None when nothing is known. `source`: "progress" (the job's own reported
    steps and throughput), "spec", "history:name", "history:command", "max_runtime"
    (only the limit the job is killed at) or "none"."""

    total: float | None
    remaining: float | None
    source: str

    def as_dict(self) -> dict[str, float | str | None]:
        return {"total_seconds": self.total, "remaining_seconds": self.remaining,
                "source": self.source}


def runtime_estimate(job: JobRecord, now: float) -> Estimate:
    """What `job` (waiting or running) still needs, best source first: the progress its
    current attempt reported (running jobs), the spec's estimate (the user's or the
    owner's history, as the engine stored it), else its max_runtime limit. A running job
    past its estimate without progress is taken to need until its limit (it already
    overran what was thought; the limit is the only bound left), else nothing more."""
    spec = job.spec
    ran = max(0.0, now - job.started_at) if job.started_at is not None \
        and job.state in ("running", "preempting") else None
    if ran is not None and job.progress is not None:
        p = Progress.from_dict(job.progress)
        left = estimate_remaining(p, now) if p is not None and p.attempt == job.attempt \
            else None
        # a job still running past the end its own progress promised has overrun it (or
        # reports nonsense): "ends now" forever would keep reserved GPUs idle behind it,
        # so it falls back to what the spec and its limit say
        if left is not None and left > 0:
            return Estimate(ran + left, left, "progress")
    limit = spec.max_runtime_seconds
    if spec.expected_runtime is not None:
        total = spec.expected_runtime
        source = spec.expected_runtime_source or "spec"
        if ran is None:
            return Estimate(total, total, source)
        if ran < total or limit is None:
            return Estimate(total, max(0.0, total - ran), source)
        return Estimate(limit, max(0.0, limit - ran), "max_runtime")
    if limit is not None:
        return Estimate(limit, limit if ran is None else max(0.0, limit - ran), "max_runtime")
    return Estimate(None, None, "none")


def forecast_starts(now: float, capacity: float,
                    running: Sequence[tuple[float, float]],
                    waiting: Sequence[tuple[int, float, float | None]],
                    ) -> dict[int, float | None]:
    """Estimated start of each waiting job if the queue ran in the given order on a node
    of `capacity` GPUs: `running` are (estimated end, GPUs held), `waiting` (id, GPUs,
    estimated runtime or None) in scheduling order. Each job starts at the first time
    enough GPUs are free once every job before it has started (no job overtakes one
    ahead: the forecast is what the order promises, not what backfill may add). A job
    behind one with no estimate gets None (nothing bounds when that one ends).
    Counts GPUs, not their memory: an estimate, said as one."""
    heap = [(max(now, e), g) for e, g in running]
    heapq.heapify(heap)
    free = capacity - sum(g for _, g in heap)
    out: dict[int, float | None] = {}
    t = now
    unbounded = False
    for job_id, need, est in waiting:
        if unbounded or need > capacity + 1e-9:
            out[job_id] = None
            continue
        # the order is kept, so time only moves forward: free what has ended by then
        while heap and heap[0][0] <= t:
            free += heapq.heappop(heap)[1]
        while free < need - 1e-9:
            if not heap or math.isinf(heap[0][0]):
                unbounded = True
                break
            t = heap[0][0]
            while heap and heap[0][0] <= t:
                free += heapq.heappop(heap)[1]
        if unbounded:
            out[job_id] = None
            continue
        out[job_id] = t
        if need > 0:
            free -= need
            heapq.heappush(heap, (math.inf if est is None else t + est, need))
    return out


@dataclass(frozen=True)
class DeadlineJob:
    """One job for the feasibility test: released at `release`, `work` wall seconds on
    `share` GPUs (a fraction for a fractional job), due at `deadline`."""

    key: str
    release: float
    work: float
    share: float
    deadline: float


def _fluid_edf_ok(jobs: Sequence[DeadlineJob], capacity: float) -> bool:
    """Whether every job meets its deadline under fluid earliest-deadline-first, each job
    at most its own share, the node at most `capacity`."""
    if not jobs:
        return True
    left = {j.key: j.work for j in jobs}
    events = sorted({j.release for j in jobs} | {j.deadline for j in jobs})
    t = events[0]
    order = sorted(jobs, key=lambda j: (j.deadline, j.key))
    while True:
        active = [j for j in order if j.release <= t + 1e-9 and left[j.key] > 1e-6]
        if not active:
            later = [j.release for j in order if j.release > t + 1e-9 and left[j.key] > 1e-6]
            if not later:
                return True
            t = min(later)
            continue
        room = capacity
        rates: list[tuple[DeadlineJob, float]] = []
        for j in active:
            give = min(1.0, room / j.share) if j.share > 0 else 1.0  # speed 0..1
            if give <= 1e-12:
                break
            rates.append((j, give))
            room -= give * j.share
        nxt = [e for e in events if e > t + 1e-9]
        until = min(nxt) if nxt else math.inf
        for j, give in rates:
            until = min(until, t + left[j.key] / give)
        for j, give in rates:
            left[j.key] -= give * (until - t)
        t = until
        if any(left[j.key] > 1e-6 and j.deadline <= t + 1e-9 for j in order):
            return False


def jointly_feasible(jobs: Sequence[DeadlineJob], capacity: float,
                     pinned: Collection[str] = ()) -> set[str]:
    """Keys of a large set of jobs that can all meet their deadlines together on an
    otherwise empty node: deadline order, and when adding a job breaks the set the
    largest (share x work) one is dropped (Moore-Hodgson's rule, fluid). Jobs that cannot
    make it even alone are never in it. `pinned` jobs (running ones, due no earlier than
    they can end) are never dropped: they hold their GPUs whatever the test says."""
    kept: list[DeadlineJob] = []
    for job in sorted(jobs, key=lambda j: (j.deadline, j.release, j.key)):
        if job.release + job.work > job.deadline + 1e-6 and job.key not in pinned:
            continue
        kept.append(job)
        if not _fluid_edf_ok(kept, capacity):
            free = [j for j in kept if j.key not in pinned]
            if free:
                kept.remove(max(free, key=lambda j: (j.share * j.work, j.key)))
    return {j.key for j in kept}
