"""From what a source measured to the bill: rows, costs, idle share, reconciliation.

- Owner rows, one per (department, project, user), sum the owner's usage over GPU
  models; the GPU cost is charged GPU-hours x the model's price, per model, then summed.
  The energy cost is the owner's counter energy (kWh) x the energy price.
- The unattributed row is GPU time held only by processes nobody owns; it is costed the
  same way and never shares idle cost (there is nobody to bill).
- The idle row is each model's up time minus the time any process held a GPU of that
  model, and the fleet's energy that no row carries.
- Idle share (`idle_policy`): "none" leaves the idle cost on the idle row; "proportional"
  shares it over owner rows by charged GPU-hours; "even" shares it equally over owner
  rows. When every proportional weight is 0 it is shared evenly; with no owner rows it
  stays on the idle row (`Bill.idle_policy_note` says which). The idle row's
  `idle_share_cost` is minus what was shared, so total_cost sums to the fleet's cost.
- Without rates (None) the bill is a showback: every price 0, `Bill.priced` False, and
  the outputs leave the cost columns empty (never a cost of 0 that looks like one).
- `Bill.lines`: each row's GPU cost per GPU model (hours x price), the line items that
  let a reader recompute `gpu_cost`.
"""

from __future__ import annotations

from chargeback.directory import UNMAPPED, Directory
from chargeback.model import (
    UNATTRIBUTED,
    Bill,
    Line,
    Owner,
    Reconciliation,
    Row,
    RowDifference,
    SourceComparison,
    SourceData,
    Usage,
)
from chargeback.rates import Rates

IDLE_POLICIES = ("none", "proportional", "even")
MAX_ROWS = 10  # rows listed per compared source
_H = 3600.0
_KWH = 3.6e6
SHOWBACK = Rates("", {"default": 0.0}, 0.0)  # no rates file: hours and energy only
# The energy counter and integrated power draw measure the same energy two ways; beyond
# this share of the larger (and ENERGY_FLOOR_KWH) the bill warns (docs/CHARGEBACK.md):
# one of them is wrong (a counter that does not count, a simulator's compressed time,
# samples too sparse for the power integral).
ENERGY_TOLERANCE = 0.05
ENERGY_FLOOR_KWH = 0.01


def energy_warning(counter_kwh: float, power_kwh: float) -> str | None:
    """The warning for a bill whose two energy measures disagree, or None."""
    big = max(abs(counter_kwh), abs(power_kwh))
    diff = abs(counter_kwh - power_kwh)
    if diff <= ENERGY_FLOOR_KWH or diff <= ENERGY_TOLERANCE * big:
        return None
    return (f"ENERGY: the energy counter says {counter_kwh:,.3f} kWh and integrated power "
            f"draw {power_kwh:,.3f} kWh, {100 * diff / big:.1f} % apart (tolerance "
            f"{100 * ENERGY_TOLERANCE:g} %): energy is billed from the counter; check "
            "the counters and the sampling before invoicing energy")


def _row(kind: str, department: str, project: str, user: str, u: Usage) -> Row:
    return Row(kind, department, project, user,
               allocated_gpu_hours=u.allocated_gpu_seconds / _H,
               used_gpu_hours=u.used_gpu_seconds / _H,
               charged_gpu_hours=u.charged_gpu_seconds / _H,
               busy_gpu_hours=u.busy_gpu_seconds / _H,
               idle_held_gpu_hours=u.idle_held_gpu_seconds / _H,
               energy_kwh=u.energy_joules / _KWH,
               power_energy_kwh=u.power_energy_joules / _KWH)


def build_bill(data: SourceData, rates: Rates | None, directory: Directory,
               idle_policy: str) -> Bill:
    if idle_policy not in IDLE_POLICIES:
        raise ValueError(f"idle policy {idle_policy!r}: one of {', '.join(IDLE_POLICIES)}")
    priced = rates is not None
    rates = rates if rates is not None else SHOWBACK
    models = sorted({m for _, m in data.usage} | set(data.fleet))
    rates.check_models(models, "rates")

    per_owner: dict[Owner, Usage] = {}
    gpu_cost: dict[Owner, float] = {}
    by_model: dict[Owner, dict[str, float]] = {}  # owner -> model -> charged seconds
    for (owner, model), u in sorted(data.usage.items(), key=lambda kv: (
            str(kv[0][0]), kv[0][1])):
        per_owner.setdefault(owner, Usage()).add(u)
        gpu_cost[owner] = gpu_cost.get(owner, 0.0) + (
            u.charged_gpu_seconds / _H * rates.gpu_hour_price(model))
        models_of = by_model.setdefault(owner, {})
        models_of[model] = models_of.get(model, 0.0) + u.charged_gpu_seconds

    rows: list[Row] = []
    row_models: dict[tuple[str, str, str, str], dict[str, float]] = {}
    unmapped: set[str] = set()
    unattributed = _row("unattributed", "", "", "", per_owner.get(UNATTRIBUTED, Usage()))
    unattributed.gpu_cost = gpu_cost.get(UNATTRIBUTED, 0.0)
    row_models[("unattributed", "", "", "")] = by_model.get(UNATTRIBUTED, {})
    for owner, u in per_owner.items():
        if owner == UNATTRIBUTED:
            continue
        user, project = owner
        dept = directory.department(user, project)
        if dept == UNMAPPED:
            unmapped.add(f"{user or '-'}/{project or '-'}")
        row = _row("owner", dept, project or "", user or "", u)
        row.gpu_cost = gpu_cost[owner]
        rows.append(row)
        row_models[("owner", dept, project or "", user or "")] = by_model[owner]
    rows.sort(key=lambda r: (r.department, r.project, r.user))

    # idle: per model, up time minus time held (by anyone); energy nobody carries
    idle_seconds = 0.0
    idle_cost = 0.0
    fleet_seconds = down_seconds = 0.0
    fleet_energy = fleet_power_energy = 0.0
    idle_models: dict[str, float] = {}
    row_models[("idle", "", "", "")] = idle_models
    for model in models:
        f = data.fleet.get(model)
        if f is None:
            continue
        idle = max(0.0, f.gpu_seconds - f.held_gpu_seconds)
        if idle > 0:
            idle_models[model] = idle
        idle_seconds += idle
        idle_cost += idle / _H * rates.gpu_hour_price(model)
        fleet_seconds += f.gpu_seconds
        down_seconds += f.down_gpu_seconds
        fleet_energy += f.energy_joules
        fleet_power_energy += f.power_energy_joules
    rows_energy = sum(u.energy_joules for u in per_owner.values())
    idle_row = Row("idle", "", "", "", charged_gpu_hours=idle_seconds / _H,
                   energy_kwh=max(0.0, fleet_energy - rows_energy) / _KWH,
                   gpu_cost=idle_cost)

    for r in (*rows, unattributed, idle_row):
        r.energy_cost = r.energy_kwh * rates.energy_kwh
    note = _share_idle(rows, idle_row, idle_policy)
    if not priced:
        note = ("showback: no rates file, so no cost; the idle GPU-hours are on the idle "
                "row")
    for r in (*rows, unattributed, idle_row):
        r.total_cost = r.gpu_cost + r.energy_cost + r.idle_share_cost

    owners_h = sum(r.charged_gpu_hours for r in rows)
    recon = Reconciliation(
        fleet_gpu_hours=fleet_seconds / _H,
        down_gpu_hours=down_seconds / _H,
        owners_gpu_hours=owners_h,
        unattributed_gpu_hours=unattributed.charged_gpu_hours,
        idle_gpu_hours=idle_row.charged_gpu_hours,
        difference_gpu_hours=fleet_seconds / _H - (
            owners_h + unattributed.charged_gpu_hours + idle_row.charged_gpu_hours),
        fleet_energy_kwh=fleet_energy / _KWH,
        rows_energy_kwh=rows_energy / _KWH,
        power_energy_kwh=fleet_power_energy / _KWH,
        energy_difference_kwh=(fleet_energy - fleet_power_energy) / _KWH,
    )
    notes = list(data.notes)
    warning = energy_warning(recon.fleet_energy_kwh, recon.power_energy_kwh)
    if warning is not None:
        notes.append(warning)
    return Bill(
        start=data.start, end=data.end, source=data.source, currency=rates.currency,
        idle_policy=idle_policy, idle_policy_note=note,
        rows=[*rows, unattributed, idle_row], reconciliation=recon, days=data.days,
        unmapped=sorted(unmapped), simulated_excluded=data.simulated_excluded,
        simulated_included=data.simulated_included, verified=data.verified,
        verification_problems=list(data.verification_problems), notes=notes,
        completeness=data.completeness, priced=priced,
        allocation_known=data.allocation_known, energy_kwh_price=rates.energy_kwh,
        lines=_lines([*rows, unattributed, idle_row], row_models, rates),
    )


def _lines(rows: list[Row], row_models: dict[tuple[str, str, str, str], dict[str, float]],
           rates: Rates) -> list[Line]:
    """Each row's GPU cost per model, in the rows' order, models sorted."""
    out = []
    for r in rows:
        for model, seconds in sorted(row_models.get(
                (r.kind, r.department, r.project, r.user), {}).items()):
            if seconds <= 0:
                continue
            price = rates.gpu_hour_price(model)
            out.append(Line(r.kind, r.department, r.project, r.user, model, seconds / _H,
                            price, seconds / _H * price))
    return out


def _share_idle(rows: list[Row], idle_row: Row, policy: str) -> str:
    """Spread the idle row's cost over owner rows; returns the note for the bill."""
    cost = idle_row.gpu_cost + idle_row.energy_cost
    if policy == "none":
        return "idle cost not shared (policy none): the idle row carries it"
    if not rows:
        return f"idle cost not shared (policy {policy}): no owner rows to share it"
    weights = [r.charged_gpu_hours for r in rows]
    note = "idle cost shared over owner rows in proportion to charged GPU-hours"
    if policy == "even":
        weights = [1.0] * len(rows)
        note = "idle cost shared evenly over owner rows"
    elif sum(weights) <= 0:
        weights = [1.0] * len(rows)
        note = ("idle cost shared evenly over owner rows: policy proportional, but every "
                "owner's charged GPU-hours are 0 (the defined fallback)")
    total = sum(weights)
    for r, w in zip(rows, weights, strict=True):
        r.idle_share_cost = cost * w / total
    idle_row.idle_share_cost = -cost
    return note


def _key(r: Row) -> str:
    return f"{r.kind}/{r.department}/{r.project}/{r.user}"


def compare_bills(bill: Bill, other: Bill) -> SourceComparison:
    """How `other` (another source's bill of the same period, same rates, directory and
    policy) differs from `bill`: its reconciliation figures and the `MAX_ROWS` rows that
    differ most (absolute total-cost difference, then charged GPU-hours, then key)."""
    mine = {_key(r): r for r in bill.rows}
    theirs = {_key(r): r for r in other.rows}
    zero = Row("", "", "", "")
    diffs = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key, zero), theirs.get(key, zero)
        diffs.append(RowDifference(
            key=key, charged_gpu_hours=a.charged_gpu_hours,
            other_charged_gpu_hours=b.charged_gpu_hours, energy_kwh=a.energy_kwh,
            other_energy_kwh=b.energy_kwh, total_cost=a.total_cost,
            other_total_cost=b.total_cost))
    diffs.sort(key=lambda d: (-abs(d.other_total_cost - d.total_cost),
                              -abs(d.other_charged_gpu_hours - d.charged_gpu_hours), d.key))
    r = other.reconciliation
    return SourceComparison(
        fleet_gpu_hours=r.fleet_gpu_hours, owners_gpu_hours=r.owners_gpu_hours,
        unattributed_gpu_hours=r.unattributed_gpu_hours, idle_gpu_hours=r.idle_gpu_hours,
        fleet_energy_kwh=r.fleet_energy_kwh, rows_energy_kwh=r.rows_energy_kwh,
        largest_differences=diffs[:MAX_ROWS])
