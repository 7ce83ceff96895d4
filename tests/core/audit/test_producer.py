"""The producer: chaining, group commit, restart recovery, spool failures, self-metrics."""

from __future__ import annotations

import errno
import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_audit.audit.builder import PartsCache, build_cycle, build_records
from gpu_audit.audit.canonical import ZERO_HASH, seal_any, seal_reference
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.metrics import AuditCollector
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.audit.verify import verify_records, verify_spool_dir
from gpu_audit.spool import SpoolConfig, SpoolFull, SpoolReader, SpoolWriteError, SpoolWriter
from tests.core.audit.factory import HOST, T0, advance, realistic
from tests.core.audit.fakes import MemorySpool
from tests.core.audit.trails import exporter_chain


class Clock:
    """Wall clock stand-in: always moving forward, shared by every producer in a test
    module, as real time is shared by an exporter and its restarted successor."""

    def __init__(self) -> None:
        self.t = T0 - 1000.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


CLOCK = Clock()


def _producer(spool: Any, cfg: AuditConfig | None = None, **kw: Any) -> AuditProducer:
    return AuditProducer(cfg or AuditConfig(interval_seconds=5.0), spool, host=HOST,
                         exporter_version="0.1.0", simulated=False, clock=CLOCK, **kw)


def _cycles(n: int, start: float = T0) -> Iterator[Any]:
    s = realistic(start)
    yield s
    for _ in range(n - 1):
        s = advance(s)
        yield s


def _records(spool: MemorySpool) -> list[dict[str, Any]]:
    return [orjson.loads(p) for p in spool.payloads]


def test_full_cycle_group_commits_and_chains() -> None:
    """start + 3 snapshots + stop: one commit per cycle, seq 1..N, the chain verifies,
    and the stored bytes are the canonical JSON of each record."""
    spool = MemorySpool()
    p = _producer(spool)
    p.start()
    for s in _cycles(3):
        p.on_snapshot(s)
    p.stop()
    recs = _records(spool)
    assert spool.commits == 5
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    assert recs[0]["event"] == "exporter_start" and recs[-1]["event"] == "exporter_stop"
    assert recs[0]["prev_hash"] == ZERO_HASH
    assert all(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) == b for r, b in
               zip(recs, spool.payloads, strict=True))
    report = verify_records(spool.payloads, hmac_key=None)
    assert report.ok, report.render()
    assert p.stats()["records_written"] == len(recs) == p.stats()["last_seq"]


def test_restart_resumes_seq_and_hash_from_the_spool() -> None:
    """A new producer on the same spool continues at last seq + 1, linked to the last
    hash, and the whole trail verifies."""
    spool = MemorySpool()
    p = _producer(spool)
    p.start()
    p.on_snapshot(realistic())
    p.stop()
    n = len(spool.payloads)
    p2 = _producer(spool)
    p2.start()
    p2.on_snapshot(realistic(T0 + 100))
    p2.stop()
    recs = _records(spool)
    assert recs[n]["seq"] == n + 1 and recs[n]["prev_hash"] == recs[n - 1]["hash"]
    assert verify_records(spool.payloads, hmac_key=None).ok


def test_restart_when_another_stream_wrote_last_uses_checkpoint_or_scan(tmp_path: Path) -> None:
    """If the spool's last record is another stream's, the chain resumes from the state
    checkpoint, or without one by scanning the spool through a reader."""
    spool = MemorySpool()
    cfg = AuditConfig(interval_seconds=5.0, state_directory=tmp_path / "state")
    p = _producer(spool, cfg)
    p.start()
    p.on_snapshot(realistic())
    mine = p.stats()["last_seq"]
    other = _producer(spool, AuditConfig(interval_seconds=5.0, stream="launcher"))
    other.start()
    assert _records(spool)[-1]["stream"] == "launcher"

    for kw in ({}, {"reader": spool}):
        cfg2 = cfg if not kw else AuditConfig(interval_seconds=5.0)
        q = _producer(spool, cfg2, **kw)
        q.start()
        assert q.stats()["last_seq"] == mine + 1, kw
        spool.payloads.pop()  # undo that exporter_start for the next variant
    assert (tmp_path / "state" / "audit-stream-exporter.json").exists()


def test_restart_without_any_memory_starts_a_new_chain() -> None:
    """With no record of the stream in the spool, no checkpoint and no reader, the
    stream starts at seq 1 with a zero prev_hash."""
    spool = MemorySpool()
    _producer(spool, AuditConfig(interval_seconds=5.0, stream="other")).start()
    p = _producer(spool)
    p.start()
    assert _records(spool)[-1]["seq"] == 1
    assert _records(spool)[-1]["prev_hash"] == ZERO_HASH


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (SpoolFull("max_bytes", "test"), "max_bytes"),
        (SpoolWriteError("ENOSPC", Path("/x"), "test"), "ENOSPC"),
        (OSError(errno.EACCES, "denied"), "EACCES"),
    ],
)
def test_spool_failure_is_counted_not_raised_and_chain_stays_whole(
    exc: BaseException, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While the spool refuses, on_snapshot does not raise, records are counted by
    reason, the log says so once; when space returns the chain continues from the last
    written record and verifies with no gap."""
    spool = MemorySpool()
    p = _producer(spool)
    p.start()
    snaps = list(_cycles(6))
    p.on_snapshot(snaps[0])
    written = len(spool.payloads)
    spool.fail_with = exc
    with caplog.at_level(logging.WARNING, logger="gpu_audit.audit.producer"):
        for s in snaps[1:4]:
            p.on_snapshot(s)
        failing_logs = [r for r in caplog.records if reason in r.getMessage()]
        assert len(failing_logs) == 1
        st = p.stats()
        assert st["records_failed"] == st[f"records_failed.{reason}"] > 0
        assert st["spool_writable"] == 0 and st["last_seq"] == written
        spool.fail_with = None
        for s in snaps[4:]:
            p.on_snapshot(s)
    assert p.stats()["spool_writable"] == 1
    assert any("writable again" in r.getMessage() for r in caplog.records)
    recs = _records(spool)
    assert recs[written]["seq"] == written + 1
    assert recs[written]["prev_hash"] == recs[written - 1]["hash"]
    assert verify_records(spool.payloads, hmac_key=None).ok


def test_log_once_per_reason_transition(caplog: pytest.LogCaptureFixture) -> None:
    """A change of reason logs again; the same reason every cycle does not."""
    spool = MemorySpool()
    p = _producer(spool)
    with caplog.at_level(logging.WARNING, logger="gpu_audit.audit.producer"):
        for i, s in enumerate(_cycles(6)):
            spool.fail_with = SpoolFull("min_free" if i < 3 else "max_bytes", "t")
            p.on_snapshot(s)
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("min_free" in m for m in msgs) == 1 and sum("max_bytes" in m for m in msgs) == 1


def test_hmac_keyed_producer(tmp_path: Path) -> None:
    """With hmac_key_file the chain verifies only with that key (trailing newline
    stripped), and the key never appears in the records."""
    key_file = tmp_path / "key"
    key_file.write_bytes(b"s3cr3t-audit-key\n")
    spool = MemorySpool()
    p = _producer(spool, AuditConfig(interval_seconds=5.0, hmac_key_file=key_file))
    p.start()
    p.on_snapshot(realistic())
    assert verify_records(spool.payloads, hmac_key=b"s3cr3t-audit-key").ok
    bad = verify_records(spool.payloads, hmac_key=b"other")
    assert bad.counts["modified"] == len(spool.payloads)
    assert not verify_records(spool.payloads, hmac_key=None).ok
    assert not any(b"s3cr3t" in x for x in spool.payloads)


def test_disabled_producer_writes_nothing() -> None:
    """enabled: false writes no record at all."""
    spool = MemorySpool()
    p = _producer(spool, AuditConfig(interval_seconds=5.0, enabled=False))
    p.start()
    p.on_snapshot(realistic())
    p.stop()
    assert spool.payloads == []


def test_collector_exposes_self_metrics() -> None:
    """The collector publishes written/failed counters, writability and last seq."""
    spool = MemorySpool()
    p = _producer(spool)
    p.start()
    spool.fail_with = SpoolFull("min_free", "t")
    p.on_snapshot(realistic())
    reg = CollectorRegistry()
    reg.register(AuditCollector(p))
    text = generate_latest(reg).decode()
    assert "gpu_audit_records_written_total 1.0" in text
    assert 'gpu_audit_records_failed_total{reason="min_free"}' in text
    assert "gpu_audit_spool_writable 0.0" in text
    assert 'gpu_audit_audit_last_seq{stream="exporter"} 1.0' in text


# --- with the real spool --------------------------------------------------------------


class FreeSpace:
    """A statvfs stand-in whose free space the test controls."""

    def __init__(self) -> None:
        self.free = 10 * 1024**3

    def __call__(self, path: Path) -> Any:
        return SimpleNamespace(f_bavail=self.free // 4096, f_frsize=4096)


def _real_spool(d: Path, free: FreeSpace | None = None) -> SpoolWriter:
    cfg = SpoolConfig(directory=d, min_free_bytes=1024**3, fsync_window_ms=2.0,
                      statvfs_interval_s=0.001)
    if free is None:
        return SpoolWriter(cfg)
    # A monotonic clock that jumps ahead on every look, so free space is re-read per commit.
    ticks = iter(range(1, 10**9))
    return SpoolWriter(cfg, statvfs=free, clock=lambda: float(next(ticks)))


def test_real_spool_full_cycle_restart_and_disk_full(tmp_path: Path) -> None:
    """On the real spool: records survive close/reopen, the chain resumes, a full disk
    (min_free) is counted while sampling goes on, and after space returns the spool
    directory verifies clean."""
    d = tmp_path / "spool"
    free = FreeSpace()
    w = _real_spool(d, free)
    p = _producer(w)
    p.start()
    snaps = list(_cycles(8))
    for s in snaps[:2]:
        p.on_snapshot(s)
    p.stop()
    w.close()
    last = p.stats()["last_seq"]

    w2 = _real_spool(d, free)
    p2 = _producer(w2)
    p2.start()
    assert p2.stats()["last_seq"] == last + 1
    free.free = 100 * 1024**2  # below min_free_bytes
    for s in snaps[2:5]:
        p2.on_snapshot(s)
    assert p2.stats()["records_failed.min_free"] > 0
    free.free = 10 * 1024**3
    for s in snaps[5:]:
        p2.on_snapshot(s)
    p2.stop()
    w2.close()
    report = verify_spool_dir(d, None, complete=True)
    assert report.ok, report.render()
    assert exporter_chain(report).last_seq == p2.stats()["last_seq"]
    assert os.listdir(d)
    with SpoolReader(d) as r:
        assert r.read(0, 1).entries[0][1].startswith(b"{")


def test_fragment_parts_give_identical_bytes() -> None:
    """The producer's pre-serialised shared parts produce exactly the bytes that plain
    dict records produce: the optimisation never changes the trail."""
    s1, s2 = realistic(), advance(realistic())
    out = []
    for parts in (PartsCache(), PartsCache(fragments=True)):
        h, trail = ZERO_HASH, []
        for i, r in enumerate([*build_cycle(s1, None, stream="e", exporter_version="v",
                                            parts=parts),
                               *build_cycle(s2, s1, stream="e", exporter_version="v",
                                            parts=parts)], 1):
            stored, h = seal_any(r, i, h, None)
            trail.append(stored)
        out.append(trail)
    assert out[0] == out[1]


def test_build_records_refuses_the_producers_cache() -> None:
    """build_records() hands out plain dict records only: a cache with fragments (whose
    `process` records are pre-encoded bytes) belongs to build_cycle()."""
    with pytest.raises(ValueError, match="build_cycle"):
        build_records(realistic(), None, stream="e", exporter_version="v",
                      parts=PartsCache(fragments=True))


def _rename_first(snap: Any, name: str) -> Any:
    """`snap` with the first process of its first GPU renamed (same pid and start)."""
    g = snap.gpus[0]
    p0 = replace(g.processes[0], name=name)
    gpus = (replace(g, processes=(p0, *g.processes[1:])), *snap.gpus[1:])
    procs = dict(snap.processes)
    aps = procs.get(g.info.uuid)
    if aps:
        procs[g.info.uuid] = (replace(aps[0], process=p0), *aps[1:])
    return replace(snap, gpus=gpus, processes=procs)


def _drop_first(snap: Any) -> Any:
    """`snap` without the first process of its first GPU (it ended)."""
    g = snap.gpus[0]
    procs = dict(snap.processes)
    procs[g.info.uuid] = procs.get(g.info.uuid, ())[1:]
    return replace(snap, gpus=(replace(g, processes=g.processes[1:]), *snap.gpus[1:]),
                   processes=procs)


def _trail(snaps: list[Any], parts: PartsCache, key: bytes | None) -> list[bytes]:
    h, seq, trail = ZERO_HASH, 0, []
    prev = None
    for s in snaps:
        for r in build_cycle(s, prev, stream="e", exporter_version="v", parts=parts):
            seq += 1
            stored, h = seal_any(r, seq, h, key)
            trail.append(stored)
        prev = s
    return trail


def test_encoded_process_records_seal_to_canonical_bytes() -> None:
    """The producer's `process` records (pre-encoded bytes, sealed without serialising)
    store exactly the canonical bytes of what they hold, and the same trail as plain
    records, with and without an HMAC key, also with a process name full of braces,
    quotes and a fake `,"host":` member, a process renamed mid-run (its cached part is
    rebuilt) and one that ends (process_end from the cached previous view)."""
    s1 = _rename_first(realistic(), 'py{th"on},"host":"x"}{')
    s2 = advance(s1)
    s3 = _rename_first(advance(s2), "renamed")
    s4 = _drop_first(advance(s3))
    snaps = [s1, s2, s3, s4, advance(s4)]
    fast = PartsCache(fragments=True)
    recs = build_cycle(s2, s1, stream="e", exporter_version="v", parts=fast)
    encoded = [r for r in recs if isinstance(r, tuple)]
    assert len(encoded) == sum(len(g.processes) for g in s2.gpus if g.up)
    for r in encoded:
        stored, h = seal_any(r, 7, "c" * 64, None)
        doc = orjson.loads(stored)
        assert doc["kind"] == "process" and doc["hash"] == h
        assert stored == orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    for key in (None, b"k3y"):
        plain = _trail(snaps, PartsCache(), key)
        assert _trail(snaps, PartsCache(fragments=True), key) == plain
        for stored in plain:
            assert stored == orjson.dumps(orjson.loads(stored), option=orjson.OPT_SORT_KEYS)
    assert any(b'"name":"renamed"' in b for b in plain)
    assert any(b'"event":"process_end"' in b for b in plain)


def test_sealing_an_encoded_record_twice_gives_canonical_bytes() -> None:
    """Sealing a record again (a retry after a failed commit) gives the canonical bytes
    of the record at the new chain point; it never reuses the first hash. A chain point
    that is not hex (only a damaged checkpoint could give one) is escaped in the record
    and hashed as is, as for a dict record."""
    s1, s2 = realistic(), advance(realistic())
    rec = next(r for r in build_cycle(s2, s1, stream="e", exporter_version="v",
                                      parts=PartsCache(fragments=True))
               if isinstance(r, tuple))
    plain = next(r for r in build_records(s2, s1, stream="e", exporter_version="v")
                 if r["kind"] == "process")
    first, h1 = seal_any(rec, 1, ZERO_HASH, None)
    second, h2 = seal_any(rec, 2, "a" * 64, None)
    assert first != second and h1 != h2
    assert second == seal_reference(plain, 2, "a" * 64, None)
    assert orjson.loads(second)["prev_hash"] == "a" * 64
    odd = '"\\' + "a" * 61
    assert seal_any(rec, 3, odd, b"k")[0] == seal_reference(plain, 3, odd, b"k")


def test_a_one_shot_writer_adds_records_without_lifecycle_events() -> None:
    """lifecycle_events=None (the Slurm epilog: one record per job, one process each):
    start() only resumes the chain, stop() writes nothing, and two such writers in a row
    continue one verifiable chain."""
    from gpu_audit.audit.jobevents import job_event

    spool = MemorySpool()
    for i in range(2):
        p = AuditProducer(AuditConfig(stream="slurm"), spool, host=HOST,
                          exporter_version="0", simulated=False, lifecycle_events=None)
        p.start()
        p.commit_records([job_event("job_finished", timestamp=T0 + i, host=HOST,
                                    stream="slurm", version="0", job={"id": str(i)})])
        p.stop()
    recs = _records(spool)
    assert [(r["seq"], r["event"], r["job"]["id"]) for r in recs] == [
        (1, "job_finished", "0"), (2, "job_finished", "1")]
    assert verify_records(spool.payloads, hmac_key=None).ok


class _StillClock:
    """A wall clock that moves only when the producer sleeps (and when a test sets it)."""

    def __init__(self, t: float) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


@pytest.mark.parametrize("found_by", ["spool", "checkpoint", "scan"])
def test_a_restart_dates_its_first_record_a_gap_after_the_previous_lifes_last(
    tmp_path: Path, found_by: str,
) -> None:
    """Killed and restarted within a second, the exporter waits until 1 s has passed
    since the newest record of its stream (wherever the restart found it) before it
    writes exporter_start: two cycles of one series never sit less than 1 s apart,
    which is what keeps VictoriaMetrics' millisecond points distinct (the soak lost one
    cycle of points to a quick restart before)."""
    spool = MemorySpool()
    state = AuditConfig(interval_seconds=5.0, state_directory=tmp_path / "state")
    clock = _StillClock(T0 + 10.0)
    first = AuditProducer(state, spool, host=HOST, exporter_version="0.1.0",
                          simulated=False, clock=clock)
    first.start()
    first.on_snapshot(realistic(T0 + 10.0))  # then SIGKILL: no exporter_stop
    last_ns = max(r["time_ns"] for r in _records(spool))
    if found_by != "spool":  # another stream wrote last: a checkpoint or a scan finds it
        AuditProducer(AuditConfig(interval_seconds=5.0, stream="launcher"), spool,
                      host=HOST, exporter_version="0.1.0", simulated=False,
                      clock=clock).start()
    clock.t = last_ns / 1e9 + 0.3
    cfg = state if found_by == "checkpoint" else AuditConfig(interval_seconds=5.0)
    kw: dict[str, Any] = {"reader": spool} if found_by == "scan" else {}
    again = AuditProducer(cfg, spool, host=HOST, exporter_version="0.1.0", simulated=False,
                          clock=clock, restart_gap_seconds=1.0, sleep=clock.sleep, **kw)
    again.start()
    assert clock.slept == [pytest.approx(0.7)]
    start = _records(spool)[-1]
    assert start["event"] == "exporter_start"
    assert start["time_ns"] - last_ns >= 10**9 - 1000  # float seconds: to the microsecond


def test_the_restart_gap_never_waits_longer_than_itself_and_is_off_by_default() -> None:
    """A clock set back far behind the last record costs at most the gap; the default
    (one-shot writers such as the Slurm epilog, the launcher) waits not at all."""
    spool = MemorySpool()
    clock = _StillClock(T0 + 10.0)
    AuditProducer(AuditConfig(interval_seconds=5.0), spool, host=HOST,
                  exporter_version="0.1.0", simulated=False, clock=clock).start()
    clock.t -= 3600.0
    AuditProducer(AuditConfig(interval_seconds=5.0), spool, host=HOST,
                  exporter_version="0.1.0", simulated=False, clock=clock,
                  sleep=clock.sleep).start()
    assert clock.slept == []
    AuditProducer(AuditConfig(interval_seconds=5.0), spool, host=HOST,
                  exporter_version="0.1.0", simulated=False, clock=clock,
                  restart_gap_seconds=1.0, sleep=clock.sleep).start()
    assert clock.slept == [1.0]


def test_each_cycles_process_view_is_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The visible-process view of a snapshot's GPU is built once, in the cycle that
    sampled it, and reused as the next cycle's "before", also after a cycle that had to
    build both (a cache that starts mid-stream): the two views no longer share one slot,
    where the older one overwrote the newer and every later cycle built both."""
    from gpu_audit.audit import parts as parts_module

    calls: list[float] = []
    real = parts_module.visible_keys

    def counting(snap: Any, gpu: Any) -> Any:
        calls.append(snap.timestamp)
        return real(snap, gpu)

    monkeypatch.setattr(parts_module, "visible_keys", counting)
    snaps = [realistic()]
    for _ in range(4):
        snaps.append(advance(snaps[-1]))
    cache = PartsCache(fragments=True)
    n = len(snaps[0].gpus)
    build_cycle(snaps[1], snaps[0], stream="e", exporter_version="v", parts=cache)
    assert sorted(calls) == sorted([snaps[1].timestamp, snaps[0].timestamp] * n)
    for prev, s in itertools.pairwise(snaps[1:]):
        calls.clear()
        build_cycle(s, prev, stream="e", exporter_version="v", parts=cache)
        assert calls == [s.timestamp] * n, calls


def test_process_parts_cache_stays_bounded_as_processes_come_and_go() -> None:
    """Processes that ended leave the cross-cycle cache of process parts: with 100
    processes a cycle, all new every cycle, it never holds more than about twice a
    cycle's worth, and a process seen again gets the same part back."""
    from gpu_audit.model.samples import ProcessSample

    cache = PartsCache(fragments=True)
    for cycle in range(40):
        for i in range(100):
            cache.process("GPU-0", ProcessSample(pid=cycle * 1000 + i, name=f"job-{i}"))
        cache.end_cycle()
        assert len(cache._procs) <= 2 * 100 + 64 + 100
    again = ProcessSample(pid=39 * 1000 + 7, name="job-7")
    assert cache.process("GPU-0", again) == cache.process("GPU-0", again)
