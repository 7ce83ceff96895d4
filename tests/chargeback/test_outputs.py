"""The CSV and JSON exports: pinned columns, exact values, defused formulas, a JSON round
trip, and bytes that depend on the bill only (no clock, no float noise)."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
from pathlib import Path

import pytest

from chargeback.outputs import (
    CSV_COLUMNS,
    render_csv,
    render_json,
    write_outputs,
)
from chargeback.values import CSV_NAME, HTML_NAME, JSON_NAME, MANIFEST_NAME
from tests.chargeback.billjson import bill_from_json
from tests.chargeback.fixtures import (
    FORMULA_USER,
    HOSTILE_USER,
    sample_bill,
    sample_request,
    sample_source_data,
)

PINNED_HEADER = (
    "period_start,period_end,kind,department,project,user,allocated_gpu_hours,"
    "used_gpu_hours,charged_gpu_hours,busy_gpu_hours,idle_held_gpu_hours,energy_kwh,"
    "power_energy_kwh,gpu_cost,energy_cost,idle_share_cost,total_cost,currency,"
    "idle_policy,source,completeness,energy_kwh_price,simulated"
)


def _rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))


def test_csv_header_is_the_documented_one() -> None:
    """The header is a contract (docs/CHARGEBACK.md): changing it breaks every importer."""
    data = render_csv(sample_bill(days=3))
    assert data.split(b"\r\n", 1)[0].decode() == PINNED_HEADER
    assert ",".join(CSV_COLUMNS) == PINNED_HEADER
    doc = (Path(__file__).parents[2] / "docs" / "CHARGEBACK.md").read_text(encoding="utf-8")
    for column in CSV_COLUMNS:
        assert f"`{column}`" in doc, f"column {column} is not documented"


def test_csv_rows_carry_the_bill_values_in_order() -> None:
    """One line per row in bill order, every number with 6 decimals, the period and
    currency on each line (files from several months concatenate)."""
    bill = sample_bill(days=3)
    rows = _rows(render_csv(bill))
    assert [r["kind"] for r in rows] == [r.kind for r in bill.rows]
    assert rows[-2]["kind"] == "unattributed" and rows[-1]["kind"] == "idle"
    alice = next(r for r in rows if r["user"] == "alice")
    row = next(r for r in bill.rows if r.user == "alice")
    assert alice["department"] == "physics" and alice["project"] == "lattice-qcd"
    assert alice["charged_gpu_hours"] == f"{row.charged_gpu_hours:.6f}"
    assert alice["total_cost"] == f"{row.total_cost:.6f}"
    assert alice["period_start"] == "2026-11-01T00:00:00Z"
    assert alice["period_end"] == "2026-11-04T00:00:00Z"
    assert (alice["currency"], alice["idle_policy"], alice["source"]) == \
        ("EUR", "proportional", "archive")
    total = sum(float(r["total_cost"]) for r in rows)
    assert total == pytest.approx(sum(r.total_cost for r in bill.rows), abs=1e-4)


def test_csv_defuses_spreadsheet_formulas_and_keeps_markup_as_text() -> None:
    """A user named `=HYPERLINK(...)` is not a formula when the CSV is opened in a
    spreadsheet; quotes and commas survive CSV quoting."""
    rows = _rows(render_csv(sample_bill(days=2, hostile=True)))
    users = {r["user"] for r in rows}
    assert "'" + FORMULA_USER in users
    assert FORMULA_USER not in users
    assert HOSTILE_USER in users  # CSV is data: markup stays as written


def test_json_round_trips_to_the_same_bill() -> None:
    bill = sample_bill(days=4, other_sources={"prometheus": 1530.25})
    back = bill_from_json(json.loads(render_json(bill)))
    assert (back.start, back.end, back.source, back.currency) == \
        (bill.start, bill.end, bill.source, bill.currency)
    assert len(back.rows) == len(bill.rows)
    for got, want in zip(back.rows, bill.rows, strict=True):
        for f in dataclasses.fields(want):
            value = getattr(want, f.name)
            if isinstance(value, float):
                assert getattr(got, f.name) == pytest.approx(value, abs=1e-6), f.name
            else:
                assert getattr(got, f.name) == value, f.name
    assert back.reconciliation.other_sources == {"prometheus": 1530.25}
    assert back.reconciliation.fleet_gpu_hours == pytest.approx(
        bill.reconciliation.fleet_gpu_hours)
    assert sorted(back.days) == sorted(bill.days)
    day = sorted(bill.days)[1]
    assert back.days[day][1].gpu_seconds == pytest.approx(bill.days[day][1].gpu_seconds)
    owners = bill.days[day][0]
    for owner, usage in owners.items():
        assert back.days[day][0][owner].energy_joules == pytest.approx(
            usage.energy_joules, abs=4)  # 1e-6 kWh
    assert (back.unmapped, back.simulated_excluded, back.verified, back.notes) == \
        (bill.unmapped, bill.simulated_excluded, bill.verified, bill.notes)
    # and a second round trip is exact: the rounding happened once
    assert render_json(back) == render_json(bill)


def test_json_is_sorted_and_rounded() -> None:
    text = render_json(sample_bill(days=2)).decode()
    doc = json.loads(text)
    assert list(doc) == sorted(doc)
    assert list(doc["rows"][0]) == sorted(doc["rows"][0])
    for row in doc["rows"]:
        for key, value in row.items():
            if isinstance(value, float):
                assert round(value, 6) == value, key


def test_same_bill_gives_the_same_bytes_and_float_noise_does_not_leak(tmp_path: Path) -> None:
    """Two exports of one bill are byte-identical, including the manifest; a bill whose
    floats differ in the last bits (another summation order) gives the same files."""
    bill = sample_bill(days=5)
    req = sample_request(tmp_path, bill)
    data = sample_source_data(bill)
    first = write_outputs(bill, req, data, tmp_path / "a")
    noisy = sample_bill(days=5)
    for row in noisy.rows:
        row.total_cost = row.total_cost * (1 + 1e-15)
        row.charged_gpu_hours += 1e-12
    second = write_outputs(noisy, req, data, tmp_path / "b")
    assert first == second
    for name in (CSV_NAME, JSON_NAME, HTML_NAME, MANIFEST_NAME):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    for name, digest in first.items():
        assert hashlib.sha256((tmp_path / "a" / name).read_bytes()).hexdigest() == digest
    changed = sample_bill(days=5)
    changed.rows[0].total_cost += 0.01
    assert write_outputs(changed, req, data, tmp_path / "c")[CSV_NAME] != first[CSV_NAME]


def test_no_clock_in_any_output(tmp_path: Path) -> None:
    """The only dates written are the period's (and the days inside it)."""
    bill = sample_bill(days=2)
    write_outputs(bill, sample_request(tmp_path, bill), sample_source_data(bill), tmp_path)
    for name in (CSV_NAME, JSON_NAME, HTML_NAME, MANIFEST_NAME):
        text = (tmp_path / name).read_text(encoding="utf-8")
        for year in ("2024", "2025", "2027"):
            assert year not in text, (name, year)
        for month in ("2026-12-0" + str(d) for d in range(2, 10)):
            assert month not in text, (name, month)


def test_a_bill_with_nan_writes_nothing(tmp_path: Path) -> None:
    """A NaN is a bug upstream: refused before any file is replaced, so the previous
    export stays whole."""
    bill = sample_bill(days=2)
    req, data = sample_request(tmp_path, bill), sample_source_data(bill)
    out = tmp_path / "out"
    write_outputs(bill, req, data, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = sample_bill(days=2)
    bad.rows[0].energy_kwh = math.nan
    with pytest.raises(ValueError, match="finite"):
        write_outputs(bad, req, data, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_failed_write_leaves_no_manifest(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest vouches for the files beside it: when replacing one fails (disk
    full), the earlier manifest is already gone and no new one is written."""
    from chargeback import outputs

    bill = sample_bill(days=2)
    req, data = sample_request(tmp_path, bill), sample_source_data(bill)
    out = tmp_path / "out"
    write_outputs(bill, req, data, out)
    real = outputs.replace_file

    def full_disk(path: Path, data: bytes) -> None:
        if path.name == HTML_NAME:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(outputs, "replace_file", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_outputs(sample_bill(days=3), req, data, out)
    assert not (out / MANIFEST_NAME).exists()
