"""Bills that prove completeness: per host and stream the chain is continuous
from the last record before the period to the first after it, or the period is still
open; a gap (a day's head cut off, the day before deleted) refuses the bill with the gap
named unless --allow-gaps, which stamps it in the terminal, CSV, JSON, report and
manifest; silent hosts and the inventory's GPU-hours are stated."""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import json
import shutil
from pathlib import Path

import pytest

from chargeback.model import Request
from chargeback.sources.archive import ArchiveRefused, read_archive
from chargeback.values import CSV_NAME, HTML_NAME, JSON_NAME, MANIFEST_NAME
from gpu_audit.archive import list_parts
from gpu_audit.model.snapshot import Snapshot
from gpu_audit_app.cli import main
from tests.chargeback.archives import produce, write_archive
from tests.core.audit.factory import ALICE, gpu, proc, snapshot

pytestmark = pytest.mark.timeout(300)

EXAMPLES = Path(__file__).resolve().parents[2] / "chargeback" / "examples"
OCT31 = dt.datetime(2026, 10, 31, tzinfo=dt.UTC)
NOV1, NOV2, NOV3 = (OCT31 + dt.timedelta(days=d) for d in (1, 2, 3))
E = 10.0  # sampling interval; the audit interval is the default 60 s


def _snaps(start: float, end: float) -> list[Snapshot]:
    n = round((end - start) / E)
    return [snapshot(start + E * k, [
        gpu(0, util=0.8, energy=2000.0 * k, power=200.0, processes=[proc(101, sm=0.8)]),
        gpu(1, util=0.0, energy=500.0 * k, power=50.0)], {101: ALICE}, interval=E)
        for k in range(n)]


def _node(host: str, start: dt.datetime, end: dt.datetime) -> list[bytes]:
    s, e = start.timestamp() + 5, end.timestamp() - 5
    return produce(_snaps(s, e), host=host, start_s=s - 1, stop_s=e, interval_s=60.0)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node-a runs Oct 31 .. Nov 2 (three sealed days, the last part open); node-b ran
    Oct 31 only."""
    d = tmp_path_factory.mktemp("archive")
    write_archive(d, _node("node-a", OCT31, NOV3), _node("node-b", OCT31, NOV1))
    return d


@pytest.fixture
def archive(pristine: Path, tmp_path: Path) -> Path:
    d = tmp_path / "archive"
    shutil.copytree(pristine, d)
    return d


def _req(start: dt.datetime = NOV1, end: dt.datetime = NOV2, **kw: object) -> Request:
    base: dict[str, object] = {
        "start": start, "end": end, "source": "archive", "config": None,
        "prometheus_url": None, "rates": None, "directory": None, "idle_policy": "none",
        "out": "out"}
    base.update(kw)
    return Request(**base)  # type: ignore[arg-type]


def _part(d: Path, host: str, day: str) -> Path:
    return next(p.path for p in list_parts(d) if p.host == host and p.day.isoformat() == day)


def test_a_day_is_proven_continuous_from_the_day_before_to_the_day_after(
        archive: Path) -> None:
    """Nov 1 of node-a: continuous from Oct 31's last record to Nov 2's first; node-b,
    which wrote on Oct 31 and not on Nov 1, is silent; the GPUs of the inventory stand
    for the GPU-hours the records account for."""
    d = read_archive(_req(), archive)
    c = d.completeness
    assert c is not None and c.gaps == [] and c.status == "complete"
    [proof] = c.chains
    assert "stream exporter of host node-a: continuous from seq" in proof
    assert "2026-10-31" in proof and "2026-11-02" in proof
    assert [s.split(":")[0] for s in c.silent] == ["stream exporter of host node-b"]
    assert (c.inventory_gpus, c.inventory_hosts) == (2, 1)
    assert c.observed_gpu_hours == pytest.approx(48.0, abs=0.01)
    assert c.expected_gpu_hours == pytest.approx(48.0, abs=0.01)
    # an unkeyed trail: no seal proves its sums, so every part is read
    assert not any("(sealed: its rollup)" in q for q in d.queries)


def test_the_newest_day_is_open(archive: Path) -> None:
    """No record after the period yet: proven from the day before, and said to be open."""
    c = read_archive(_req(NOV2, NOV3), archive).completeness
    assert c is not None and c.gaps == []
    assert "the period is still open" in c.chains[0]


def test_a_head_truncated_first_day_is_refused_with_the_gap_named(
        archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first 1,000 lines of the period's first day removed billed 36 % less
    and said "verified". Now the part's digest fails, its records are read, and the
    missing seqs are named; the CLI exits 1 and writes no bill."""
    part = _part(archive, "node-a", "2026-11-01")
    lines = gzip.decompress(part.read_bytes()).split(b"\n")
    assert len(lines) > 1100
    part.write_bytes(gzip.compress(b"\n".join(lines[1000:])))
    with pytest.raises(ArchiveRefused) as exc:
        read_archive(_req(), archive)
    msg = str(exc.value)
    assert "records are missing" in msg and "--allow-gaps" in msg
    assert ": gap: seq" in msg and "(1000 records) missing" in msg and part.name in msg
    cfg = _config(archive, tmp_path)
    out = tmp_path / "bill"
    assert main(_cli(cfg, out, "--allow-unverified")) == 1
    assert "records are missing" in capsys.readouterr().err
    assert not out.exists()


def test_a_deleted_previous_day_is_refused_with_the_gap_named(archive: Path) -> None:
    """With the previous day's file deleted a month billed 0.25 GPU-h instead
    of 72, "verified". Now the stream's first record in the archive is in the period and
    does not start its chain: refused, naming the seqs that are not there."""
    oct31 = _part(archive, "node-a", "2026-10-31")
    oct31.unlink()
    oct31.with_name(oct31.name.replace(".jsonl.gz", ".seal.json")).unlink()
    with pytest.raises(ArchiveRefused) as exc:
        read_archive(_req(), archive)
    msg = str(exc.value)
    assert "holds no record of it before the period" in msg
    assert "seq 1.." in msg and "node-a" in msg


def _config(archive: Path, tmp_path: Path) -> Path:
    cfg = tmp_path / "gpu-audit.yaml"
    cfg.write_text(f"shipper:\n  sinks:\n  - type: archive\n    directory: {archive}\n")
    return cfg


def _cli(cfg: Path, out: Path, *extra: str) -> list[str]:
    return ["chargeback", "bill", "--from", "2026-11-01T00:00:00Z", "--to", "2026-11-02T00:00:00Z",
            "--source", "archive", "--config", str(cfg), "--rates",
            str(EXAMPLES / "rates.yaml"), "--out", str(out), *extra]


def test_allow_gaps_bills_and_stamps_every_output(
        archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--allow-gaps: the bill is written and says INCOMPLETE in the terminal, on every CSV
    row, in the JSON, at the top of the report and in the manifest (replayable)."""
    part = _part(archive, "node-a", "2026-11-01")
    lines = gzip.decompress(part.read_bytes()).split(b"\n")
    part.write_bytes(gzip.compress(b"\n".join(lines[:5] + lines[10:])))
    out = tmp_path / "bill"
    cfg = _config(archive, tmp_path)
    assert main(_cli(cfg, out)) == 1
    capsys.readouterr()
    assert main(_cli(cfg, out, "--allow-gaps", "--allow-unverified")) == 0
    printed = capsys.readouterr().out
    assert "completeness: GAPS (--allow-gaps)" in printed and "GAP: " in printed
    assert "INCOMPLETE" in printed
    rows = list(csv.DictReader(io.StringIO((out / CSV_NAME).read_text())))
    assert rows and {r["completeness"] for r in rows} == {"GAPS (--allow-gaps)"}
    doc = json.loads((out / JSON_NAME).read_text())
    assert doc["completeness"]["allowed"] is True and doc["completeness"]["gaps"]
    assert 'id="gaps">INCOMPLETE' in (out / HTML_NAME).read_text()
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["request"]["allow_gaps"] is True
    assert manifest["source"]["completeness"]["gaps"] == doc["completeness"]["gaps"]
    assert main(["chargeback", "replay", str(out / MANIFEST_NAME)]) == 0


def test_a_complete_bill_says_so_everywhere(archive: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bill"
    assert main(_cli(_config(archive, tmp_path), out)) == 0
    assert "completeness: complete" in capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO((out / CSV_NAME).read_text())))
    assert {r["completeness"] for r in rows} == {"complete"}
    html = (out / HTML_NAME).read_text()
    assert 'id="completeness"' in html and "continuous from seq" in html
