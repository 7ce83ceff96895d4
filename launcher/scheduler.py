"""One scheduling decision: which waiting jobs start on which GPUs, and which running jobs
are preempted for whom. Pure: no clock, no I/O; the engine supplies the state.

Policies (config `policy.name`), all through this one placement code so replay compares
them fairly:
- `priority` (default): jobs in priority order (launcher.policy), each placed if it fits
  (backfilling behind a job that does not); a job that has waited `preempt_wait_seconds`
  and still does not fit may preempt lower-priority running jobs, choosing the victim
  set that loses the least un-checkpointed GPU-time; jobs that checkpoint are chosen
  before jobs that cannot (a job with no checkpoint_dir loses its whole run).
  Idle reclaim (`idle_reclaim`): a running job whose measured utilisation has stayed
  under `idle_util_threshold` for `idle_reclaim_seconds` while work waits gives way
  without losing anything: a one-GPU job that cannot checkpoint (a notebook) is
  re-admitted as a share of its GPU sized by its measured memory, so fractional jobs
  pack beside it; a job that checkpoints becomes the preferred victim of any waiting
  job of higher OR EQUAL priority (no priority gap needed), reason "idle_reclaim".
- `fifo-exclusive`: submission order, whole GPUs only (a fraction takes a whole GPU),
  strictly in order (the first job that does not fit blocks the rest), no preemption.
- `first-fit`: submission order, every job that fits starts (fractions packed by
  measured free memory), no preemption.
- `hand-launched` (a replay baseline: people starting jobs by hand): the most urgent
  level first (a person with urgent work takes the next free GPU), then submission order,
  whole GPUs only, every job that fits starts, no preemption; replay also holds each job
  back while its owner is away (the engine's `gate`).

Every eligible job that does not start gets its reason (launcher/reasons.py) in
`Decision.waits`: the quota that holds it back, the jobs ahead that took what was free,
what it needs against what the GPUs have (with the numbers), or the preemption under way.

Placement trusts measurement: a GPU is free for a whole-GPU job only when no job of ours
holds it AND its measured used memory is at most `idle_memory_bytes`; a fractional job
is admitted when the GPU's total minus max(measured used, memory booked by our
fractional jobs there) covers its need and the fractions there sum to at most 1.
GPUs down, with a recent XID, throttling or hotter than `max_temperature_c` get nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from launcher import reasons as r
from launcher.config import PolicyConfig
from launcher.deadlines import DeadlineJob, jointly_feasible, runtime_estimate
from launcher.gpustate import GpuInfo
from launcher.policy import FairShareLedger, PriorityBreakdown, priority
from launcher.quota import Budget
from launcher.store import JobRecord


@dataclass
class Decision:
    """What to do now. `memory` is the GPU memory each started job was admitted with
    (per GPU); `victim_cost` the un-checkpointed GPU-seconds each victim loses;
    `unusable` the GPUs that got nothing and why."""

    starts: list[tuple[int, list[str]]] = field(default_factory=list)
    preemptions: list[tuple[int, int]] = field(default_factory=list)
    breakdowns: dict[int, PriorityBreakdown] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    memory: dict[int, int] = field(default_factory=dict)
    victim_cost: dict[int, float] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)
    # why each victim is preempted: "priority" or "idle_reclaim"
    preempt_reasons: dict[int, str] = field(default_factory=dict)
    # idle reclaim by sharing: (job id, fraction of its GPU, memory booked), and how long
    # each reclaimed job had been measured idle
    shares: list[tuple[int, float, int]] = field(default_factory=list)
    idle_seconds: dict[int, float] = field(default_factory=dict)
    # why each eligible job that does not start waits: (reason kind, detail)
    waits: dict[int, tuple[str, str]] = field(default_factory=dict)
    # deadline jobs that could not start now: when (estimated) and on which GPUs they
    # are to start; later jobs in the order start now only where they delay none of it
    reservations: dict[int, tuple[float, list[str]]] = field(default_factory=dict)


@dataclass
class _Slot:
    """One GPU as the placement sees it during one decision."""

    uuid: str
    index: int
    total: int
    used: int
    temperature: float
    exclusive: bool = False  # a whole-GPU job of ours holds it
    fraction: float = 0.0  # sum of our fractional jobs' shares on it
    booked: int = 0  # memory our fractional jobs there were admitted with
    idle: bool = False  # measured under the idle threshold while a job of ours holds it

    def clone(self) -> _Slot:
        return _Slot(self.uuid, self.index, self.total, self.used, self.temperature,
                     self.exclusive, self.fraction, self.booked, self.idle)


class Scheduler:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        # set for the duration of one decide(): jobs re-admitted as a share of their GPU
        # (job id -> fraction) and since when each running job has been measured idle
        self._shared: dict[int, float] = {}
        self._idle: dict[int, float] = {}
        self._now = 0.0
        self._index: dict[str, int] = {}
        # one decision's answers to "why does a job of this shape not start" (None: it
        # would have fit on what was free before the decision)
        self._why_cache: dict[tuple[int, float | None, int | None],
                              tuple[str, str] | None] = {}
        # waiting deadline jobs that cannot make it together with the others (per decision)
        self._deferred: set[int] = set()

    # -------------------------------------------------------------------------- health

    def unusable_reason(self, g: GpuInfo) -> str | None:
        c = self.config
        if not g.up:
            return "down"
        if c.skip_recent_xid and g.recent_xid:
            return "recent XID"
        if c.skip_throttling and g.throttling:
            return "throttling"
        if g.temperature_c is not None and g.temperature_c > c.max_temperature_c:
            return f"too hot ({g.temperature_c:.0f} C > {c.max_temperature_c:.0f} C)"
        return None

    # ----------------------------------------------------------------------- placement

    def need_bytes(self, job: JobRecord, total: int) -> int:
        """Memory a job needs on each of its GPUs (of a GPU with `total` bytes)."""
        spec = job.spec
        if spec.gpu_memory_bytes is not None:
            return spec.gpu_memory_bytes
        if spec.gpu_fraction is not None and not self._whole_only:
            return int(spec.gpu_fraction * total)
        return total

    @property
    def _whole_only(self) -> bool:
        return self.config.name in ("fifo-exclusive", "hand-launched")

    def _fits_exclusive(self, s: _Slot) -> bool:
        return (not s.exclusive and s.fraction == 0.0 and s.booked == 0
                and s.used <= self.config.idle_memory_bytes)

    def _place(self, job: JobRecord, slots: dict[str, _Slot]) -> tuple[list[str], int] | None:
        """GPUs for `job` on `slots` (mutated to book them), with the memory admitted."""
        spec = job.spec
        if spec.gpus == 0:
            return [], 0
        if spec.gpu_fraction is None or self._whole_only:
            free = [s for s in slots.values() if self._fits_exclusive(s)
                    and (spec.gpu_memory_bytes is None or spec.gpu_memory_bytes <= s.total)]
            if len(free) < spec.gpus:
                return None
            free.sort(key=lambda s: (s.temperature, s.index))
            chosen = free[:spec.gpus]
            for s in chosen:
                s.exclusive = True
            return [s.uuid for s in chosen], min(self.need_bytes(job, s.total) for s in chosen)
        fits = []
        for s in slots.values():
            if s.exclusive:
                continue
            need = self.need_bytes(job, s.total)
            room = s.total - max(s.used, s.booked)
            if need <= room and s.fraction + spec.gpu_fraction <= 1.0 + 1e-9:
                fits.append((room - need, s, need))
        if not fits:
            return None
        if self.config.name == "first-fit":
            fits.sort(key=lambda f: f[1].index)
        else:  # best fit: pack onto the fullest GPU that still fits, cooler first on ties;
            # with idle reclaim, a GPU an idle job holds comes first (its time turns busy)
            fits.sort(key=lambda f: (not f[1].idle, f[0], f[1].temperature, f[1].index))
        _, slot, need = fits[0]
        slot.idle = False
        slot.fraction += spec.gpu_fraction
        slot.booked += need
        slot.used += need  # it will use it: later jobs in this decision must see that
        return [slot.uuid], need

    def _holds_whole(self, job: JobRecord) -> bool:
        """A running job that owns its GPUs (not a fraction, not re-admitted as a share)."""
        return (job.spec.gpu_fraction is None or self._whole_only) \
            and job.id not in self._shared

    def _share(self, job: JobRecord) -> float:
        return self._shared.get(job.id, job.spec.gpu_fraction or 0.0)

    def _release(self, job: JobRecord, slots: dict[str, _Slot]) -> None:
        """`slots` as they would be once `job` (running) has exited."""
        self._release_on(job, job.gpus, job.memory_bytes, slots)

    def _slots(self, gpus: Sequence[GpuInfo], running: Sequence[JobRecord],
               blocked: Collection[str], decision: Decision) -> dict[str, _Slot]:
        slots: dict[str, _Slot] = {}
        for g in gpus:
            reason = "awaiting release" if g.uuid in blocked else self.unusable_reason(g)
            if reason is not None:
                decision.unusable[g.uuid] = reason
                continue
            slots[g.uuid] = _Slot(g.uuid, g.index, g.memory_total_bytes, g.memory_used_bytes,
                                  g.temperature_c if g.temperature_c is not None else 0.0,
                                  idle=bool(self._idle) and g.utilization is not None
                                  and g.utilization < self.config.idle_util_threshold
                                  and bool(g.processes))
        for job in running:
            for uuid in job.gpus:
                s = slots.get(uuid)
                if s is None:
                    continue
                if self._holds_whole(job):
                    s.exclusive = True
                else:
                    s.fraction += self._share(job)
                    s.booked += job.memory_bytes or 0
        return slots

    # ------------------------------------------------------------------------ decision

    def decide(self, now: float,  # noqa: PLR0917 - the contract engine and replay share
               queued: Sequence[JobRecord], running: Sequence[JobRecord],
               gpus: Sequence[GpuInfo], ledger: FairShareLedger,
               blocked: Collection[str] = (), *,
               idle: Mapping[int, float] | None = None,
               shared: Mapping[int, float] | None = None,
               budget: Budget | None = None) -> Decision:
        """Decide at `now`. `queued`: jobs eligible to start (dependencies met, backoff
        over, not held); `running`: jobs holding GPUs (running or preempting); `blocked`:
        GPU uuids the engine keeps out (release barrier, leak); `idle`: running job id ->
        since when its measured utilisation has stayed under `idle_util_threshold`;
        `shared`: whole-GPU jobs an earlier idle reclaim re-admitted as a share (job id ->
        fraction; their record's memory_bytes is the memory booked); `budget`: the
        per-user and per-project limits (None: none)."""
        c = self.config
        d = Decision()
        self._shared = dict(shared or {})
        self._idle = dict(idle or {}) if c.name == "priority" and c.idle_reclaim else {}
        self._now = now
        self._index = {g.uuid: g.index for g in gpus}
        self._why_cache = {}
        self._deferred = set()
        slots = self._slots(gpus, running, blocked, d)
        if self._idle and queued:
            self._share_idle(running, slots, d)
        initial = {u: s.clone() for u, s in slots.items()}  # before this decision's starts
        if c.name == "priority":
            for job in queued:
                d.breakdowns[job.id] = priority(c, job, now, ledger)
            order = sorted(queued, key=lambda j: (-d.breakdowns[j.id].total,
                                                  j.submitted_at, j.id))
            if c.deadline_order:
                self._deferred = self._jointly_infeasible(queued, running, gpus, now)
                order = self._least_slack_first(order, d, now)
        elif c.name == "hand-launched":
            # a person at the desk with urgent work takes the next free GPU themselves
            # rather than queueing behind other people's older jobs: the most urgent
            # level first, then submission order
            order = sorted(queued, key=lambda j: (
                -c.urgency_points(j.spec.urgency or c.default_urgency), j.submitted_at,
                j.id))
        else:
            order = sorted(queued, key=lambda j: (j.submitted_at, j.id))
        d.order = [j.id for j in order]
        preemptible = self._preemptible(now, running, ledger, d) \
            if c.name == "priority" and c.preemption else []
        # jobs whose victims are still leaving, or left so recently that their GPUs may
        # still be passing the release barrier: they wait, they do not preempt again
        leaving: dict[int, list[int]] = {}
        for j in running:
            if j.state == "preempting" and j.preempt_for is not None:
                leaving.setdefault(j.preempt_for, []).append(j.id)
        pending = set(leaving)
        pending |= {j.preempt_for for j in queued if j.preempt_for is not None
                    and j.finished_at is not None
                    and now - j.finished_at < max(c.preempt_wait_seconds, 60.0)}
        # victims that left for a job still waiting here: they do not take the GPUs back
        # before it (an idle-reclaim victim may outrank its waiter by age alone)
        waiting = {j.id for j in queued}
        yielded = {j.id for j in queued if j.preempt_for in waiting
                   and j.finished_at is not None
                   and now - j.finished_at < max(c.preempt_wait_seconds, 60.0)}
        no_victims: set[tuple[int, float | None, int | None]] = set()
        ahead = 0  # jobs earlier in the order that took or reserved GPUs in this decision
        # jobs started in this decision, with their GPUs and memory (for reservations)
        started: list[tuple[JobRecord, list[str], int]] = []
        reserving = c.name == "priority" and c.deadline_order and c.deadline_reservations
        unreservable: set[tuple[int, float | None, int | None]] = set()
        head: JobRecord | None = None  # fifo-exclusive: the job that blocks the rest
        for job in order:
            if head is not None:
                d.waits[job.id] = (r.PRIORITY, f"behind job {head.id} (first in, first "
                                               "out: it waits for GPUs)")
                continue
            if job.id in yielded:
                d.waits[job.id] = (r.YIELDED, f"gave its GPUs to job {job.preempt_for}; "
                                              "waits until that job has started")
                continue
            held_back = budget.check(job) if budget is not None else None
            if held_back is not None:
                d.waits[job.id] = held_back
                continue
            avoid = self._reserved_against(job, now, d)
            placed = self._place_avoiding(job, slots, avoid) if avoid \
                else self._place(job, slots)
            if placed is not None:
                d.starts.append((job.id, placed[0]))
                d.memory[job.id] = placed[1]
                started.append((job, placed[0], placed[1]))
                ahead += job.spec.gpus > 0
                if budget is not None:
                    budget.take(job)
                continue
            if c.name == "fifo-exclusive":
                # strict order: the head of the queue blocks everyone behind it
                d.waits[job.id] = self._why(job, initial, running, d, ahead)
                head = job
                continue
            if job.id in pending:
                self._reserve(job, slots)  # keep what is free for it until victims leave
                ahead += 1
                still = leaving.get(job.id, [])
                d.waits[job.id] = (r.PREEMPTING, r.cut(
                    f"waiting for job {r.listed(still)} it preempted to checkpoint and "
                    "leave" if still else "the jobs it preempted have left; waiting for "
                    "their GPUs to be released"))
                continue
            shape = (job.spec.gpus, job.spec.gpu_fraction, job.spec.gpu_memory_bytes)
            may_preempt = bool(preemptible) and now - job.queued_at >= c.preempt_wait_seconds
            if may_preempt and shape not in no_victims:
                victims = self._victims(job, slots, preemptible, d)
                if not victims:
                    # jobs come in priority order: a later job of the same shape has only
                    # fewer candidates, so it would find none either
                    no_victims.add(shape)
                if victims:
                    for v in victims:
                        d.preemptions.append((v.id, job.id))
                        d.victim_cost[v.id] = v.uncheckpointed_gpu_seconds(now)
                        if self._idle and v.spec.checkpoint_dir and self._reclaimable(v):
                            d.preempt_reasons[v.id] = "idle_reclaim"
                            d.idle_seconds[v.id] = self.idle_for(v)
                        else:
                            d.preempt_reasons[v.id] = "priority"
                        preemptible.remove(v)
                        self._release(v, slots)
                    self._reserve(job, slots)
                    ahead += 1
                    d.waits[job.id] = (r.PREEMPTING, r.cut(
                        f"preempting job {r.listed([v.id for v in victims])} for its GPUs "
                        "(they checkpoint and leave)"))
                    continue
            if avoid and self._fits(job, slots):
                # it fits only on GPUs a deadline job's reservation needs, and would still
                # hold them when that job is to start
                held = sorted(avoid, key=lambda u: self._index.get(u, 0))
                owners = sorted(i for i, (_, us) in d.reservations.items()
                                if set(us) & avoid)
                d.waits[job.id] = (r.PRIORITY, r.cut(
                    f"the free GPU {r.listed([self._index.get(u, '?') for u in held])} "
                    f"{'is' if len(held) == 1 else 'are'} reserved for deadline job "
                    f"{r.listed(owners)}, and this job would not end before then"))
                continue
            kind, detail = self._why(job, initial, running, d, ahead)
            if reserving and self._can_make_it(job, now) and shape not in unreservable:
                booked = self._reservation(job, slots, running, started, now, d)
                if booked is None:
                    # reservations only take GPUs away: a later job of this shape in
                    # this decision finds no room either (1,000 waiting deadline jobs
                    # cost one search per shape, not one each)
                    unreservable.add(shape)
                # a reservation that starts too late to make the deadline would only keep
                # GPUs idle: such a job needs a preemption (when short of slack), not it
                room = self.slack(job, now) or 0.0
                if booked is not None and booked[0] <= now + room + 1e-6:
                    d.reservations[job.id] = booked
                    ahead += 1
                    detail = (f"GPU {r.listed(sorted(self._index.get(u, 0) for u in booked[1]))}"
                              f" reserved for it from {r.clock(booked[0])} (estimated); "
                              + detail)
            lower = [v.id for v in preemptible
                     if self._outranks(d.breakdowns[job.id], d.breakdowns[v.id])]
            if kind != r.PRIORITY and lower:
                if not may_preempt:
                    detail += (f"; may preempt lower-priority job {r.listed(lower)} from "
                               f"{r.clock(job.queued_at + c.preempt_wait_seconds)}")
                else:
                    detail += "; preempting the lower-priority jobs would not free enough"
            d.waits[job.id] = (kind, r.cut(detail))
        if c.name == "priority" and c.deadline_order:
            for job in queued:
                slack = self.slack(job, now)
                if slack is not None and job.id in d.waits:
                    kind, detail = d.waits[job.id]
                    late = "deadline can no longer be met; waits in priority order" \
                        if slack < 0 else ("deadline cannot be met together with the "
                                           "other deadline jobs; waits in priority order"
                                           if job.id in self._deferred
                                           else f"deadline slack {slack / 3600:.1f} h")
                    d.waits[job.id] = (kind, r.cut(f"{late}; {detail}"))
        return d

    @staticmethod
    def slack(job: JobRecord, now: float) -> float | None:
        """Seconds the job can still wait and make its deadline (its estimated runtime,
        else none known: 0); None for a job without a deadline."""
        deadline = job.spec.deadline
        if not isinstance(deadline, float):
            return None
        return deadline - now - (job.spec.expected_runtime or 0.0)

    def _can_make_it(self, job: JobRecord, now: float) -> bool:
        slack = self.slack(job, now)
        return slack is not None and slack >= 0 and job.id not in self._deferred

    def _jointly_infeasible(self, queued: Sequence[JobRecord], running: Sequence[JobRecord],
                            gpus: Sequence[GpuInfo], now: float) -> set[int]:
        """Waiting deadline jobs that cannot make it together with the others (running
        deadline jobs first, with what their estimates say is left): deferred to the
        priority order, so they do not hold places that jobs which can still make it
        need. A fluid area test (launcher/deadlines.py); skipped past 64 jobs."""
        timed = [j for j in queued if (self.slack(j, now) or -1.0) >= 0]
        if not timed or len(timed) > 64 or not gpus:  # no GPUs read yet: nothing to judge
            return set()
        cands = []
        for j in running:
            left = self._running_slack(j)
            if left is not None and isinstance(j.spec.deadline, float):
                work = max(0.0, j.spec.deadline - now - left)
                # a running job holds its GPUs until it ends, late or not
                cands.append(DeadlineJob(f"r{j.id}", now, work, j.spec.gpu_share,
                                         max(j.spec.deadline, now + work)))
        for j in timed:
            assert isinstance(j.spec.deadline, float)
            cands.append(DeadlineJob(f"q{j.id}", now, j.spec.expected_runtime or 0.0,
                                     j.spec.gpu_share, j.spec.deadline))
        kept = jointly_feasible(cands, float(len(gpus)),
                                pinned={c.key for c in cands if c.key.startswith("r")})
        return {j.id for j in timed if f"q{j.id}" not in kept}

    # -------------------------------------------------------------------- reservations

    @staticmethod
    def _expected_end(job: JobRecord, now: float) -> float:
        """When a running (or just started) job is expected to end: its estimate, else its
        max_runtime; never (inf) when neither is known."""
        left = runtime_estimate(job, now).remaining
        return math.inf if left is None else now + left

    def _reserved_against(self, job: JobRecord, now: float, d: Decision) -> set[str]:
        """GPUs `job` may not take now: those reserved for deadline jobs that are to start
        before `job` would end (its estimate, else its max_runtime; never known: it
        would delay every reservation)."""
        if not d.reservations:
            return set()
        est = runtime_estimate(job, now).total
        end = math.inf if est is None else now + est
        return {u for start, uuids in d.reservations.values() if start < end - 1e-6
                for u in uuids}

    def _place_avoiding(self, job: JobRecord, slots: dict[str, _Slot],
                        avoid: Collection[str]) -> tuple[list[str], int] | None:
        """_place with the `avoid` GPUs out of reach (shown as held whole meanwhile)."""
        saved = {u: slots[u] for u in avoid if u in slots}
        for u, s in saved.items():
            stand_in = s.clone()
            stand_in.exclusive = True
            slots[u] = stand_in
        try:
            return self._place(job, slots)
        finally:
            slots.update(saved)

    def _reservation(self, job: JobRecord, slots: dict[str, _Slot],  # noqa: PLR0917
                     running: Sequence[JobRecord],
                     started: Sequence[tuple[JobRecord, list[str], int]], now: float,
                     d: Decision) -> tuple[float, list[str]] | None:
        """When and where `job` (a deadline job that does not fit now) can start: the
        running jobs (and those started in this decision) end at their estimated ends,
        earliest first, until it fits; GPUs already reserved for an earlier deadline job
        stay out of reach. Among the GPUs free then, the ones busy now are taken first,
        so what is free now stays open to backfill. None when it never fits by the
        estimates (a job with no estimate and no limit holds its GPUs for good)."""
        trial = {u: s.clone() for u, s in slots.items()}
        reserved = {u for _, uuids in d.reservations.values() for u in uuids if u in trial}
        ends: list[tuple[float, int, list[str], int | None, JobRecord]] = []
        for j in running:
            ends.append((self._expected_end(j, now), j.id, list(j.gpus), j.memory_bytes, j))
        for j, held, booked in started:
            est = runtime_estimate(j, now).total
            ends.append((math.inf if est is None else now + est, j.id, held, booked, j))
        ends.sort(key=lambda e: (e[0], e[1]))
        for end, _, held, mem, j in ends:
            if math.isinf(end):
                return None
            self._release_on(j, held, mem, trial)
            for u in reserved:  # still out of reach, whoever leaves them
                trial[u].exclusive = True
            if not self._fits(job, trial):
                continue
            if job.spec.gpu_fraction is None or self._whole_only:
                m = job.spec.gpu_memory_bytes
                free = [s for s in trial.values() if self._fits_exclusive(s)
                        and (m is None or m <= s.total)]
                free.sort(key=lambda s: (self._fits_exclusive(slots[s.uuid]),
                                         s.temperature, s.index))
                return end, [s.uuid for s in free[:job.spec.gpus]]
            placed = self._place(job, trial)
            return (end, placed[0]) if placed is not None else None
        return None

    def _release_on(self, job: JobRecord, uuids: Sequence[str], memory: int | None,
                    slots: dict[str, _Slot]) -> None:
        """`slots` as they would be once `job`, holding `uuids` with `memory` per GPU,
        has exited (a job started in this decision has no GPUs on its record yet)."""
        for uuid in uuids:
            s = slots.get(uuid)
            if s is None:
                continue
            if self._holds_whole(job):
                s.exclusive = False
                s.used = 0
            else:
                mem = memory or 0
                s.fraction = max(0.0, s.fraction - self._share(job))
                s.booked = max(0, s.booked - mem)
                s.used = max(0, s.used - mem)

    def _least_slack_first(self, order: list[JobRecord], d: Decision, now: float,
                           ) -> list[JobRecord]:
        """Within each band (urgency level and tier), deadline jobs take the band's
        places first, least slack first; the band's other jobs follow in their priority
        order, and the places the bands hold in the whole order do not move."""
        bands: dict[tuple[str, float], list[int]] = {}
        for i, job in enumerate(order):
            b = d.breakdowns[job.id]
            bands.setdefault((b.urgency_level, b.tier), []).append(i)
        out = list(order)
        for places in bands.values():
            members = [order[i] for i in places]
            # a job that can no longer make its deadline is deferred to the priority
            # order: least slack first would otherwise put every late job ahead of the
            # ones that can still make it (the domino effect of earliest deadline first)
            timed = sorted((j for j in members if self._can_make_it(j, now)),
                           key=lambda j: (self.slack(j, now), j.id))
            if not timed:
                continue
            rest = [j for j in members if not self._can_make_it(j, now)]
            for i, job in zip(places, [*timed, *rest], strict=True):
                out[i] = job
        return out

    # ------------------------------------------------------------------------- reasons

    def _why(self, job: JobRecord, initial: dict[str, _Slot],
             running: Sequence[JobRecord], d: Decision, ahead: int) -> tuple[str, str]:
        """Why `job` did not start: it would have fit on the GPUs as they were before this
        decision (jobs ahead took them), or what it needs against what there is. The
        answer depends only on the job's shape and the GPUs before the decision, so it is
        worked out once per shape (1,000 waiting jobs are a few shapes)."""
        spec = job.spec
        shape = (spec.gpus, spec.gpu_fraction, spec.gpu_memory_bytes)
        if shape not in self._why_cache:
            self._why_cache[shape] = None if self._fits(job, initial) \
                else self._lacks(job, initial, running, d)
        known = self._why_cache[shape]
        if known is not None:
            return known
        who = "with higher priority" if self.config.name == "priority" else "submitted earlier"
        if ahead:
            return r.PRIORITY, f"{r.plural(ahead, 'job')} ahead {who} took the free GPUs"
        return r.PRIORITY, f"the free GPUs are reserved for jobs ahead {who}"

    def _fits(self, job: JobRecord, slots: dict[str, _Slot]) -> bool:
        """Would `job` be placed on `slots`? (_place without booking anything)"""
        spec = job.spec
        if spec.gpus == 0:
            return True
        if spec.gpu_fraction is None or self._whole_only:
            m = spec.gpu_memory_bytes
            return sum(1 for s in slots.values() if self._fits_exclusive(s)
                       and (m is None or m <= s.total)) >= spec.gpus
        return any(not s.exclusive and self.need_bytes(job, s.total)
                   <= s.total - max(s.used, s.booked)
                   and s.fraction + spec.gpu_fraction <= 1.0 + 1e-9 for s in slots.values())

    def _lacks(self, job: JobRecord, initial: dict[str, _Slot],
               running: Sequence[JobRecord], d: Decision) -> tuple[str, str]:
        """What `job` needs against what the GPUs have (it does not fit on them)."""
        spec = job.spec
        count = len(self._index)
        holders: dict[str, list[int]] = {}
        for j in running:
            for uuid in j.gpus:
                holders.setdefault(uuid, []).append(j.id)
        notes = [f"GPU {self._index.get(u, '?')} {why}" for u, why in sorted(
            d.unusable.items(), key=lambda kv: self._index.get(kv[0], 0))]
        if spec.gpu_fraction is None or self._whole_only:
            m = spec.gpu_memory_bytes
            free = [s for s in initial.values() if self._fits_exclusive(s)
                    and (m is None or m <= s.total)]
            head = (f"needs {r.plural(spec.gpus, 'whole GPU')}"
                    + (f" with {r.gib(m)}" if m is not None else "")
                    + f"; {len(free)} of {count} free")
            whole = sorted((s for s in initial.values() if s.exclusive), key=lambda s: s.index)
            frac = sorted((s for s in initial.values() if not s.exclusive
                           and (s.fraction > 0 or s.booked > 0)), key=lambda s: s.index)
            other = sorted((s for s in initial.values() if not s.exclusive
                            and s.fraction == 0 and s.booked == 0
                            and s.used > self.config.idle_memory_bytes), key=lambda s: s.index)
            if whole:
                ids = sorted({i for s in whole for i in holders.get(s.uuid, [])})
                notes.insert(0, f"GPU {r.listed([s.index for s in whole])} held by job "
                             f"{r.listed(ids)}")
            if frac:
                ids = sorted({i for s in frac for i in holders.get(s.uuid, [])})
                notes.append(f"GPU {r.listed([s.index for s in frac])} shared by job "
                             f"{r.listed(ids)}")
            notes += [f"GPU {s.index} has {r.gib(s.used)} in use outside the launcher"
                      for s in other[:r.MAX_LISTED]]
            if m is not None:
                small = [s for s in initial.values() if m > s.total]
                if small:
                    notes.append(f"GPU {r.listed([s.index for s in small])} has less than "
                                 f"{r.gib(m)}")
            return r.RESOURCES, r.cut(head + (": " + "; ".join(notes) if notes else ""))
        f = spec.gpu_fraction
        shared = [s for s in initial.values() if not s.exclusive]
        share = f"{f:g} of a GPU"
        if not shared:
            ids = sorted({i for s in initial.values() for i in holders.get(s.uuid, [])})
            text = (f"needs {share}; every usable GPU is held whole"
                    + (f" (by job {r.listed(ids)})" if ids else ""))
            return r.RESOURCES, r.cut(text + ("; " + "; ".join(notes) if notes else ""))
        room = [s for s in shared if s.fraction + f <= 1.0 + 1e-9]
        if room:
            best = max(room, key=lambda s: s.total - max(s.used, s.booked))
            need = self.need_bytes(job, best.total)
            left = max(0, best.total - max(best.used, best.booked))
            return r.GPU_MEMORY, r.cut(
                f"needs {r.gib(need)} on one GPU for {f:g} of it; the most free is "
                f"{r.gib(left)} (GPU {best.index})")
        most = min(s.fraction for s in shared)
        return r.RESOURCES, r.cut(f"needs {share}; the most left of any GPU is "
                                  f"{max(0.0, 1 - most):.2g}")

    # ---------------------------------------------------------------------- idle reclaim

    def idle_for(self, job: JobRecord) -> float:
        """Seconds `job` has been measured idle (0: busy, or not measured yet)."""
        since = self._idle.get(job.id)
        return 0.0 if since is None else max(0.0, self._now - since)

    def _reclaimable(self, job: JobRecord) -> bool:
        return (job.state == "running" and job.id in self._idle
                and self.idle_for(job) >= self.config.idle_reclaim_seconds)

    def _share_idle(self, running: Sequence[JobRecord], slots: dict[str, _Slot],
                    d: Decision) -> None:
        """Re-admit idle one-GPU jobs that cannot checkpoint as a share of their GPU sized
        by their measured memory: the job keeps its process, its memory and its GPU; the
        rest of the GPU's memory is offered to fractional jobs. (A job that checkpoints
        is preempted instead, see _victims: it loses nothing either.)"""
        for job in running:
            if (not self._reclaimable(job) or not self._holds_whole(job)
                    or job.spec.gpus != 1 or job.spec.checkpoint_dir or len(job.gpus) != 1):
                continue
            s = slots.get(job.gpus[0])
            if s is None or s.fraction > 0 or s.booked > 0:
                continue
            booked = max(job.spec.gpu_memory_bytes or 0, s.used)
            fraction = math.ceil(100.0 * booked / s.total) / 100.0
            if fraction > self.config.idle_share_max_fraction:
                continue
            s.exclusive = False
            s.fraction = fraction
            s.booked = booked
            self._shared[job.id] = fraction
            d.shares.append((job.id, fraction, booked))
            d.idle_seconds[job.id] = self.idle_for(job)

    # ------------------------------------------------------------------------ preemption

    def _preemptible(self, now: float, running: Sequence[JobRecord], ledger: FairShareLedger,
                     d: Decision) -> list[JobRecord]:
        """Running jobs that may be preempted, cheapest first: jobs that checkpoint (they
        commit on the signal) by least un-checkpointed GPU-time, then jobs without a
        checkpoint_dir (a preemption throws their whole run away)."""
        c = self.config
        out = []
        for j in running:
            if j.state != "running" or j.started_at is None:
                continue
            if now - j.started_at < c.preempt_min_runtime_seconds:
                continue
            d.breakdowns[j.id] = priority(c, j, now, ledger)
            out.append(j)
        out.sort(key=lambda j: (not j.spec.checkpoint_dir,
                                j.uncheckpointed_gpu_seconds(now), -j.id))
        return out

    def _victims(self, job: JobRecord, slots: dict[str, _Slot],
                 preemptible: list[JobRecord], d: Decision) -> list[JobRecord]:
        """The cheapest victim set that lets `job` fit: the single victim with the least
        un-checkpointed GPU-time that frees enough; else the fewest cheapest in order.
        Idle reclaim: a job that checkpoints and has been measured idle long enough is a
        candidate for any waiter of higher or equal priority (its own age term left out),
        and comes first."""
        mine = d.breakdowns[job.id].total
        # (the idle job's age term does not count: it is running, not waiting)
        idle = [v for v in preemptible if self._idle and v.spec.checkpoint_dir
                and self._reclaimable(v)
                and d.breakdowns[v.id].total - d.breakdowns[v.id].age <= mine]
        mine_b = d.breakdowns[job.id]
        busy = [v for v in preemptible if v not in idle
                and (self._outranks(mine_b, d.breakdowns[v.id])
                     or self._deadline_may_take(job, v, d))
                and not self._deadline_protected(v, job, d)]
        candidates = idle + busy
        if not candidates:
            return []
        for v in candidates:  # already cheapest first
            trial = {u: s.clone() for u, s in slots.items()}
            self._release(v, trial)
            if self._place(job, trial) is not None:
                return [v]
        chosen: list[JobRecord] = []
        trial = {u: s.clone() for u, s in slots.items()}
        for v in candidates:
            chosen.append(v)
            self._release(v, trial)
            probe = {u: s.clone() for u, s in trial.items()}
            if self._place(job, probe) is not None:
                return chosen
        return []

    def _running_slack(self, job: JobRecord) -> float | None:
        """Slack of a running deadline job: its deadline - now - what its estimate says is
        left of this run (its reported progress first, launcher/deadlines.py
        `runtime_estimate`; progress of earlier runs not credited: errs on the safe side)."""
        deadline = job.spec.deadline
        if not isinstance(deadline, float):
            return None
        left = runtime_estimate(job, self._now).remaining
        return deadline - self._now - (left or 0.0)

    def _has_room(self, victim: JobRecord, job: JobRecord) -> bool:
        """Whether a running deadline job keeps more than the threshold of slack after
        giving `job` its estimated runtime plus a grace period."""
        slack = self._running_slack(victim)
        need = (job.spec.expected_runtime or 0.0) + self.config.preempt_wait_seconds
        return slack is not None and slack - need > self.config.deadline_preempt_slack_seconds

    def _deadline_protected(self, victim: JobRecord, job: JobRecord,
                            d: Decision) -> bool:
        """A running job with a deadline is preempted only for a more urgent level, or by
        a deadline job in trouble when it keeps enough slack itself (a waiter that merely
        outranks it by age or fair share would make it miss)."""
        if not self.config.deadline_order or self._running_slack(victim) is None:
            return False
        if d.breakdowns[job.id].urgency > d.breakdowns[victim.id].urgency:
            return False
        return not (self._in_trouble(job) and self._has_room(victim, job))

    def _in_trouble(self, job: JobRecord) -> bool:
        """Short of slack, but still able to make it (a late job preempts nobody)."""
        slack = self.slack(job, self._now)
        return (slack is not None and 0 <= slack <= self.config.deadline_preempt_slack_seconds
                and job.id not in self._deferred)

    def _deadline_may_take(self, job: JobRecord, victim: JobRecord, d: Decision) -> bool:
        """A waiting deadline job whose slack has fallen under
        `deadline_preempt_slack_seconds` may preempt a checkpointing job of the same or a
        lower urgency level, whatever their priorities, when that job has no deadline or
        keeps enough slack to make its own."""
        if not self.config.deadline_order or not self._in_trouble(job):
            return False
        return (victim.spec.checkpoint_dir is not None
                and d.breakdowns[victim.id].urgency <= d.breakdowns[job.id].urgency
                and (self._running_slack(victim) is None or self._has_room(victim, job)))

    def _outranks(self, waiter: PriorityBreakdown, victim: PriorityBreakdown) -> bool:
        """May `waiter` preempt the busy `victim` (policy preempt_by)?"""
        gap = self.config.preempt_min_priority_gap
        if self.config.preempt_by == "urgency":
            return victim.urgency + gap <= waiter.urgency and victim.total < waiter.total
        return victim.total + gap <= waiter.total

    def _reserve(self, job: JobRecord, slots: dict[str, _Slot]) -> None:
        """Book for `job` what is free now (up to its need), so lower-priority jobs in
        this decision do not take the GPUs its victims are freeing for it."""
        if job.spec.gpu_fraction is None or self._whole_only:
            free = [s for s in slots.values() if self._fits_exclusive(s)]
            free.sort(key=lambda s: (s.temperature, s.index))
            for s in free[:job.spec.gpus]:
                s.exclusive = True
        else:
            self._place(job, slots)
