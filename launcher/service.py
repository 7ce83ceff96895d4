"""What the daemon does with a request, and what it does around each engine tick.

`Service.handle(caller, request)` answers one protocol request for a caller the kernel
identified (launcher.peer): submit (the YAML text is validated here, every problem
listed; the engine checks the admin's policy and the node), queue (each waiting job's
priority broken into its terms and its current reason; each running job's start,
attempt, GPUs and starting priority), status, logs (own jobs only unless admin), cancel
/ hold / release / retry (the engine checks who may).
`Service.tick()` runs the engine and then reports what changed since the last tick:
lifecycle audit records (job_queued, job_started / job_resumed, job_preempted,
job_checkpoint_committed, job_finished), job-mapping files for the exporter, and
telemetry from the jobs' events files.

This module must never trust an identity from a request, and never hand a caller the
contents of a log or a job it may not see.
"""

from __future__ import annotations

import grp
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpu_audit.errors import ConfigError
from launcher import protocol
from launcher import reasons as wait_reasons
from launcher.audit import LauncherAudit
from launcher.deadlines import forecast_starts, runtime_estimate
from launcher.engine import BadState, Engine, LauncherError, PermissionDenied, UnknownJob
from launcher.executor import ProcessExecutor
from launcher.jobmap import JobMapWriter
from launcher.limits import LOG_CHUNK_BYTES
from launcher.peer import Caller
from launcher.progress import Progress, estimate_remaining, fraction
from launcher.protocol import Request
from launcher.safefs import RefusedFile
from launcher.spec import load_submission
from launcher.store import ACTIVE, TERMINAL, WAITING, Event, JobRecord, Store
from launcher.submissions import Parsed
from launcher.telemetry import Telemetry

log = logging.getLogger(__name__)

MAX_STATUS_ROWS = 5000  # `status` without an id lists at most the newest this many jobs
PRUNE_EVERY_SECONDS = 60.0
QUEUE_WAITING_ROWS = 1000  # waiting jobs one `queue` answer lists (the highest first)
STATUS_EVENTS = 200  # events (and decisions) one `status ID` answer carries: a page


class Service:
    """The engine, its store and executor, and the side outputs the daemon maintains."""

    def __init__(
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
        self._events_seen = 0
        self._next_prune = 0.0
        self._mapped: dict[int, set[int]] = {}  # job -> pids its mapping file lists
        # audit records of a job whose job_started waits for its fingerprint (the probe of
        # its interpreter runs in the background): emitted in order once it is known
        self._held: dict[int, list[tuple[str, dict[str, Any], float]]] = {}

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Recover after a restart: adopt attempts whose process group still runs, take the
        outcome of those that ended while no daemon ran from their exit-status file, and
        requeue the ones that vanished without one (killed with the node, say). Never
        starts an attempt twice: an adopted job stays running, a requeued one runs again
        only through the scheduler, with the next attempt number."""
        self._events_seen = self.store.last_event_seq()
        now = self._clock()
        for job in self.store.jobs(ACTIVE):
            if self.executor.adopt(job.id, job.attempt, job.uid):
                self.telemetry.job_started(job.id, job.name, job.user, job.project,
                                           job.attempt)
                self._mapped[job.id] = set()
                continue
            done = self.executor.finished_while_away(job.id, job.attempt, job.uid)
            if done is not None:
                self.executor.inject_exit(done)
                continue
            with self.store.transaction():
                self.store.update(job.id, state="requeued", queued_at=now, backoff_until=now,
                                  finished_at=now, preempt_signal_at=None,
                                  reason="its process was gone when the launcher restarted")
                self.store.add_event(Event(now, job.id, "requeued", {
                    "reason": "lost_on_restart", "attempt": job.attempt}))
            log.warning("job %d attempt %d was gone after the restart: requeued", job.id,
                        job.attempt)
        self._after_tick()

    def close(self) -> None:
        for job_id in list(self._held):
            self._release(job_id)
        if self.audit is not None:
            self.audit.close()
        if self.jobmap is not None:
            self.jobmap.close()
        self.executor.close()
        self.store.close()

    def tick(self) -> None:
        self.engine.tick()
        self._after_tick()

    # --- after each tick -----------------------------------------------------------------

    def _after_tick(self) -> None:
        for line in self.executor.drain_events():
            self.telemetry.job_event(line.job_id, line.doc)
        while True:
            batch = self.store.events_after(self._events_seen)
            for seq, ev in batch:
                self._events_seen = seq
                self._on_event(ev)
            if not batch:
                break
        self.telemetry.set_states(self.store.state_counts())
        counts = dict.fromkeys(_DAEMON_REASONS, 0)
        counts.update(self.store.wait_reason_counts())
        self.telemetry.set_waiting({k: n for k, n in counts.items() if k})
        self._refresh_jobmap()
        self._prune()
        for job_id in [j for j in self._held if not self.executor.fingerprint_pending(j)]:
            self._release(job_id)
        if self.audit is not None:
            self.audit.flush()  # the round's records in one spool commit

    def _prune(self) -> None:
        """Every minute: delete finished jobs past their user's count or their age
        (quotas.max_finished_jobs_per_user, finished_retention_seconds)."""
        now = self._clock()
        if now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY_SECONDS
        q = self.engine.config.quotas
        gone = self.store.prune(now, q.max_finished_jobs_per_user, q.finished_retention_seconds)
        if gone:
            log.info("deleted %d finished jobs past quotas.max_finished_jobs_per_user (%d) "
                     "or finished_retention_seconds (%g)", gone, q.max_finished_jobs_per_user,
                     q.finished_retention_seconds)

    def _release(self, job_id: int) -> None:
        """Emit the held records of `job_id`, its job_started now with its fingerprint."""
        records = self._held.pop(job_id, [])
        if self.audit is None:
            return
        fingerprint = self.executor.fingerprint(job_id) or None
        for i, (event, part, at) in enumerate(records):
            fields = {**part, "fingerprint": fingerprint} if i == 0 and fingerprint else part
            self.audit.emit(event, fields, at=at)

    def _refresh_jobmap(self) -> None:
        if self.jobmap is None:
            return
        for job_id in list(self._mapped):
            pids = self.executor.pids(job_id)
            if job_id in self.executor.running() and pids != self._mapped[job_id]:
                job = self.store.get(job_id)
                if job is not None:
                    self._mapped[job_id] = pids
                    self.jobmap.started(str(job.id), user=job.user, project=job.project,
                                        gpus=job.gpus, pids=sorted(pids),
                                        start_time=job.started_at or self._clock(),
                                        attempt=job.attempt)
        self.jobmap.sweep()

    def _on_event(self, ev: Event) -> None:
        if ev.job_id is None:
            return
        job = self.store.get(ev.job_id)
        if job is None:
            return
        d = ev.data
        if ev.kind in ("queued", "retried"):
            self._emit("job_queued", job, {"state": "queued"}, ev.time)
        elif ev.kind in ("started", "resumed", "restarted"):
            if self.audit is not None and job.id not in self._held:
                self._held[job.id] = []  # until the fingerprint is known (see _release)
            # a later attempt without a checkpoint starts over: a job_started record
            self._emit("job_resumed" if ev.kind == "resumed" else "job_started", job, {
                "attempt": d.get("attempt"), "gpus": d.get("gpus"),
                "checkpoint_step": d.get("checkpoint_step"), "state": "running"}, ev.time)
            self.telemetry.job_started(job.id, job.name, job.user, job.project,
                                       int(d.get("attempt") or job.attempt))
            self.telemetry.decision("start")
            if self.jobmap is not None:
                self._mapped[job.id] = set()
        elif ev.kind == "preempt_signal":
            self.telemetry.decision("preempt")
        elif ev.kind == "checkpoint_committed":
            self._emit("job_checkpoint_committed", job, {
                "checkpoint_step": d.get("step"), "checkpoint_time": ev.time,
                "checkpoint_path": d.get("path")}, ev.time)
        elif ev.kind == "preempted":
            self._attempt_ended(job)
            outcome = "checkpointed" if d.get("clean") else "killed"
            self.telemetry.preemption(outcome, d.get("signal_to_commit_seconds"),
                                      d.get("commit_to_exit_seconds"),
                                      float(d.get("lost_gpu_seconds") or 0.0))
            self._emit("job_preempted", job, {
                "attempt": d.get("attempt"), "exit_code": d.get("code"),
                "exit_class": "preempted", "reason": d.get("reason"),
                "signal_to_commit_seconds": d.get("signal_to_commit_seconds"),
                "commit_to_exit_seconds": d.get("commit_to_exit_seconds"),
                "lost_gpu_seconds": d.get("lost_gpu_seconds"),
                "allocated_gpu_seconds": d.get("allocated_gpu_seconds"),
                "checkpoint_step": d.get("checkpoint_step"), "state": "requeued"}, ev.time)
        elif ev.kind in ("succeeded", "failed", "cancelled", "timed_out", "requeued"):
            self._attempt_ended(job)
            if "code" not in d and ev.kind == "requeued":
                return  # requeued after a restart: no attempt outcome to report
            self.telemetry.lost(float(d.get("lost_gpu_seconds") or 0.0))
            exit_class = ev.kind if ev.kind != "requeued" else "failed"
            if d.get("kind") == "oom":
                exit_class = "oom"
            self._emit("job_finished", job, {
                "attempt": d.get("attempt"), "exit_code": d.get("code"),
                "exit_class": exit_class, "reason": d.get("reason") or None,
                "allocated_gpu_seconds": d.get("allocated_gpu_seconds"),
                "lost_gpu_seconds": d.get("lost_gpu_seconds"), "state": ev.kind}, ev.time)

    def _attempt_ended(self, job: JobRecord) -> None:
        self.telemetry.job_ended(job.id)
        if self.jobmap is not None and self._mapped.pop(job.id, None) is not None:
            self.jobmap.ended(str(job.id))

    def _emit(self, event: str, job: JobRecord, extra: Mapping[str, Any], at: float) -> None:
        if self.audit is None:
            return
        part: dict[str, Any] = {
            "id": str(job.id), "attempt": job.attempt, "user": job.user, "uid": job.uid,
            "project": job.project, "department": job.spec.department,
            "gpus": list(job.gpus) or None, "gpu_fraction": job.spec.gpu_fraction,
        }
        part.update({k: v for k, v in extra.items() if v is not None})
        if not isinstance(part.get("exit_code"), int):
            part.pop("exit_code", None)
        for key in ("signal_to_commit_seconds", "commit_to_exit_seconds", "lost_gpu_seconds",
                    "allocated_gpu_seconds"):
            if key in part:
                part[key] = max(0.0, float(part[key]))
        if not isinstance(part.get("checkpoint_step"), int) or part["checkpoint_step"] < 0:
            part.pop("checkpoint_step", None)
        if job.id in self._held:
            self._held[job.id].append((event, part, at))
            return
        self.audit.emit(event, part, at=at)

    # --- requests ------------------------------------------------------------------------

    def handle(self, caller: Caller, req: Request) -> dict[str, Any]:
        """The answer to one request (already parsed and range-checked by
        launcher.protocol.parse_request) from `caller`."""
        op = req.op
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
        if op == "retry":
            return self._retry(caller, req)
        return self._control(caller, op, req)

    def _submit(self, caller: Caller, req: Request) -> dict[str, Any]:
        """A submission read here, on the caller's thread (tests, the fuzz); the daemon
        reads them in a worker process (launcher/submissions.py) and calls
        refuse_submission / finish_submission around it."""
        refused = self.refuse_submission(caller, req)
        if refused is not None:
            return refused
        try:
            parsed = Parsed(load_submission(
                req.spec or "", source=req.path,
                levels=list(self.engine.scheduler.config.urgency_levels)), [])
        except ConfigError as exc:
            parsed = Parsed(None, list(exc.problems))
        return self.finish_submission(caller, req, parsed)

    def refuse_submission(self, caller: Caller, req: Request) -> dict[str, Any] | None:
        """The answer to a submission that is refused before it is read, else None."""
        if req.spec is None:
            return protocol.error("bad_request", "submit needs `spec`: the YAML text")
        if caller.uid == 0 and not self.executor.allow_root_jobs:
            return protocol.error("invalid", f"{req.path}: the submission is invalid", [
                "root may not submit jobs (they would run as root); submit as the user "
                "the job should run as"])
        limit = self.engine.config.quotas.max_spec_bytes
        size = len(req.spec.encode("utf-8", "surrogatepass"))
        if size > limit:
            return protocol.error("invalid", f"{req.path}: the submission is too large", [
                f"{size} bytes of YAML; at most {limit} (quotas.max_spec_bytes)"])
        return None

    def finish_submission(self, caller: Caller, req: Request,
                          parsed: Parsed) -> dict[str, Any]:
        """Queue a submission that was read (or list every problem with it)."""
        source = req.path
        if parsed.specs is None:
            return protocol.error("invalid", f"{source}: the submission is invalid",
                                  parsed.problems)
        specs = parsed.specs
        problems = [f"{s.name}: user: {s.user!r} is not you ({caller.user}); a job always "
                    "runs as the user who submits it"
                    for s in specs if s.user is not None and s.user != caller.user]
        if problems:
            return protocol.error("invalid", f"{source}: the submission is invalid", problems)
        if req.cwd:
            specs = [s if s.cwd and Path(s.cwd).is_absolute() else
                     s.model_copy(update={"cwd": str(Path(req.cwd) / (s.cwd or "."))})
                     for s in specs]
        try:
            ids = self.engine.submit(specs, uid=caller.uid, user=caller.user,
                                     is_admin=caller.admin, groups=_group_names(caller))
        except PermissionDenied as exc:
            return protocol.error("denied", str(exc))
        except LauncherError as exc:
            return protocol.error("invalid", f"{source}: {exc}", exc.problems)
        self._after_tick()
        return {"ok": True, "ids": list(ids), "names": [s.name for s in specs],
                "timing": self._timing(ids)}

    def _timing(self, ids: list[int]) -> list[dict[str, Any]]:
        """Per job: the deadline as stored, the runtime estimate and its source, the
        earliest it could end (started now, on free GPUs), the estimated start and finish
        in the daemon's current queue (`forecast`), and the submit-time warning when the
        deadline cannot be met (`submit` prints them)."""
        now = self.engine.clock()
        forecast = self._forecast(now)
        out: list[dict[str, Any]] = []
        for job_id in ids:
            rec = self.engine.store.get(job_id)
            if rec is None:
                continue
            est = runtime_estimate(rec, now)
            start = rec.started_at if rec.started_at is not None else forecast.get(job_id)
            out.append({"id": job_id, "deadline": rec.spec.deadline,
                        "estimate_seconds": est.total,
                        "estimate_source": est.source,
                        "started_at": rec.started_at,
                        "earliest_finish": (rec.started_at or now) + est.total
                        if est.total is not None else None,
                        "estimated_start": start,
                        "estimated_finish": start + est.total
                        if start is not None and est.total is not None else None,
                        "warning": rec.wait_detail.split(";")[0]
                        if rec.wait_detail.startswith("DEADLINE") else None})
        return out

    def _forecast(self, now: float) -> dict[int, float | None]:
        """Estimated start of every waiting job: the order of the newest scheduling
        decision (the jobs it did not consider after it, oldest first) run
        forward on the node's GPUs from the running jobs' estimated ends
        (launcher/deadlines.py `forecast_starts`). None where nothing bounds it."""
        engine = self.engine
        running = [(now + (e.remaining if e.remaining is not None else math.inf),
                    j.spec.gpu_share) for j in engine.store.jobs(ACTIVE)
                   for e in (runtime_estimate(j, now),)]
        waiting = {j.id: j for j in engine.store.jobs(WAITING)}
        decided = engine.last_decision.order if engine.last_decision is not None else []
        order = [i for i in decided if i in waiting]
        seen = set(order)
        # the rest (not eligible at that decision: dependencies, backoff) after them in
        # submission order: cheap on every submission, whatever the queue's length
        order += sorted((i for i in waiting if i not in seen),
                        key=lambda i: (waiting[i].submitted_at, i))
        rows = [(i, waiting[i].spec.gpu_share, runtime_estimate(waiting[i], now).total)
                for i in order]
        return forecast_starts(now, float(len(engine.node) or 0), running, rows)

    def _queue(self, caller: Caller) -> dict[str, Any]:
        del caller  # the queue is public on the node, like squeue
        rows = []
        now = self._clock()
        for job in self.store.jobs(ACTIVE):
            rows.append(_summary(job, now))
        for row in rows:
            est = row["estimate"]
            row["estimated_end"] = now + est["remaining_seconds"] \
                if est and est["remaining_seconds"] is not None else None
        view = self.engine.queue_view(now)
        forecast = self._forecast(now)
        for job, breakdown in view[:QUEUE_WAITING_ROWS]:  # the highest priorities
            row = _summary(job, now)
            row["priority"] = breakdown.as_dict()
            row["estimated_start"] = forecast.get(job.id)
            rows.append(row)
        return {"ok": True, "jobs": rows, "waiting_total": len(view)}

    def _retry(self, caller: Caller, req: Request) -> dict[str, Any]:
        job_id = req.id
        if job_id is None or self.store.get(job_id) is None:
            return protocol.error("not_found", f"no job {req.id}")
        try:
            ids = self.engine.retry(job_id, caller.uid, caller.admin)
        except LauncherError as exc:
            return _refused(exc)
        self._after_tick()
        jobs = [j for i in ids if (j := self.store.get(i)) is not None]
        return {"ok": True, "id": job_id, "ids": ids, "names": [j.name for j in jobs],
                "resumes_from_step": jobs[0].last_checkpoint_step if jobs else None}

    def _status(self, caller: Caller, req: Request) -> dict[str, Any]:
        if req.id is None:  # filtered and limited in SQL: no other user's job is loaded
            jobs = self.store.jobs_of(None if caller.admin else caller.uid, MAX_STATUS_ROWS)
            now = self._clock()
            return {"ok": True, "jobs": [_summary(j, now) for j in jobs]}
        job = self.store.get(req.id)
        if job is None:
            return protocol.error("not_found", f"no job {req.id}")
        out = _summary(job, self._clock())
        if not caller.may_act_on(job.uid):
            return {"ok": True, "job": out}  # like the queue: no spec, env or events
        total, first, events = self.store.events_page(job.id, req.events_from,
                                                      STATUS_EVENTS)
        out.update({
            "environment": job.environment,
            "spec": job.spec.model_dump(mode="json"),
            "events": [{"time": e.time, "kind": e.kind, **e.data} for e in events],
            "events_total": total, "events_from": first,
            "decisions": [{"time": t, "action": a, "breakdown": b}
                          for t, _, a, b in self.store.decisions(job.id,
                                                                 newest=STATUS_EVENTS)],
        })
        return {"ok": True, "job": out}

    def _logs(self, caller: Caller, req: Request) -> dict[str, Any]:
        job = self.store.get(req.id) if req.id is not None else None
        if job is None:
            return protocol.error("not_found", f"no job {req.id}")
        if not caller.may_act_on(job.uid):
            return protocol.error("denied", f"job {job.id} belongs to {job.user}; you may "
                                            "read the logs of your own jobs only")
        attempt = req.attempt if req.attempt is not None else max(1, job.attempt)
        try:
            data = self.executor.read_log(job.id, attempt, req.stream, owner=job.uid,
                                          offset=req.offset, size=LOG_CHUNK_BYTES)
        except RefusedFile as exc:
            log.warning("job %d attempt %d: %s log refused: %s", job.id, attempt, req.stream,
                        exc)
            return protocol.error("denied", f"job {job.id}'s {req.stream} log is not the file "
                                            f"the launcher made ({exc}): not read")
        return {"ok": True, "data": data.decode("utf-8", "replace"),
                "offset": req.offset + len(data), "attempt": attempt, "state": job.state,
                "done": job.state in TERMINAL and len(data) < LOG_CHUNK_BYTES}

    def _control(self, caller: Caller, op: str, req: Request) -> dict[str, Any]:
        job_id = req.id
        if job_id is None or self.store.get(job_id) is None:
            return protocol.error("not_found", f"no job {req.id}")
        action = {"cancel": self.engine.cancel, "hold": self.engine.hold,
                  "release": self.engine.release}[op]
        try:
            action(job_id, caller.uid, caller.admin)
        except (PermissionDenied, UnknownJob, BadState) as exc:
            return _refused(exc)
        self._after_tick()
        job = self.store.get(job_id)
        return {"ok": True, "id": job_id, "state": job.state if job else None}


def _refused(exc: LauncherError) -> dict[str, Any]:
    """The answer when the engine refuses an operation on a job."""
    if isinstance(exc, PermissionDenied):
        return protocol.error("denied", str(exc))
    if isinstance(exc, UnknownJob):
        return protocol.error("not_found", str(exc))
    if isinstance(exc, BadState):
        return protocol.error("bad_request", str(exc))
    return protocol.error("invalid", str(exc), exc.problems)


# the reason kinds a daemon can give (the hand-launched one is replay's only)
_DAEMON_REASONS = tuple(k for k in wait_reasons.KINDS if k != wait_reasons.OWNER_AWAY)


def _group_names(caller: Caller) -> list[str]:
    """The names of the caller's groups (the kernel's list: SO_PEERGROUPS)."""
    out = []
    for gid in sorted({caller.gid, *caller.groups}):
        try:
            out.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return out


def progress_summary(job: JobRecord, now: float) -> dict[str, Any] | None:
    """The job's newest progress for `queue` and `status`: step, total_steps, fraction,
    loss, steps_per_second, epoch, reported_at, attempt, and eta_seconds (only while it
    runs, from a report of its current attempt; None when it did not report what an
    estimate needs: launcher/progress.py)."""
    p = Progress.from_dict(job.progress) if job.progress is not None else None
    if p is None:
        return None
    current = job.state == "running" and p.attempt == job.attempt
    return {"step": p.step, "total_steps": p.total_steps, "fraction": fraction(p),
            "loss": p.loss, "steps_per_second": p.steps_per_second, "epoch": p.epoch,
            "reported_at": p.time, "attempt": p.attempt,
            "eta_seconds": estimate_remaining(p, now) if current else None}


def _summary(job: JobRecord, now: float) -> dict[str, Any]:
    waiting = job.state not in ACTIVE and job.state not in TERMINAL
    return {
        "progress": progress_summary(job, now),
        "id": job.id, "name": job.name, "user": job.user, "project": job.project,
        "state": job.state, "attempt": job.attempt, "gpus": job.gpus,
        "urgency": job.spec.urgency,
        "submitted_at": job.submitted_at, "queued_at": job.queued_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at, "exit_code": job.exit_code, "reason": job.reason,
        "wait_reason": job.wait_reason if waiting else None,
        "wait_detail": job.wait_detail if waiting else None,
        "start_priority": job.start_priority if job.state in ACTIVE else None,
        "last_checkpoint_step": job.last_checkpoint_step,
        "allocated_gpu_seconds": job.allocated_gpu_seconds,
        "lost_gpu_seconds": job.lost_gpu_seconds,
        # what the scheduler thinks it still needs and from where (launcher/deadlines.py)
        "estimate": None if job.state in TERMINAL else runtime_estimate(job, now).as_dict(),
        "deadline": job.spec.deadline if isinstance(job.spec.deadline, float) else None,
    }
