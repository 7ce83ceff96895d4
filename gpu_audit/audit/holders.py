"""What one GPU's sampling cycle gives each of its holders and the fleet: the quantities a
bill adds up (docs/AUDIT.md, "Accounting"; docs/CHARGEBACK.md).

One function, `close_cycle`, used twice so the two can never disagree:
- the producer calls it for every sample when it aggregates samples into interval usage
  records (schema 3): a record carries the sums of these quantities over its interval,
  so a bill from the 60 s trail and one from the per-cycle trail are the same sums;
- the archive rollup calls it for every cycle of version 1 and 2 records (a `gpu` record,
  its `process` records and its `unattributed` record, grouped by host, GPU and time).

A holder is an owner `(user, project)` (either may be None: unknown); `(None, None)` is
the unattributed holder, which takes both the processes nobody owns and owned processes
whose owner names neither a user nor a project. Rules (those chargeback's archive source
has always applied to version 2 records):

- fleet: up GPU-seconds, down GPU-seconds, held (any process on the GPU), idle-held
  (held while the GPU's utilisation < IDLE_UTILIZATION), energy and the power x elapsed
  cross-check;
- an owner: used = the interval once per GPU (several processes of one owner on one GPU
  count once), charged = the interval divided equally among the distinct owners, busy =
  the sum of their processes' busy GPU-seconds, idle-held = used while the GPU is idle,
  energy = their processes' split energy plus, when only owners hold the GPU, the energy
  the split left unattributed (in proportion to their energy, equally when all 0), and
  the power cross-check in the same proportion as the GPU's;
- the unattributed holder, when processes nobody owns hold the GPU: the unattributed
  record's seconds, busy, energy (counted only when one of them is not 0);
- a GPU counted by the slice (MIG, `GpuCycle.slices`; docs/CHARGEBACK.md "MIG: billed
  by the slice"): an owner's used is the weights of the MIG instances its processes run
  in x the interval, charged each instance's weight x the interval divided equally among
  the owners running in it; the GPU's held (and idle-held) time is the weights of the
  held instances x the interval, so what no instance holds stays idle.

Pure arithmetic: no I/O, nothing but the numbers given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_audit.rules import IDLE_UTILIZATION

Owner = tuple[str | None, str | None]  # (user, project)
UNATTRIBUTED: Owner = (None, None)

# Indexes of a holder's sums (HolderSums is a plain list for speed and for merging).
USED, CHARGED, BUSY, IDLE_HELD, ENERGY, POWER_ENERGY = range(6)
HOLDER_FIELDS = ("used", "charged", "busy", "idle_held", "energy", "power_energy")
# Indexes of a GPU's fleet sums.
F_GPU, F_DOWN, F_HELD, F_IDLE_HELD, F_BUSY, F_ENERGY, F_POWER = range(7)
FLEET_FIELDS = ("gpu_seconds", "down_seconds", "held_seconds", "idle_held_seconds",
                "busy_seconds", "energy_joules", "power_energy_joules")


@dataclass(slots=True)
class GpuCycle:
    """One GPU's cycle (one sample's interval), as measured."""

    elapsed: float
    up: bool | None = None  # None: no gpu record seen (a partial v1/v2 cycle)
    gpu_seconds: float = 0.0
    energy: float | None = None  # joules
    energy_source: str = "none"
    power_energy: float | None = None  # power x elapsed, joules
    utilization: float | None = None
    # owner -> [used (max GPU-seconds of its processes), busy, energy]
    owners: dict[Owner, list[float]] = field(default_factory=dict)
    unowned_processes: int = 0
    un_seen: bool = False
    un_seconds: float = 0.0
    un_energy: float = 0.0
    un_busy: float = 0.0
    # A GPU counted slice by slice (MIG, gpu_audit.model.mig): owner -> {gpu_instance_id:
    # weight} of the instances its processes run in; None: the whole GPU. `un_seconds`
    # is then the unowned processes' slices x elapsed. `whole` set: some process had no
    # weight, so the whole GPU after all.
    slices: dict[Owner, dict[int, float]] | None = None
    whole: bool = False


def close_cycle(c: GpuCycle) -> tuple[dict[Owner, list[float]], list[float]]:
    """(holder -> sums [used, charged, busy, idle_held, energy, power_energy], fleet sums
    [gpu_seconds, down, held, idle_held, busy, energy, power_energy]) of one cycle.

    A holder is present when it counts for the bill: every owner of a process, and the
    unattributed holder of unowned processes when one of its sums is not 0.
    """
    e = c.elapsed
    fleet = [0.0] * 7
    idle = c.utilization is not None and c.utilization < IDLE_UTILIZATION
    gpu_energy = c.energy or 0.0
    ratio = (c.power_energy / gpu_energy
             if c.power_energy is not None and gpu_energy > 0 else None)
    if c.up is True:
        fleet[F_GPU] = c.gpu_seconds
        fleet[F_ENERGY] = gpu_energy
        fleet[F_POWER] = c.power_energy or 0.0
    elif c.up is False:
        fleet[F_DOWN] = e
    sliced = c.slices if c.slices is not None and not c.whole else None
    holders_of: dict[int, list[float]] = {}  # gpu_instance_id -> [weight, owners]
    if sliced is not None:
        for gis in sliced.values():
            for gi, w in gis.items():
                slot = holders_of.setdefault(gi, [w, 0.0])
                slot[1] += 1
    if c.owners or c.unowned_processes > 0:
        held = e
        if sliced is not None:
            held = min(e, e * sum(w for w, _ in holders_of.values())
                       + (c.un_seconds if c.unowned_processes > 0 else 0.0))
        fleet[F_HELD] = held
        if idle:
            fleet[F_IDLE_HELD] = held
    out: dict[Owner, list[float]] = {}
    n = len(c.owners)
    un_energy = c.un_energy
    if c.owners and c.unowned_processes == 0 and un_energy:
        # held by owners only: what the split left unattributed (GPU utilisation no
        # owner's process explains) is theirs, in proportion to their energy
        total = sum(acc[2] for acc in c.owners.values())
        for acc in c.owners.values():
            acc[2] += un_energy * (acc[2] / total if total > 0 else 1.0 / n)
        un_energy = 0.0
    for owner, (seconds, busy, energy) in c.owners.items():
        used, charged = seconds, (e or seconds) / n
        if sliced is not None:
            # by the slice: the instances it runs in, each shared by its owners
            gis = sliced.get(owner, {})
            used = e * sum(gis.values())
            charged = e * sum(w / holders_of[gi][1] for gi, w in gis.items())
        out[owner] = [used, charged, busy, used if idle else 0.0, energy,
                      energy * ratio if ratio is not None else 0.0]
        fleet[F_BUSY] += busy
    if c.un_seen and c.unowned_processes > 0:
        held = c.un_seconds
        if held or un_energy or c.un_busy:
            sums = [held, held, c.un_busy, held if idle else 0.0, un_energy,
                    un_energy * ratio if ratio is not None else 0.0]
            mine = out.get(UNATTRIBUTED)
            if mine is None:
                out[UNATTRIBUTED] = sums
            else:
                for i, v in enumerate(sums):
                    mine[i] += v
        fleet[F_BUSY] += c.un_busy
    return out, fleet
