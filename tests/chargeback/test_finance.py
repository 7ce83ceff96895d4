"""What a finance reader gets from `gpu-audit chargeback`: a CSV that stands
alone (line items with each model's price, totals, a simulated marker, a byte-order mark
for spreadsheet tools, formulas guarded whatever the separator), prices bounded with
every problem named by line, and a showback when there is no rates file.

The source is a hand-made period (two GPU models, two owners, some idle) handed to the
real CLI in place of the archive reader: everything after the source is the real code.
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chargeback.model import UNATTRIBUTED, Fleet, Request, SourceData, Usage
from chargeback.report import Money
from chargeback.values import CSV_NAME, JSON_NAME, LINES_CSV_NAME
from gpu_audit_app.cli import main

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
START = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 11, 2, tzinfo=UTC)
EVIL = "x;=1+2"  # one cell in a comma locale, a formula in a semicolon locale


def _data(req: Request, progress: bool) -> SourceData:
    """One day: alice 10 h on an H100 and 4 h on an A100, EVIL 6 h on the A100, 1 h
    unattributed on the H100; 2 H100s and 1 A100 up all day."""
    data = SourceData("archive", req.start, req.end)
    h = 3600.0
    for owner, model, hours, kwh in (
            (("alice", "vision"), H100, 10, 5.0), (("alice", "vision"), A100, 4, 1.0),
            ((EVIL, "=cmd|' /C calc'!A0"), A100, 6, 2.0), (UNATTRIBUTED, H100, 1, 0.5)):
        data.usage[(owner, model)] = Usage(
            allocated_gpu_seconds=hours * h, used_gpu_seconds=hours * h,
            charged_gpu_seconds=hours * h, busy_gpu_seconds=hours * h / 2,
            energy_joules=kwh * 3.6e6, power_energy_joules=kwh * 3.6e6)
    data.fleet[H100] = Fleet(gpu_seconds=48 * h, held_gpu_seconds=11 * h,
                             energy_joules=8 * 3.6e6, power_energy_joules=8 * 3.6e6)
    data.fleet[A100] = Fleet(gpu_seconds=24 * h, held_gpu_seconds=10 * h,
                             energy_joules=4 * 3.6e6, power_energy_joules=4 * 3.6e6)
    return data


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpu_audit_app.chargeback.main._archive", _data)


def _rates(tmp_path: Path, text: str = "") -> Path:
    f = tmp_path / "rates.yaml"
    f.write_text(text or f'currency: EUR\ngpu_hour:\n  default: 1.5\n  "{H100}": 3.0\n'
                 "energy_kwh: 0.25\n")
    return f


def _bill(tmp_path: Path, *extra: str) -> int:
    return main(["chargeback", "bill", "--from", "2026-11-01T00:00:00Z", "--to",
                 "2026-11-02T00:00:00Z", "--source", "archive", "--idle-policy", "none",
                 "--out", str(tmp_path / "o"), *extra])


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8-sig"),
                                           newline="")))


def test_line_items_let_a_reader_recompute_every_gpu_cost(
        tmp_path: Path, source: None) -> None:
    """chargeback-lines.csv has each row's hours per GPU model and that model's price;
    hours x price is the line's cost, and a row's lines add up to its gpu_cost. The
    main CSV carries the energy price, so energy_cost is recomputable too."""
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path))) == 0
    rows = _csv(tmp_path / "o" / CSV_NAME)
    lines = _csv(tmp_path / "o" / LINES_CSV_NAME)
    by_row: dict[tuple[str, str], float] = {}
    for li in lines:
        assert float(li["gpu_cost"]) == pytest.approx(
            float(li["charged_gpu_hours"]) * float(li["gpu_hour_price"]), abs=1e-6)
        key = (li["kind"], li["user"])
        by_row[key] = by_row.get(key, 0.0) + float(li["gpu_cost"])
    alice = [li for li in lines if li["user"] == "alice"]
    assert {(li["gpu_model"], li["gpu_hour_price"]) for li in alice} == {
        (H100, "3.000000"), (A100, "1.500000")}
    idle = [li for li in lines if li["kind"] == "idle"]
    assert {li["gpu_model"]: float(li["charged_gpu_hours"]) for li in idle} == {
        H100: 37.0, A100: 14.0}
    for r in rows:
        assert float(r["gpu_cost"]) == pytest.approx(by_row.get((r["kind"], r["user"]), 0),
                                                     abs=1e-5), r
        assert float(r["energy_cost"]) == pytest.approx(
            float(r["energy_kwh"]) * float(r["energy_kwh_price"]), abs=1e-6)
        assert r["simulated"] == "false"


def test_csv_totals_line_is_the_sum_of_the_rows(tmp_path: Path, source: None) -> None:
    """--csv-totals ends the CSV with a `total` line; its numbers are the rows' sums, and
    the total cost is the fleet's (GPU-hours up x price + energy)."""
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path)), "--csv-totals") == 0
    rows = _csv(tmp_path / "o" / CSV_NAME)
    assert [r["kind"] for r in rows][-1] == "total"
    total, body = rows[-1], rows[:-1]
    for column in ("charged_gpu_hours", "energy_kwh", "gpu_cost", "total_cost"):
        assert float(total[column]) == pytest.approx(sum(float(r[column]) for r in body),
                                                     abs=1e-6), column
    assert float(total["charged_gpu_hours"]) == pytest.approx(72.0)
    assert float(total["total_cost"]) == pytest.approx(48 * 3.0 + 24 * 1.5 + 12 * 0.25)


def test_formulas_are_guarded_whatever_the_separator(tmp_path: Path, source: None) -> None:
    """`x;=1+2` is a formula in a semicolon locale: the cell is guarded and quoted, and
    a project that starts a formula after a `|` is guarded too; the JSON keeps the
    names as they were."""
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path))) == 0
    raw = (tmp_path / "o" / CSV_NAME).read_text(encoding="utf-8")
    assert '"x;\'=1+2"' in raw
    for line in raw.splitlines():
        for sep in (",", ";", "|"):  # each locale's reading of the line, quotes or not
            for cell in line.split(sep):
                assert not cell.lstrip(' "').startswith(("=", "+", "@")), (sep, line)
    rows = _csv(tmp_path / "o" / CSV_NAME)
    evil = next(r for r in rows if r["user"].startswith("x;"))
    assert evil["user"] == "x;'=1+2" and evil["project"] == "'=cmd|' /C calc'!A0"
    doc = json.loads((tmp_path / "o" / JSON_NAME).read_text())
    assert EVIL in {r["user"] for r in doc["rows"]}


def test_excel_writes_a_byte_order_mark(tmp_path: Path, source: None) -> None:
    """--excel starts both CSVs with a UTF-8 BOM; without it there is none."""
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path))) == 0
    assert not (tmp_path / "o" / CSV_NAME).read_bytes().startswith(b"\xef\xbb\xbf")
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path)), "--excel") == 0
    for name in (CSV_NAME, LINES_CSV_NAME):
        assert (tmp_path / "o" / name).read_bytes().startswith(b"\xef\xbb\xbfperiod_start")


def test_showback_without_rates_has_hours_and_no_costs(
        tmp_path: Path, source: None, capsys: pytest.CaptureFixture[str]) -> None:
    """No --rates: exit 0, hours and energy in every row, cost columns and currency
    empty (not 0), the JSON says priced false, the report says showback."""
    assert _bill(tmp_path) == 0
    assert "SHOWBACK: no --rates" in capsys.readouterr().out
    rows = _csv(tmp_path / "o" / CSV_NAME)
    alice = next(r for r in rows if r["user"] == "alice")
    assert float(alice["charged_gpu_hours"]) == pytest.approx(14.0)
    for r in rows:
        for column in ("gpu_cost", "energy_cost", "idle_share_cost", "total_cost",
                       "currency", "energy_kwh_price"):
            assert r[column] == "", (column, r)
    doc = json.loads((tmp_path / "o" / JSON_NAME).read_text())
    assert doc["priced"] is False and doc["rows"][0]["total_cost"] is None
    html = (tmp_path / "o" / "report.html").read_text()
    assert "Showback" in html and "EUR" not in html
    # the charts rank by hours, not by a cost that is not there
    assert "Top users by charged GPU-hours" in html and "14.0 h" in html


@pytest.mark.parametrize("price", ["1e308", "1" + "0" * 300, "1000000.01"])
def test_an_unbounded_price_is_exit_2_with_its_line(
        tmp_path: Path, source: None, capsys: pytest.CaptureFixture[str], price: str) -> None:
    """A price above the documented maximum (1,000,000) is refused before the source is
    read: exit 2, the line named, no traceback (1e308 used to overflow to inf at the
    writing; a 300-digit integer was taken)."""
    rates = _rates(tmp_path, f"currency: EUR\ngpu_hour:\n  default: {price}\n")
    assert _bill(tmp_path, "--rates", str(rates)) == 2
    err = capsys.readouterr().err
    assert "line 3: gpu_hour.default" in err and "1,000,000" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_every_problem_of_both_files_in_one_pass(
        tmp_path: Path, source: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad prices on two lines and bad directory entries on two lines: all four named,
    each with its file and line, exit 2."""
    rates = _rates(tmp_path, "currency: EUR\ngpu_hour:\n  default: -1\n  big: .inf\n"
                   "energy_kwh: 2e6\n")
    directory = tmp_path / "dir.yaml"
    directory.write_text("users:\n  alice: ''\n  bob: lab\nprojects:\n  nlp: '  '\n")
    assert _bill(tmp_path, "--rates", str(rates), "--directory", str(directory)) == 2
    err = capsys.readouterr().err
    for where in ("rates.yaml:3: gpu_hour.default", "rates.yaml:4: gpu_hour.big",
                  "rates.yaml:5: energy_kwh", "dir.yaml:2: users.alice",
                  "dir.yaml:5: projects.nlp"):
        assert where in err, where


def _html_row(html: str, row_id: str) -> list[str]:
    """The text of each cell of the table row with that id."""
    row = html.split(f'<tr id="{row_id}"', 1)[1].split("</tr>", 1)[0]
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]


def test_report_period_labels_and_totals_agree_with_the_csv(tmp_path: Path,
                                                             source: None) -> None:
    """A 7-hour window is titled with its times and UTC (not "2026-11-01 to
    2026-11-01"); charged, used and busy are each explained; the full bill has unit
    prices and cost columns and a totals line equal to the CSV's `total` line."""
    assert main(["chargeback", "bill", "--from", "2026-11-01T08:00:00Z", "--to",
                 "2026-11-01T15:00:00Z", "--source", "archive", "--csv-totals",
                 "--rates", str(_rates(tmp_path)), "--out", str(tmp_path / "o")]) == 0
    html = (tmp_path / "o" / "report.html").read_text()
    assert "<h1>GPU chargeback 2026-11-01 08:00 UTC to 2026-11-01 15:00 UTC</h1>" in html
    for meaning in ("<b>Charged</b>: GPU-hours billed", "<b>Used</b>:", "<b>Busy</b>:"):
        assert meaning in html
    assert "Price / GPU-h (EUR)" in html and "Energy cost (EUR)" in html
    assert "3.00 (NVIDIA H100 80GB HBM3)" in html
    total = _csv(tmp_path / "o" / CSV_NAME)[-1]
    assert total["kind"] == "total"
    cells = _html_row(html, "bill-total")
    shown = [float(c.replace(",", "")) for c in cells[3:8] + cells[9:]]
    want = [float(total[c]) for c in (
        "allocated_gpu_hours", "used_gpu_hours", "charged_gpu_hours", "busy_gpu_hours",
        "energy_kwh", "gpu_cost", "energy_cost", "idle_share_cost", "total_cost")]
    assert shown == pytest.approx(want, abs=0.051)  # hours to 0.1, money to 0.01
    assert "-0.00" not in html


def test_money_is_never_negative_zero() -> None:
    """A residue below a cent either side of zero is written 0.00 (the idle row's
    total under a shared policy is such a residue)."""
    money = Money("EUR")
    assert money(-0.001) == "0.00 EUR" and money(-0.0) == "0.00 EUR"
    assert money.plain(-1e-12) == "0.00" and money(-0.006) == "-0.01 EUR"
    assert Money("EUR", priced=False)(12.0) == "\u2013"


def test_counter_and_integrated_power_apart_is_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's 14.82 kWh counter against 0.25 kWh of integrated power: the bill says
    so on the terminal, in the notes and in a report banner; within 5 % it does not."""
    def apart(req: Request, progress: bool) -> SourceData:
        data = _data(req, progress)
        data.fleet[H100].energy_joules = 14.82 * 3.6e6
        data.fleet[H100].power_energy_joules = 0.25 * 3.6e6
        data.fleet[A100].power_energy_joules = 0.0
        data.fleet[A100].energy_joules = 0.0
        return data

    monkeypatch.setattr("gpu_audit_app.chargeback.main._archive", apart)
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path))) == 0
    out = capsys.readouterr().out
    assert "WARNING ENERGY: the energy counter says 14.820 kWh and integrated power " \
           "draw 0.250 kWh, 98.3 % apart (tolerance 5 %)" in out
    doc = json.loads((tmp_path / "o" / JSON_NAME).read_text())
    assert any(n.startswith("ENERGY:") for n in doc["notes"])
    assert 'id="energy-warning"' in (tmp_path / "o" / "report.html").read_text()
    monkeypatch.setattr("gpu_audit_app.chargeback.main._archive", _data)
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path))) == 0
    assert "ENERGY" not in capsys.readouterr().out


def test_allocation_not_known_is_null_in_the_json_and_reads_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that cannot see reservations: the CSV's allocated cells are empty, the
    JSON's rows and days say null (not 0, not a copy of used), and the JSON reads back
    into the same bill."""
    from tests.chargeback.billjson import bill_from_json

    def unknown(req: Request, progress: bool) -> SourceData:
        data = _data(req, progress)
        data.allocation_known = False
        data.days["2026-11-01"] = ({("alice", "vision"): Usage(used_gpu_seconds=3600.0)},
                                   Fleet(gpu_seconds=7200.0))
        return data

    monkeypatch.setattr("gpu_audit_app.chargeback.main._archive", unknown)
    assert _bill(tmp_path, "--rates", str(_rates(tmp_path))) == 0
    assert {r["allocated_gpu_hours"] for r in _csv(tmp_path / "o" / CSV_NAME)} == {""}
    doc = json.loads((tmp_path / "o" / JSON_NAME).read_text())
    assert doc["allocation_known"] is False
    assert {r["allocated_gpu_hours"] for r in doc["rows"]} == {None}
    assert doc["days"]["2026-11-01"]["owners"][0]["allocated_gpu_hours"] is None
    back = bill_from_json(doc)
    assert back.allocation_known is False
    assert {r.user: r.used_gpu_hours for r in back.rows}["alice"] == 14.0
