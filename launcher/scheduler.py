"""One scheduling decision: which waiting jobs start on which GPUs, and which running jobs
are preempted for whom. Pure: no clock, no I/O; the engine supplies the state.

Policies (config `policy.name`), all through this one placement code so replay compares
them fairly:
- `priority` (default): jobs in priority order (launcher.policy), each placed if it fits
  (backfilling behind a job that does not); a job that has waited `preempt_wait_seconds`
  and still does not fit may preempt lower-priority running jobs, choosing the victim
  set that loses the least un-checkpointed GPU-time.
- `fifo-exclusive`: submission order, whole GPUs only (a fraction takes a whole GPU),
  strictly in order (the first job that does not fit blocks the rest), no preemption.
- `first-fit`: submission order, every job that fits starts (fractions packed by
  measured free memory), no preemption.

Placement trusts measurement: a GPU is free for a whole-GPU job only when no job of ours
holds it AND its measured used memory is at most `idle_memory_bytes`; a fractional job
is admitted when the GPU's total minus max(measured used, memory booked by our
fractional jobs there) covers its need and the fractions there sum to at most 1.
GPUs down, with a recent XID, throttling or hotter than `max_temperature_c` get nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from launcher.config import PolicyConfig
from launcher.gpustate import GpuInfo
from launcher.policy import FairShareLedger, PriorityBreakdown, priority
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

    def clone(self) -> _Slot:
        return _Slot(self.uuid, self.index, self.total, self.used, self.temperature,
                     self.exclusive, self.fraction, self.booked)


class Scheduler:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

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
        return self.config.name == "fifo-exclusive"

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
        else:  # best fit: pack onto the fullest GPU that still fits, cooler first on ties
            fits.sort(key=lambda f: (f[0], f[1].temperature, f[1].index))
        _, slot, need = fits[0]
        slot.fraction += spec.gpu_fraction
        slot.booked += need
        slot.used += need  # it will use it: later jobs in this decision must see that
        return [slot.uuid], need

    def _release(self, job: JobRecord, slots: dict[str, _Slot]) -> None:
        """`slots` as they would be once `job` (running) has exited."""
        for uuid in job.gpus:
            s = slots.get(uuid)
            if s is None:
                continue
            if job.spec.gpu_fraction is None or self._whole_only:
                s.exclusive = False
                s.used = 0
            else:
                mem = job.memory_bytes or 0
                s.fraction = max(0.0, s.fraction - (job.spec.gpu_fraction or 0.0))
                s.booked = max(0, s.booked - mem)
                s.used = max(0, s.used - mem)

    def _slots(self, gpus: Sequence[GpuInfo], running: Sequence[JobRecord],
               blocked: Collection[str], decision: Decision) -> dict[str, _Slot]:
        slots: dict[str, _Slot] = {}
        for g in gpus:
            reason = "awaiting release" if g.uuid in blocked else self.unusable_reason(g)
            if reason is not None:
                decision.unusable[g.uuid] = reason
                continue
            slots[g.uuid] = _Slot(g.uuid, g.index, g.memory_total_bytes, g.memory_used_bytes,
                                  g.temperature_c if g.temperature_c is not None else 0.0)
        for job in running:
            for uuid in job.gpus:
                s = slots.get(uuid)
                if s is None:
                    continue
                if job.spec.gpu_fraction is None or self._whole_only:
                    s.exclusive = True
                else:
                    s.fraction += job.spec.gpu_fraction
                    s.booked += job.memory_bytes or 0
        return slots

    # ------------------------------------------------------------------------ decision

    def decide(self, now: float,  # noqa: PLR0917 - the contract engine and replay share
               queued: Sequence[JobRecord], running: Sequence[JobRecord],
               gpus: Sequence[GpuInfo], ledger: FairShareLedger,
               blocked: Collection[str] = ()) -> Decision:
        """Decide at `now`. `queued`: jobs eligible to start (dependencies met, backoff
        over, not held); `running`: jobs holding GPUs (running or preempting); `blocked`:
        GPU uuids the engine keeps out (release barrier, leak)."""
        c = self.config
        d = Decision()
        slots = self._slots(gpus, running, blocked, d)
        if c.name == "priority":
            for job in queued:
                d.breakdowns[job.id] = priority(c, job, now, ledger)
            order = sorted(queued, key=lambda j: (-d.breakdowns[j.id].total,
                                                  j.submitted_at, j.id))
        else:
            order = sorted(queued, key=lambda j: (j.submitted_at, j.id))
        d.order = [j.id for j in order]
        preemptible = self._preemptible(now, running, ledger, d) \
            if c.name == "priority" and c.preemption else []
        # jobs whose victims are still leaving, or left so recently that their GPUs may
        # still be passing the release barrier: they wait, they do not preempt again
        pending = {j.preempt_for for j in running
                   if j.state == "preempting" and j.preempt_for is not None}
        pending |= {j.preempt_for for j in queued if j.preempt_for is not None
                    and j.finished_at is not None
                    and now - j.finished_at < max(c.preempt_wait_seconds, 60.0)}
        no_victims: set[tuple[int, float | None, int | None]] = set()
        for job in order:
            placed = self._place(job, slots)
            if placed is not None:
                d.starts.append((job.id, placed[0]))
                d.memory[job.id] = placed[1]
                continue
            if c.name == "fifo-exclusive":
                break  # strict order: the head of the queue blocks everyone behind it
            if job.id in pending:
                self._reserve(job, slots)  # keep what is free for it until victims leave
                continue
            shape = (job.spec.gpus, job.spec.gpu_fraction, job.spec.gpu_memory_bytes)
            if preemptible and now - job.queued_at >= c.preempt_wait_seconds \
                    and shape not in no_victims:
                victims = self._victims(job, slots, preemptible, d)
                if not victims:
                    # jobs come in priority order: a later job of the same shape has only
                    # fewer candidates, so it would find none either
                    no_victims.add(shape)
                if victims:
                    for v in victims:
                        d.preemptions.append((v.id, job.id))
                        d.victim_cost[v.id] = v.uncheckpointed_gpu_seconds(now)
                        preemptible.remove(v)
                        self._release(v, slots)
                    self._reserve(job, slots)
        return d

    def _preemptible(self, now: float, running: Sequence[JobRecord], ledger: FairShareLedger,
                     d: Decision) -> list[JobRecord]:
        """Running jobs that may be preempted, least un-checkpointed GPU-time first."""
        c = self.config
        out = []
        for j in running:
            if j.state != "running" or j.started_at is None:
                continue
            if now - j.started_at < c.preempt_min_runtime_seconds:
                continue
            d.breakdowns[j.id] = priority(c, j, now, ledger)
            out.append(j)
        out.sort(key=lambda j: (j.uncheckpointed_gpu_seconds(now), -j.id))
        return out

    def _victims(self, job: JobRecord, slots: dict[str, _Slot],
                 preemptible: list[JobRecord], d: Decision) -> list[JobRecord]:
        """The cheapest victim set that lets `job` fit: the single victim with the least
        un-checkpointed GPU-time that frees enough; else the fewest cheapest in order."""
        mine = d.breakdowns[job.id].total
        candidates = [v for v in preemptible
                      if d.breakdowns[v.id].total + self.config.preempt_min_priority_gap <= mine]
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
