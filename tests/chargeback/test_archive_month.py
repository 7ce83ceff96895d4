"""The chargeback test month (tests/chargeback/month.py) from the archive: its audit
records, hash-chained per node and archived by the real archive sink, read back by the
archive source and billed by `build_bill`, give the month's rows, worked out by hand
from the scenario (below, not from the code under test), within 0.1 %."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chargeback.compute import build_bill
from chargeback.directory import load_directory
from chargeback.model import Request
from chargeback.rates import load_rates
from chargeback.sources.archive import read_archive
from gpu_audit.audit.canonical import ZERO_HASH, record_id, seal
from tests.chargeback.archives import ArchiveWriter
from tests.chargeback.month import audit_records, scenario

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[2] / "chargeback" / "examples"

# charged GPU-hours by hand (month.py's docstring):
# alice: a0 0-240 (240) + a1 600-648 shared with erin (24) + b1 MIG 100-300, shared with
#        bob 200-300 (100 + 50) = 414; bob: a0 400-520 (120) + b1 200-400 (50 + 100) = 270;
# carol: a1 0-200 = 200; dave: a1 500-600 = 100; erin: b0 720 + a1 24 = 744;
# unattributed: a1 300-372 = 72; fleet: 4 GPUs x 720 h - 24 h down = 2856;
# idle: 2856 - (414 + 270 + 200 + 100 + 744 + 72) = 1056. simsam (simulated) left out.
CHARGED = {("alice", "vision"): 414, ("bob", "nlp"): 270, ("carol", "nlp"): 200,
           ("dave", "misc"): 100, ("erin", "vision"): 744}
USED = {("alice", "vision"): 240 + 48 + 200, ("bob", "nlp"): 120 + 200,
        ("carol", "nlp"): 200, ("dave", "misc"): 100, ("erin", "vision"): 720 + 48}


def _chained(recs: Any) -> list[bytes]:
    """The month's records as a producer stores them: an id, a seq and the chain, per
    node's stream."""
    chain: dict[str, tuple[int, str]] = {}
    out = []
    for r in recs:
        seq, prev = chain.get(r["stream"], (0, ZERO_HASH))
        proc = r.get("process") or {}
        r["id"] = record_id(r["host"], r["stream"], r["kind"], event="", time_ns=r["time_ns"],
                            gpu_uuid=r["gpu"]["uuid"],
                            process_key=f"{proc.get('pid', '')}:{proc.get('gpu_instance_id')}",
                            xid_key="")
        out.append(seal(r, seq + 1, prev, None))
        chain[r["stream"]] = (seq + 1, r["hash"])
    return out


@pytest.fixture(scope="module")
def month_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("month") / "archive"
    d.mkdir()
    w = ArchiveWriter(d)
    w.write(_chained(audit_records(scenario(step=3600))))
    w.close()
    return d


def test_the_month_from_the_archive_gives_the_hand_computed_rows(month_archive: Path) -> None:
    m = scenario()
    req = Request(start=m.start, end=m.end, source="archive", config=None,
                  prometheus_url=None, rates=None, directory=None,
                  idle_policy="proportional", out="-")
    data = read_archive(req, month_archive)
    assert data.verified is True
    assert data.simulated_excluded > 0
    assert len(data.days) == 30
    # a0's counter restarts at 300 h: one interval's energy comes from after the reset
    assert any("1 GPU interval(s) from the counter after a reset" in n for n in data.notes)
    bill = build_bill(data, load_rates(EXAMPLES / "rates.yaml"),
                      load_directory(EXAMPLES / "directory.yaml"), "proportional")
    owners = {(r.user, r.project): r for r in bill.rows if r.kind == "owner"}
    assert set(owners) == set(CHARGED)
    for owner, hours in CHARGED.items():
        assert owners[owner].charged_gpu_hours == pytest.approx(hours, rel=1e-3), owner
        assert owners[owner].used_gpu_hours == pytest.approx(USED[owner], rel=1e-3), owner
    (un,) = (r for r in bill.rows if r.kind == "unattributed")
    (idle,) = (r for r in bill.rows if r.kind == "idle")
    assert un.charged_gpu_hours == pytest.approx(72, rel=1e-3)
    assert idle.charged_gpu_hours == pytest.approx(1056, rel=1e-3)
    rec = bill.reconciliation
    assert rec.fleet_gpu_hours == pytest.approx(2856, rel=1e-3)
    assert rec.down_gpu_hours == pytest.approx(24, rel=1e-3)
    assert abs(rec.difference_gpu_hours) < 1e-6
    # energy: the counter's and integrated power agree in this month (power x step is
    # exactly the counter's delta), and rows + idle carry all of it
    assert rec.energy_difference_kwh == pytest.approx(0, abs=1e-6)
    assert rec.rows_energy_kwh + idle.energy_kwh == pytest.approx(rec.fleet_energy_kwh)
    assert owners[("dave", "misc")].department == "unmapped"
