"""`audit verify` finds deleted, duplicated, reordered and edited records, says where,
and passes a clean trail: on JSON Lines files, spool directories and sink read-backs."""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpu_audit.audit.canonical import seal
from gpu_audit.audit.verify import VerifyReport, verify_jsonl, verify_readback, verify_spool_dir
from gpu_audit.spool import SpoolConfig, SpoolWriter
from tests.core.audit.trails import exporter_chain, producer_trail

Trail = list[bytes]


TRAIL = producer_trail()
N = len(TRAIL)


def delete(t: Trail) -> Trail:
    return t[:10] + t[11:]


def duplicate(t: Trail) -> Trail:
    return [*t[:11], t[10], *t[11:]]


def reorder(t: Trail) -> Trail:
    return [*t[:10], t[11], t[10], *t[12:]]


def edit(t: Trail) -> Trail:
    rec = orjson.loads(t[10])
    rec["gpu_seconds"] = 0.0 if rec.get("gpu_seconds") else 1.0
    return [*t[:10], orjson.dumps(rec, option=orjson.OPT_SORT_KEYS), *t[11:]]


def edit_and_rehash(t: Trail) -> Trail:
    """An attacker without the HMAC key who edits a record and recomputes its hash."""
    rec = orjson.loads(t[10])
    rec["values"] = {}
    return [*t[:10], seal(rec, rec["seq"], rec["prev_hash"], None), *t[11:]]


CASES: list[tuple[Callable[[Trail], Trail], str, int]] = [
    (delete, "gap", 11),
    (duplicate, "duplicate_seq", 12),
    (reorder, "reordered", 12),
    (edit, "modified", 11),
    (edit_and_rehash, "chain_break", 12),
]


def _write_jsonl(path: Path, t: Trail, gz: bool = False) -> Path:
    data = b"".join(x + b"\n" for x in t)
    if gz:
        path = path.with_suffix(".jsonl.gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def _write_spool(d: Path, t: Trail) -> Path:
    w = SpoolWriter(SpoolConfig(directory=d, min_free_bytes=0, fsync_window_ms=0))
    try:
        w.commit(t)
    finally:
        w.close()
    return d


def _assert_found(report: VerifyReport, kind: str, where: str) -> None:
    assert not report.ok
    assert report.counts == {kind: 1}, report.render()
    hits = [p for p in report.problems if p.kind == kind]
    assert any(p.where == where for p in hits), report.render()
    assert where in report.render()


@pytest.mark.parametrize("gz", [False, True])
def test_clean_jsonl_trail_verifies(tmp_path: Path, gz: bool) -> None:
    """An untouched export (plain or gzip) verifies with no problem."""
    report = verify_jsonl(_write_jsonl(tmp_path / "a.jsonl", TRAIL, gz), None)
    assert report.ok, report.render()
    assert report.records == N and exporter_chain(report).last_seq == N
    assert "OK" in report.render()


@pytest.mark.parametrize(("tamper", "kind", "line"), CASES, ids=[c[0].__name__ for c in CASES])
def test_jsonl_tampering_is_found_at_its_line(
    tmp_path: Path, tamper: Callable[[Trail], Trail], kind: str, line: int
) -> None:
    """Each kind of tampering is reported with its kind and the exact line."""
    report = verify_jsonl(_write_jsonl(tmp_path / "a.jsonl", tamper(TRAIL)), None)
    _assert_found(report, kind, f"line {line}")


def test_clean_spool_dir_verifies(tmp_path: Path) -> None:
    """A spool directory holding an untouched trail verifies."""
    report = verify_spool_dir(_write_spool(tmp_path / "s", TRAIL), None, complete=True)
    assert report.ok, report.render()


@pytest.mark.parametrize(("tamper", "kind", "line"), CASES, ids=[c[0].__name__ for c in CASES])
def test_spool_dir_tampering_is_found_at_its_offset(
    tmp_path: Path, tamper: Callable[[Trail], Trail], kind: str, line: int
) -> None:
    """Tampered records written into a spool with valid framing are found, by offset."""
    report = verify_spool_dir(_write_spool(tmp_path / "s", tamper(TRAIL)), None)
    _assert_found(report, kind, f"offset {line - 1}")


def test_invalid_json_line_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    """A line that is not JSON is reported with its number and verification goes on."""
    t = [*TRAIL[:5], b'{"schema": "gpu-audit.rec', *TRAIL[5:]]
    report = verify_jsonl(_write_jsonl(tmp_path / "a.jsonl", t), None)
    assert report.counts == {"invalid_json": 1}
    assert report.problems[0].where == "line 6"


def test_wrong_schema_version_is_reported(tmp_path: Path) -> None:
    """A record of an unknown schema version is reported as bad_schema."""
    rec = orjson.loads(TRAIL[3])
    rec["schema"] = "gpu-audit.record/9"
    t = [*TRAIL[:3], orjson.dumps(rec), *TRAIL[4:]]
    report = verify_jsonl(_write_jsonl(tmp_path / "a.jsonl", t), None)
    assert report.counts["bad_schema"] == 1 and report.problems[0].where == "line 4"


def test_deleted_first_record_is_a_gap_in_a_complete_export(tmp_path: Path) -> None:
    """A full export must start at seq 1: deleting the first record is found."""
    report = verify_jsonl(_write_jsonl(tmp_path / "a.jsonl", TRAIL[1:]), None)
    _assert_found(report, "gap", "line 1")


def test_hmac_trail_needs_the_key(tmp_path: Path) -> None:
    """An HMAC-keyed trail verifies with its key; without it every record fails and the
    report hints at the key."""
    t = producer_trail(b"k3y", tmp_path)
    path = _write_jsonl(tmp_path / "h.jsonl", t)
    assert verify_jsonl(path, b"k3y").ok
    bad = verify_jsonl(path, None)
    assert bad.counts["modified"] == len(t)
    assert "hmac-key-file" in bad.render()


def test_readback_in_any_order_over_a_time_range() -> None:
    """Records read back from a sink in random order, for a range that starts mid-trail,
    verify clean; a missing and a doubled record in range are found."""
    window = [orjson.loads(x) for x in TRAIL[7:30]]
    shuffled: list[Any] = window[:]
    random.Random(4).shuffle(shuffled)
    assert verify_readback(shuffled, hmac_key=None).ok
    gone = [r for r in shuffled if r["seq"] != 15]
    report = verify_readback(gone, hmac_key=None)
    assert report.counts == {"gap": 1} and report.problems[0].seq == 15
    doubled = [*shuffled, dict(window[3])]
    assert verify_readback(doubled, hmac_key=None).counts == {"duplicate_seq": 1}


def test_same_sample_chained_twice_is_a_duplicate_id(tmp_path: Path) -> None:
    """A sample replayed into the chain under a new seq is found by its id."""
    rec = orjson.loads(TRAIL[10])
    last = orjson.loads(TRAIL[-1])
    again = seal(rec, last["seq"] + 1, last["hash"], None)
    report = verify_jsonl(_write_jsonl(tmp_path / "a.jsonl", [*TRAIL, again]), None)
    _assert_found(report, "duplicate_id", f"line {N + 1}")


def test_two_hosts_default_streams_are_two_chains(tmp_path: Path) -> None:
    """Read back from one sink, two nodes' `exporter` streams interleave: each host's
    chain verifies on its own (seq runs per host and stream), and damage in one names it."""
    other = producer_trail(host="node-b")
    mixed = [line for pair in zip(TRAIL, other, strict=True) for line in pair]
    report = verify_jsonl(_write_jsonl(tmp_path / "a.jsonl", mixed, False), None)
    assert report.ok, report.render()
    assert sorted(report.streams) == sorted(
        {f"exporter@{orjson.loads(TRAIL[0])['host']}", "exporter@node-b"})
    broken = verify_jsonl(_write_jsonl(tmp_path / "b.jsonl", [*mixed[:5], *mixed[7:]], False),
                          None)
    assert not broken.ok
    assert {p.stream for p in broken.problems} == {f"exporter@{orjson.loads(TRAIL[0])['host']}",
                                                   "exporter@node-b"}
