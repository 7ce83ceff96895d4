"""The capacity report's what-if: the period's queue replayed through the launcher's own
replay engine (launcher/replay/run.py) with the node as it is, with idle reclaim, and
with more GPUs. A replay, not a promise: the jobs are replayed with the run times and
utilisation the store measured, arriving when they arrived; real users would have
submitted differently to a bigger node.

The trace comes from `--whatif-trace FILE`, else it is rebuilt from the first
`--launcher-state` store: each job submitted in the period, its GPU time
(allocated GPU-seconds / GPUs) as its run time, measured / allocated as its
utilisation, and a checkpoint every CHECKPOINT_S when its spec names a checkpoint_dir.

A store is read from a snapshot (`snapshot`: SQLite's online backup of it, opened
read-only, into a temporary file): never written, and a running daemon keeps going.
"""

from __future__ import annotations

import math
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from chargeback.capacity.compute import percentile
from chargeback.capacity.model import WhatIf
from launcher.config import LauncherCoreConfig
from launcher.replay.run import ReplayRun, replay
from launcher.replay.trace import GIB, Trace, TraceHeader, TraceJob, load_trace
from launcher.store import Store

MAX_GPUS = 64  # the replay engine's node (TraceHeader.gpus)
# the store keeps no checkpoint interval: a job with a checkpoint_dir is replayed as
# committing one every 10 minutes (so idle reclaim may preempt it, as the daemon would)
CHECKPOINT_S = 600.0


@contextmanager
def snapshot(path: str) -> Iterator[Store]:
    """A consistent copy of the launcher store at `path`, opened as a Store; the original
    is opened read-only and never written (a live daemon's WAL is included)."""
    with tempfile.TemporaryDirectory(prefix="capacity-store-") as tmp:
        src = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        copy = Path(tmp) / "state.db"
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst)
        finally:
            dst.close()
            src.close()
        store = Store(copy)
        try:
            yield store
        finally:
            store.close()


def trace_from_store(path: str, start: datetime, end: datetime,
                     node_gpus: int | None = None) -> Trace | None:
    """The store's jobs submitted in [start, end) as a replay trace (None: none ran)."""
    with snapshot(path) as store:
        uuids: set[str] = set()
        for kind in ("started", "resumed", "restarted"):
            for ev in store.events(kind=kind):
                gpus = ev.data.get("gpus")
                if isinstance(gpus, list):
                    uuids.update(str(g) for g in gpus)
        lo, hi = start.timestamp(), end.timestamp()
        jobs = []
        for rec in store.jobs():
            if not lo <= rec.submitted_at < hi:
                continue
            share = rec.spec.gpu_share
            runtime = rec.allocated_gpu_seconds / share if share > 0 else 0.0
            if runtime <= 0 and rec.started_at is not None and rec.finished_at is not None:
                runtime = rec.finished_at - rec.started_at
            if runtime <= 0:
                continue
            util = (min(1.0, rec.measured_gpu_seconds / rec.allocated_gpu_seconds)
                    if rec.allocated_gpu_seconds > 0 else 0.9)
            jobs.append(TraceJob(
                name=f"job-{rec.id}", arrival=rec.submitted_at - lo, user=rec.user,
                project=rec.spec.project, urgency=rec.spec.urgency or "normal",
                gpus=max(1, rec.spec.gpus) if rec.spec.gpu_fraction is None else 1,
                gpu_fraction=(rec.spec.gpu_fraction if rec.spec.gpu_fraction is not None
                              and rec.spec.gpu_fraction < 1 else None),
                memory_bytes=min(rec.spec.gpu_memory_bytes or GIB, 80 * GIB),
                runtime=runtime, util=util,
                checkpoint_interval=CHECKPOINT_S if rec.spec.checkpoint_dir else None))
    if not jobs:
        return None
    gpus = node_gpus or max(1, min(MAX_GPUS, len(uuids) or max(j.gpus for j in jobs)))
    header = TraceHeader(trace=Path(path).stem, gpus=gpus,
                         window_seconds=max(1.0, hi - lo), start=start.date())
    return Trace(header=header, jobs=tuple(sorted(jobs, key=lambda j: (j.arrival, j.name))))


def _p95_wait_h(run: ReplayRun) -> float:
    end = run.metrics.end_s
    waits = [((t.starts[0] if t.starts else end) - t.trace.arrival)
             for t in run.executor.truth.values()]
    return percentile(waits, 95) / 3600.0


def _result(name: str, run: ReplayRun) -> WhatIf:
    return WhatIf(name=name, gpus=run.metrics.gpus, p95_wait_h=_p95_wait_h(run),
                  deadline_jobs=run.metrics.night_could, deadline_met=run.metrics.night_did)


def run_whatif(trace_path: str | None, states: list[str], more: list[int],
               start: datetime, end: datetime, *, node_gpus: int | None = None
               ) -> tuple[list[WhatIf], str]:
    if trace_path is not None:
        trace: Trace | None = load_trace(Path(trace_path))
        where = f"the trace {trace_path}"
    elif states:
        trace = trace_from_store(states[0], start, end, node_gpus)
        where = f"the jobs of {states[0]} submitted in the period"
    else:
        return [], ("no replay: pass --launcher-state (the queue is rebuilt from it) or "
                    "--whatif-trace")
    if trace is None:
        return [], f"no replay: no job of {where} ran"
    base_cfg = LauncherCoreConfig()
    off = base_cfg.model_copy(update={"policy": base_cfg.policy.model_copy(
        update={"idle_reclaim": False})})
    out = [_result("baseline", replay(trace, "priority", config=off)),
           _result("idle reclaim", replay(trace, "priority", config=base_cfg))]
    capped = []
    for n in more:
        gpus = trace.header.gpus + n
        if gpus > MAX_GPUS:
            capped.append(n)
            continue
        bigger = Trace(header=trace.header.model_copy(update={"gpus": gpus}),
                       jobs=trace.jobs, people=trace.people)
        out.append(_result(f"+{n} GPUs", replay(bigger, "priority", config=off)))
    note = (f"A replay of {where} ({len(trace.jobs)} jobs, {trace.header.gpus} GPUs) through "
            "the launcher's own engine (policy priority): each job arrives when it did and "
            "runs as long and as busy as measured. Deadline jobs: those submitted 17:00-09:00 "
            "that could end by 09:00 on an empty node. Compare the replays with each other, "
            "not with the measured waits: the replay knows only these jobs, not other "
            "work on the GPUs. A replay, not a promise: users submit differently to a "
            "bigger node.")
    if capped:
        note += (f" Not replayed: +{', +'.join(map(str, capped))} GPUs (the replay engine's "
                 f"node has at most {MAX_GPUS}).")
    if any(math.isnan(x.p95_wait_h) for x in out):
        note += " Some replay had no job: its wait is not known."
    return out, note
