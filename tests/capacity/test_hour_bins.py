"""`--bin hour` on the archive: one read of the period (each part once, record by record:
a seal sums a whole day), and the hour bins of each day add up to its day bin, which the
day path takes from the seals without reading a record."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

import chargeback.sources.archive as archive_source
from chargeback.capacity.model import Bin, Figures
from chargeback.model import Request
from chargeback.run import SourceError
from gpu_audit.model.samples import GpuSample
from gpu_audit_app.capacity.main import read_bins
from gpu_audit_app.chargeback.main import readers
from tests.chargeback.archives import produce, write_archive
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot

pytestmark = pytest.mark.timeout(120)

START = dt.datetime(2026, 11, 3, tzinfo=dt.UTC)
DAYS = 2
STEP = 600.0
KEY = b"capacity-hour-bins-test-key"
FIELDS = [f.name for f in dataclasses.fields(Figures)]


def _gpus(k: int) -> list[GpuSample]:
    """Three GPUs whose use changes hour by hour (so hour bins differ from each other)."""
    h = int((k - 1) * STEP // 3600) if k > 0 else 0
    e = 1000.0 * k
    g0 = gpu(0, util=(h % 5) / 4, energy=e, processes=[proc(101, sm=(h % 5) / 4)])
    g1 = (gpu(1, util=0.0, energy=e, processes=[proc(201, sm=0.0)]) if h % 2
          else gpu(1, util=0.0, energy=e))
    g2 = gpu(2, up=False) if h % 7 == 3 else gpu(2, util=0.7, energy=e,
                                                  processes=[proc(301, sm=0.7)])
    return [g0, g1, g2]


@pytest.fixture(scope="module")
def trail(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A keyed trail of two whole days (sealed day parts) and the start of a third."""
    root = tmp_path_factory.mktemp("hourbins")
    key_file = root / "hmac.key"
    key_file.write_bytes(KEY + b"\n")
    t0 = START.timestamp()
    n = int(DAYS * 86400 / STEP) + 3
    # half a second late: records straddle the bins' edges and the period's end, as
    # real cycles do (a record belongs to the bin its interval ends in)
    snaps = [snapshot(t0 + 0.5 + STEP * k, _gpus(k), {101: ALICE, 201: BOB, 301: ALICE},
                      interval=STEP) for k in range(n)]
    write_archive(root / "archive", produce(snaps, host="gpu-node-01", start_s=t0 - 10,
                                            stop_s=t0 + STEP * n + 10, key_file=key_file),
                  seal_key=KEY)
    config = root / "gpu-audit.yaml"
    config.write_text(
        f"audit:\n  hmac_key_file: {orjson.dumps(str(key_file)).decode()}\n"
        "shipper:\n  sinks:\n  - type: archive\n"
        f"    directory: {orjson.dumps(str(root / 'archive')).decode()}\n", encoding="utf-8")
    return config


def _request(config: Path) -> Request:
    return Request(start=START, end=START + dt.timedelta(days=DAYS), source="archive",
                   config=str(config), prometheus_url=None, rates=None, directory=None,
                   idle_policy="none", out="unused")


def _counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    reads: Counter[str] = Counter()
    real = archive_source.read_part

    def counting(v: Any, p: Any, **kw: Any) -> Any:
        reads[p.path.name] += 1
        return real(v, p, **kw)

    monkeypatch.setattr(archive_source, "read_part", counting)
    return reads


def _sum(bins: list[Bin]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for b in bins:
        assert b.models is not None, f"bin {b.start} has no data"
        for model, f in b.models.items():
            acc = out.setdefault(model, dict.fromkeys(FIELDS, 0.0))
            for name in FIELDS:
                acc[name] += getattr(f, name)
    return out


def test_hour_bins_add_up_to_day_bins(trail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _counted(monkeypatch)
    days, _ = read_bins(_request(trail), 86400.0, [])
    # the bins hold the whole period, as the bill of it does (the share of the record
    # across the period's end too, keyed by the day after it)
    bill = archive_source.read_archive(
        _request(trail), trail.parent / "archive", KEY).fleet
    for model, f in _sum(days).items():
        assert f["installed"] == pytest.approx(
            bill[model].gpu_seconds + bill[model].down_gpu_seconds, rel=1e-12)
    # a keyed trail: the whole days come from their seals, no part of them read
    assert not [n for n in reads if "2026-11-03" in n or "2026-11-04" in n], reads
    reads.clear()
    hours, _ = read_bins(_request(trail), 3600.0, [])
    # one read of the period: each part at most once (not once per hour bin)
    assert reads and max(reads.values()) == 1, reads
    assert [b.start for b in hours] == [START + dt.timedelta(hours=i)
                                        for i in range(24 * DAYS)]
    assert all(b.seconds == 3600.0 for b in hours)
    assert len(days) == DAYS
    for d, day in enumerate(days):
        summed = _sum(hours[24 * d:24 * (d + 1)])
        assert day.models is not None
        assert set(summed) == set(day.models)
        for model, f in day.models.items():
            for name in FIELDS:
                assert summed[model][name] == pytest.approx(getattr(f, name), rel=1e-9,
                                                            abs=1e-6), (d, model, name)
    # the hours differ (the test would pass for flat data whatever the binning)
    first_day = [b.models for b in hours[:24]]
    assert len({round(sum(f.busy for f in m.values()), 3) for m in first_day if m}) > 2
    # down time lands in the hours GPU 2 was down (h % 7 == 3), only there
    downs = [sum(f.down for f in b.models.values()) if b.models else 0.0 for b in hours]
    assert [i for i, x in enumerate(downs) if x > 1000.0] == [
        i for i in range(24 * DAYS) if i % 7 == 3]


def test_day_bins_read_seals_not_parts(trail: Path, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    """With a keyed trail the day path reads each sealed part's seal and size, never the
    part's bytes (a half year of a 1,000-GPU site is ~40 GB of parts); --hash-parts
    checks their SHA-256 as a bill does."""
    import gpu_audit.archive.verify as core_verify

    hashed: list[str] = []
    real = core_verify.file_sha256

    def counting(path: Path) -> tuple[str, int]:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(core_verify, "file_sha256", counting)
    req = _request(trail)
    notes: list[str] = []
    days, _ = read_bins(dataclasses.replace(req, hash_sealed_parts=False), 86400.0, notes)
    assert not [n for n in hashed if n.endswith(".jsonl.gz")], hashed
    assert any("size was checked against its seal, not its SHA-256" in n for n in notes)
    # the part across the period's start is added up from its (hashed) bytes without
    # the per-record check: the same figures as the record-by-record read
    verified, _ = read_bins(req, 86400.0, [])
    assert [n for n in hashed if n.endswith(".jsonl.gz")]
    for model, f in _sum(verified).items():
        for name in FIELDS:
            assert _sum(days)[model][name] == pytest.approx(f[name], rel=1e-12), name
    # a part changed after sealing, same size: not seen without hashing (the seal's sums
    # are used), seen with it
    part = next((trail.parent / "archive").glob("*2026-11-04*.jsonl.gz"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    try:
        again, _ = read_bins(dataclasses.replace(req, hash_sealed_parts=False), 86400.0, [])
        assert _sum(again) == _sum(days)
        with pytest.raises(SourceError, match="changed after it was sealed"):
            read_bins(req, 86400.0, [])
    finally:
        data[len(data) // 2] ^= 0xFF
        part.write_bytes(bytes(data))


def test_parts_across_the_edges_without_the_verifier(trail: Path) -> None:
    """A period from 06:00 to 18:00 the next day: both sealed day parts cross an edge.
    Not hashing parts, each is added up from its bytes (hashed as read) without the
    per-record verifier, with the same figures as the verified read; a part changed after
    sealing (same size, so the seal's size check passes) is caught by that hash and read
    through the verifier, which refuses."""
    verified = dataclasses.replace(_request(trail), start=START + dt.timedelta(hours=6),
                                   end=START + dt.timedelta(hours=42))
    fast = dataclasses.replace(verified, hash_sealed_parts=False)
    data = readers()["archive"](fast, False)
    assert len([q for q in data.queries if q.endswith("(sealed: its records, the period's "
                                                       "share)")]) == 2, data.queries
    for bin_s in (86400.0, 3600.0):
        want = _sum(read_bins(verified, bin_s, [])[0])
        got = _sum(read_bins(fast, bin_s, [])[0])
        for model, f in want.items():
            for name in FIELDS:
                assert got[model][name] == pytest.approx(f[name], rel=1e-12), (bin_s, name)
    part = next((trail.parent / "archive").glob("*2026-11-03*.jsonl.gz"))
    good = part.read_bytes()
    changed = bytearray(good)
    changed[len(changed) // 2] ^= 0xFF
    part.write_bytes(bytes(changed))
    try:
        with pytest.raises(SourceError):
            read_bins(fast, 86400.0, [])
    finally:
        part.write_bytes(good)
