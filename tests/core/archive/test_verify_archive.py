"""`audit verify` on an archive directory: seals, part digests, the chain across parts,
damaged parts, records that do not belong to their part; `--fast` from the seals alone."""

from __future__ import annotations

import datetime as dt
import gzip
import shutil
from pathlib import Path

import orjson
import pytest

from gpu_audit.archive import list_parts
from gpu_audit.archive.verify import verify_archive
from gpu_audit.audit.verify import VerifyReport, verify_jsonl
from gpu_audit.model.snapshot import Snapshot
from gpu_audit_app.cli import main
from tests.chargeback.archives import produce, rewrite_part, write_archive
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot

DAY = dt.datetime(2026, 11, 3, tzinfo=dt.UTC).timestamp()
E = 5.0


def _snaps(n: int, start: float) -> list[Snapshot]:
    owners = {101: ALICE, 102: BOB}
    return [snapshot(start + E * k, [
        gpu(0, util=0.9, energy=900.0 * k, power=180.0,
            processes=[proc(101, sm=0.6), proc(102, sm=0.3)]),
        gpu(1, util=0.0, energy=100.0 * k, power=20.0)], owners, interval=E)
        for k in range(n)]


def _trail(host: str, start: float = DAY - 3600, n: int = 1440) -> list[bytes]:
    """Two hours of a node across midnight at the default 60 s cadence."""
    return produce(_snaps(n, start), host=host, start_s=start - 1, stop_s=start + n * E,
                   interval_s=60.0)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("archive")
    write_archive(d, _trail("gpu-node-01"), _trail("gpu-node-02"), max_file_bytes=16_000)
    return d


@pytest.fixture
def archive(pristine: Path, tmp_path: Path) -> Path:
    d = tmp_path / "a"
    shutil.copytree(pristine, d)
    return d


def _parts(d: Path, host: str = "gpu-node-01") -> list[Path]:
    return [p.path for p in list_parts(d) if p.host == host]


def _kinds(r: VerifyReport) -> set[str]:
    return set(r.counts)


def test_a_sealed_archive_verifies_record_by_record_and_from_its_seals(archive: Path) -> None:
    """Two hosts, each its own series of sealed parts (names carry host and stream): the
    full check and the fast check both pass and agree on every stream's seqs."""
    parts = list_parts(archive)
    assert {p.host for p in parts} == {"gpu-node-01", "gpu-node-02"}
    assert all(p.seal_path.exists() for p in parts if p.compressed)
    assert sum(1 for p in parts if not p.compressed) == 2  # each host's live part
    full, fast = verify_archive(archive, None), verify_archive(archive, None, fast=True)
    assert full.ok, full.render()
    assert fast.ok, fast.render()
    assert {n: (s.first_seq, s.last_seq, s.records) for n, s in full.streams.items()} == {
        n: (s.first_seq, s.last_seq, s.records) for n, s in fast.streams.items()}
    assert verify_archive(archive, None, rollups=True).ok


def test_a_truncated_gz_part_names_the_file_and_its_last_good_line(
    archive: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated .gz part is a problem naming the file and the last
    line read whole; every other part is still verified; no traceback (exit 1)."""
    victim = _parts(archive)[1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    assert main(["audit", "verify", str(archive)]) == 1
    out = capsys.readouterr().out
    assert "damaged_part" in out and victim.name in out and "after line" in out
    assert "Traceback" not in out
    report = verify_archive(archive, None)
    assert {"damaged_part", "part_digest"} <= _kinds(report)
    # the records of the other parts were all verified: the other host's stream is whole
    other = report.streams["exporter@gpu-node-02"]
    assert other.records == other.last_seq


def test_a_truncated_gz_file_given_alone_is_a_problem_not_a_traceback(
    archive: Path, tmp_path: Path
) -> None:
    """On one JSON Lines file: the damage is named, the lines before
    it verified."""
    victim = _parts(archive)[0]
    cut = tmp_path / "cut.jsonl.gz"
    data = victim.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    report = verify_jsonl(cut, None)
    assert "damaged_part" in report.counts and report.records > 0
    assert any("after line" in p.detail for p in report.problems)


def test_a_record_of_another_host_in_a_part_is_foreign_without_hmac(archive: Path) -> None:
    """The first record of a host that is nowhere else in the archive
    (a valid chain of its own) inserted into a part of gpu-node-01: `foreign`, with no HMAC
    key, because the part's name says whose chain it holds."""
    intruder = _trail("gpu-node-99", n=13)[0]
    assert orjson.loads(intruder)["seq"] == 1
    rewrite_part(_parts(archive)[1], lambda lines: [lines[0], intruder, *lines[1:]])
    report = verify_archive(archive, None)
    assert "foreign" in report.counts, report.render()
    assert any("gpu-node-99" in p.detail for p in report.problems if p.kind == "foreign")


def test_a_part_changed_after_sealing_fails_its_digest_even_when_rechained(
    archive: Path,
) -> None:
    """Re-compressing a part (same records, other bytes) is caught by the seal's SHA-256,
    in the fast check too; `sha256sum PART` is what the seal holds."""
    import hashlib

    victim = _parts(archive)[2]
    seal = orjson.loads(victim.with_name(victim.name.replace(".jsonl.gz", ".seal.json"))
                        .read_bytes())
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == seal["part_sha256"]
    victim.write_bytes(gzip.compress(gzip.decompress(victim.read_bytes()), compresslevel=1))
    for fast in (False, True):
        assert "part_digest" in verify_archive(archive, None, fast=fast).counts


def test_a_removed_part_breaks_the_seal_chain_and_the_numbering(archive: Path) -> None:
    """A part and its seal removed from the middle of a series: the part numbers skip,
    the next seal does not follow the one before, and the seqs jump (fast and full)."""
    victim = _parts(archive)[2]
    victim.unlink()
    victim.with_name(victim.name.replace(".jsonl.gz", ".seal.json")).unlink()
    for fast in (False, True):
        kinds = _kinds(verify_archive(archive, None, fast=fast))
        assert {"missing_part", "seal_chain", "gap"} <= kinds, (fast, kinds)


def test_a_seal_edited_to_bill_more_is_caught(archive: Path) -> None:
    """A seal's rollup edited (more GPU-seconds for alice): the next seal's prev_seal no
    longer matches; --rollups also recomputes the sums from the records."""
    seal_path = _parts(archive)[1].with_name(
        _parts(archive)[1].name.replace(".jsonl.gz", ".seal.json"))
    doc = orjson.loads(seal_path.read_bytes())
    doc["rollup"]["holders"][0][6] += 3600.0
    seal_path.write_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n")
    assert "seal_chain" in verify_archive(archive, None, fast=True).counts
    assert "seal_rollup" in verify_archive(archive, None, rollups=True).counts


def test_fast_reads_only_the_unsealed_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`audit verify --fast` on a keyed trail opens no sealed part's records (it hashes
    their bytes and checks their MACs), only each host's live part; on an unkeyed one no
    seal is authentic, so it reads every part."""
    import gpu_audit.archive.verify as averify

    keyfile = tmp_path / "k"
    keyfile.write_bytes(b"k3y\n")
    archive = tmp_path / "keyed"
    write_archive(archive, *(produce(_snaps(240, DAY - 3600), host=h, start_s=DAY - 3601,
                                     stop_s=DAY - 3600 + 240 * E, interval_s=60.0,
                                     key_file=keyfile)
                             for h in ("gpu-node-01", "gpu-node-02")),
                  max_file_bytes=8_000, seal_key=b"k3y")
    plain = tmp_path / "plain"
    write_archive(plain, _trail("gpu-node-01", n=240), max_file_bytes=8_000)

    read: list[str] = []
    real = averify.read_part

    def spy(v: object, p: object, **kw: object) -> object:
        read.append(p.path.name)  # type: ignore[attr-defined]
        return real(v, p, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(averify, "read_part", spy)
    assert main(["audit", "verify", "--fast", "--workers", "1", "--hmac-key-file",
                 str(keyfile), str(archive)]) == 0, capsys.readouterr().out
    assert sorted(read) == sorted(p.path.name for p in list_parts(archive)
                                  if not p.seal_path.exists())
    assert len(list_parts(archive)) > 4
    read.clear()
    assert main(["audit", "verify", "--fast", "--workers", "1", str(plain)]) == 0
    assert sorted(read) == sorted(p.path.name for p in list_parts(plain))


def test_two_workers_report_what_one_does(archive: Path) -> None:
    """Hosts' streams verified in two processes (as `zcat | sha256sum` uses two) give the
    same report: records, streams and every problem (gaps are listed per stream, when
    each stream ends, rather than all at the end)."""
    _parts(archive)[1].write_bytes(_parts(archive)[1].read_bytes()[:1500])
    intruder = _trail("gpu-node-99", n=13)[0]
    rewrite_part(_parts(archive, "gpu-node-02")[3], lambda ls: [ls[0], intruder, *ls[1:]])
    one, two = verify_archive(archive, None), verify_archive(archive, None, workers=2)
    assert (two.records, two.counts, two.streams) == (one.records, one.counts, one.streams)
    assert sorted(p.render() for p in two.problems) == sorted(p.render() for p in one.problems)
    assert {"damaged_part", "foreign"} <= set(two.counts)
