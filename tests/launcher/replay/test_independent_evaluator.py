"""A second evaluator, written from the definitions in docs/REPLAY.md ("Metrics") and
nothing else of launcher/replay/metrics.py: it reads the engine's event log (queued,
started/resumed, and the events that end a run) and the trace, and recomputes the
replay's utilisation, urgent p95 wait and deadline jobs met. The two must agree; a
metric that drifts from its definition fails here."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pytest

from launcher.config import LauncherCoreConfig, PolicyConfig
from launcher.replay.run import ReplayRun, replay
from launcher.replay.trace import load_trace

pytestmark = pytest.mark.timeout(120)

DAY = Path(__file__).resolve().parents[3] / "bench" / "traces" / "lab-day.jsonl"
STARTS = ("started", "resumed", "restarted")  # restarted: an attempt without a checkpoint
ENDS = ("succeeded", "failed", "preempted", "preempt_kill", "requeued", "timed_out",
        "cancelled")


def _runs(run: ReplayRun) -> list[tuple[str, list[str], float, float]]:
    """(trace job, its GPUs, from, to) of every run, from the event log alone: a run
    starts at `started`/`resumed` (which name its GPUs) and ends at the first event after
    it that ends a run (a run still going at the end lasts until the log's end)."""
    names = {e.job_id: e.data["name"] for e in run.engine.store.events(kind="queued")}
    by_job: dict[int, list[tuple[float, str, dict[str, object]]]] = defaultdict(list)
    for e in run.engine.store.events():
        if e.job_id is not None:
            by_job[e.job_id].append((e.time, e.kind, e.data))
    end = run.metrics.end_s
    out = []
    for job_id, events in by_job.items():
        open_: tuple[float, list[str]] | None = None
        for t, kind, data in events:
            if kind in STARTS:
                gpus = data["gpus"]
                assert isinstance(gpus, list)
                open_ = (t, [str(g) for g in gpus])
            elif kind in ENDS and open_ is not None:
                out.append((names[job_id], open_[1], open_[0], t))
                open_ = None
        if open_ is not None:
            out.append((names[job_id], open_[1], open_[0], end))
    return out


def _utilisation(run: ReplayRun, trace_jobs: dict[str, float], gpus: int,
                 window: float) -> float:
    """busy GPU-seconds / available GPU-seconds over the window; a GPU's busy ratio is
    min(1, sum of its processes' utilisation). Leaks hold at 0 %: they add nothing."""
    steps: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for name, on, t0, t1 in _runs(run):
        for g in on:
            steps[g][t0] += trace_jobs[name]
            steps[g][t1] -= trace_jobs[name]
    busy = 0.0
    for deltas in steps.values():
        level, last = 0.0, 0.0
        for t in sorted(deltas):
            lo, hi = max(last, 0.0), min(t, window)
            if hi > lo:
                busy += min(1.0, max(0.0, level)) * (hi - lo)
            level += deltas[t]
            last = t
    return busy / (gpus * window)


def _p95(values: list[float]) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(0.95 * len(ordered))) - 1]


@pytest.fixture(scope="module")
def run() -> ReplayRun:
    core = LauncherCoreConfig(policy=PolicyConfig(evening_deadline="09:00"))
    return replay(load_trace(DAY), "priority", config=core)


def test_utilisation_from_the_event_log_matches_the_replay(run: ReplayRun) -> None:
    trace = load_trace(DAY)
    util = {j.name: j.util for j in trace.jobs}
    mine = _utilisation(run, util, trace.header.gpus, trace.header.window_seconds)
    assert mine == pytest.approx(run.metrics.utilisation_window, rel=1e-4)


def test_urgent_p95_wait_from_the_event_log_matches_the_replay(run: ReplayRun) -> None:
    trace = load_trace(DAY)
    urgent = {j.name for j in trace.jobs if j.urgency == "urgent"}
    queued = {e.job_id: (e.data["name"], e.time) for e in run.engine.store.events(
        kind="queued")}
    first: dict[str, float] = {}
    for e in run.engine.store.events(kind="started"):
        name, at = queued[e.job_id]
        first.setdefault(str(name), e.time - at)
    waits = [first[n] for n in urgent]
    assert len(waits) == len(urgent) > 0
    assert _p95(waits) == pytest.approx(run.metrics.wait["urgent"].p95_s, abs=1.0)


def test_deadline_jobs_met_from_the_event_log_match_the_replay(run: ReplayRun) -> None:
    """Jobs with a deadline (the evening default here), met when `succeeded` comes by
    it; trainings (>= 1 h of runtime) apart from short jobs."""
    trace = load_trace(DAY)
    runtime = {j.name: j.runtime for j in trace.jobs if not j.interactive}
    due = {e.job_id: (str(e.data["name"]), float(e.data["deadline"]))
           for e in run.engine.store.events(kind="queued") if "deadline" in e.data}
    done = {e.job_id: e.time for e in run.engine.store.events(kind="succeeded")}
    long_ = short = 0
    for job_id, (name, deadline) in due.items():
        if name not in runtime:
            continue
        met = job_id in done and done[job_id] <= deadline + 1e-6
        if runtime[name] >= 3600:
            long_ += met
        else:
            short += met
    assert due, "the evening default must have given the day's evening jobs a deadline"
    assert (long_, short) == (run.metrics.deadline_long.met, run.metrics.deadline_short.met)
