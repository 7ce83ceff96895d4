"""A truncated part and a host seen nowhere else, through the command line and the
chargeback source, on an archive the real sink wrote from a real hash chain
(tests.shipper.producer.chained):

b. a truncated `.gz` part gave a Python traceback (EOFError) in `audit verify` and in
   `chargeback`, with or without --allow-unverified, naming no file or line;
c. a record of another host inserted into an archive part verified OK without an HMAC
   key (the other host's chain started at seq 1, so it looked whole)."""

from __future__ import annotations

import datetime as dt
import gzip
from pathlib import Path

import orjson
import pytest

from chargeback.model import Request
from chargeback.sources.archive import ArchiveRefused, read_archive
from gpu_audit_app.cli import main
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import SinkRecord
from tests.shipper.producer import chained, make_doc

MIDNIGHT_NS = 1_790_035_200 * 1_000_000_000  # 2026-09-22T00:00:00Z
N = 120


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """Two days of one host's chain in parts of 4 KB (many closed, gzipped parts)."""
    d = tmp_path / "archive"
    sink = ArchiveSink(ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": d, "max_file_bytes": 4096, "fsync": False}),
        "archive", d)
    sink.start()
    raws = chained(N, MIDNIGHT_NS - N // 2 * 60 * 1_000_000_000, pad=200)
    recs = []
    for i, raw in enumerate(raws):
        doc = orjson.loads(raw)
        recs.append(SinkRecord(offset=i, record_id=doc["id"], doc=doc, raw=raw))
    for i in range(0, N, 10):
        sink.send(recs[i:i + 10])
    sink.close()
    return d


def _gz_parts(d: Path) -> list[Path]:
    return sorted((p for p in d.iterdir() if p.name.endswith(".jsonl.gz")),
                  key=lambda p: p.stat().st_mtime_ns)


def test_b_a_truncated_part_is_a_named_problem_in_audit_verify(
        archive: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`audit verify`: no traceback; exit 1; the damaged file and its last good line are
    named, and the other parts are still verified (their records are counted)."""
    victim = _gz_parts(archive)[2]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    code = main(["audit", "verify", str(archive)])
    out = capsys.readouterr().out
    assert code == 1
    assert "damaged_part" in out and victim.name in out and "after line" in out
    records = int(out.splitlines()[0].split(": ")[1].split()[0])
    assert records > N // 2


@pytest.mark.parametrize("allow", [False, True])
def test_b_a_truncated_part_is_a_named_problem_in_chargeback(archive: Path,
                                                             allow: bool) -> None:
    """chargeback: the archive is refused naming the damaged file (not an EOFError),
    with or without --allow-unverified."""
    victim = _gz_parts(archive)[2]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    start = dt.datetime.fromtimestamp(MIDNIGHT_NS / 1e9 - 86400, tz=dt.UTC)
    req = Request(start=start, end=start + dt.timedelta(days=2), source="archive",
                  config=None, prometheus_url=None, rates=None, directory=None,
                  idle_policy="none", out="out", include_simulated=True,
                  allow_unverified=allow)
    with pytest.raises(ArchiveRefused) as exc:
        read_archive(req, archive)
    assert victim.name in str(exc.value)


def test_c_a_record_of_another_host_in_a_part_is_caught_without_hmac(
        archive: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first record of another host's chain (seq 1, a whole chain of its own) put into
    a part of node-1: `audit verify` exits 1 naming it, with no HMAC key."""
    from gpu_audit.audit.canonical import ZERO_HASH, seal

    doc = make_doc(1, MIDNIGHT_NS)
    doc["host"], doc["stream"] = "node-9", "node-9/exporter"
    intruder = seal(doc, 1, ZERO_HASH, None)
    victim = _gz_parts(archive)[1]
    lines = gzip.decompress(victim.read_bytes()).split(b"\n")
    victim.write_bytes(gzip.compress(b"\n".join([lines[0], intruder, *lines[1:]])))
    code = main(["audit", "verify", str(archive)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "foreign" in out and "node-9" in out
