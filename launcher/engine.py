"""The launcher's state machine, shared by the daemon and by replay.

`Engine.tick()` does one round at the injected clock's `now`:
1. charge measured GPU use since the last tick (fair share) and allocated GPU-seconds;
2. take the job's reports (checkpoint committed, telemetry, anomalies) and exits;
3. classify each exit: 0 succeeded; EXIT_PREEMPTED (or any exit after a preemption
   signal) preempted -> requeued at once; past max runtime timed_out; OOM or other
   codes failed -> requeued with exponential backoff while retries remain;
4. the GPU release barrier: a GPU a job left stays out until the GpuStateSource shows no
   process of that job holding memory on it; a holder is reaped and recorded as a leak;
5. escalate preemptions past their grace (kill the process group), signal jobs past
   their max runtime, and checkpoint-and-requeue jobs whose GPU is lost or shows an XID;
6. cancel jobs whose dependency failed; schedule the eligible ones (Scheduler.decide) and
   carry out the starts, preemption signals and idle-reclaim shares, storing each
   decision's breakdown; store every waiting job's one current reason (held, its
   dependency, its backoff, a quota, or the scheduler's: resources, memory, priority,
   preemption; launcher/reasons.py).

Step 1 also tracks, per running job, since when its measured utilisation (the GPU's
utilisation times the job's share of the memory in use there) has stayed under the
policy's `idle_util_threshold`: the scheduler's idle reclaim reads it.

Requests (launcher/requests.py, a part of the engine): `submit`, `cancel`, `hold`,
`release`, `retry`.

No wall clock, no sockets, no processes: the executor, the GPU state and the clock are
injected, so replay runs a week in seconds through exactly this code. A `gate` (replay's
hand-launched baseline) may hold eligible jobs back with a reason of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from launcher import reasons as r
from launcher.admission import FAILED_STATES
from launcher.config import EngineConfig, LauncherCoreConfig
from launcher.constants import EXIT_PREEMPTED
from launcher.deadlines import LocalTime, system_local_time
from launcher.gpustate import GpuInfo, GpuStateSource
from launcher.identity import job_environment
from launcher.policy import FairShareLedger, PriorityBreakdown, priority
from launcher.progress import clean_environment, progress_of
from launcher.quota import Budget, UsageWindow
from launcher.requests import BadState, LauncherError, PermissionDenied, Requests, UnknownJob
from launcher.scheduler import Decision, Scheduler
from launcher.spec import JobSpec
from launcher.store import ACTIVE, WAITING, Event, JobRecord, Store
from launcher.waiting import Gate, classify

log = logging.getLogger("gpu_audit.launcher")

# the request errors are the engine's to callers (service, replay, tests)
__all__ = ["BadState", "Engine", "Executor", "Exit", "LauncherError", "PermissionDenied",
           "Report", "UnknownJob"]

FAILED_DEPENDENCY_STATES = FAILED_STATES


@dataclass(frozen=True)
class Exit:
    """A job's process group ended. `oom`: the executor saw a CUDA out-of-memory error or
    the kernel OOM killer; `last_checkpoint_*`: the newest commit the job reported."""

    job_id: int
    code: int
    time: float
    oom: bool = False
    last_checkpoint_time: float | None = None
    last_checkpoint_step: int | None = None


@dataclass(frozen=True)
class Report:
    """Something the job told the launcher through the helper. kind: "checkpoint" (data:
    step, global_batch, path; `time` is the commit time), "telemetry" (step, loss,
    total_steps, steps_per_second, epoch, metrics), "environment" (what the job runs:
    python, torch, cuda, ...), "anomaly" (reason)."""

    job_id: int
    time: float
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    """Runs jobs. The daemon's runs processes as the submitting user in their own process
    group; replay's simulates them."""

    def start(self, job_id: int, attempt: int, spec: JobSpec,  # noqa: PLR0917 - the contract
              gpus: list[GpuInfo], env: dict[str, str], uid: int) -> None:
        """Start attempt `attempt` of the job on `gpus` with exactly `env`, as `uid`."""

    def signal(self, job_id: int, signum: int) -> None:
        """Send `signum` to the job's process group (the preemption request)."""

    def kill_group(self, job_id: int) -> None:
        """Kill the job's whole process group (after the grace period, on cancel, to reap)."""

    def poll(self) -> list[Exit]:
        """Jobs that ended since the last poll."""

    def reports(self) -> list[Report]:
        """What jobs reported since the last call (checkpoints, telemetry, anomalies)."""

    def pids(self, job_id: int) -> set[int]:
        """Every pid the job's process group has had (still running or not): the release
        barrier looks for these on the GPUs the job held."""


@dataclass
class _Barrier:
    uuid: str
    job_id: int
    since: float
    leak_reported: bool = False
    last_reap: float = 0.0


class Engine(Requests):
    """See the module docstring. `clock` returns the current time (unix seconds; virtual
    in replay). `env_base` is the environment every job starts from."""

    executor: Executor

    def __init__(self, store: Store, scheduler: Scheduler,  # noqa: PLR0917 - the contract
                 gpus: GpuStateSource,
                 executor: Executor, clock: Callable[[], float],
                 config: LauncherCoreConfig | None = None,
                 env_base: dict[str, str] | None = None,
                 gate: Gate | None = None) -> None:
        self.store = store
        self.scheduler = scheduler
        self.gpus = gpus
        self.executor = executor
        self.clock = clock
        self.config = config or LauncherCoreConfig(policy=scheduler.config)
        self.env_base = env_base or {}
        self.ledger = FairShareLedger(scheduler.config.half_life_seconds)
        self.ledger.load(store.load_fairshare())
        self.gate = gate
        # (user, clock seconds) -> their local time: `HH:MM` deadlines and the evening
        # policy; replay maps its virtual clock onto the trace's calendar here
        self.local_time: LocalTime = system_local_time
        # GPU-hours per user and project in the quotas' sliding window (allocated)
        self.usage = UsageWindow(self.config.quotas.window_seconds)
        self.usage.load(store.load_usage(self.usage.oldest_hour(clock())))
        # the memory of every GPU seen up (uuid -> bytes): what "can never run" compares
        # a submission with
        self.node: dict[str, int] = {}
        # GPUs left by a job and not yet confirmed clean: kept in the store, so a restarted
        # daemon does not hand a GPU with a leftover process to the next job
        self.barriers = [_Barrier(u, j, t, r) for u, j, t, r in store.barriers()]
        self.last_gpus: list[GpuInfo] = []
        self.last_decision: Decision | None = None
        self._last_tick: float | None = None
        self._over_fraction: set[tuple[int, int]] = set()
        self._killed_at: dict[int, float] = {}
        self._telemetry_kept_at: dict[int, float] = {}
        self._reports_stored: dict[int, int] = {}  # job -> report events stored (cap)
        self._tick_events: list[Event] | None = None  # collecting while a tick runs
        # idle reclaim: since when each active job has been measured idle, and the
        # whole-GPU jobs re-admitted as a share of their GPU (job id -> fraction; durable
        # through their "idle_shared" events, so a restart keeps their GPU shared)
        self.idle_since: dict[int, float] = {}
        self.shared: dict[int, float] = {}
        for rec in store.jobs(ACTIVE):
            for ev in store.events(rec.id, kind="idle_shared"):
                if ev.data.get("attempt") == rec.attempt:
                    self.shared[rec.id] = float(ev.data["fraction"])

    @property
    def ec(self) -> EngineConfig:
        return self.config.engine

    def _note_node(self, gpus: Sequence[GpuInfo]) -> None:
        for g in gpus:
            if g.up and g.memory_total_bytes > 0:
                self.node[g.uuid] = max(self.node.get(g.uuid, 0), g.memory_total_bytes)

    # ----------------------------------------------------------------------------- tick

    def tick(self) -> list[Event]:
        """One round (see the module docstring); returns the events it recorded."""
        now = self.clock()
        events: list[Event] = []
        self._tick_events = events
        try:
            gpus: list[GpuInfo] | None = self.gpus.read(now)
        except Exception as exc:  # noqa: BLE001 (any source failure: do not place blind)
            log.warning("GPU state unavailable: %s", exc)
            self._event(now, None, "gpu_state_unavailable", {"error": str(exc)})
            gpus = None
        active = self.store.jobs(ACTIVE)
        if gpus is not None:
            self.last_gpus = gpus
            self._note_node(gpus)
            self._account(now, gpus, active)
        reports = self.executor.reports()
        if reports:
            with self.store.transaction():  # one commit for the round's reports
                for report in reports:
                    self._report(report)
        exits = self.executor.poll()
        for ex in exits:
            self._exit(ex)
        if exits and gpus is not None:
            # what the exits freed: the barrier and placement must see it now
            try:
                gpus = self.gpus.read(now)
                self.last_gpus = gpus
            except Exception as exc:  # noqa: BLE001
                self._event(now, None, "gpu_state_unavailable", {"error": str(exc)})
                gpus = None
        by_uuid = {g.uuid: g for g in (gpus if gpus is not None else self.last_gpus)}
        if gpus is not None:
            self._barrier(now, by_uuid)
        self._watch_running(now, by_uuid)
        self._dependencies(now)
        self._schedule(now, gpus)
        self.store.save_fairshare(self.ledger.dirty())
        self.store.add_usage(self.usage.drain())
        self._last_tick = now
        self._tick_events = None
        return events

    def _event(self, now: float, job_id: int | None, kind: str,
               data: dict[str, Any] | None = None) -> Event:
        ev = Event(now, job_id, kind, data or {})
        self.store.add_event(ev)
        if self._tick_events is not None:
            self._tick_events.append(ev)
        return ev

    # ---------------------------------------------------------------- measured usage

    def _account(self, now: float, gpus: list[GpuInfo], active: list[JobRecord]) -> None:
        ids = {rec.id for rec in active}
        for gone in [i for i in self.idle_since if i not in ids]:
            del self.idle_since[gone]
        for gone in [i for i in self.shared if i not in ids]:
            del self.shared[gone]
        if self._last_tick is None or now <= self._last_tick or not active:
            return
        dt = now - self._last_tick
        by_uuid = {g.uuid: g for g in gpus}
        threshold = self.scheduler.config.idle_util_threshold
        for rec in active:
            pids = self.executor.pids(rec.id)
            busy = 0.0
            measured = 0
            for uuid in rec.gpus:
                g = by_uuid.get(uuid)
                if g is None or not g.up:
                    continue
                mine = g.memory_of(pids)
                if mine <= 0:
                    continue
                ours = sum(used for _, used in g.processes) or mine
                util = g.utilization if g.utilization is not None else 1.0
                busy += util * mine / ours
                measured += g.utilization is not None
                if ((rec.spec.gpu_fraction is not None or rec.id in self.shared)
                        and rec.memory_bytes
                        and mine > rec.memory_bytes
                        and (rec.id, rec.attempt) not in self._over_fraction):
                    self._over_fraction.add((rec.id, rec.attempt))
                    self._event(now, rec.id, "over_fraction", {
                        "gpu": uuid, "used_bytes": mine, "admitted_bytes": rec.memory_bytes})
            # idle: every GPU of the job reports utilisation and its share is under the
            # threshold (a GPU without a utilisation reading never makes a job idle)
            if rec.state == "running" and measured == len(rec.gpus) and measured \
                    and busy / measured < threshold:
                self.idle_since.setdefault(rec.id, self._last_tick)
            else:
                self.idle_since.pop(rec.id, None)
            self.ledger.charge(now, rec.user, rec.project, busy * dt)
            self.usage.charge(now, rec.user, rec.project, dt * rec.spec.gpu_share)
            self.store.update(rec.id,
                              measured_gpu_seconds=rec.measured_gpu_seconds + busy * dt,
                              allocated_gpu_seconds=rec.allocated_gpu_seconds
                              + dt * rec.spec.gpu_share)

    # -------------------------------------------------------------- reports and exits

    def _report(self, r: Report) -> None:
        rec = self.store.get(r.job_id)
        if rec is None:
            return
        if r.kind == "checkpoint":
            step = r.data.get("step")
            if rec.state in ACTIVE:
                self.store.update(rec.id, last_checkpoint_time=r.time,
                                  last_checkpoint_step=step if isinstance(step, int) else None)
            self._store_report(rec, r, "checkpoint_committed")
        elif r.kind == "environment":
            if rec.state in ACTIVE:  # one column, replaced: a job cannot grow it
                self.store.update(rec.id, environment=clean_environment(r.data))
        elif r.kind == "telemetry":
            if rec.state in ACTIVE:  # coalesced: one row update per job per round
                p = progress_of(r.data, r.time, rec.attempt)
                if p.step is not None:
                    self.store.update(rec.id, progress=p.as_dict())
            # a report per training step would be a stored row per step: keep one a while
            kept = self._telemetry_kept_at.get(rec.id)
            if kept is None or r.time - kept >= self.ec.telemetry_event_interval_seconds:
                self._telemetry_kept_at[rec.id] = r.time
                self._store_report(rec, r, r.kind)
        else:
            self._store_report(rec, r, r.kind)

    def _store_report(self, rec: JobRecord, r: Report, kind: str) -> None:
        """Store what a job reported as its event, up to engine.max_report_events per
        job: past it, one `reports_capped` event and nothing more (its newest checkpoint
        is still kept in its record), so a job cannot grow the store without end."""
        n = self._reports_stored.get(rec.id)
        if n is None:
            n = self.store.report_event_count(rec.id)
        cap = self.ec.max_report_events
        if n < cap:
            self._event(r.time, rec.id, kind, dict(r.data))
        elif n == cap:
            self._event(r.time, rec.id, "reports_capped", {
                "limit": cap, "key": "engine.max_report_events"})
            log.warning("job %d stored %d reported events (engine.max_report_events): "
                        "its further reports are not stored", rec.id, cap)
        self._reports_stored[rec.id] = min(n + 1, cap + 1)

    def _exit(self, ex: Exit) -> None:
        rec = self.store.get(ex.job_id)
        if rec is None or rec.state not in ACTIVE:
            return  # an exit we already handled, or of a job we no longer run
        ckpt_t = rec.last_checkpoint_time
        ckpt_step = rec.last_checkpoint_step
        if ex.last_checkpoint_time is not None and (ckpt_t is None
                                                    or ex.last_checkpoint_time > ckpt_t):
            ckpt_t, ckpt_step = ex.last_checkpoint_time, ex.last_checkpoint_step
        started = rec.started_at if rec.started_at is not None else ex.time
        since = max(started, ckpt_t) if ckpt_t is not None else started
        lost = max(0.0, ex.time - since) * rec.spec.gpu_share
        base: dict[str, Any] = {"code": ex.code, "attempt": rec.attempt, "gpus": rec.gpus,
                                "runtime_seconds": ex.time - started,
                                "allocated_gpu_seconds": rec.allocated_gpu_seconds,
                                "measured_gpu_seconds": rec.measured_gpu_seconds}
        self._killed_at.pop(rec.id, None)
        with self.store.transaction():
            for uuid in rec.gpus:
                self.barriers.append(_Barrier(uuid, rec.id, ex.time))
                self.store.set_barrier(uuid, rec.id, ex.time, False)
            self.store.update(rec.id, last_checkpoint_time=ckpt_t,
                              last_checkpoint_step=ckpt_step, exit_code=ex.code)
            if rec.cancel_requested:
                self._finish(rec, "cancelled", ex.time, "cancelled while running", base)
            elif ex.code == 0:
                self._finish(rec, "succeeded", ex.time, "", base)
            elif rec.preempt_reason == "timeout":
                self._finish(rec, "timed_out", ex.time,
                             f"ran past max_runtime_seconds={rec.spec.max_runtime_seconds:g}",
                             {**base, "lost_gpu_seconds": lost})
                self.store.update(rec.id, lost_gpu_seconds=rec.lost_gpu_seconds + lost)
            elif ex.code == EXIT_PREEMPTED or rec.state == "preempting":
                self._preempted(rec, ex, ckpt_t, ckpt_step, lost, base)
            else:
                self._failed(rec, ex, lost, base)

    def _preempted(self, rec: JobRecord, ex: Exit, ckpt_t: float | None,  # noqa: PLR0917
                   ckpt_step: int | None, lost: float, base: dict[str, Any]) -> None:
        sig = rec.preempt_signal_at
        committed_after_signal = sig is not None and ckpt_t is not None and ckpt_t >= sig
        data = {**base, "reason": rec.preempt_reason or "exit code 75",
                "for_job": rec.preempt_for, "clean": ex.code == EXIT_PREEMPTED,
                "checkpoint_step": ckpt_step, "lost_gpu_seconds": lost,
                "signal_to_commit_seconds": (ckpt_t - sig) if committed_after_signal
                and ckpt_t is not None and sig is not None else None,
                "commit_to_exit_seconds": (ex.time - ckpt_t) if committed_after_signal
                and ckpt_t is not None else None,
                "signal_to_exit_seconds": (ex.time - sig) if sig is not None else None}
        self.store.update(rec.id, state="requeued", queued_at=ex.time, backoff_until=ex.time,
                          finished_at=ex.time, lost_gpu_seconds=rec.lost_gpu_seconds + lost,
                          preempt_signal_at=None, reason=f"preempted ({data['reason']})")
        self._event(ex.time, rec.id, "preempted", data)

    def _failed(self, rec: JobRecord, ex: Exit, lost: float, base: dict[str, Any]) -> None:
        kind = "oom" if ex.oom else "failed"
        failures = rec.failures + 1
        budget = self.retry_budget(rec, ex)
        data = {**base, "kind": kind, "failures": failures, "lost_gpu_seconds": lost,
                "retry_budget": budget}
        self.store.update(rec.id, failures=failures,
                          lost_gpu_seconds=rec.lost_gpu_seconds + lost)
        if failures <= budget:
            delay = min(self.ec.backoff_max_seconds,
                        self.ec.backoff_base_seconds * 2 ** (failures - 1))
            self.store.update(rec.id, state="requeued", queued_at=ex.time,
                              backoff_until=ex.time + delay, finished_at=ex.time,
                              reason=f"{kind} (exit {ex.code}); retry {failures} of "
                                     f"{budget} after {delay:g}s")
            self._event(ex.time, rec.id, "requeued", {**data, "backoff_seconds": delay})
        else:
            reason = "out of GPU memory" if ex.oom else f"exit code {ex.code}"
            if budget:
                reason += f" (after {budget} retries)"
            self._finish(rec, "failed", ex.time, reason, data)

    def retry_budget(self, rec: JobRecord, ex: Exit) -> int:
        """Retries a failure like `ex` gets: the spec's max_retries; else, for a job that
        checkpoints, engine.checkpoint_retries when a signal killed it (exit code above
        128, the shell's 128 + signal) or it ran out of memory (nothing is lost but the
        work since its newest checkpoint); else none."""
        if rec.spec.max_retries is not None:
            return rec.spec.max_retries
        if rec.spec.checkpoint_dir and (ex.oom or ex.code > 128 or ex.code < 0):
            return self.ec.checkpoint_retries
        return 0

    def _finish(self, rec: JobRecord, state: str, now: float, reason: str,
                data: dict[str, Any] | None = None) -> None:
        self.store.update(rec.id, state=state, finished_at=now, reason=reason,
                          preempt_signal_at=None)
        self._event(now, rec.id, state, {**(data or {}), "reason": reason})

    # ----------------------------------------------------------------- release barrier

    def _barrier(self, now: float, by_uuid: dict[str, GpuInfo]) -> None:
        keep: list[_Barrier] = []
        for b in self.barriers:
            g = by_uuid.get(b.uuid)
            if g is None or not g.up:
                keep.append(b)  # cannot confirm on a GPU we cannot read: stays out
                continue
            pids = self.executor.pids(b.job_id)
            holders = [(pid, used) for pid, used in g.processes if pid in pids and used > 0]
            if not holders:
                if b.leak_reported:
                    self._event(now, b.job_id, "leak_cleared",
                                {"gpu": b.uuid, "after_seconds": now - b.since})
                self.store.clear_barrier(b.uuid, b.job_id)
                continue
            if not b.leak_reported:
                b.leak_reported = True
                self.store.set_barrier(b.uuid, b.job_id, b.since, True)
                self._event(now, b.job_id, "leak", {
                    "gpu": b.uuid, "pids": [p for p, _ in holders],
                    "bytes": sum(u for _, u in holders)})
            if now - b.last_reap >= self.ec.release_timeout_seconds or b.last_reap == 0.0:
                b.last_reap = now
                self.executor.kill_group(b.job_id)
            keep.append(b)
        self.barriers = keep

    @property
    def blocked_gpus(self) -> set[str]:
        return {b.uuid for b in self.barriers}

    # ----------------------------------------------------------- watching running jobs

    def _signal(self, rec: JobRecord, now: float, reason: str, for_job: int | None) -> None:
        self.store.update(rec.id, state="preempting", preempt_signal_at=now,
                          preempt_reason=reason, preempt_for=for_job)
        self.executor.signal(rec.id, rec.spec.signum)
        self._event(now, rec.id, "preempt_signal", {
            "reason": reason, "for_job": for_job, "signal": rec.spec.preempt_signal,
            "grace_seconds": self.ec.preempt_grace_seconds,
            "uncheckpointed_gpu_seconds": rec.uncheckpointed_gpu_seconds(now)})

    def _watch_running(self, now: float, by_uuid: dict[str, GpuInfo]) -> None:
        grace = self.ec.preempt_grace_seconds
        for rec in self.store.jobs(ACTIVE):
            if rec.state == "preempting" and rec.preempt_signal_at is not None:
                killed = self._killed_at.get(rec.id)
                if now >= rec.preempt_signal_at + grace and (
                        killed is None or now - killed >= grace):
                    self._killed_at[rec.id] = now
                    self.executor.kill_group(rec.id)
                    self._event(now, rec.id, "preempt_kill", {
                        "after_seconds": now - rec.preempt_signal_at})
                continue
            if rec.state != "running" or rec.cancel_requested:
                continue
            limit = rec.spec.max_runtime_seconds
            if limit is not None and rec.started_at is not None \
                    and now - rec.started_at >= limit:
                self._signal(rec, now, "timeout", None)
                continue
            bad = [u for u in rec.gpus if u in by_uuid and (
                not by_uuid[u].up or by_uuid[u].recent_xid)]
            if bad:
                what = "lost" if any(not by_uuid[u].up for u in bad) else "XID"
                self._signal(rec, now, f"gpu_{what.lower()}", None)
                self._event(now, rec.id, "gpu_fault", {"gpus": bad, "fault": what})

    # -------------------------------------------------------------------- dependencies

    def _dependencies(self, now: float) -> None:
        changed = True
        while changed:
            changed = False
            waiting = self.store.jobs((*WAITING, "held"), with_dependencies=True)
            deps = self.store.states(i for j in waiting for i in j.after_ids)
            for j in waiting:
                bad = [i for i in j.after_ids if deps.get(i) in FAILED_DEPENDENCY_STATES]
                if bad:
                    self._finish(j, "cancelled", now,
                                 f"dependency job {bad[0]} {deps[bad[0]]}",
                                 {"dependency": bad[0]})
                    changed = True

    def eligible(self, now: float) -> list[JobRecord]:
        """Waiting jobs that may start now: backoff over, every dependency succeeded."""
        return classify(self.store, now, self.store.jobs(WAITING), self.gate)[0]

    # ---------------------------------------------------------------------- scheduling

    def _schedule(self, now: float, gpus: list[GpuInfo] | None) -> None:
        waiting = self.store.jobs((*WAITING, "held"))
        if not waiting:
            return
        queued, why = classify(self.store, now, waiting, self.gate)
        running = self.store.jobs(ACTIVE)
        if not queued or gpus is None:
            if gpus is None:  # the GPU state could not be read: no decision this round
                why.update({j.id: (r.RESOURCES, "the GPU state could not be read; "
                                   "nothing starts until it can") for j in queued})
            self._set_reasons(waiting, why)
            return
        d = self.scheduler.decide(now, queued, running, gpus, self.ledger, self.blocked_gpus,
                                  idle=self.idle_since, shared=self.shared,
                                  budget=Budget(self.config.quotas, self.usage, running, now))
        self.last_decision = d
        why.update(d.waits)
        started = {job_id for job_id, _ in d.starts}
        self._set_reasons([j for j in waiting if j.id not in started], why)
        by_id = {j.id: j for j in queued}
        by_uuid = {g.uuid: g for g in gpus}
        for position, (job_id, uuids) in enumerate(d.starts):
            rec = by_id[job_id]
            bd = d.breakdowns.get(job_id)
            self.store.add_decision(now, job_id, "start", {
                "policy": self.scheduler.config.name, "gpus": uuids,
                "memory_bytes": d.memory.get(job_id), "position": position,
                **(bd.as_dict() if bd is not None else {})})
            self._start(rec, [by_uuid[u] for u in uuids], d.memory.get(job_id), now,
                        bd.total if bd is not None else None)
        running_by_id = {j.id: j for j in running}
        for job_id, fraction, memory in d.shares:
            rec = running_by_id[job_id]
            self.shared[job_id] = fraction
            self.store.update(job_id, memory_bytes=memory)
            data = {"reason": "idle_reclaim", "attempt": rec.attempt, "fraction": fraction,
                    "memory_bytes": memory, "gpus": rec.gpus,
                    "idle_seconds": d.idle_seconds.get(job_id)}
            self.store.add_decision(now, job_id, "share", data)
            self._event(now, job_id, "idle_shared", data)
        for victim_id, for_id in d.preemptions:
            victim = running_by_id[victim_id]
            vb, wb = d.breakdowns.get(victim_id), d.breakdowns.get(for_id)
            reason = d.preempt_reasons.get(victim_id, "priority")
            self.store.add_decision(now, victim_id, "preempt", {
                "for_job": for_id, "reason": reason, "victim": vb.as_dict() if vb else None,
                "waiter": wb.as_dict() if wb else None,
                "idle_seconds": d.idle_seconds.get(victim_id),
                "uncheckpointed_gpu_seconds": d.victim_cost.get(victim_id)})
            self._signal(victim, now, reason, for_id)

    def _set_reasons(self, jobs: Sequence[JobRecord],
                     why: dict[int, tuple[str, str]]) -> None:
        """Store each job's current reason where it changed (one row write per change,
        not per tick)."""
        with self.store.transaction():
            for j in jobs:
                kind, detail = why.get(j.id, (j.wait_reason, j.wait_detail))
                if (kind, detail) != (j.wait_reason, j.wait_detail):
                    self.store.update(j.id, wait_reason=kind, wait_detail=detail)

    def _start(self, rec: JobRecord, gpus: list[GpuInfo], memory: int | None,
               now: float, start_priority: float | None = None) -> None:
        attempt = rec.attempt + 1
        if memory is not None and not rec.spec.exclusive:
            limit: int | None = memory
        else:
            limit = rec.spec.gpu_memory_bytes
        env = job_environment(job_id=rec.id, attempt=attempt, user=rec.user, spec=rec.spec,
                              gpus=gpus, grace_seconds=self.ec.preempt_grace_seconds,
                              memory_limit_bytes=limit, mps=self.ec.mps, base=self.env_base)
        uuids = [g.uuid for g in gpus]
        self.idle_since.pop(rec.id, None)  # a new attempt is measured afresh
        self.shared.pop(rec.id, None)
        self.store.update(rec.id, state="running", attempt=attempt, gpus=uuids,
                          memory_bytes=memory, started_at=now, finished_at=None,
                          preempt_signal_at=None, preempt_reason=None, preempt_for=None,
                          exit_code=None, reason="", wait_reason="", wait_detail="",
                          start_priority=start_priority)
        # a later attempt resumes only from a checkpoint; without one it starts over
        if attempt == 1:
            kind = "started"
        elif rec.last_checkpoint_time is not None or rec.last_checkpoint_step is not None:
            kind = "resumed"
        else:
            kind = "restarted"
        self._event(now, rec.id, kind, {
            "attempt": attempt, "gpus": uuids, "memory_bytes": memory,
            "checkpoint_step": rec.last_checkpoint_step if attempt > 1 else None,
            "waited_seconds": now - rec.queued_at})
        try:
            self.executor.start(rec.id, attempt, rec.spec, gpus, env, rec.uid)
        except Exception as exc:  # noqa: BLE001 (a start that fails is the job's failure)
            log.warning("job %d: start failed: %s", rec.id, exc)
            self._event(now, rec.id, "start_failed", {"error": str(exc)})
            self._exit(Exit(rec.id, 127, now))

    # ------------------------------------------------------------------------- queries

    def queue_view(self, now: float | None = None) -> list[tuple[JobRecord,
                                                                 PriorityBreakdown]]:
        """Waiting and held jobs with their priority breakdown now, highest first."""
        t = self.clock() if now is None else now
        cfg = self.scheduler.config
        rows = [(j, priority(cfg, j, t, self.ledger))
                for j in self.store.jobs((*WAITING, "held"))]
        rows.sort(key=lambda r: (-r[1].total, r[0].submitted_at, r[0].id))
        return rows

    def next_deadline(self) -> float | None:
        """The earliest time a timer of the engine fires (backoff end, preemption grace,
        max runtime): replay can jump its clock there when nothing else happens."""
        times: list[float] = []
        for j in self.store.jobs(("requeued",)):
            times.append(j.backoff_until)
        for j in self.store.jobs(ACTIVE):
            if j.state == "preempting" and j.preempt_signal_at is not None:
                times.append(j.preempt_signal_at + self.ec.preempt_grace_seconds)
            elif j.spec.max_runtime_seconds is not None and j.started_at is not None:
                times.append(j.started_at + j.spec.max_runtime_seconds)
        return min(times) if times else None
