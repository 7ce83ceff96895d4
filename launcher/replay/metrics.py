"""Metrics of one replay, computed from the executor's ground truth (what the simulated
GPUs really did), never from the engine's own bookkeeping.

- utilisation: busy GPU-seconds / available GPU-seconds, where a GPU's busy ratio at any
  moment is min(1, sum of the utilisation of the processes on it); over the trace's
  window (the week) and over the whole replay (until the last job ended); and the
  window's utilisation as a share of the demand ceiling (launcher/replay/demand.py: the
  most any scheduler could get out of these jobs in the window);
- deadline jobs met: jobs with a deadline (the trace's, or the site's evening default as
  the engine resolved it), trainings (>= SHORT_SECONDS) apart from short jobs, and
  overnight trainings (15:00-09:00, due the next 09:00) on their own line, each against
  the jointly feasible ceiling (launcher/deadlines.py: how many could ALL make it);
- night completion (kept for comparison; it flatters itself): of the jobs submitted in
  the night (17:00-09:00, owner's time; not notebooks) that could have ended by 09:00 on
  an empty node, the share that did;
- idle-held GPU-hours: time a GPU was held by a process of ours (a job or a leak) while
  under IDLE_UTIL busy;
- queue wait: first start - arrival, per urgency class (mean, p95); a job that never
  started counts as waiting until the replay ended;
- lost GPU-seconds: work thrown away (since the newest commit) by preemption and by
  failures; delivered GPU-hours: GPU-seconds the jobs' runs held;
- fairness: Jain's index over the users' GPU-hours in the window, each divided by the
  user's max-min fair share of them given what they asked for (1 = every user got their
  fair share; raw GPU-hours would call a user who asked for little "starved").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_audit.rules import IDLE_UTILIZATION
from launcher.deadlines import DeadlineJob, jointly_feasible
from launcher.replay.demand import NIGHT_UNTIL, demand_ceiling, earliest_finish, night_deadline
from launcher.replay.executor import Interval, JobTruth
from launcher.replay.people import parse_hhmm
from launcher.replay.trace import URGENCIES, Trace

IDLE_UTIL = IDLE_UTILIZATION
HOUR = 3600.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class WaitStats:
    jobs: int
    mean_s: float
    p95_s: float
    never_started: int


@dataclass
class DeadlineFigure:
    """One group of deadline jobs: how many there are, how many could meet their
    deadline alone on an empty node, how many could ALL meet them together (the jointly
    feasible ceiling), and how many did; `missed` names the jointly feasible ones that
    did not."""

    jobs: int = 0
    alone: int = 0
    jointly: int = 0
    met: int = 0
    met_of_joint: int = 0  # met jobs that are in the jointly feasible set
    missed: list[str] = field(default_factory=list)

    @property
    def share_of_joint(self) -> float:
        """Met, as a share of the jointly feasible ceiling (NaN when it is 0)."""
        return self.met / self.jointly if self.jointly else math.nan


@dataclass
class ReplayMetrics:
    policy: str
    gpus: int
    window_s: float
    end_s: float
    utilisation_window: float
    utilisation_overall: float
    idle_held_gpu_hours: float
    busy_gpu_hours: float
    delivered_gpu_hours: float
    lost_preemption_gpu_hours: float
    lost_failure_gpu_hours: float
    preemptions: int
    jobs: int
    jobs_finished: int
    jobs_failed: int
    jobs_unfinished: int
    makespan_s: float
    wait: dict[str, WaitStats]
    fairness_jain: float
    user_share: dict[str, dict[str, float]]
    utilisation_hourly: list[float] = field(default_factory=list)
    ticks: int = 0
    demand_ceiling: float = 0.0
    night_could: int = 0  # night jobs that could have ended by 09:00
    night_did: int = 0  # ... and did
    refused: int = 0  # trace jobs the launcher refused at submission
    # jobs with a deadline (their own, or the site's evening default), by their deadline:
    # trainings (>= SHORT_SECONDS of runtime) apart from short jobs
    deadline_long: DeadlineFigure = field(default_factory=DeadlineFigure)
    deadline_short: DeadlineFigure = field(default_factory=DeadlineFigure)
    # trainings submitted in the evening or night (OVERNIGHT_FROM-09:00, owner's time,
    # every day of the week), due the next 09:00, whatever deadline the job had
    overnight: DeadlineFigure = field(default_factory=DeadlineFigure)

    @property
    def preemption_loss_ratio(self) -> float:
        if self.delivered_gpu_hours <= 0:
            return 0.0
        return self.lost_preemption_gpu_hours / self.delivered_gpu_hours

    @property
    def ceiling_share(self) -> float:
        """Utilisation over the window as a share of the demand ceiling."""
        return self.utilisation_window / self.demand_ceiling if self.demand_ceiling else 0.0

    @property
    def night_completion(self) -> float:
        return self.night_did / self.night_could if self.night_could else math.nan

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["preemption_loss_ratio"] = self.preemption_loss_ratio
        out["ceiling_share"] = self.ceiling_share
        out["night_completion"] = self.night_completion
        for key in ("deadline_long", "deadline_short", "overnight"):
            out[key]["share_of_joint"] = getattr(self, key).share_of_joint
        return out


def _gpu_profile(intervals: Iterable[Interval], end: float) -> list[tuple[float, float, int]]:
    """Step function of one GPU: (time, busy ratio from here, processes held from here)."""
    deltas: dict[float, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for iv in intervals:
        t1 = min(iv.t1, end)
        if t1 <= iv.t0:
            continue
        deltas[iv.t0][0] += iv.util
        deltas[iv.t0][1] += 1
        deltas[t1][0] -= iv.util
        deltas[t1][1] -= 1
    util, held = 0.0, 0
    steps = []
    for t in sorted(deltas):
        util += deltas[t][0]
        held += int(deltas[t][1])
        steps.append((t, min(1.0, max(0.0, util)), held))
    return steps


def _integrate(steps: list[tuple[float, float, int]], lo: float, hi: float
               ) -> tuple[float, float]:
    """(busy GPU-seconds, idle-held GPU-seconds) of one GPU within [lo, hi)."""
    busy = idle = 0.0
    for i, (t, util, held) in enumerate(steps):
        t_next = steps[i + 1][0] if i + 1 < len(steps) else hi
        a, b = max(t, lo), min(t_next, hi)
        if b <= a:
            continue
        busy += util * (b - a)
        if held > 0 and util < IDLE_UTIL:
            idle += b - a
    return busy, idle


def max_min_fair(demand: dict[str, float], total: float) -> dict[str, float]:
    """Water-filling: each user gets min(demand, level), the level set so shares sum to
    `total` (or to the whole demand where that is less)."""
    shares = {u: 0.0 for u in demand}
    left = dict(demand)
    budget = total
    while left and budget > 1e-9:
        level = budget / len(left)
        small = {u: d for u, d in left.items() if d <= level}
        if not small:
            for u in left:
                shares[u] += level
            break
        for u, d in small.items():
            shares[u] += d
            budget -= d
            del left[u]
    return shares


SHORT_SECONDS = 3600.0  # a job running less than this is a short (debug) job
OVERNIGHT_FROM = parse_hhmm("15:00")


def deadline_figure(trace: Trace, due: Mapping[str, float], finished: Mapping[str, float],
                    names: Collection[str]) -> DeadlineFigure:
    """The figure of the jobs `names` due at `due[name]` (trace seconds), finished at
    `finished[name]` (missing: never)."""
    soonest = earliest_finish(trace)
    by_name = {j.name: j for j in trace.jobs}
    cands = []
    for name in names:
        job = by_name[name]
        wall = job.wall_seconds()
        cands.append(DeadlineJob(name, soonest[name] - wall, wall, job.gpu_share,
                                 due[name]))
    joint = jointly_feasible(cands, float(trace.header.gpus))
    met = {n for n in names if n in finished and finished[n] <= due[n] + 1e-6}
    return DeadlineFigure(
        jobs=len(cands), alone=sum(1 for c in cands if c.release + c.work <= c.deadline
                                   + 1e-6),
        jointly=len(joint), met=len(met), met_of_joint=len(met & joint),
        missed=sorted(joint - met))


def deadline_figures(trace: Trace, deadlines: Mapping[str, float],
                     finished: Mapping[str, float]
                     ) -> tuple[DeadlineFigure, DeadlineFigure, DeadlineFigure]:
    """(deadline trainings, deadline short jobs, overnight trainings). Notebooks never
    count: a session is not work that completes."""
    work = [j for j in trace.jobs if not j.interactive]
    timed = [j for j in work if j.name in deadlines]
    long_ = deadline_figure(trace, deadlines, finished,
                            [j.name for j in timed if j.runtime >= SHORT_SECONDS])
    short = deadline_figure(trace, deadlines, finished,
                            [j.name for j in timed if j.runtime < SHORT_SECONDS])
    calendar = trace.calendar()
    morning: dict[str, float] = {}
    for j in work:
        if j.runtime < SHORT_SECONDS:
            continue
        zone = trace.zone_of(j.user)
        local = calendar.local(j.arrival, zone)
        of_day = local.hour * 3600 + local.minute * 60 + local.second
        if of_day >= OVERNIGHT_FROM or of_day < NIGHT_UNTIL:
            morning[j.name] = calendar.next_local(j.arrival, NIGHT_UNTIL, zone)
    overnight = deadline_figure(trace, morning, finished, list(morning))
    return long_, short, overnight


def compute(policy: str, trace: Trace, truth: dict[int, JobTruth], *,
            intervals: Sequence[Interval], started: dict[str, float | None],
            end: float, ticks: int = 0, refused: int = 0,
            failed: Collection[str] = (),
            deadlines: Mapping[str, float] | None = None) -> ReplayMetrics:
    """Metrics of one replay. `started` maps each trace job's name to its first start
    (None: never started); `end` is when the replay stopped; `failed`: the jobs the
    launcher gave up on (failed, or cancelled because a step before them failed)."""
    header = trace.header
    window = header.window_seconds
    by_gpu: dict[str, list[Interval]] = defaultdict(list)
    for iv in intervals:
        by_gpu[iv.gpu].append(iv)
    busy_w = busy_all = idle = 0.0
    hours = max(1, math.ceil(max(end, window) / HOUR))
    hourly = [0.0] * hours
    for ivs in by_gpu.values():
        steps = _gpu_profile(ivs, end)
        b, _ = _integrate(steps, 0.0, window)
        busy_w += b
        b_all, i_all = _integrate(steps, 0.0, end)
        busy_all += b_all
        idle += i_all
        for h in range(hours):
            hourly[h] += _integrate(steps, h * HOUR, (h + 1) * HOUR)[0]
    hourly = [round(x / (HOUR * header.gpus), 4) for x in hourly]

    finished = sum(1 for t in truth.values() if t.finished_at is not None)
    gave_up = len(failed)
    last_exit = max((t.exits[-1][0] for t in truth.values() if t.exits), default=0.0)

    levels = [*URGENCIES, *sorted({j.urgency for j in trace.jobs} - set(URGENCIES))]
    waits: dict[str, list[float]] = {u: [] for u in levels}
    never: dict[str, int] = dict.fromkeys(levels, 0)
    for job in trace.jobs:
        first = started.get(job.name)
        if first is None:
            never[job.urgency] += 1
            waits[job.urgency].append(max(0.0, end - job.arrival))
        else:
            waits[job.urgency].append(first - job.arrival)
    wait = {u: WaitStats(len(v), sum(v) / len(v) if v else math.nan, percentile(v, 95),
                         never[u]) for u, v in waits.items() if v}

    demand: dict[str, float] = defaultdict(float)
    for job in trace.jobs:
        if job.arrival < window:
            demand[job.user] += job.gpu_share * job.runtime
    got: dict[str, float] = defaultdict(float)
    for iv in intervals:
        if iv.leak:
            continue
        user = truth[iv.job_id].trace.user
        share = truth[iv.job_id].trace.gpu_fraction or 1.0
        got[user] += share * max(0.0, min(iv.t1, window) - max(iv.t0, 0.0))
    fair = max_min_fair(dict(demand), sum(got.values()))
    ratios = [got[u] / fair[u] for u in demand if fair[u] > 0]
    jain = (sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))) if ratios else 1.0
    total_got = sum(got.values()) or 1.0
    user_share = {u: {"share": round(got[u] / total_got, 4),
                      "fair_share": round(fair[u] / total_got, 4),
                      "ratio": round(got[u] / fair[u], 3) if fair[u] > 0 else 1.0}
                  for u in sorted(demand)}

    could, did = night_completion(trace, truth)
    done = {t.trace.name: t.finished_at for t in truth.values() if t.finished_at is not None}
    long_, short, overnight = deadline_figures(trace, deadlines or {}, done)
    return ReplayMetrics(
        policy=policy, gpus=header.gpus, window_s=window, end_s=end,
        demand_ceiling=demand_ceiling(trace), night_could=could, night_did=did,
        refused=refused,
        utilisation_window=busy_w / (header.gpus * window),
        utilisation_overall=busy_all / (header.gpus * max(end, 1e-9)),
        idle_held_gpu_hours=idle / HOUR, busy_gpu_hours=busy_all / HOUR,
        delivered_gpu_hours=sum(t.held for t in truth.values()) / HOUR,
        lost_preemption_gpu_hours=sum(t.lost_preempt for t in truth.values()) / HOUR,
        lost_failure_gpu_hours=sum(t.lost_failure for t in truth.values()) / HOUR,
        preemptions=sum(t.preemptions for t in truth.values()),
        jobs=len(trace.jobs), jobs_finished=finished, jobs_failed=gave_up,
        jobs_unfinished=len(trace.jobs) - finished - gave_up, makespan_s=last_exit,
        wait=wait, fairness_jain=jain, user_share=user_share, utilisation_hourly=hourly,
        ticks=ticks, deadline_long=long_, deadline_short=short, overnight=overnight)


def night_completion(trace: Trace, truth: dict[int, JobTruth]) -> tuple[int, int]:
    """(night jobs that could have ended by 09:00, those that did). Notebooks are left
    out: a session is not work that completes."""
    finished = {t.trace.name: t.finished_at for t in truth.values()}
    soonest = earliest_finish(trace)
    could = did = 0
    for job in trace.jobs:
        if job.interactive:
            continue
        deadline = night_deadline(trace, job)
        if deadline is None or soonest[job.name] > deadline:
            continue
        could += 1
        end = finished.get(job.name)
        did += end is not None and end <= deadline
    return could, did
