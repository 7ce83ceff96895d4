"""Write a bill to disk: `chargeback.csv`, `chargeback-lines.csv`, `chargeback.json`,
`report.html`, `manifest.json`.

Every byte is a function of the bill, the request and what the source read: no wall
clock, no host name, no output path, so `gpu-audit chargeback replay MANIFEST` can
reproduce each file byte for byte. Numbers are rounded once (chargeback.values) to `DECIMALS` places
(CSV and JSON alike), so two runs whose floats differ in the last bit still agree.

Each file is replaced atomically (gpu_audit.atomicfile): a reader never sees half a
bill. The manifest is written last, with the sha256 of the four outputs; a crash
before it leaves no manifest, and an export without a manifest is not a finished one.

This module never computes a bill (chargeback.compute does) and never reads a source.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson

from chargeback.manifest import completeness_json, render_manifest
from chargeback.model import (
    Bill,
    Fleet,
    Line,
    Request,
    Row,
    SourceComparison,
    SourceData,
    Usage,
)
from chargeback.report import render_html
from chargeback.values import (
    CSV_NAME,
    HTML_NAME,
    JOULES_PER_KWH,
    JSON_NAME,
    LINES_CSV_NAME,
    MANIFEST_NAME,
    SECONDS_PER_HOUR,
    fmt_number,
    owner_sort_key,
    rfc3339,
    rounded,
    sha256_bytes,
    software_version,
)
from gpu_audit.atomicfile import replace_file

JSON_FORMAT = "gpu-audit-chargeback/1"

# The CSV's columns, in order. Stable: a new column is added at the end, none is renamed
# or removed (docs/CHARGEBACK.md; tests/chargeback/test_outputs.py pins the header).
ROW_NUMBER_COLUMNS = (
    "allocated_gpu_hours",
    "used_gpu_hours",
    "charged_gpu_hours",
    "busy_gpu_hours",
    "idle_held_gpu_hours",
    "energy_kwh",
    "power_energy_kwh",
    "gpu_cost",
    "energy_cost",
    "idle_share_cost",
    "total_cost",
)
# what names a row in both CSVs
ROW_KEY_COLUMNS = ("period_start", "period_end", "kind", "department", "project", "user")
CSV_COLUMNS = (
    *ROW_KEY_COLUMNS,
    *ROW_NUMBER_COLUMNS,
    "currency",
    "idle_policy",
    "source",
    "completeness",
    "energy_kwh_price",
    "simulated",
)
COST_COLUMNS = ("gpu_cost", "energy_cost", "idle_share_cost", "total_cost")
# The line-items CSV: each row's charged GPU-hours per GPU model at that model's price
LINE_COLUMNS = (
    *ROW_KEY_COLUMNS,
    "gpu_model",
    "charged_gpu_hours",
    "gpu_hour_price",
    "gpu_cost",
    "currency",
    "source",
    "simulated",
)

# A spreadsheet runs a cell starting with one of these as a formula (OWASP "CSV
# injection"); user and project names are whatever a job said, so they are defused.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")
# Where a spreadsheet may start a new cell, whatever separator its locale reads a CSV
# with: `x;=1+2` is two cells, the second a formula, in a semicolon locale (quoting does
# not help there: a comma CSV's quotes are not at a semicolon cell's start).
_AFTER_SEPARATOR = re.compile(r"([,;\t|] *)(?=[=+\-@\t\r\n])")
# A cell holding any of these is quoted (RFC 4180 allows quoting any cell), so every
# locale's CSV reader keeps it one cell.
_QUOTE_IF = (",", ";", "\t", "|", '"', "\r", "\n")


def _csv_text(value: str) -> str:
    """A text cell (a name a job gave), defused: a leading `'` when it starts like a
    formula, and a `'` after every separator that a formula start follows (a reader
    whose locale splits on `;` sees `x;'=1+2` as `x` and the text `'=1+2`)."""
    value = _AFTER_SEPARATOR.sub(r"\1'", value)
    return "'" + value if value.startswith(_FORMULA_START) else value


def _cell(value: str) -> str:
    if any(c in value for c in _QUOTE_IF) or value != value.strip(" "):
        return '"' + value.replace('"', '""') + '"'
    return value


def _csv_bytes(lines: list[list[str]], excel: bool) -> bytes:
    """RFC 4180 (comma, CRLF), every cell that holds a separator of any locale quoted;
    with `excel` a UTF-8 byte-order mark first."""
    text = "".join(",".join(_cell(c) for c in line) + "\r\n" for line in lines)
    return ("\ufeff" if excel else "").encode("utf-8") + text.encode("utf-8")


def _number(bill: Bill, name: str, value: float) -> str:
    """A number cell; cost cells are empty in a showback (no rates: no cost)."""
    if not bill.priced and (name in COST_COLUMNS or name == "gpu_hour_price"):
        return ""
    if not bill.allocation_known and name == "allocated_gpu_hours":
        return ""
    return fmt_number(value)


def _simulated(bill: Bill) -> str:
    return "true" if bill.simulated_included else "false"


def completeness_status(bill: Bill) -> str:
    """What every CSV row says of the trail behind the bill."""
    c = bill.completeness
    return "not proven (no hash chain)" if c is None else c.status


def render_csv(bill: Bill, *, totals: bool = False, excel: bool = False) -> bytes:
    """The bill, one line per row; `totals`: a last line of kind `total` whose numbers
    are the sums of the rows' written (rounded) numbers."""
    start, end = rfc3339(bill.start), rfc3339(bill.end)
    currency = bill.currency if bill.priced else ""
    price = fmt_number(bill.energy_kwh_price) if bill.priced else ""
    tail = [currency, bill.idle_policy, bill.source, completeness_status(bill), price,
            _simulated(bill)]
    lines = [list(CSV_COLUMNS)]
    for row in bill.rows:
        lines.append([
            start, end, row.kind,
            _csv_text(row.department), _csv_text(row.project), _csv_text(row.user),
            *(_number(bill, name, getattr(row, name)) for name in ROW_NUMBER_COLUMNS),
            *tail,
        ])
    if totals:
        sums = {name: sum(rounded(getattr(r, name)) for r in bill.rows)
                for name in ROW_NUMBER_COLUMNS}
        lines.append([start, end, "total", "", "", "",
                      *(_number(bill, name, sums[name]) for name in ROW_NUMBER_COLUMNS),
                      *tail])
    return _csv_bytes(lines, excel)


def render_lines_csv(bill: Bill, *, excel: bool = False) -> bytes:
    """The line items: per row and GPU model, charged GPU-hours x price = GPU cost (a
    row's lines add up to its `gpu_cost`)."""
    start, end = rfc3339(bill.start), rfc3339(bill.end)
    lines = [list(LINE_COLUMNS)]
    for li in bill.lines:
        lines.append([
            start, end, li.kind, _csv_text(li.department), _csv_text(li.project),
            _csv_text(li.user), _csv_text(li.gpu_model), fmt_number(li.charged_gpu_hours),
            _number(bill, "gpu_hour_price", li.gpu_hour_price),
            _number(bill, "gpu_cost", li.gpu_cost),
            bill.currency if bill.priced else "", bill.source, _simulated(bill)])
    return _csv_bytes(lines, excel)


# -- JSON -------------------------------------------------------------------------------

_HOURS = SECONDS_PER_HOUR
_KWH = JOULES_PER_KWH


def _amounts_json(amounts: Usage | Fleet, allocation_known: bool = True
                  ) -> dict[str, float | None]:
    """A Usage or Fleet in the bill's units: every `*_seconds` field as `*_hours`, every
    `*_joules` field as `*_kwh`; allocated GPU-hours null when not known."""
    out: dict[str, float | None] = {}
    for f in fields(amounts):
        value = getattr(amounts, f.name)
        if f.name.endswith("_seconds"):
            out[f.name.removesuffix("_seconds") + "_hours"] = rounded(value / _HOURS)
        elif f.name.endswith("_joules"):
            out[f.name.removesuffix("_joules") + "_kwh"] = rounded(value / _KWH)
    if not allocation_known and "allocated_gpu_hours" in out:
        out["allocated_gpu_hours"] = None
    return out


def _row_json(row: Row, priced: bool, allocation_known: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": row.kind, "department": row.department,
                           "project": row.project, "user": row.user}
    out.update({name: rounded(getattr(row, name)) if priced or name not in COST_COLUMNS
                else None for name in ROW_NUMBER_COLUMNS})
    if not allocation_known:
        out["allocated_gpu_hours"] = None
    return out


def _line_json(li: Line, priced: bool) -> dict[str, Any]:
    return {"kind": li.kind, "department": li.department, "project": li.project,
            "user": li.user, "gpu_model": li.gpu_model,
            "charged_gpu_hours": rounded(li.charged_gpu_hours),
            "gpu_hour_price": rounded(li.gpu_hour_price) if priced else None,
            "gpu_cost": rounded(li.gpu_cost) if priced else None}


def bill_to_json(bill: Bill) -> dict[str, Any]:
    """The bill as plain JSON values: hours and kWh throughout (days included)."""
    rec = bill.reconciliation
    days: dict[str, Any] = {}
    for day in sorted(bill.days):
        owners, fleet = bill.days[day]
        days[day] = {
            "fleet": _amounts_json(fleet),
            "owners": [
                {"user": owner[0], "project": owner[1],
                 **_amounts_json(owners[owner], bill.allocation_known)}
                for owner in sorted(owners, key=owner_sort_key)
            ],
        }
    return {
        "format": JSON_FORMAT,
        "software": software_version(),
        "period": {"start": rfc3339(bill.start), "end": rfc3339(bill.end)},
        "source": bill.source,
        "currency": bill.currency if bill.priced else None,
        "priced": bill.priced,
        "energy_kwh_price": rounded(bill.energy_kwh_price) if bill.priced else None,
        "idle_policy": bill.idle_policy,
        "idle_policy_note": bill.idle_policy_note,
        "rows": [_row_json(row, bill.priced, bill.allocation_known) for row in bill.rows],
        "allocation_known": bill.allocation_known,
        "lines": [_line_json(li, bill.priced) for li in bill.lines],
        "reconciliation": {
            **{f.name: rounded(getattr(rec, f.name)) for f in fields(rec)
               if f.name not in ("other_sources", "comparisons")},
            "other_sources": {name: rounded(value)
                              for name, value in sorted(rec.other_sources.items())},
            "comparisons": {name: _comparison_json(c)
                            for name, c in sorted(rec.comparisons.items())},
        },
        "days": days,
        "unmapped": sorted(bill.unmapped),
        "simulated_excluded": bill.simulated_excluded,
        "simulated_included": bill.simulated_included,
        "verified": bill.verified,
        "verification_problems": list(bill.verification_problems),
        "notes": list(bill.notes),
        "completeness": completeness_json(bill.completeness),  # as in the manifest
    }


def render_json(bill: Bill) -> bytes:
    return orjson.dumps(bill_to_json(bill),
                        option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


def _comparison_json(c: SourceComparison) -> dict[str, Any]:
    out: dict[str, Any] = {f.name: rounded(getattr(c, f.name)) for f in fields(c)
                           if f.name != "largest_differences"}
    out["largest_differences"] = [
        {f.name: (getattr(d, f.name) if f.name == "key" else rounded(getattr(d, f.name)))
         for f in fields(d)} for d in c.largest_differences]
    return out


# -- writing ----------------------------------------------------------------------------

def render_outputs(bill: Bill, req: Request, data: SourceData) -> dict[str, bytes]:
    """Every output file's bytes, by name (the manifest excluded: it hashes these)."""
    return {
        CSV_NAME: render_csv(bill, totals=req.csv_totals, excel=req.excel),
        LINES_CSV_NAME: render_lines_csv(bill, excel=req.excel),
        JSON_NAME: render_json(bill),
        HTML_NAME: render_html(bill, req, data),
    }


def write_outputs(bill: Bill, req: Request, data: SourceData, out_dir: Path) -> dict[str, str]:
    """Write the CSVs, JSON and HTML report, then the audit manifest beside them.

    Returns file name -> sha256 of the four outputs (what the manifest records and
    `--replay` compares). `out_dir` is created if missing.
    """
    rendered = render_outputs(bill, req, data)  # every byte first: a bad value writes nothing
    out_dir.mkdir(parents=True, exist_ok=True)
    # An earlier export's manifest would vouch for files about to change.
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    hashes: dict[str, str] = {}
    for name, data_bytes in rendered.items():
        replace_file(out_dir / name, data_bytes)
        hashes[name] = sha256_bytes(data_bytes)
    replace_file(out_dir / MANIFEST_NAME, render_manifest(req, data, hashes))
    return hashes
