"""What the daemon does with a request, and what it does around each engine tick.

`Service.handle(caller, request)` answers one protocol request for a caller the kernel
identified (launcher.peer): submit (the YAML text is validated here, every problem
listed), queue (each waiting job's priority broken into its terms), status, logs (own
jobs only unless admin), cancel / hold / release (the engine checks who may).
`Service.tick()` runs the engine and then reports what changed since the last tick:
lifecycle audit records (job_queued, job_started / job_resumed, job_preempted,
job_checkpoint_committed, job_finished), job-mapping files for the exporter, and
telemetry from the jobs' events files.

This module must never trust an identity from a request, and never hand a caller the
contents of a log or a job it may not see.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_audit.errors import ConfigError
from launcher import protocol
from launcher.audit import LauncherAudit, environment_fingerprint
from launcher.engine import Engine, PermissionDenied
from launcher.executor import ProcessExecutor
from launcher.jobmap import JobMapWriter
from launcher.peer import Caller
from launcher.policy import priority
from launcher.spec import load_submission
from launcher.store import ACTIVE, TERMINAL, WAITING, JobRecord, Store
from launcher.telemetry import Telemetry

log = logging.getLogger(__name__)

_LOG_CHUNK = 256 * 1024
_EXIT_CLASS = {"succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled",
               "timed_out": "timed_out"}


@dataclass
class _Seen:
    state: str
    attempt: int


class Service:
    """The engine, its store and executor, and the side outputs the daemon maintains."""

    def __init__(  # noqa: PLR0913 - the daemon's parts, wired by the app layer
        self,
        engine: Engine,
        store: Store,
        executor: ProcessExecutor,
        *,
        jobmap: JobMapWriter | None,
        audit: LauncherAudit | None,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.store = store
        self.executor = executor
        self.jobmap = jobmap
        self.audit = audit
        self.telemetry = telemetry
        self._clock = clock
        self._seen: dict[int, _Seen] = {}

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Recover after a restart, and learn the jobs' states without re-announcing them."""
        self.engine.recover()
        for job in self.store.jobs():
            self._seen[job.id] = _Seen(job.state, job.attempt)
            if job.state in ACTIVE:
                self.telemetry.job_started(job.id, job.name, job.user, job.project,
                                           job.attempt)
        self._after_tick()

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()
        self.store.close()

    def tick(self) -> None:
        self.engine.tick()
        self._after_tick()

    # --- after each tick -----------------------------------------------------------------

    def _after_tick(self) -> None:
        now = self._clock()
        for ev in self.executor.drain_events():
            self.telemetry.job_event(ev.job_id, ev.doc)
            if ev.doc.get("event") == "checkpoint_committed":
                job = self.store.get(ev.job_id)
                if job is not None:
                    self._emit("job_checkpoint_committed", job, {
                        "checkpoint_step": ev.doc.get("step"),
                        "checkpoint_time": ev.doc.get("time"),
                        "checkpoint_path": ev.doc.get("path"),
                    })
        counts: dict[str, int] = {}
        for job in self.store.jobs():
            counts[job.state] = counts.get(job.state, 0) + 1
            seen = self._seen.get(job.id)
            if seen is not None and seen.state == job.state and seen.attempt == job.attempt:
                continue
            self._transition(job, seen)
            self._seen[job.id] = _Seen(job.state, job.attempt)
        self.telemetry.set_states(counts)
        if self.jobmap is not None:
            self.jobmap.sweep()
        del now

    def _transition(self, job: JobRecord, seen: _Seen | None) -> None:
        if seen is None:
            self._emit("job_queued", job, {"state": job.state})
        started = job.state in ACTIVE and (seen is None or seen.state not in ACTIVE
                                           or seen.attempt != job.attempt)
        if seen is not None and seen.state in ACTIVE and (
                job.state not in ACTIVE or seen.attempt != job.attempt):
            self._ended(job, seen)
        if started:
            self._started(job)

    def _started(self, job: JobRecord) -> None:
        pid = self.executor.pid_of(job.id)
        event = "job_resumed" if job.attempt > 1 else "job_started"
        self._emit(event, job, {
            "fingerprint": environment_fingerprint(job.spec.env),
            "checkpoint_step": job.last_checkpoint_step,
        })
        self.telemetry.job_started(job.id, job.name, job.user, job.project, job.attempt)
        if self.jobmap is not None:
            self.jobmap.started(str(job.id), user=job.user, project=job.project,
                                gpus=job.gpus, pids=[pid] if pid else [],
                                start_time=job.started_at or self._clock(),
                                attempt=job.attempt)

    def _ended(self, job: JobRecord, seen: _Seen) -> None:
        self.telemetry.job_ended(job.id)
        if self.jobmap is not None:
            self.jobmap.ended(str(job.id))
        if job.state in WAITING and job.exit_code == 75:  # noqa: PLR2004 - EXIT_PREEMPTED
            s2c, c2e = self._preempt_latencies(job)
            self.telemetry.preemption("checkpointed", s2c, c2e, job.lost_gpu_seconds)
            self._emit("job_preempted", job, {
                "signal_to_commit_seconds": s2c, "commit_to_exit_seconds": c2e,
                "lost_gpu_seconds": job.lost_gpu_seconds, "exit_code": job.exit_code,
                "exit_class": "preempted", "reason": job.preempt_reason or None,
                "checkpoint_step": job.last_checkpoint_step,
            })
            return
        if job.state in TERMINAL or job.state in WAITING:
            exit_class = _EXIT_CLASS.get(job.state, "failed")
            if job.reason and "memory" in job.reason.lower():
                exit_class = "oom"
            self._emit("job_finished", job, {
                "exit_code": job.exit_code, "exit_class": exit_class,
                "allocated_gpu_seconds": job.allocated_gpu_seconds,
                "lost_gpu_seconds": job.lost_gpu_seconds or None,
                "reason": job.reason or None,
            })
        del seen

    def _preempt_latencies(self, job: JobRecord) -> tuple[float | None, float | None]:
        sig = job.preempt_signal_at
        commit = job.last_checkpoint_time
        exit_at = job.finished_at
        s2c = commit - sig if sig is not None and commit is not None and commit >= sig \
            else None
        c2e = exit_at - commit if commit is not None and exit_at is not None and s2c \
            is not None else None
        return (max(0.0, s2c) if s2c is not None else None,
                max(0.0, c2e) if c2e is not None else None)

    def _emit(self, event: str, job: JobRecord, extra: Mapping[str, Any]) -> None:
        if self.audit is None:
            return
        part: dict[str, Any] = {
            "id": str(job.id), "attempt": job.attempt, "user": job.user, "uid": job.uid,
            "project": job.project, "department": job.spec.department,
            "gpus": list(job.gpus) or None, "gpu_fraction": job.spec.gpu_fraction,
            "state": job.state,
        }
        part.update({k: v for k, v in extra.items() if v is not None})
        self.audit.emit(event, part)

    # --- requests ------------------------------------------------------------------------

    def handle(self, caller: Caller, req: Mapping[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op not in protocol.OPS:
            return protocol.error("bad_request", f"unknown op {op!r}; one of "
                                                 f"{', '.join(sorted(protocol.OPS))}")
        if op == "ping":
            return {"ok": True, "uid": caller.uid, "user": caller.user, "admin": caller.admin}
        if op == "submit":
            return self._submit(caller, req)
        if op == "queue":
            return self._queue(caller)
        if op == "status":
            return self._status(caller, req)
        if op == "logs":
            return self._logs(caller, req)
        return self._control(caller, str(op), req)

    def _job_id(self, req: Mapping[str, Any]) -> int | None:
        raw = req.get("id")
        if isinstance(raw, bool):
            return None
        if isinstance(raw, int):
            return raw
        if isinstance(raw, str) and raw.isdigit():
            return int(raw)
        return None

    def _submit(self, caller: Caller, req: Mapping[str, Any]) -> dict[str, Any]:
        text, source = req.get("spec"), req.get("path") or "<submission>"
        if not isinstance(text, str):
            return protocol.error("bad_request", "submit needs `spec`: the YAML text")
        try:
            specs = load_submission(text, source=str(source))
        except ConfigError as exc:
            return protocol.error("invalid", f"{source}: the submission is invalid",
                                  list(exc.problems))
        problems = [f"{s.name}: user: {s.user!r} is not you ({caller.user}); a job always "
                    "runs as the user who submits it"
                    for s in specs if s.user is not None and s.user != caller.user]
        if caller.uid == 0 and not self.executor.allow_root_jobs:
            problems.append("root may not submit jobs (they would run as root); submit as "
                            "the user the job should run as")
        if problems:
            return protocol.error("invalid", f"{source}: the submission is invalid", problems)
        cwd = req.get("cwd")
        if isinstance(cwd, str) and cwd:
            specs = [s if s.cwd and Path(s.cwd).is_absolute() else
                     s.model_copy(update={"cwd": str(Path(cwd) / (s.cwd or "."))})
                     for s in specs]
        ids = self.engine.submit(specs, uid=caller.uid, user=caller.user)
        self._after_tick()
        return {"ok": True, "ids": list(ids), "names": [s.name for s in specs]}

    def _queue(self, caller: Caller) -> dict[str, Any]:
        del caller  # the queue is public on the node, like squeue
        now = self._clock()
        rows = []
        for job in self.store.jobs():
            if job.state in TERMINAL:
                continue
            row = _summary(job)
            if job.state in WAITING or job.state == "held":
                row["priority"] = priority(self.engine.policy, job, now,
                                           self.engine.ledger).as_dict()
            rows.append(row)
        return {"ok": True, "jobs": rows}

    def _status(self, caller: Caller, req: Mapping[str, Any]) -> dict[str, Any]:
        if req.get("id") is None:
            jobs = [j for j in self.store.jobs()
                    if caller.admin or j.uid == caller.uid]
            return {"ok": True, "jobs": [_summary(j) for j in jobs]}
        job_id = self._job_id(req)
        job = self.store.get(job_id) if job_id is not None else None
        if job is None:
            return protocol.error("not_found", f"no job {req.get('id')}")
        out = _summary(job)
        out.update({
            "spec": job.spec.model_dump(mode="json"),
            "events": [{"time": e.time, "kind": e.kind, **e.data}
                       for e in self.store.events(job.id)],
            "decisions": [{"time": t, "action": a, "breakdown": b}
                          for t, _, a, b in self.store.decisions(job.id)],
        })
        return {"ok": True, "job": out}

    def _logs(self, caller: Caller, req: Mapping[str, Any]) -> dict[str, Any]:
        job_id = self._job_id(req)
        job = self.store.get(job_id) if job_id is not None else None
        if job is None:
            return protocol.error("not_found", f"no job {req.get('id')}")
        if not caller.may_act_on(job.uid):
            return protocol.error("denied", f"job {job.id} belongs to {job.user}; you may "
                                            "read the logs of your own jobs only")
        attempt = req.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            attempt = max(1, job.attempt)
        stream = "err" if req.get("stream") == "err" else "out"
        out_path, err_path = self.executor.log_paths(job.id, attempt)
        path = err_path if stream == "err" else out_path
        offset = req.get("offset", 0)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            offset = 0
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(_LOG_CHUNK)
        except FileNotFoundError:
            data = b""
        return {"ok": True, "data": data.decode("utf-8", "replace"),
                "offset": offset + len(data), "attempt": attempt, "state": job.state,
                "done": job.state in TERMINAL and len(data) < _LOG_CHUNK}

    def _control(self, caller: Caller, op: str, req: Mapping[str, Any]) -> dict[str, Any]:
        job_id = self._job_id(req)
        if job_id is None or self.store.get(job_id) is None:
            return protocol.error("not_found", f"no job {req.get('id')}")
        action = {"cancel": self.engine.cancel, "hold": self.engine.hold,
                  "release": self.engine.release}[op]
        try:
            action(job_id, uid=caller.uid, admin=caller.admin)
        except PermissionDenied as exc:
            return protocol.error("denied", str(exc))
        except ValueError as exc:
            return protocol.error("bad_request", str(exc))
        self._after_tick()
        job = self.store.get(job_id)
        return {"ok": True, "id": job_id, "state": job.state if job else None}


def _summary(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id, "name": job.name, "user": job.user, "project": job.project,
        "state": job.state, "attempt": job.attempt, "gpus": job.gpus,
        "submitted_at": job.submitted_at, "started_at": job.started_at,
        "finished_at": job.finished_at, "exit_code": job.exit_code, "reason": job.reason,
        "last_checkpoint_step": job.last_checkpoint_step,
        "allocated_gpu_seconds": job.allocated_gpu_seconds,
        "lost_gpu_seconds": job.lost_gpu_seconds,
    }
