"""What users ask of the engine: submit, cancel, hold, release, retry. A part of the
`Engine` (its base class), apart because each request is a check of who may and what
is allowed, then one transaction; the tick never calls them.

- `submit`: a validated submission (launcher/spec.py) queued once admission
  (launcher/admission.py) finds no problem: levels its user may use, jobs that can never
  run on this node, quotas, `after` ids of the same owner that did not fail.
- `cancel`, `hold`, `release`: the owner's or an admin's.
- `retry`: a failed, timed out or cancelled job queued again with a fresh retry budget,
  with the dependents its failure cancelled (launcher/waiting.py `retry_chain`).

Refusals are exceptions whose message says why and whose `problems` list every reason;
this module never changes anything before every check has passed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from gpu_audit.errors import GpuAuditError
from launcher import reasons as r
from launcher.admission import FAILED_STATES, queued_problems, submission_problems
from launcher.config import LauncherCoreConfig
from launcher.deadlines import LocalTime, evening_deadline, history_estimate, resolve_deadline
from launcher.scheduler import Scheduler
from launcher.spec import JobSpec
from launcher.store import ACTIVE, TERMINAL, WAITING, Event, JobRecord, Store
from launcher.waiting import retry_chain

RETRYABLE = frozenset({"failed", "timed_out", "cancelled"})


class LauncherError(GpuAuditError):
    """A request the engine refuses; the message says why, `problems` lists each reason."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class PermissionDenied(LauncherError):
    """The caller may not act on this job (not theirs, and not an admin)."""


class UnknownJob(LauncherError):
    pass


class BadState(LauncherError):
    """The job is in a state where the request means nothing (e.g. release a running job)."""


class _Killer(Protocol):
    def kill_group(self, job_id: int) -> None: ...


class Requests:
    """The engine's request methods; the engine provides the attributes and the event
    and finish methods declared here."""

    store: Store
    scheduler: Scheduler
    config: LauncherCoreConfig
    clock: Callable[[], float]
    executor: _Killer
    node: dict[str, int]
    _killed_at: dict[int, float]
    local_time: LocalTime
    _estimate_sources: dict[str, str]

    def _event(self, now: float, job_id: int | None, kind: str,
               data: dict[str, Any] | None = None) -> Event:
        raise NotImplementedError

    def _finish(self, rec: JobRecord, state: str, now: float, reason: str,
                data: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    def submit(self, specs: Sequence[JobSpec], uid: int, user: str | None = None,
               is_admin: bool = False, groups: Collection[str] = ()) -> list[int]:
        """Queue a validated submission. `user` is the account of `uid` as the daemon
        resolved it from the socket's peer credentials (`groups` its groups' names); a
        spec naming another user is refused unless the caller is an admin. Refused with
        every problem (LauncherError.problems) when a job can never run here, names a
        level its user may not use, passes a quota or depends on a job it may not."""
        if not specs:
            raise LauncherError("empty submission")
        names = {s.user for s in specs if s.user is not None}
        if user is not None and names - {user} and not is_admin:
            raise PermissionDenied(f"uid {uid} ({user}) may not submit as "
                                   f"{', '.join(sorted(names - {user}))}")
        now = self.clock()
        owner = user if user is not None else (specs[0].user or str(uid))
        if is_admin and len(names) == 1 and user is not None:
            owner = next(iter(names))  # an admin submitting on someone's behalf
        # what "can never run" compares with: the GPUs the ticks have read (the daemon
        # ticks before it serves; a submission never waits on a GPU read of its own)
        policy = self.scheduler.config
        problems = submission_problems(
            specs, owner=owner, groups=groups, is_admin=is_admin, policy=policy,
            quotas=self.config.quotas, node=list(self.node.values()), store=self.store,
            projects=self.config.projects)
        if problems:
            raise LauncherError(f"the submission cannot be queued ({len(problems)} "
                                f"problem{'s' if len(problems) != 1 else ''})", problems)
        specs = [s if s.urgency is not None else
                 s.model_copy(update={"urgency": policy.default_urgency}) for s in specs]
        specs, late = self._timed(specs, owner, now)
        with self.store.transaction():
            ids = self.store.add_jobs(specs, uid, owner, now)
            for job_id, spec in zip(ids, specs, strict=True):
                detail = "submitted; waits for the next scheduling round"
                if late.get(spec.name):
                    detail = late[spec.name] + "; " + detail
                self.store.update(job_id, wait_reason=r.NEW, wait_detail=r.cut(detail))
                data: dict[str, Any] = {"name": spec.name, "user": owner,
                                        "project": spec.project, "uid": uid}
                if spec.deadline is not None:
                    data["deadline"] = spec.deadline
                if spec.expected_runtime is not None:
                    data["runtime_estimate"] = {
                        "seconds": spec.expected_runtime,
                        "source": spec.expected_runtime_source or "spec",
                        "detail": self._estimate_sources.get(spec.name, "the spec")}
                if late.get(spec.name):
                    data["warning"] = late[spec.name]
                self._event(now, job_id, "queued", data)
        return ids

    def _timed(self, specs: list[JobSpec], owner: str, now: float,
               ) -> tuple[list[JobSpec], dict[str, str]]:
        """Deadlines resolved to clock seconds (`HH:MM`: the next one in the owner's
        local time; the site's evening default for an evening submission without one)
        and, per job name, a warning when the deadline cannot be met even on an empty
        node. Such a job is accepted (it may still be worth running), the warning goes
        into its reason and the `queued` event so the user sees it at once."""
        policy = self.scheduler.config
        local = self.local_time(owner, now)
        out: list[JobSpec] = []
        late: dict[str, str] = {}
        sources = self._estimate_sources = {}
        done: list[JobRecord] | None = None  # the owner's history, read once if needed
        for given in specs:
            s = given
            # the runtime estimate every job gets (reservations and backfill need one for
            # jobs without a deadline too): the user's, else the owner's history
            if s.expected_runtime is not None:
                s = s.model_copy(update={"expected_runtime_source": "spec"})
            else:
                if done is None:
                    done = self.store.jobs(("succeeded",))
                known = history_estimate(self.store, owner, s.name, s.command, done=done)
                s = s.model_copy(update={
                    "expected_runtime": known[0] if known else None,
                    "expected_runtime_source": known[1] if known else None})
                if known is not None:
                    label = "name" if known[1] == "history:name" else "command"
                    sources[s.name] = f"history: {known[2]} run(s) of this {label}"
            deadline: float | None
            if s.deadline is not None:
                deadline = resolve_deadline(s.deadline, now, local)
            else:
                deadline = evening_deadline(policy.evening_deadline, policy.evening_starts,
                                            now, local)
            if deadline is not None:
                s = s.model_copy(update={"deadline": deadline})
                need = s.expected_runtime
                if deadline <= now:
                    late[s.name] = "DEADLINE ALREADY PASSED"
                elif need is not None and now + need > deadline:
                    late[s.name] = (f"DEADLINE CANNOT BE MET: needs ~{need / 3600:.1f} h, "
                                    f"{(deadline - now) / 3600:.1f} h left even on an empty "
                                    "node")
            out.append(s)
        return out, late

    def _owned(self, job_id: int, uid: int, is_admin: bool) -> JobRecord:
        rec = self.store.get(job_id)
        if rec is None:
            raise UnknownJob(f"no job {job_id}")
        if rec.uid != uid and not is_admin:
            raise PermissionDenied(f"job {job_id} belongs to {rec.user}; only they or an "
                                   "admin may act on it")
        return rec

    def cancel(self, job_id: int, uid: int, is_admin: bool = False) -> None:
        rec = self._owned(job_id, uid, is_admin)
        now = self.clock()
        if rec.state in TERMINAL:
            raise BadState(f"job {job_id} already ended ({rec.state})")
        if rec.state in ACTIVE:
            self.store.update(job_id, cancel_requested=True)
            self._event(now, job_id, "cancel_requested", {"by_uid": uid})
            self.executor.kill_group(job_id)
            self._killed_at[job_id] = now
            return
        self._finish(rec, "cancelled", now, f"cancelled by uid {uid}")

    def hold(self, job_id: int, uid: int, is_admin: bool = False) -> None:
        rec = self._owned(job_id, uid, is_admin)
        if rec.state not in WAITING:
            raise BadState(f"job {job_id} is {rec.state}; only a waiting job can be held")
        self.store.update(job_id, state="held")
        self._event(self.clock(), job_id, "held", {"by_uid": uid})

    def release(self, job_id: int, uid: int, is_admin: bool = False) -> None:
        rec = self._owned(job_id, uid, is_admin)
        if rec.state != "held":
            raise BadState(f"job {job_id} is {rec.state}, not held")
        self.store.update(job_id, state="queued")
        self._event(self.clock(), job_id, "released", {"by_uid": uid})

    def retry(self, job_id: int, uid: int, is_admin: bool = False) -> list[int]:
        """Queue a failed (or timed out, or cancelled) job again with a fresh retry budget,
        and with it the jobs its failure cancelled (its dependents, transitively): a
        pipeline resumes from the step that failed. The job resumes from its newest
        checkpoint if it has one, else starts over (logged `restarted`). Returns the ids
        queued, the job first."""
        rec = self._owned(job_id, uid, is_admin)
        if rec.state not in RETRYABLE:
            raise BadState(f"job {job_id} is {rec.state}; only a failed, timed out or "
                           "cancelled job can be retried")
        chain = retry_chain(self.store, rec)
        ids = {j.id for j in chain}
        outside = sorted({d for j in chain for d in j.after_ids if d not in ids})
        states = self.store.states(outside)
        failed = [d for d in outside if states.get(d) in FAILED_STATES]
        if failed:
            raise BadState(f"job {job_id} waits for job {r.listed(failed)}, which "
                           f"{states[failed[0]]}: retry that one first")
        problems = queued_problems(
            {"user": Counter({rec.user: len(chain)}),
             "project": Counter(j.project for j in chain)}, self.config.quotas, self.store)
        if problems:
            raise LauncherError(f"job {job_id} cannot be retried", problems)
        now = self.clock()
        with self.store.transaction():
            for j in chain:
                self.store.update(j.id, state="queued", failures=0, queued_at=now,
                                  submitted_at=now, backoff_until=now, finished_at=None,
                                  exit_code=None, cancel_requested=False, reason="",
                                  preempt_for=None, wait_reason=r.NEW,
                                  wait_detail="retried; waits for the next scheduling round")
                self._event(now, j.id, "retried", {
                    "by_uid": uid, "previous_state": j.state, "attempt": j.attempt,
                    "for_job": None if j.id == job_id else job_id,
                    "checkpoint_step": j.last_checkpoint_step})
        return [j.id for j in chain]

