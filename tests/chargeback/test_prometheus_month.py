"""THE month from a real Prometheus: the scenario of tests/chargeback/month.py backfilled
with promtool (raw series and the recording rules), read by the Prometheus source, billed
by build_bill, and compared with a bill worked out by hand below (within 0.1 %).

Tolerance: 0.1 % of each figure, and at least two rule intervals (2 x 5 min) of GPU time
or 0.1 kWh: promtool evaluates the rules at an offset inside the interval, so a rule
sample can land one interval off at a hold's edge or at the month's end.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chargeback.compute import build_bill
from chargeback.directory import load_directory
from chargeback.model import Bill, Request, Row
from chargeback.rates import load_rates
from chargeback.run import Reader
from chargeback.sources.prometheus import RULES, read_prometheus
from gpu_audit_app.cli import main
from tests.chargeback.month import A100, H100, scenario
from tests.chargeback.promfill import Backfilled, backfilled_prometheus

EXAMPLES = Path(__file__).parents[2] / "chargeback" / "examples"
STEP_H = 300 / 3600  # the month's step and rule interval, in hours
TOL_H = 2 * STEP_H
TOL_KWH = 0.1

# ---- the bill by hand (rates: A100 1.50, H100 3.00 per GPU-hour, 0.25 per kWh) ----
A100_PRICE, H100_PRICE, KWH_PRICE = 1.50, 3.00, 0.25
# power = 60 W + 300 W x util on an A100, 80 W + 500 W x util on the H100
# (dept, project, user): used, charged, busy, idle_held GPU-h, kWh, GPU cost
EXPECTED = {
    # bob: GPU a0 120 h at 2 % (66 W: idle while held), MIG b1 200 h, shared with alice
    # 200-300 h (half each) -> charged 120 + 50 + 100; energy 66 W x 120 h + 3/4 of
    # 180 W x 100 h (no SM under MIG: by memory, his 30 GiB to her 10) + 120 W x 100 h
    # = 7.92 + 13.5 + 12 kWh
    ("lang-lab", "nlp", "bob"): (320, 270, 0.02 * 120, 120, 7.92 + 13.5 + 12,
                                 270 * A100_PRICE),
    # carol (no user mapping: by project nlp): a1 200 h at 50 % = 210 W
    ("lang-lab", "nlp", "carol"): (200, 200, 100, 0, 210 * 200 / 1000, 200 * A100_PRICE),
    # dave/misc is in no directory entry: unmapped; a1 100 h at 100 % = 360 W
    ("unmapped", "misc", "dave"): (100, 100, 100, 0, 36, 100 * A100_PRICE),
    # alice: a0 240 h at 80 % (300 W), a1 48 h shared with erin (240 W, half by SM),
    # b1 100 h alone (120 W) + 100 h shared with bob (180 W: a quarter, by memory)
    ("vision-lab", "vision", "alice"): (240 + 48 + 200, 240 + 24 + 150, 0.8 * 240 + 0.3 * 48,
                                        0, 72 + 5.76 + 12 + 4.5, 414 * A100_PRICE),
    # erin: the H100 all month at 90 % (530 W) + half of a1's 48 shared hours
    ("vision-lab", "vision", "erin"): (720 + 48, 720 + 24, 0.9 * 720 + 0.3 * 48, 0,
                                       530 * 720 / 1000 + 5.76,
                                       720 * H100_PRICE + 24 * A100_PRICE),
}
# the process nobody owns: a1 72 h at 30 % (150 W)
UNATTRIBUTED = (72, 72, 0.3 * 72, 0, 150 * 72 / 1000, 72 * A100_PRICE)
# fleet: 4 real GPUs x 720 h, a1 down 24 h; held on A100s: a0 360, a1 420, b1 300 h
FLEET_UP_H = 4 * 720 - 24
A100_IDLE_H = (720 + 696 + 720) - (360 + 420 + 300)
# counter energy per GPU (kWh), idle 60 W / 80 W otherwise:
A0_KWH = 0.3 * 240 + 0.066 * 120 + 0.06 * 360
A1_KWH = 42 + 0.06 * 16 + 0.06 * 60 + 10.8 + 0.06 * 128 + 36 + 11.52 + 0.06 * 72
B1_KWH = 0.06 * 100 + 0.12 * 100 + 0.18 * 100 + 0.12 * 100 + 0.06 * 320
FLEET_KWH = A0_KWH + A1_KWH + B1_KWH + 0.53 * 720


def close(got: float, want: float, tol: float) -> bool:
    return abs(got - want) <= max(1e-3 * abs(want), tol)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    with backfilled_prometheus(tmp_path_factory.mktemp("month"), scenario(step=300),
                               records=set(RULES)) as p:
        yield p


def _request(url: str, out: Path, **kw: object) -> Request:
    m = scenario()
    args: dict[str, object] = dict(start=m.start, end=m.end, source="prometheus", config=None,
                                   prometheus_url=url, rates=str(EXAMPLES / "rates.yaml"),
                                   directory=str(EXAMPLES / "directory.yaml"),
                                   idle_policy="proportional", out=str(out))
    args.update(kw)
    return Request(**args)  # type: ignore[arg-type]


def _bill(prom: Backfilled, tmp_path: Path, raw: bool = False, **kw: object) -> Bill:
    req = _request(prom.url, tmp_path, **kw)
    data = read_prometheus(req, raw=raw)
    return build_bill(data, load_rates(EXAMPLES / "rates.yaml"),
                      load_directory(EXAMPLES / "directory.yaml"), req.idle_policy)


def _check_row(row: Row, want: tuple[float, ...]) -> None:
    kwh = want[4]
    got = (row.used_gpu_hours, row.charged_gpu_hours, row.busy_gpu_hours,
           row.idle_held_gpu_hours, row.energy_kwh, row.gpu_cost)
    tols = (TOL_H, TOL_H, TOL_H, TOL_H, TOL_KWH, TOL_H * H100_PRICE)
    for name, g, w, t in zip(("used", "charged", "busy", "idle_held", "kWh", "gpu_cost"),
                             got, want, tols, strict=True):
        assert close(g, w, t), (row.user or row.kind, name, g, w)
    assert close(row.energy_cost, kwh * KWH_PRICE, TOL_KWH * KWH_PRICE)


def test_month_from_prometheus_matches_the_hand_bill(prom: Backfilled, tmp_path: Path) -> None:
    bill = _bill(prom, tmp_path)
    owners = [r for r in bill.rows if r.kind == "owner"]
    assert [(r.department, r.project, r.user) for r in owners] == list(EXPECTED)
    for row in owners:
        _check_row(row, EXPECTED[(row.department, row.project, row.user)])
        assert close(row.allocated_gpu_hours, EXPECTED[(row.department, row.project,
                                                        row.user)][0], TOL_H)
    unatt, idle = bill.rows[-2], bill.rows[-1]
    assert (unatt.kind, idle.kind) == ("unattributed", "idle")
    _check_row(unatt, UNATTRIBUTED)
    assert unatt.allocated_gpu_hours == 0  # nobody's allocation
    assert close(idle.charged_gpu_hours, A100_IDLE_H, TOL_H)
    assert close(idle.gpu_cost, A100_IDLE_H * A100_PRICE, TOL_H * A100_PRICE)
    rows_kwh = sum(w[4] for w in EXPECTED.values()) + UNATTRIBUTED[4]
    # a residual (fleet - rows): within 0.1 % of the fleet's energy
    assert abs(idle.energy_kwh - (FLEET_KWH - rows_kwh)) <= 1e-3 * FLEET_KWH

    # idle cost shared in proportion to charged hours (1728 owner hours)
    idle_cost = A100_IDLE_H * A100_PRICE + (FLEET_KWH - rows_kwh) * KWH_PRICE
    alice = owners[3]
    assert close(alice.idle_share_cost, idle_cost * 414 / 1728, 0.5)
    assert close(sum(r.total_cost for r in bill.rows),
                 (FLEET_UP_H - 720) * A100_PRICE + 720 * H100_PRICE + FLEET_KWH * KWH_PRICE, 1.0)

    r = bill.reconciliation
    assert close(r.fleet_gpu_hours, FLEET_UP_H, TOL_H)
    assert close(r.down_gpu_hours, 24, TOL_H)
    assert abs(r.difference_gpu_hours) <= 1e-3 * FLEET_UP_H
    assert close(r.fleet_energy_kwh, FLEET_KWH, TOL_KWH)  # reset on a0, MIG copies on b1
    assert close(r.power_energy_kwh, FLEET_KWH, TOL_KWH)
    assert bill.unmapped == ["dave/misc"]
    # the simulated GPU's 8 series (up, info, util, power, energy, 2 process, allocation)
    assert bill.simulated_excluded == 8 and not bill.simulated_included


def test_days_queries_and_the_outage_day(prom: Backfilled, tmp_path: Path) -> None:
    data = read_prometheus(_request(prom.url, tmp_path))
    assert sorted(data.days) == [f"2026-11-{d:02d}" for d in range(1, 31)]
    _, outage = data.days["2026-11-10"]  # hours 216-240: a1 down
    assert close(outage.down_gpu_seconds / 3600, 24, TOL_H)
    assert close(outage.gpu_seconds / 3600, 3 * 24, TOL_H)
    assert close(sum(f.gpu_seconds for _, f in data.days.values()),
                 sum(f.gpu_seconds for f in data.fleet.values()), 1.0)
    assert data.queries and all(q.startswith(("query ", "query_range ")) for q in data.queries)
    assert any("gpu:gpu_held:weight[" in q for q in data.queries)  # the rule, not its expansion
    assert data.inputs["rule_interval_seconds"] == "300"
    assert set(data.fleet) == {A100, H100}


def test_raw_series_give_the_same_bill(prom: Backfilled, tmp_path: Path) -> None:
    rules = _bill(prom, tmp_path)
    raw = _bill(prom, tmp_path, raw=True)
    for a, b in zip(rules.rows, raw.rows, strict=True):
        assert (a.kind, a.user) == (b.kind, b.user)
        assert close(a.charged_gpu_hours, b.charged_gpu_hours, TOL_H), a.user
        tol = 1e-3 * FLEET_KWH if a.kind == "idle" else TOL_KWH  # idle: a residual
        assert close(a.energy_kwh, b.energy_kwh, tol), a.user


def test_include_simulated_bills_the_simulated_gpu(prom: Backfilled, tmp_path: Path) -> None:
    bill = _bill(prom, tmp_path, include_simulated=True)
    sim = [r for r in bill.rows if r.user == "simsam"]
    assert len(sim) == 1 and close(sim[0].used_gpu_hours, 720, TOL_H)
    assert bill.simulated_included and bill.simulated_excluded == 0
    assert any("raw series" in n for n in bill.notes)


def test_a_period_without_data_is_exit_1(prom: Backfilled, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["chargeback", "bill", "--month", "2025-03", "--prometheus-url", prom.url,
                 "--rates", str(EXAMPLES / "rates.yaml"), "--out", str(tmp_path / "o")])
    assert code == 1
    assert "no data for 2025-03-01" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_unreachable_source_names_the_url(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from tests.netutil import free_port
    url = f"http://127.0.0.1:{free_port()}"
    code = main(["chargeback", "bill", "--from", "2026-11-01T00:00:00Z", "--to",
                 "2026-11-02T12:00:00Z", "--prometheus-url", url,
                 "--rates", str(EXAMPLES / "rates.yaml"), "--out", str(tmp_path)])
    assert code == 1
    assert f"{url}/api/v1/query: cannot reach" in capsys.readouterr().err


def test_bad_arguments_are_listed_together(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["chargeback", "bill", "--from", "yesterday", "--to", "2026-11-02T00:00:00"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--from: 'yesterday' is not an RFC 3339 time" in err
    assert "--to: '2026-11-02T00:00:00' needs a time zone" in err


def test_partial_days_use_instant_queries(prom: Backfilled, tmp_path: Path) -> None:
    start = datetime(2026, 11, 9, 12, tzinfo=UTC)
    end = datetime(2026, 11, 11, 6, tzinfo=UTC)
    data = read_prometheus(_request(prom.url, tmp_path, start=start, end=end))
    assert sorted(data.days) == ["2026-11-09", "2026-11-10", "2026-11-11"]
    # a1 down the whole of the 10th: 42 h of 4 GPUs minus 24 h
    assert close(sum(f.gpu_seconds for f in data.fleet.values()) / 3600, 4 * 42 - 24, TOL_H)


def test_missing_recording_rules_are_named_not_called_no_data(tmp_path: Path) -> None:
    """Raw series without the rules (a Prometheus that never loaded them): the error
    says the rules are missing instead of "no data"."""
    import subprocess

    from chargeback.sources.prometheus import PrometheusError
    from tests.chargeback.month import write_openmetrics_file
    from tests.chargeback.promfill import _start, _stop
    from tests.promstack import need

    m = scenario(step=3600)
    root = tmp_path / "p"
    (root / "tsdb").mkdir(parents=True)
    write_openmetrics_file(m, tmp_path / "m.om")
    subprocess.run([need("promtool"), "tsdb", "create-blocks-from", "openmetrics", "-q",
                    "--max-block-duration=744h", str(tmp_path / "m.om"), str(root / "tsdb")],
                   check=True, timeout=120, capture_output=True)
    (tmp_path / "none.yaml").write_text("groups: []\n")
    proc, url = _start(need("prometheus"), root, tmp_path / "none.yaml", "3599s",
                       root / "log.txt")
    try:
        with pytest.raises(PrometheusError, match=r"recording rules .* have none"):
            read_prometheus(_request(url, tmp_path))
    finally:
        _stop(proc)


def test_cli_month_hands_the_bill_to_write_outputs(prom: Backfilled, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The whole command on the month; chargeback.outputs.write_outputs is stood in for
    here, to pin the call: write_outputs(bill, req, data, out_dir)."""
    calls: list[tuple[object, ...]] = []

    def write_outputs(bill: Bill, req: Request, data: object, out: Path) -> dict[str, str]:
        calls.append((bill, req, data, out))
        return {"bill.csv": "0" * 64}

    monkeypatch.setattr("chargeback.run.write_outputs", write_outputs)
    out = tmp_path / "bill"
    code = main(["chargeback", "bill", "--month", "2026-11", "--prometheus-url", prom.url,
                 "--rates", str(EXAMPLES / "rates.yaml"),
                 "--directory", str(EXAMPLES / "directory.yaml"), "--out", str(out)])
    assert code == 0
    (bill, req, _, where), = calls
    assert where == out and out.is_dir()
    assert isinstance(req, Request) and req.start == datetime(2026, 11, 1, tzinfo=UTC)
    assert isinstance(bill, Bill) and bill.idle_policy == "proportional"
    text = capsys.readouterr().out
    assert "5 owner rows" in text and "simulated left out: 8" in text
    assert f"wrote {out / 'bill.csv'}" in text


def test_progress_bar_on_a_terminal_only(prom: Backfilled, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from chargeback.sources import prometheus as source

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert source._Progress(True, 3).enabled
    assert not source._Progress(False, 3).enabled
    start = datetime(2026, 11, 3, tzinfo=UTC)
    req = _request(prom.url, tmp_path, start=start, end=datetime(2026, 11, 5, tzinfo=UTC))
    with_bar = read_prometheus(req, progress=True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not source._Progress(True, 3).enabled
    assert read_prometheus(req).usage == with_bar.usage


# ---- the same month from the archive: the sources agree, and --compare-with says so ----

@pytest.fixture(scope="module")
def month_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.chargeback.archives import ArchiveWriter
    from tests.chargeback.month import audit_records
    from tests.chargeback.test_archive_month import _chained

    d = tmp_path_factory.mktemp("month-archive") / "archive"
    d.mkdir()
    w = ArchiveWriter(d)
    w.write(_chained(audit_records(scenario(step=300))))
    w.close()
    return d


def _archive_reader(d: Path) -> Reader:
    from chargeback.sources.archive import read_archive

    return lambda req, progress: read_archive(req, d)


def test_archive_and_prometheus_give_the_same_rows(prom: Backfilled, month_archive: Path,
                                                   tmp_path: Path) -> None:
    """Per row, GPU-hours and energy (free GPUs' energy on the idle row in both)."""
    from chargeback.sources.archive import read_archive

    p = _bill(prom, tmp_path)
    a = build_bill(read_archive(_request(prom.url, tmp_path, source="archive"), month_archive),
                   load_rates(EXAMPLES / "rates.yaml"),
                   load_directory(EXAMPLES / "directory.yaml"), "proportional")
    assert [(r.kind, r.department, r.project, r.user) for r in p.rows] == \
        [(r.kind, r.department, r.project, r.user) for r in a.rows]
    for x, y in zip(p.rows, a.rows, strict=True):
        for f in ("used_gpu_hours", "charged_gpu_hours", "busy_gpu_hours",
                  "idle_held_gpu_hours"):
            assert close(getattr(x, f), getattr(y, f), TOL_H), (x.user, x.kind, f)
        assert close(x.energy_kwh, y.energy_kwh, TOL_KWH), (x.user, x.kind)
        assert close(x.total_cost, y.total_cost, 1.0), (x.user, x.kind)


def test_compare_with_archive_reports_the_differences_and_replays(
        prom: Backfilled, month_archive: Path, tmp_path: Path) -> None:
    import io
    import json

    from chargeback import run as cb_run
    from chargeback.replay import replay
    from chargeback.sources.archive import read_archive
    from chargeback.values import CSV_NAME, HTML_NAME, JSON_NAME, MANIFEST_NAME
    from gpu_audit_app.chargeback import main as chargeback_main

    readers = {**chargeback_main.readers(), "archive": _archive_reader(month_archive)}
    out = tmp_path / "bill"
    result = cb_run.run_chargeback(_request(prom.url, out, compare_with=("archive",)),
                                   readers=readers)
    bill = result.bill
    # what the archive's own bill says, computed apart
    a = build_bill(read_archive(_request(prom.url, out, source="archive"), month_archive),
                   load_rates(EXAMPLES / "rates.yaml"),
                   load_directory(EXAMPLES / "directory.yaml"), "proportional")
    c = bill.reconciliation.comparisons["archive"]
    ar = a.reconciliation
    assert (c.fleet_gpu_hours, c.owners_gpu_hours, c.unattributed_gpu_hours,
            c.idle_gpu_hours, c.fleet_energy_kwh, c.rows_energy_kwh) == (
        ar.fleet_gpu_hours, ar.owners_gpu_hours, ar.unattributed_gpu_hours,
        ar.idle_gpu_hours, ar.fleet_energy_kwh, ar.rows_energy_kwh)
    assert bill.reconciliation.other_sources == {"archive": ar.fleet_gpu_hours}
    assert c.fleet_gpu_hours == pytest.approx(FLEET_UP_H, rel=1e-3)
    # the rows that differ most, by cost: each difference is the two bills' rows'
    mine = {(r.kind, r.department, r.project, r.user): r for r in bill.rows}
    theirs = {(r.kind, r.department, r.project, r.user): r for r in a.rows}
    assert 0 < len(c.largest_differences) <= len(mine)
    for d in c.largest_differences:
        key = tuple(d.key.split("/"))
        assert (d.charged_gpu_hours, d.other_charged_gpu_hours) == (
            mine[key].charged_gpu_hours, theirs[key].charged_gpu_hours)
        assert (d.energy_kwh, d.other_energy_kwh, d.total_cost, d.other_total_cost) == (
            mine[key].energy_kwh, theirs[key].energy_kwh, mine[key].total_cost,
            theirs[key].total_cost)
    costs = [abs(d.other_total_cost - d.total_cost) for d in c.largest_differences]
    assert costs == sorted(costs, reverse=True)
    assert max(costs) == max(abs(theirs[k].total_cost - mine[k].total_cost) for k in mine)
    # JSON, HTML and manifest carry it; the CSV's columns do not change
    doc = json.loads((out / JSON_NAME).read_text())
    assert doc["reconciliation"]["comparisons"]["archive"]["fleet_gpu_hours"] == \
        pytest.approx(ar.fleet_gpu_hours, abs=1e-6)
    html = (out / HTML_NAME).read_text()
    assert "<h3>archive against prometheus (this bill)</h3>" in html
    assert "Rows that differ most" in html
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["request"]["compare_with"] == ["archive"]
    queried = manifest["compared_sources"]["archive"]["queries"]
    assert {q.split()[2] for q in queried} == {
        p.name for p in month_archive.glob("gpu-audit_*.jsonl*")}
    assert (out / CSV_NAME).read_text().splitlines()[0].endswith(
        ",source,completeness,energy_kwh_price,simulated")
    say = io.StringIO()
    again = replay(out / MANIFEST_NAME, tmp_path / "again", readers=readers, say=say)
    assert again == 0, say.getvalue()
    for name in (CSV_NAME, JSON_NAME, HTML_NAME):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name


def test_compare_with_its_own_source_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["chargeback", "bill", "--month", "2026-11", "--source", "archive",
                 "--compare-with", "archive,nosuch", "--rates", str(EXAMPLES / "rates.yaml")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--compare-with archive: that is the bill's own source" in err
    assert "--compare-with 'nosuch'" in err
