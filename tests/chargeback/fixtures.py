"""A hand-made month of chargeback for the output tests: a Bill built without the code
under test (no compute.build_bill), from a seeded generator, so its totals add up by
construction: per day, owners + unattributed + idle = the fleet's up time."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chargeback.model import (
    UNATTRIBUTED,
    Bill,
    Fleet,
    Owner,
    Reconciliation,
    Request,
    Row,
    SourceData,
    Usage,
)

HOSTILE_USER = '<script>alert("pwned")</script>'
HOSTILE_PROJECT = '"><img src=x onerror=alert(1)>'
FORMULA_USER = "=HYPERLINK(\"http://evil\")"

GPU_PRICE = 2.5  # EUR per GPU-hour
KWH_PRICE = 0.30  # EUR per kWh
GPUS = 16

# user -> (project, department or None when unmapped, share of the fleet held, busy ratio)
OWNERS: dict[str, tuple[str, str | None, float, float]] = {
    "alice": ("lattice-qcd", "physics", 0.20, 0.85),
    "bob": ("lattice-qcd", "physics", 0.10, 0.40),
    "carol": ("cosmo-sim", "physics", 0.08, 0.70),
    "dave": ("protein-fold", "biology", 0.15, 0.90),
    "erin": ("protein-fold", "biology", 0.06, 0.25),
    "frank": ("dft-screen", "chemistry", 0.09, 0.75),
    "mallory": ("side-quest", None, 0.03, 0.10),
}


def period(days: int = 30) -> tuple[datetime, datetime]:
    start = datetime(2026, 11, 1, tzinfo=UTC)
    return start, start + timedelta(days=days)


def sample_days(days: int = 30, *, hostile: bool = False
                ) -> dict[str, tuple[dict[Owner, Usage], Fleet]]:
    rng = random.Random(12)
    owners = dict(OWNERS)
    if hostile:
        owners[HOSTILE_USER] = (HOSTILE_PROJECT, None, 0.02, 0.5)
        owners[FORMULA_USER] = ("ok-project", None, 0.01, 0.5)
    start, _ = period(days)
    out: dict[str, tuple[dict[Owner, Usage], Fleet]] = {}
    for d in range(days):
        day = (start + timedelta(days=d)).strftime("%Y-%m-%d")
        down = 86400.0 if d == 9 else 0.0  # one GPU down for a day
        up = GPUS * 86400.0 - down
        usage: dict[Owner, Usage] = {}
        held = 0.0
        for user, (project, _dept, share, busy) in owners.items():
            weekend = 0.4 if d % 7 in (5, 6) else 1.0
            used = up * share * weekend * rng.uniform(0.7, 1.1)
            idle_held = used * (1 - busy) * rng.uniform(0.6, 0.9)
            energy = used * (busy * 300 + 60)
            usage[(user, project)] = Usage(
                allocated_gpu_seconds=used * 1.1, used_gpu_seconds=used,
                charged_gpu_seconds=used, busy_gpu_seconds=used * busy,
                idle_held_gpu_seconds=idle_held, energy_joules=energy,
                power_energy_joules=energy * 0.995)
            held += used
        unattributed = up * 0.01
        usage[UNATTRIBUTED] = Usage(used_gpu_seconds=unattributed,
                                    charged_gpu_seconds=unattributed,
                                    busy_gpu_seconds=unattributed * 0.5,
                                    energy_joules=unattributed * 200,
                                    power_energy_joules=unattributed * 199)
        held += unattributed
        idle_energy = (up - held) * 55
        fleet = Fleet(
            gpu_seconds=up, down_gpu_seconds=down, held_gpu_seconds=held,
            busy_gpu_seconds=sum(u.busy_gpu_seconds for u in usage.values()),
            idle_held_gpu_seconds=sum(u.idle_held_gpu_seconds for u in usage.values()),
            energy_joules=sum(u.energy_joules for u in usage.values()) + idle_energy,
            power_energy_joules=sum(u.power_energy_joules for u in usage.values())
            + idle_energy * 0.99)
        out[day] = (usage, fleet)
    return out


def _row(kind: str, dept: str, project: str, user: str, u: Usage) -> Row:
    h, kwh = u.charged_gpu_seconds / 3600, u.energy_joules / 3.6e6
    return Row(kind=kind, department=dept, project=project, user=user,
               allocated_gpu_hours=u.allocated_gpu_seconds / 3600,
               used_gpu_hours=u.used_gpu_seconds / 3600, charged_gpu_hours=h,
               busy_gpu_hours=u.busy_gpu_seconds / 3600,
               idle_held_gpu_hours=u.idle_held_gpu_seconds / 3600, energy_kwh=kwh,
               power_energy_kwh=u.power_energy_joules / 3.6e6,
               gpu_cost=h * GPU_PRICE, energy_cost=kwh * KWH_PRICE,
               total_cost=h * GPU_PRICE + kwh * KWH_PRICE)


def sample_bill(days: int = 30, *, hostile: bool = False, verified: bool | None = True,
                other_sources: dict[str, float] | None = None) -> Bill:
    """A month for 16 GPUs, 7 users in 3 departments plus an unmapped one, proportional
    idle share; `hostile` adds users whose names are HTML and a spreadsheet formula."""
    per_day = sample_days(days, hostile=hostile)
    totals: dict[Owner, Usage] = {}
    fleet = Fleet()
    for usage, day_fleet in per_day.values():
        fleet.add(day_fleet)
        for owner, u in usage.items():
            totals.setdefault(owner, Usage()).add(u)
    departments = {user: dept for user, (_, dept, _, _) in OWNERS.items()}
    rows = [_row("owner", departments.get(user or "") or "unmapped", project or "",
                 user or "", u) for (user, project), u in totals.items()
            if (user, project) != UNATTRIBUTED]
    idle_hours = (fleet.gpu_seconds - fleet.held_gpu_seconds) / 3600
    idle_kwh = (fleet.energy_joules - sum(u.energy_joules for u in totals.values())) / 3.6e6
    idle_cost = idle_hours * GPU_PRICE + idle_kwh * KWH_PRICE  # shared, as compute does
    owner_hours = sum(r.charged_gpu_hours for r in rows)
    for r in rows:  # proportional idle share
        r.idle_share_cost = idle_cost * r.charged_gpu_hours / owner_hours
        r.total_cost += r.idle_share_cost
    rows.sort(key=lambda r: (r.department, r.project, r.user))
    rows.append(_row("unattributed", "", "", "", totals[UNATTRIBUTED]))
    rows.append(Row(kind="idle", department="", project="", user="",
                    charged_gpu_hours=idle_hours, energy_kwh=idle_kwh,
                    power_energy_kwh=idle_kwh * 0.99, gpu_cost=idle_hours * GPU_PRICE,
                    energy_cost=idle_kwh * KWH_PRICE, idle_share_cost=-idle_cost,
                    total_cost=0.0))
    unattributed_h = totals[UNATTRIBUTED].charged_gpu_seconds / 3600
    fleet_h = fleet.gpu_seconds / 3600
    rec = Reconciliation(
        fleet_gpu_hours=fleet_h, down_gpu_hours=fleet.down_gpu_seconds / 3600,
        owners_gpu_hours=owner_hours, unattributed_gpu_hours=unattributed_h,
        idle_gpu_hours=idle_hours,
        difference_gpu_hours=fleet_h - (owner_hours + unattributed_h + idle_hours),
        fleet_energy_kwh=fleet.energy_joules / 3.6e6,
        rows_energy_kwh=sum(r.energy_kwh for r in rows),
        power_energy_kwh=fleet.power_energy_joules / 3.6e6,
        energy_difference_kwh=(fleet.energy_joules - fleet.power_energy_joules) / 3.6e6,
        other_sources=dict(other_sources or {}))
    start, end = period(days)
    unmapped = sorted(user for (user, _p) in totals
                      if user is not None and departments.get(user) is None)
    return Bill(
        start=start, end=end, source="archive", currency="EUR", idle_policy="proportional",
        idle_policy_note="idle cost shared over owner rows in proportion to charged "
        "GPU-hours", rows=rows, reconciliation=rec, days=per_day, unmapped=unmapped,
        simulated_excluded=1234, simulated_included=False, verified=verified,
        verification_problems=[] if verified is not False else
        ["part 2026-11-14.jsonl.gz record 88: prev_hash does not match record 87"],
        notes=["1 energy counter reset handled (gpu 3, 2026-11-20)"])


def sample_files(tmp: Path) -> tuple[Path, Path]:
    rates = tmp / "rates.yaml"
    rates.write_text(f"currency: EUR\ngpu_hour:\n  default: {GPU_PRICE}\n"
                     f"energy_kwh: {KWH_PRICE}\n", encoding="utf-8")
    directory = tmp / "directory.yaml"
    directory.write_text("users:\n" + "".join(
        f"  {u}: {d}\n" for u, (_, d, _, _) in OWNERS.items() if d) +
        "projects: {}\n", encoding="utf-8")
    return rates, directory


def sample_request(tmp: Path, bill: Bill) -> Request:
    rates, directory = sample_files(tmp)
    return Request(start=bill.start, end=bill.end, source=bill.source, config=None,
                   prometheus_url=None, rates=str(rates), directory=str(directory),
                   idle_policy=bill.idle_policy, out=str(tmp / "out"))


def sample_source_data(bill: Bill) -> SourceData:
    return SourceData(
        source=bill.source, start=bill.start, end=bill.end,
        queries=[f"archive part {d}.jsonl.gz" for d in sorted(bill.days)],
        inputs={f"{d}.jsonl.gz": f"{i:064x}" for i, d in enumerate(sorted(bill.days))},
        simulated_excluded=bill.simulated_excluded, verified=bill.verified)


A100 = "NVIDIA A100-SXM4-80GB"


def sample_month_data(days: int = 30, *, hostile: bool = False) -> SourceData:
    """The same month as `sample_bill`, as a source would hand it to compute.build_bill
    (every GPU an A100)."""
    per_day = sample_days(days, hostile=hostile)
    start, end = period(days)
    data = SourceData(source="archive", start=start, end=end, days=per_day,
                      simulated_excluded=1234, verified=True)
    fleet = Fleet()
    for usage, day_fleet in per_day.values():
        fleet.add(day_fleet)
        for owner, u in usage.items():
            data.usage.setdefault((owner, A100), Usage()).add(u)
    data.fleet[A100] = fleet
    data.queries = [f"archive part {d}.jsonl.gz" for d in sorted(per_day)]
    data.inputs = {f"{d}.jsonl.gz": f"{i:064x}" for i, d in enumerate(sorted(per_day))}
    return data
