"""The HTML report a lab head reads in a minute: one self-contained page per bill.

Top of the page: the period exactly as given (date and time, UTC said), the trail
warning when the bill comes from an unverified audit trail, then a one-screen summary
(key figures, the bill by kind with a totals line, what charged, used and busy hours
mean). Then cost by
department, top users and projects, fleet time and energy by day, the reconciliation
(and how other sources disagree), unmapped users and projects, simulated records left
out, and the full bill (unit price, GPU cost, energy cost, idle share and total per row,
and a totals line). A showback (no rates) shows hours and energy and no money. Charts
are inline SVG (chargeback.charts); there is no script,
no external asset and no fetched font, and a print stylesheet keeps it readable on A4.

Every value that came from outside (user, project, department, source names, notes) is
HTML-escaped: names in the audit trail are whatever a job said they were. The page holds
no wall-clock time and no output path, only the period and the software version, so a
replay renders it byte for byte.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from html import escape

from chargeback.charts import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    SKY,
    VERMILLION,
    Series,
    hbars,
    stacked_days,
)
from chargeback.model import Bill, Request, Row, SourceData
from chargeback.values import (
    JOULES_PER_KWH,
    MANIFEST_NAME,
    SECONDS_PER_HOUR,
    rfc3339,
    software_version,
)

TOP = 10
# |fleet - (owners + unattributed + idle)| above this share of the fleet is flagged.
RECONCILE_TOLERANCE = 0.001

_CSS = """
:root { --ink: #1b1b1b; --muted: #555; --rule: #d7d7d7; --warn: #8a1c00; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--ink); margin: 0 auto;
       max-width: 940px; padding: 20px; }
h1 { font-size: 22px; margin: 0 0 2px; }
h2 { font-size: 16px; margin: 22px 0 6px; border-bottom: 1px solid var(--rule);
     padding-bottom: 3px; }
.sub { color: var(--muted); margin: 0 0 12px; }
.banner { border: 2px solid var(--warn); color: var(--warn); background: #fff3ef;
          padding: 8px 12px; margin: 10px 0; font-weight: 600; }
.banner ul { margin: 4px 0 0; font-weight: 400; }
.note { border-left: 3px solid var(--rule); padding: 2px 10px; color: var(--muted); }
.tiles { display: grid; grid-template-columns: repeat(3, 1fr); gap: 8px; margin: 12px 0; }
.tile { border: 1px solid var(--rule); padding: 8px 10px; }
.tile .v { font-size: 20px; font-weight: 650; }
.tile .k { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; margin: 4px 0 8px; }
th, td { padding: 3px 6px; border-bottom: 1px solid var(--rule); text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th.n { white-space: normal; }
tr.flag td { color: var(--warn); font-weight: 600; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
svg.chart { max-width: 100%; height: auto; display: block; }
.dept { color: var(--muted); font-size: 11px; }
.full table { font-size: 11px; }
.full td { overflow-wrap: anywhere; }
.full th, .full td { padding: 3px 4px; }
tr.total td { border-top: 2px solid var(--ink); font-weight: 650; }
.meanings { color: var(--muted); font-size: 12px; margin: 4px 0; padding-left: 18px; }
footer { margin-top: 24px; color: var(--muted); font-size: 12px; }
@page { size: A4; margin: 12mm; }
@media print {
  body { max-width: none; padding: 0; font-size: 11px; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  section, .tiles, table, svg { break-inside: avoid; }
  h2 { break-after: avoid; }
  .full { break-before: page; }
}
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _h(value: float) -> str:
    return f"{value:,.1f}"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "n/a"


class Money:
    """Money as the reader sees it: two decimals and the currency, never "-0.00" (a
    rounding residue is zero), and a dash in a showback (no rates: no cost)."""

    def __init__(self, currency: str, priced: bool = True) -> None:
        self.currency = currency
        self.priced = priced

    def __call__(self, value: float) -> str:
        if not self.priced:
            return "\u2013"
        return f"{self.plain(value)} {self.currency}".strip()

    def plain(self, value: float) -> str:
        """The amount without the currency (tables that say it in the header)."""
        if not self.priced:
            return "\u2013"
        cents = round(value, 2)
        return f"{0.0 if cents == 0 else cents:,.2f}"


def when(moment: datetime) -> str:
    """A period bound as given: date and time (seconds when not whole minutes), UTC."""
    moment = moment.astimezone(UTC)
    fmt = "%Y-%m-%d %H:%M:%S" if moment.second else "%Y-%m-%d %H:%M"
    return moment.strftime(fmt) + " UTC"


# What each kind of GPU-hours means, said wherever they are shown side by side.
MEANINGS = (
    ("Charged", "GPU-hours billed: the time a GPU was held, a GPU shared by several "
     "owners split among them. Charged hours of all rows add up to the fleet's hours."),
    ("Used", "GPU-hours a process of the owner held a GPU; a shared GPU counts fully for "
     "each owner, so used can exceed charged."),
    ("Busy", "used GPU-hours weighted by the GPU's utilisation (1 h at 50 % is 0.5 h). "
     "Busy % = busy / used."),
    ("Allocated", "GPU-hours reserved for the owner (launcher, Kubernetes, Slurm), used "
     "or not; \u2013 where the source cannot see reservations."),
    ("Waste", "used GPU-hours while the GPU was under 5 % busy."),
)


def _table(head: Iterable[tuple[str, bool]], rows: Iterable[Iterable[str]],
           flags: Iterable[bool] = ()) -> str:
    """A table; head is (title, numeric); cells are already-escaped HTML."""
    head = list(head)
    flag_list = list(flags)
    out = ["<table><thead><tr>"]
    out += [f'<th class="n">{t}</th>' if n else f"<th>{t}</th>" for t, n in head]
    out.append("</tr></thead><tbody>")
    for i, cells in enumerate(rows):
        cls = ' class="flag"' if i < len(flag_list) and flag_list[i] else ""
        out.append(f"<tr{cls}>")
        out += [f'<td class="n">{c}</td>' if n else f"<td>{c}</td>"
                for c, (_, n) in zip(cells, head, strict=True)]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _label(row: Row) -> str:
    if row.kind == "idle":
        return "(idle fleet)"
    if row.kind == "unattributed":
        return "(unattributed)"
    return row.department


def _measure(bill: Bill, money: Money) -> tuple[str, Callable[[Row], float],
                                               Callable[[float], str]]:
    """What the charts rank by: total cost, or charged GPU-hours in a showback."""
    if bill.priced:
        return "cost", lambda r: r.total_cost, money
    return "charged GPU-hours", lambda r: r.charged_gpu_hours, lambda v: f"{_h(v)} h"


def _group(rows: Iterable[Row], key: str) -> list[tuple[str, Row]]:
    """Owner rows summed by department, user or project; largest total cost (then
    charged GPU-hours) first."""
    sums: dict[str, Row] = {}
    for row in rows:
        if row.kind != "owner":
            continue
        name = getattr(row, key) or "(unknown)"
        acc = sums.setdefault(name, Row(kind="owner", department="", project="", user=""))
        for field in ("allocated_gpu_hours", "used_gpu_hours", "charged_gpu_hours",
                      "busy_gpu_hours", "idle_held_gpu_hours", "energy_kwh",
                      "power_energy_kwh", "gpu_cost", "energy_cost", "idle_share_cost",
                      "total_cost"):
            setattr(acc, field, getattr(acc, field) + getattr(row, field))
    return sorted(sums.items(), key=lambda kv: (-kv[1].total_cost,
                                                -kv[1].charged_gpu_hours, kv[0]))


def _departments_of(rows: Iterable[Row], key: str) -> dict[str, list[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        if row.kind == "owner":
            out[getattr(row, key) or "(unknown)"].add(row.department)
    return {k: sorted(v) for k, v in out.items()}


def _dept_hint(departments: list[str], key: str) -> str:
    if key == "department" or not departments:
        return ""
    return f' <span class="dept">{_e(", ".join(departments))}</span>'


def _trail(bill: Bill) -> str:
    return _simulated(bill) + _gaps(bill) + _energy(bill) + _chain(bill)


def _energy(bill: Bill) -> str:
    said = [n for n in bill.notes if n.startswith("ENERGY:")]
    return "".join(f'<div class="banner" id="energy-warning">{_e(n)}</div>' for n in said)


def _gaps(bill: Bill) -> str:
    c = bill.completeness
    if c is None or not c.gaps:
        return ""
    listed = "".join(f"<li>{_e(g)}</li>" for g in c.gaps)
    return ('<div class="banner" id="gaps">INCOMPLETE audit trail: records are missing and '
            "this bill was made with --allow-gaps. It cannot be proven complete."
            f"<ul>{listed}</ul></div>")


def _completeness(bill: Bill) -> str:
    c = bill.completeness
    if c is None:
        return ""
    parts = ['<section id="completeness"><h2>Completeness</h2>',
             f'<p id="completeness-status"><b>{_e(c.status)}</b>: '
             f"{c.inventory_gpus} GPU(s) on {c.inventory_hosts} host(s) in the period stand "
             f"for {_h(c.expected_gpu_hours)} GPU-hours over the time their chains cover; "
             f"the records account for {_h(c.observed_gpu_hours)} (up + down), "
             f"{_h(c.expected_gpu_hours - c.observed_gpu_hours)} not observed.</p>"]
    parts.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in c.chains) + "</ul>")
    if c.silent:
        parts.append("<p>Silent this period (records in the one before):</p><ul>"
                     + "".join(f"<li>{_e(x)}</li>" for x in c.silent) + "</ul>")
    parts.append("</section>")
    return "".join(parts)


def _simulated(bill: Bill) -> str:
    if not bill.simulated_included:
        return ""
    said = "".join(f"<li>{_e(n)}</li>" for n in bill.notes if n.startswith("SIMULATED"))
    return ('<div class="banner" id="simulated-banner">SIMULATED: simulated records are '
            "included in this bill (--include-simulated). It is not a bill for real "
            f"hardware.<ul>{said}</ul></div>")


def _chain(bill: Bill) -> str:
    if bill.verified is False:
        problems = "".join(f"<li>{_e(p)}</li>" for p in bill.verification_problems)
        return ('<div class="banner" id="unverified">Unverified audit trail: not all of '
                "what this bill adds up was proven (the hash chain did not verify and "
                "--allow-unverified let it through, or an unkeyed trail's seals were "
                "billed unread with --trust-unkeyed-seals). Do not invoice from it before "
                f"the trail is explained.<ul>{problems}</ul></div>")
    if bill.verified:
        return '<p class="note">Audit trail: hash chain verified while reading.</p>'
    return (f'<p class="note">Source {_e(bill.source)} has no hash chain: figures are '
            "as the source reports them.</p>")


def _tiles(bill: Bill, money: Money) -> str:
    rec = bill.reconciliation
    rows = bill.rows
    total = sum(r.total_cost for r in rows)
    held = sum(r.used_gpu_hours for r in rows if r.kind != "idle")
    waste = sum(r.idle_held_gpu_hours for r in rows if r.kind != "idle")
    tiles = [
        (money(total), "total cost"),
        (f"{_h(rec.fleet_gpu_hours)} h", f"fleet GPU-hours up ({_h(rec.down_gpu_hours)} h down)"),
        (_pct(rec.owners_gpu_hours, rec.fleet_gpu_hours), "of fleet time charged to owners"),
        (f"{_h(waste)} h", f"waste: held but idle ({_pct(waste, held)} of held time)"),
        (f"{_h(rec.idle_gpu_hours)} h", f"idle fleet, held by no one "
                                       f"({_pct(rec.idle_gpu_hours, rec.fleet_gpu_hours)})"),
        (f"{rec.fleet_energy_kwh:,.1f} kWh",
         f"energy (integrated power: {rec.power_energy_kwh:,.1f} kWh)"),
    ]
    cells = "".join(f'<div class="tile"><div class="v">{_e(v)}</div>'
                    f'<div class="k">{_e(k)}</div></div>' for v, k in tiles)
    return f'<div class="tiles">{cells}</div>'


def _departments(bill: Bill, money: Money) -> str:
    groups = _group(bill.rows, "department")
    what, value, shown = _measure(bill, money)
    items = [(name, value(row), shown(value(row))) for name, row in groups]
    items += [(_label(r), value(r), shown(value(r))) for r in bill.rows
              if r.kind != "owner" and value(r) > 0]
    items.sort(key=lambda item: (-item[1], item[0]))
    table = _table(
        [("Department", False), ("GPU-hours charged", True), ("Used", True),
         ("Waste (held idle)", True), ("kWh", True), ("GPU cost", True),
         ("Energy cost", True), ("Idle share", True), ("Total", True)],
        ([_e(name), _h(r.charged_gpu_hours), _h(r.used_gpu_hours),
          _h(r.idle_held_gpu_hours), _h(r.energy_kwh), _e(money(r.gpu_cost)),
          _e(money(r.energy_cost)), _e(money(r.idle_share_cost)), _e(money(r.total_cost))]
         for name, r in groups),
    )
    policy = f"Idle fleet cost policy: <b>{_e(bill.idle_policy)}</b>"
    policy += f" ({_e(bill.idle_policy_note)})." if bill.idle_policy_note else "."
    title = f"{what.capitalize()} by department"
    return (f'<section id="departments"><h2>{_e(title)}</h2>'
            f"{hbars(title, items, color=BLUE)}{table}"
            f'<p class="note">{policy}</p></section>')


def _top(bill: Bill, money: Money, key: str, color: str) -> str:
    groups = _group(bill.rows, key)[:TOP]
    depts = _departments_of(bill.rows, key)
    what, value, shown = _measure(bill, money)
    title = f"Top {key}s by {what}"
    items = [(name, value(r), shown(value(r))) for name, r in groups]
    table = _table(
        [(key.capitalize(), False), ("Charged GPU-h", True), ("Used GPU-h", True),
         ("Busy % of used", True), ("Total cost", True)],
        ([_e(name) + _dept_hint(depts.get(name, []), key), _h(r.charged_gpu_hours),
          _h(r.used_gpu_hours), _pct(r.busy_gpu_hours, r.used_gpu_hours),
          _e(money(r.total_cost))]
         for name, r in groups),
    )
    return (f'<section id="top-{key}s"><h2>{_e(title)}</h2>'
            f"{hbars(title, items, color=color, width=440)}{table}</section>")


def _waste(bill: Bill) -> str:
    groups = [(n, r) for n, r in _group(bill.rows, "user") if r.idle_held_gpu_hours > 0]
    groups.sort(key=lambda kv: (-kv[1].idle_held_gpu_hours, kv[0]))
    items = [(name, r.idle_held_gpu_hours,
              f"{_h(r.idle_held_gpu_hours)} h ({_pct(r.idle_held_gpu_hours, r.used_gpu_hours)})")
             for name, r in groups[:TOP]]
    return ('<section id="waste"><h2>Biggest waste: GPUs held while under 5 % busy</h2>'
            f"{hbars('Idle-held GPU-hours by user', items, color=VERMILLION)}</section>")


def _by_day(bill: Bill) -> str:
    days = sorted(bill.days)
    held_busy: list[float] = []
    held_idle: list[float] = []
    idle: list[float] = []
    down: list[float] = []
    energy: list[float] = []
    for day in days:
        fleet = bill.days[day][1]
        held_idle.append(fleet.idle_held_gpu_seconds / SECONDS_PER_HOUR)
        held_busy.append(max(fleet.held_gpu_seconds - fleet.idle_held_gpu_seconds, 0.0)
                         / SECONDS_PER_HOUR)
        idle.append(max(fleet.gpu_seconds - fleet.held_gpu_seconds, 0.0) / SECONDS_PER_HOUR)
        down.append(fleet.down_gpu_seconds / SECONDS_PER_HOUR)
        energy.append(fleet.energy_joules / JOULES_PER_KWH)
    time_chart = stacked_days(
        "Fleet GPU-hours by day",
        days,
        [Series("held, working", GREEN), Series("held, idle (waste)", VERMILLION),
         Series("not held (idle)", ORANGE), Series("down", GREY)],
        [held_busy, held_idle, idle, down],
        "GPU-h",
    )
    energy_chart = stacked_days("Energy by day", days, [Series("energy", SKY)], [energy],
                                "kWh", height=180)
    return ('<section id="by-day"><h2>Fleet time by day: working, waste, idle, down</h2>'
            f"{time_chart}<h2>Energy by day</h2>{energy_chart}</section>")


def _reconciliation(bill: Bill) -> str:
    rec = bill.reconciliation
    off = abs(rec.difference_gpu_hours) > RECONCILE_TOLERANCE * max(rec.fleet_gpu_hours, 1e-9)
    rows = [
        ("Fleet GPU-hours (GPUs up)", rec.fleet_gpu_hours, False),
        ("Charged to owners", rec.owners_gpu_hours, False),
        ("Unattributed processes", rec.unattributed_gpu_hours, False),
        ("Idle (held by no one)", rec.idle_gpu_hours, False),
        ("Difference: fleet \u2212 (owners + unattributed + idle)",
         rec.difference_gpu_hours, off),
        ("Down (not in the fleet's time)", rec.down_gpu_hours, False),
    ]
    hours = _table([("GPU time", False), ("GPU-hours", True), ("Share of fleet", True)],
                   ([_e(k), f"{v:,.3f}", _pct(v, rec.fleet_gpu_hours)] for k, v, _ in rows),
                   [flag for _, _, flag in rows])
    energy_rows = [
        ("Energy counter, fleet", rec.fleet_energy_kwh),
        ("Energy in the rows", rec.rows_energy_kwh),
        ("Integrated power draw (cross-check)", rec.power_energy_kwh),
        ("Counter \u2212 power", rec.energy_difference_kwh),
    ]
    energy = _table([("Energy", False), ("kWh", True), ("Share of counter", True)],
                    ([_e(k), f"{v:,.3f}", _pct(v, rec.fleet_energy_kwh)]
                     for k, v in energy_rows))
    others = _other_sources(bill)
    verdict = ("does not add up: see the flagged line" if off
               else "adds up (within 0.1 % of the fleet)")
    return ('<section id="reconciliation"><h2>Reconciliation</h2>'
            f'<p>Rows + unattributed + idle against the fleet: <b>{verdict}</b>.</p>'
            f'<div class="cols"><div>{hours}</div><div>{energy}</div></div>{others}</section>')


def _other_sources(bill: Bill) -> str:
    """Each other source's figures for the same period (--compare-with, or only its fleet
    GPU-hours when that is all the bill has), the difference flagged beyond 0.1 %, and
    the rows that differ most."""
    rec = bill.reconciliation
    if not rec.other_sources and not rec.comparisons:
        return ""

    def flag(d: float, base: float) -> bool:
        return abs(d) > RECONCILE_TOLERANCE * max(abs(base), 1e-9)

    def rel(d: float, base: float) -> str:
        return f"{100 * d / base:+.2f} %" if base else "n/a"

    out = ["<h2>Other sources for the same period</h2>"]
    for name, value in sorted(rec.other_sources.items()):
        c = rec.comparisons.get(name)
        figures = [("Fleet GPU-hours", rec.fleet_gpu_hours, value)]
        if c is not None:
            figures += [("Charged to owners", rec.owners_gpu_hours, c.owners_gpu_hours),
                        ("Unattributed", rec.unattributed_gpu_hours, c.unattributed_gpu_hours),
                        ("Idle", rec.idle_gpu_hours, c.idle_gpu_hours),
                        ("Energy, fleet (kWh)", rec.fleet_energy_kwh, c.fleet_energy_kwh),
                        ("Energy in the rows (kWh)", rec.rows_energy_kwh, c.rows_energy_kwh)]
        out.append(f"<h3>{_e(name)} against {_e(bill.source)} (this bill)</h3>" + _table(
            [("Figure", False), (_e(bill.source), True), (_e(name), True),
             ("Differs by", True), ("Relative", True)],
            [[_e(k), f"{a:,.3f}", f"{b:,.3f}", f"{b - a:+,.3f}", rel(b - a, a)]
             for k, a, b in figures],
            [flag(b - a, a) for _, a, b in figures]))
        if c is not None and c.largest_differences:
            out.append(f"<p>Rows that differ most ({_e(name)} \u2212 {_e(bill.source)}):"
                       "</p>" + _table(
                [("Row", False), ("Charged GPU-h", True), ("Energy kWh", True),
                 ("Total cost", True)],
                [[_e(d.key.strip("/")), f"{d.other_charged_gpu_hours - d.charged_gpu_hours:+,.3f}",
                  f"{d.other_energy_kwh - d.energy_kwh:+,.3f}",
                  f"{d.other_total_cost - d.total_cost:+,.2f}"]
                 for d in c.largest_differences],
                [flag(d.other_total_cost - d.total_cost, d.total_cost)
                 for d in c.largest_differences]))
    return "".join(out)


def _coverage(bill: Bill) -> str:
    parts = ['<section id="coverage"><h2>Coverage</h2>']
    if bill.unmapped:
        names = ", ".join(f"<code>{_e(n)}</code>" for n in sorted(bill.unmapped))
        parts.append(f'<p id="unmapped">{len(bill.unmapped)} user(s)/project(s) not in '
                     f'the directory, billed to department "unmapped": {names}</p>')
    else:
        parts.append('<p id="unmapped">Every user and project is in the directory.</p>')
    if bill.simulated_included:
        parts.append('<p id="simulated">Simulated records are <b>included</b> '
                     "(--include-simulated): this is not a bill for real hardware.</p>")
    else:
        parts.append(f'<p id="simulated">{bill.simulated_excluded:,} simulated '
                     "record(s)/series left out.</p>")
    parts += [f'<p class="note">{_e(n)}</p>' for n in bill.notes]
    parts.append("</section>")
    return "".join(parts)


def _prices(bill: Bill, money: Money) -> dict[tuple[str, str, str, str], str]:
    """Each row's price per GPU-hour: one price, or each model's (the line items)."""
    out: dict[tuple[str, str, str, str], list[str]] = {}
    for li in bill.lines:
        key = (li.kind, li.department, li.project, li.user)
        text = money.plain(li.gpu_hour_price)
        if len({m.gpu_model for m in bill.lines}) > 1:
            text += f" ({li.gpu_model})"
        out.setdefault(key, []).append(text)
    return {k: "<br>".join(_e(t) for t in v) for k, v in out.items()}


def _full(bill: Bill, money: Money) -> str:
    prices = _prices(bill, money)
    cur = f" ({_e(bill.currency)})" if bill.priced else ""
    head = [("Department", False), ("Project", False), ("User", False),
            ("Allocated h", True), ("Used h", True), ("Charged h", True), ("Busy h", True),
            ("kWh", True), (f"Price / GPU-h{cur}", True), (f"GPU cost{cur}", True),
            (f"Energy cost{cur}", True), (f"Idle share{cur}", True), (f"Total{cur}", True)]

    def cells(r: Row, label: str, price: str, allocated: str) -> list[str]:
        return [label, _e(r.project), _e(r.user), allocated, _h(r.used_gpu_hours),
                _h(r.charged_gpu_hours), _h(r.busy_gpu_hours), _h(r.energy_kwh), price,
                _e(money.plain(r.gpu_cost)), _e(money.plain(r.energy_cost)),
                _e(money.plain(r.idle_share_cost)), _e(money.plain(r.total_cost))]

    def allocated(r: Row) -> str:
        return _h(r.allocated_gpu_hours) if bill.allocation_known else "\u2013"

    body = [cells(r, _e(_label(r)), prices.get((r.kind, r.department, r.project, r.user),
                                               "\u2013") if bill.priced else "\u2013",
                  allocated(r)) for r in bill.rows]
    total = _sum_rows(bill.rows)
    body.append(cells(total, "<b>Total</b>", "", allocated(total)))
    table = _table(head, body).replace(
        "<tr><td><b>Total</b>", '<tr id="bill-total" class="total"><td><b>Total</b>')
    price = (f"Energy: {_e(money(bill.energy_kwh_price))} per kWh. " if bill.priced
             else "")
    return ('<section class="full" id="bill"><h2>The bill, every row</h2>'
            f"{table}<p class=\"note\">{price}Total = GPU cost + energy cost + idle "
            "share; the idle row's negative idle share is what the owners' rows carry. "
            "Exact figures: chargeback.csv (and chargeback-lines.csv: each row's GPU "
            "cost per GPU model) beside this report.</p></section>")


def _sum_rows(rows: Iterable[Row]) -> Row:
    acc = Row(kind="total", department="", project="", user="")
    for row in rows:
        for field in _NUMBERS:
            setattr(acc, field, getattr(acc, field) + getattr(row, field))
    return acc


_NUMBERS = ("allocated_gpu_hours", "used_gpu_hours", "charged_gpu_hours", "busy_gpu_hours",
            "idle_held_gpu_hours", "energy_kwh", "power_energy_kwh", "gpu_cost",
            "energy_cost", "idle_share_cost", "total_cost")


def _summary(bill: Bill, money: Money) -> str:
    """The one screen: the bill by kind (owners, unattributed, idle) with its total,
    and what the kinds of hours mean."""
    owners = _sum_rows(r for r in bill.rows if r.kind == "owner")
    kinds = [(f"Owners ({sum(1 for r in bill.rows if r.kind == 'owner')} rows)", owners)]
    kinds += [(_label(r), r) for r in bill.rows if r.kind != "owner"]
    total = _sum_rows(bill.rows)
    cur = f" ({_e(bill.currency)})" if bill.priced else ""
    table = _table(
        [("", False), ("Charged GPU-h", True), ("Used GPU-h", True), ("Busy GPU-h", True),
         ("kWh", True), (f"GPU cost{cur}", True), (f"Energy cost{cur}", True),
         (f"Idle share{cur}", True), (f"Total{cur}", True)],
        [[_e(name), _h(r.charged_gpu_hours), _h(r.used_gpu_hours), _h(r.busy_gpu_hours),
          _h(r.energy_kwh), _e(money.plain(r.gpu_cost)), _e(money.plain(r.energy_cost)),
          _e(money.plain(r.idle_share_cost)), _e(money.plain(r.total_cost))]
         for name, r in [*kinds, ("Total", total)]])
    meanings = "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in MEANINGS)
    showback = ("" if bill.priced else
                '<p class="banner" id="showback">Showback: no rates file was given, so '
                "this bill has GPU-hours and energy and no cost.</p>")
    return (f'<section id="summary"><h2>Summary</h2>{showback}{table}'
            f'<ul class="meanings">{meanings}</ul></section>')


def render_html(bill: Bill, req: Request, data: SourceData) -> bytes:
    """The report's bytes (UTF-8). `req` and `data` add provenance only."""
    money = Money(bill.currency, bill.priced)
    start, end = rfc3339(bill.start), rfc3339(bill.end)
    kind = "GPU chargeback" if bill.priced else "GPU showback"
    title = f"{kind} {when(bill.start)} to {when(bill.end)}"
    flags = []
    if req.include_simulated:
        flags.append("--include-simulated")
    if req.allow_unverified:
        flags.append("--allow-unverified")
    if req.allow_gaps:
        flags.append("--allow-gaps")
    if req.trust_unkeyed_seals:
        flags.append("--trust-unkeyed-seals")
    provenance = (f"Made by {_e(software_version())} from source <b>{_e(bill.source)}</b> "
                  f"({len(data.queries)} queries, {len(data.inputs)} inputs"
                  f"{', ' + _e(' '.join(flags)) if flags else ''}). {MANIFEST_NAME} beside "
                  "this report lists every query, input, rates and directory file with "
                  "their sha256; <code>gpu-audit chargeback --replay "
                  f"{MANIFEST_NAME}</code> reproduces this bill byte for byte.")
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(start)} to {_e(end)} (UTC, end exclusive) \u00b7 source '
        f"{_e(bill.source)} \u00b7 idle policy {_e(bill.idle_policy)} \u00b7 "
        f"{_e(bill.currency if bill.priced else 'showback, no rates')}</p>",
        _trail(bill),
        _tiles(bill, money),
        _summary(bill, money),
        _departments(bill, money),
        '<div class="cols">',
        _top(bill, money, "user", BLUE),
        _top(bill, money, "project", GREEN),
        "</div>",
        _waste(bill),
        _by_day(bill),
        _reconciliation(bill),
        _coverage(bill),
        _completeness(bill),
        _full(bill, money),
        f"<footer>{provenance}</footer>",
    ]
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><meta name=\"viewport\" "
            "content=\"width=device-width, initial-scale=1\">"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    return page.encode("utf-8")
