"""Fixed test vectors for the hash chain: golden trails checked in under
tests/core/audit/golden/, so a change in serialisation, ids or hashing fails here instead of
silently breaking every stored archive.

- v1 (written by the v1 code before the format changed): `audit verify` must accept it,
  with and without HMAC, and it still satisfies the v1 schema;
- v2: the producer's output for the fixed input of tests/core/audit/golden_input.py is
  byte-identical to the checked-in files, and every id and hash recomputes from first
  principles (hashlib, not gpu_audit.audit.canonical);
- the fast paths (encoded process records, spliced hash, cached parts) equal the plain
  reference path byte for byte, on the goldens and on hypothesis-generated input, and
  seal()'s spliced hash equals seal_reference() on arbitrary JSON records;
- one stream that goes from v1 to v2 (an upgrade) is one chain, verified across the
  change, in an archive file and in a spool.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from gpu_audit.audit import AuditConfig, AuditProducer, verify_jsonl, verify_spool_dir
from gpu_audit.audit.builder import build_records, exporter_event
from gpu_audit.audit.canonical import ZERO_HASH, seal, seal_reference
from gpu_audit.audit.schema import record_schema
from gpu_audit.model.attribution import IDENTITY_FIELDS, AttributedProcess, Attribution
from gpu_audit.model.samples import BackendInfo, GpuInfo, GpuSample, ProcessSample, XidEvent
from gpu_audit.model.snapshot import Snapshot
from gpu_audit.spool import SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from gpu_audit_app.cli import main
from tests.core.audit import golden_input as gi
from tests.core.audit.fakes import MemorySpool
from tests.core.audit.trails import exporter_chain, reference_chain

KEYS: dict[str, bytes | None] = {"plain": None, "hmac": gi.golden_key()}
_V2 = Draft202012Validator(record_schema(2))


def _golden(version: int, mode: str) -> Path:
    return gi.GOLDEN_DIR / f"trail-v{version}{'-hmac' if mode == 'hmac' else ''}.jsonl"


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def _first_principles_hash(prev_hash: str, body: bytes, key: bytes | None) -> str:
    if key is None:
        return hashlib.sha256(prev_hash.encode() + body).hexdigest()
    return hmac.new(key, prev_hash.encode() + body, hashlib.sha256).hexdigest()


def _first_principles_id(rec: dict[str, Any]) -> str:
    proc = rec.get("process")
    pkey = ""
    if rec["kind"] == "process" or rec.get("event") in {"process_start", "process_end"}:
        assert proc is not None
        pkey = (f"{proc['pid']}:{proc['type']}:{proc.get('gpu_instance_id')}:"
                f"{proc.get('compute_instance_id')}")
    xid = rec.get("xid")
    parts = [rec["host"], rec["stream"], str(rec["time_ns"]), rec["kind"],
             rec.get("event", ""), rec.get("gpu", {}).get("uuid", ""), pkey,
             f"{xid['code']}@{xid['time_ns']}" if xid else ""]
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()


@pytest.mark.parametrize("mode", list(KEYS))
def test_v1_golden_trail_still_verifies(mode: str) -> None:
    """`audit verify` accepts the checked-in v1 trail (records that exist in archives
    today), with its key when it is HMAC-keyed; without the key the keyed trail fails."""
    path = _golden(1, mode)
    report = verify_jsonl(path, KEYS[mode])
    assert report.ok, report.render()
    assert report.records == 43 and exporter_chain(report).last_seq == 43
    if mode == "hmac":
        assert verify_jsonl(path, None).counts["modified"] == 43


def test_v1_golden_satisfies_the_v1_schema() -> None:
    """The v1 schema is still published and still describes v1 records."""
    validator = Draft202012Validator(record_schema(1))
    for line in _lines(_golden(1, "plain")):
        assert list(validator.iter_errors(orjson.loads(line))) == []


@pytest.mark.parametrize("mode", list(KEYS))
def test_v2_producer_output_is_byte_identical_to_the_golden(mode: str) -> None:
    """Known input -> known bytes: the producer (fast path) writes exactly the
    checked-in v2 trail, record for record."""
    produced = gi.produce(KEYS[mode])
    golden = _lines(_golden(2, mode))
    assert len(produced) == len(golden) == 32
    for i, (p, g) in enumerate(zip(produced, golden, strict=True), 1):
        assert p == g, f"record {i} differs"


@pytest.mark.parametrize("mode", list(KEYS))
def test_v2_golden_ids_and_hashes_recompute_from_first_principles(mode: str) -> None:
    """Every golden id is blake2b-128 over its identity fields and every hash is
    SHA-256 (or HMAC-SHA256) over prev_hash + the canonical bytes without `hash`,
    computed here with hashlib alone; each prev_hash is the previous record's hash."""
    key = KEYS[mode]
    prev = ZERO_HASH
    validator = Draft202012Validator(record_schema(2))
    for seq, line in enumerate(_lines(_golden(2, mode)), 1):
        rec = orjson.loads(line)
        assert rec["seq"] == seq and rec["prev_hash"] == prev
        body = {k: v for k, v in rec.items() if k != "hash"}
        canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        assert rec["hash"] == _first_principles_hash(prev, canonical, key)
        assert rec["id"] == _first_principles_id(rec)
        assert list(validator.iter_errors(rec)) == []
        prev = rec["hash"]


def _plain_trail(key: bytes | None, snaps: list[Snapshot] | None = None,
                 t0: float = gi.T0) -> list[bytes]:
    """A trail through the plain reference path: no cached parts across cycles, no
    fragments, no encoded records, seal_reference instead of seal. Default: the golden
    trail (exporter_start at t0 - 1, the cycles, exporter_stop at t0 + 11)."""
    snaps = list(gi.snapshots()) if snaps is None else snaps
    records = [exporter_event("exporter_start", timestamp=t0 - 1.0, host=gi.HOST,
                              stream="exporter", exporter_version=gi.VERSION,
                              simulated=False)]
    prev = None
    for snap in snaps:
        records += build_records(snap, prev, stream="exporter", exporter_version=gi.VERSION,
                                 host=gi.HOST, simulated=snap.backend.simulated)
        prev = snap
    records.append(exporter_event("exporter_stop", timestamp=t0 + 11.0, host=gi.HOST,
                                  stream="exporter", exporter_version=gi.VERSION,
                                  simulated=False,
                                  interval_seconds=snaps[-1].interval_seconds if snaps else 0))
    return reference_chain(records, key)


@pytest.mark.parametrize("mode", list(KEYS))
def test_plain_reference_path_gives_the_golden_bytes(mode: str) -> None:
    """The obviously-correct path (plain dicts, sort and hash, serialise again) writes
    the same bytes as the producer's fast path: they agree on the golden input."""
    assert _plain_trail(KEYS[mode]) == _lines(_golden(2, mode))


_TEXT = st.text(st.sampled_from('ab{}",:\\\x1f\u00e9\U0001f600 host'), max_size=6)
_RATIO = st.one_of(st.none(), st.floats(0, 1), st.just(float("nan")), st.just(float("inf")))


@st.composite
def _attribution(draw: st.DrawFn) -> Attribution:
    fields = draw(st.dictionaries(st.sampled_from(IDENTITY_FIELDS), _TEXT, max_size=5))
    srcs = {f: draw(st.sampled_from(["jobmap", "environ", "cgroup", "owner", "kubelet"]))
            for f in fields if draw(st.booleans())}
    return Attribution(**fields, sources=srcs)


@st.composite
def _snapshots(draw: st.DrawFn) -> list[Snapshot]:
    """2-4 cycles of 1-3 GPUs: GPUs going down and up, processes (some persisting,
    tricky names, random owners) with missing or non-finite samples, XIDs, and steps
    that are normal, long (capped), zero or backwards."""
    out: list[Snapshot] = []
    ts = gi.T0
    for _cycle in range(draw(st.integers(2, 4))):
        gpus, procs = [], {}
        for index in range(draw(st.integers(1, 3))):
            info = GpuInfo(uuid=f"GPU-{index}", index=index, name=draw(_TEXT))
            if not draw(st.booleans()) and index:
                gpus.append(GpuSample(info=info, up=False, error="gpu_lost"))
                continue
            values: dict[str, dict[tuple[str, ...], float]] = {}
            for key, strat in (("utilization_gpu", _RATIO),
                               ("memory_used", st.one_of(st.none(), st.floats(0, 1e11))),
                               ("energy", st.one_of(st.none(), st.floats(0, 1e9))),
                               ("power_usage", st.one_of(st.none(), st.floats(0, 700)))):
                v = draw(strat)
                if v is not None:
                    values[key] = {(): v}
            plist = []
            for pid in sorted(draw(st.sets(st.integers(1, 6), max_size=4))):
                plist.append(ProcessSample(
                    pid=pid, name=draw(_TEXT), uid=draw(st.one_of(st.none(), st.just(pid))),
                    used_memory_bytes=draw(st.one_of(st.none(), st.integers(0, 2**40))),
                    sm_util_ratio=draw(_RATIO), memory_util_ratio=draw(_RATIO),
                    type=draw(st.sampled_from(["compute", "graphics"]))))
            xids = tuple(XidEvent(info.uuid, draw(st.integers(1, 120)), ts - 0.5)
                         for _ in range(draw(st.integers(0, 1))))
            g = GpuSample(info=info, values=values, processes=tuple(plist), new_xids=xids)
            gpus.append(g)
            procs[info.uuid] = tuple(AttributedProcess(info.uuid, p, draw(_attribution()))
                                     for p in plist)
        out.append(Snapshot(timestamp=ts, host=gi.HOST,
                            backend=BackendInfo(name="sim", simulated=draw(st.booleans())),
                            gpus=tuple(gpus), processes=procs, interval_seconds=5.0))
        ts += draw(st.sampled_from([5.0, 4.75, 0.0, -1.0, 600.0]))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snaps=_snapshots(), keyed=st.booleans())
def test_fast_path_equals_plain_path_on_generated_input(snaps: list[Snapshot],
                                                        keyed: bool) -> None:
    """For any input, the producer's fast path (fragments, encoded process records, cached
    parts across cycles, spliced hash) stores exactly the bytes of the plain path, and
    every record it stores satisfies the v2 schema (no empty string, no non-finite
    number, no usage row for an interval of 0)."""
    key = b"k" if keyed else None
    spool = MemorySpool()
    producer = AuditProducer(AuditConfig(interval_seconds=5.0), spool, host=gi.HOST,
                             exporter_version=gi.VERSION, simulated=False, clock=gi._Clock(gi.T0))
    producer._key = key
    producer.start()
    for snap in snaps:
        producer.on_snapshot(snap)
    producer.stop()
    assert spool.payloads == _plain_trail(key, snaps)
    for payload in spool.payloads:  # and whatever the input, a valid v2 record
        assert list(_V2.iter_errors(orjson.loads(payload))) == []


_KEY = st.sampled_from(["host", "hash", "a", "gpu", "z", "hos", "hosts", "", '"host"'])
_JSON_TEXT = st.text(st.sampled_from('{}[]",:\\ ahost\x1f\u00e9'), max_size=12)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
              st.floats(allow_nan=False, allow_infinity=False), _JSON_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_KEY, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(record=st.dictionaries(_KEY, _JSON, max_size=6), host=st.one_of(st.none(), _JSON),
       seq=st.integers(1, 2**40), keyed=st.booleans())
def test_seal_equals_the_reference_on_any_record(record: dict[str, Any], host: Any,
                                                 seq: int, keyed: bool) -> None:
    """seal()'s spliced hash gives exactly seal_reference()'s bytes for any record: with
    and without a top-level "host", with nested objects holding "host" keys, with
    strings full of braces, quotes and a fake `,"host":`, and with a stale "hash"."""
    if host is not None:
        record["host"] = host
    key = b"k" if keyed else None
    prev = "ab" * 32
    expected = seal_reference(record, seq, prev, key)
    assert seal(dict(record), seq, prev, key) == expected


def _v1_then_v2(key: bytes | None) -> tuple[list[bytes], list[bytes]]:
    """The v1 golden trail, then the v2 producer started on top of it (an upgrade)."""
    v1 = _lines(_golden(1, "hmac" if key else "plain"))
    spool = MemorySpool(payloads=list(v1))
    gi.produce(key, spool=spool, t0=gi.T0 + 3600.0)
    return v1, spool.payloads[len(v1):]


@pytest.mark.parametrize("mode", list(KEYS))
def test_upgrade_continues_the_chain_across_the_version_change(mode: str, tmp_path: Path
                                                               ) -> None:
    """A v2 producer started on a v1 trail continues the same chain (seq 44 links to
    the hash of v1 seq 43), and one archive file holding both verifies OK; editing the
    link at the boundary is caught."""
    key = KEYS[mode]
    v1, v2 = _v1_then_v2(key)
    first = orjson.loads(v2[0])
    assert first["schema"] == "gpu-audit.record/2" and first["seq"] == 44
    assert first["prev_hash"] == orjson.loads(v1[-1])["hash"]
    archive = tmp_path / "archive.jsonl"
    archive.write_bytes(b"".join(line + b"\n" for line in v1 + v2))
    report = verify_jsonl(archive, key)
    assert report.ok, report.render()
    assert report.records == 43 + 32
    tampered = [*v1[:-1], v1[-1].replace(b'"seq":43', b'"seq":43,"x":1'), *v2]
    archive.write_bytes(b"".join(line + b"\n" for line in tampered))
    bad = verify_jsonl(archive, key)
    assert bad.counts["modified"] == 1


def test_upgrade_in_a_spool_directory_verifies(tmp_path: Path) -> None:
    """The same v1-then-v2 stream in a real spool: the producer resumes from the v1
    record at the spool's end, and `audit verify` of the spool passes across the change."""
    spool_dir = tmp_path / "spool"
    writer = SpoolWriter(SpoolConfig(directory=spool_dir, min_free_bytes=0))
    try:
        writer.commit(_lines(_golden(1, "plain")))
        producer = AuditProducer(AuditConfig(interval_seconds=5.0), writer, host=gi.HOST,
                                 exporter_version=gi.VERSION, simulated=False,
                                 clock=lambda: gi.T0 + 3599.0)
        producer.start()
        for snap in gi.snapshots(gi.T0 + 3600.0):
            producer.on_snapshot(snap)
        assert producer.stats()["last_seq"] > 44
    finally:
        writer.close()
    report = verify_spool_dir(spool_dir, None, complete=True)
    assert report.ok, report.render()
    assert exporter_chain(report).first_seq == 1


def test_audit_verify_cli_accepts_an_archive_upgraded_from_v1_to_v2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gpu-audit audit verify ARCHIVE_DIR` on an archive whose older day file holds v1
    records and whose newer (compressed) day file holds the v2 records that continue the
    chain: exit 0, one stream, seq 1..75."""
    v1, v2 = _v1_then_v2(None)
    (tmp_path / "gpu-audit-2026-11-30.jsonl").write_bytes(b"".join(x + b"\n" for x in v1))
    (tmp_path / "gpu-audit-2026-12-01.jsonl.gz").write_bytes(
        gzip.compress(b"".join(x + b"\n" for x in v2)))
    assert main(["audit", "verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "seq 1..75" in out
