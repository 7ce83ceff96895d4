"""Behaviour of the shipper engine with in-memory sinks over a real spool."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_audit.spool import CursorStore, SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.engine import Shipper
from shipper.sinks.base import ItemResult, Outcome, Sink, SinkRecord
from tests.polling import wait_for
from tests.shipper.conftest import produce
from tests.shipper.memsinks import MemorySink


@contextmanager
def running(
    cfg: ShipperConfig, spool: SpoolConfig, writer: SpoolWriter | None, sinks: list[Any], **kw: Any
) -> Iterator[Shipper]:
    shipper = Shipper(cfg, spool, writer=writer, sinks=sinks, **kw)
    shipper.start()
    try:
        yield shipper
    finally:
        shipper.stop(5)


def sample(shipper: Shipper, name: str, labels: dict[str, str] | None = None) -> float | None:
    reg = CollectorRegistry()
    reg.register(shipper.collector())
    return reg.get_sample_value(name, labels or {})


def deadletters(spool: SpoolConfig, sink: str) -> list[dict[str, Any]]:
    path = Path(spool.directory) / "deadletter" / f"{sink}.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_delivers_every_record_once_and_commits_the_cursor(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """All records reach the sink exactly once and the durable cursor ends at the spool's end."""
    produce(writer, 0, 500)
    sink = MemorySink("a")
    with running(fast_config, spool_config, writer, [sink]):
        wait_for(lambda: sink.count() == 500, what="500 delivered")
    assert sink.duplicates() == 0
    assert CursorStore(Path(spool_config.directory)).get("a") == 500
    assert sink.closed


def test_dead_sink_does_not_stall_or_resend_to_a_healthy_one(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """While one sink is down the other gets everything; the dead one catches up later and
    the healthy one never receives a record twice."""
    healthy, dead = MemorySink("healthy"), MemorySink("dead")
    dead.down = True
    with running(fast_config, spool_config, writer, [healthy, dead]) as shipper:
        for start in range(0, 3000, 300):
            produce(writer, start, 300)
        wait_for(lambda: healthy.count() == 3000, what="healthy sink complete")
        assert dead.count() == 0
        assert len(dead.sends) > 1  # it kept retrying
        lag = sample(shipper, "gpu_audit_shipper_cursor_lag_records", {"sink": "dead"})
        assert lag == 3000
        before = len(healthy.received)
        dead.down = False
        wait_for(lambda: dead.count() == 3000, what="dead sink caught up")
        assert len(healthy.received) == before
    assert healthy.duplicates() == 0
    assert dead.duplicates() == 0


def test_only_the_retried_items_are_sent_again(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """A per-item 429 re-sends those items only, not the batch they came in."""

    def script(rec: SinkRecord, seen: int) -> ItemResult | None:
        if rec.offset % 10 == 3 and seen == 0:
            return ItemResult(Outcome.RETRY, "429 es_rejected_execution_exception")
        return None

    produce(writer, 0, 100)
    sink = MemorySink("es", script=script)
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: sink.count() == 100, what="all delivered")
        assert shipper.stats()["sinks"]["es"]["retried"] == 10
    assert sink.duplicates() == 0
    assert sink.sends[0] == list(range(100))
    assert sink.sends[1] == [o for o in range(100) if o % 10 == 3]


def test_dead_letters_are_durable_before_the_cursor_passes_them(
    fast_config: ShipperConfig,
    spool_config: SpoolConfig,
    writer: SpoolWriter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every cursor commit happens only after the dead-letter file holds the rejected
    records below it, with the record and reason."""
    commits: list[tuple[int, set[int]]] = []
    real_commit = CursorStore.commit

    def spying_commit(self: CursorStore, name: str, offset: int) -> None:
        on_disk = {e["offset"] for e in deadletters(spool_config, name)}
        commits.append((offset, on_disk))
        real_commit(self, name, offset)

    monkeypatch.setattr(CursorStore, "commit", spying_commit)

    def script(rec: SinkRecord, seen: int) -> ItemResult | None:
        if rec.offset % 7 == 0:
            return ItemResult(Outcome.DEAD_LETTER, "400 mapper_parsing_exception")
        return None

    produce(writer, 0, 200)
    sink = MemorySink("es", script=script)
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: shipper.stats()["sinks"]["es"]["position"] == 200, what="position")
    rejected = {o for o in range(200) if o % 7 == 0}
    assert commits
    for offset, on_disk in commits:
        assert {o for o in rejected if o < offset} <= on_disk
    letters = deadletters(spool_config, "es")
    assert {e["offset"] for e in letters} == rejected
    assert all(e["reason"] == "400 mapper_parsing_exception" for e in letters)
    assert letters[0]["record"]["seq"] == 0
    assert sink.count() == 200 - len(rejected)


def test_undecodable_records_are_dead_lettered_and_counted(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """Bytes that are not a JSON audit record with an id go to the dead-letter file with
    reason 'undecodable' (raw bytes kept) and delivery carries on."""
    produce(writer, 0, 3)
    writer.commit([b"\xff not json", b'{"no_id": 1}', b"[1, 2]"])
    produce(writer, 3, 3)
    sink = MemorySink("a")
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: shipper.stats()["sinks"]["a"]["position"] == 9, what="position 9")
        stats = shipper.stats()["sinks"]["a"]
    assert sink.count() == 6
    assert stats["dead_lettered"] == 3
    letters = deadletters(spool_config, "a")
    assert [e["reason"] for e in letters] == ["undecodable"] * 3
    assert letters[0]["raw_b64"] == "/yBub3QganNvbg=="
    assert base64.b64decode(letters[1]["raw_b64"]) == b'{"no_id": 1}'


def test_hold_keeps_the_data_and_raises_the_blocked_alert(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """An auth error holds every record (cursor stays) and sets sink_blocked=1 with the
    reason; once fixed, everything is delivered and the alert clears."""
    produce(writer, 0, 50)
    sink = MemorySink("influx")
    sink.hold = "401 unauthorized"
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        labels = {"sink": "influx", "reason": "401 unauthorized"}
        wait_for(
            lambda: sample(shipper, "gpu_audit_shipper_sink_blocked", labels) == 1,
            what="blocked alert",
        )
        wait_for(lambda: len(sink.sends) >= 3, what="retries while held")
        assert sink.count() == 0
        assert shipper.stats()["sinks"]["influx"]["committed"] == 0
        sink.hold = None
        wait_for(lambda: sink.count() == 50, what="delivered after the fix")
        cleared = {"sink": "influx", "reason": ""}
        wait_for(
            lambda: sample(shipper, "gpu_audit_shipper_sink_blocked", cleared) == 0,
            what="alert cleared",
        )
    assert deadletters(spool_config, "influx") == []


def test_retry_after_is_a_floor_for_the_backoff(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """A Retry-After of 7 s makes the engine wait at least 7 s (never less), even though
    its own backoff cap is 0.05 s."""
    waits: list[float] = []

    def script(rec: SinkRecord, seen: int) -> ItemResult | None:
        if seen < 2:
            return ItemResult(Outcome.RETRY, "429", retry_after=7.0)
        return None

    produce(writer, 0, 5)
    sink = MemorySink("a", script=script)
    with running(fast_config, spool_config, writer, [sink], sleep=waits.append):
        wait_for(lambda: sink.count() == 5, what="delivered")
    retry_waits = [w for w in waits if w >= 1]
    assert len(retry_waits) == 2
    assert all(7.0 <= w <= 7.05 for w in retry_waits)


def test_gc_deletes_a_segment_only_after_every_cursor_passed_it(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """With one sink down, no segment is deleted however far the other got; once it
    catches up, the passed segments are deleted."""
    fast, slow = MemorySink("fast"), MemorySink("slow")
    slow.down = True
    segments = lambda: sorted(Path(spool_config.directory).glob("*.seg"))  # noqa: E731
    with running(fast_config, spool_config, writer, [fast, slow]) as shipper:
        for start in range(0, 2000, 200):
            produce(writer, start, 200, size=300)
        wait_for(lambda: fast.count() == 2000, what="fast sink complete")
        first = segments()
        assert len(first) > 5
        shipper.gc()
        assert segments() == first
        slow.down = False
        wait_for(lambda: slow.count() == 2000, what="slow sink caught up")
        wait_for(lambda: len(segments()) <= 2, what="segments deleted")
    assert fast.duplicates() == 0 and slow.duplicates() == 0


def _conservation(shipper: Shipper, sink: str) -> tuple[float | None, float, float, float]:
    ok = sample(shipper, "gpu_audit_shipper_conservation_ok", {"sink": sink})
    produced = sample(shipper, "gpu_audit_records_produced_total") or 0.0
    delivered = sample(shipper, "gpu_audit_shipper_records_delivered_total", {"sink": sink}) or 0.0
    dead = sample(shipper, "gpu_audit_shipper_records_dead_lettered_total", {"sink": sink}) or 0.0
    pending = sample(shipper, "gpu_audit_shipper_cursor_lag_records", {"sink": sink}) or 0.0
    assert produced == delivered + dead + pending or ok == 0
    return ok, delivered, dead, pending


def test_conservation_holds_across_restarts_and_fails_when_facts_disagree(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """produced = delivered + dead_lettered + pending holds while running and after a
    restart (counters continue from the persisted ledger, a replayed batch is not counted
    twice); a cursor moved without a ledger makes the check report 0."""

    def script(rec: SinkRecord, seen: int) -> ItemResult | None:
        return ItemResult(Outcome.DEAD_LETTER, "bad") if rec.offset % 50 == 0 else None

    produce(writer, 0, 300)
    sink = MemorySink("a", script=script)
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: shipper.stats()["sinks"]["a"]["position"] == 300, what="drained")
        assert _conservation(shipper, "a") == (1, 294, 6, 0)

    # a crash after the ledger was written but before the cursor commit: the cursor is
    # behind, the batch is re-sent, and nothing is counted twice
    store = CursorStore(Path(spool_config.directory))
    store.remove("a")
    store.commit("a", 200)
    produce(writer, 300, 100)
    again = MemorySink("a", script=script)
    with running(fast_config, spool_config, writer, [again]) as shipper:
        wait_for(lambda: shipper.stats()["sinks"]["a"]["position"] == 400, what="drained")
        assert _conservation(shipper, "a") == (1, 392, 8, 0)
        assert shipper.stats()["sinks"]["a"]["redelivered"] == 100

    # the ledger lost: the facts no longer add up and the check says so
    (Path(spool_config.directory) / "shipper" / "a.ledger.json").unlink()
    with running(fast_config, spool_config, writer, [MemorySink("a")]) as shipper:
        assert _conservation(shipper, "a")[0] == 0


def test_pending_counts_records_not_yet_delivered(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """While a sink is down its pending records, lag seconds and conservation are exported."""
    produce(writer, 0, 40)
    sink = MemorySink("a")
    sink.down = True
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: len(sink.sends) >= 2, what="a failed send")
        ok, delivered, dead, pending = _conservation(shipper, "a")
        assert (ok, delivered, dead, pending) == (1, 0, 0, 40)
        lag = sample(shipper, "gpu_audit_shipper_cursor_lag_seconds", {"sink": "a"})
        assert lag is not None and lag > 1e6  # the records carry 2023 timestamps
        text = generate_latest(_registry(shipper)).decode()
        dropped = 'gpu_audit_shipper_records_dropped_total{reason="spool_skipped",sink="a"} 0.0'
        assert dropped in text


def _registry(shipper: Shipper) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(shipper.collector())
    return reg


def test_sink_names_must_be_unique(fast_config: ShipperConfig, spool_config: SpoolConfig) -> None:
    """Two sinks with one name would share a cursor; the engine refuses to start."""
    sinks: list[Sink] = [MemorySink("x"), MemorySink("x")]
    with pytest.raises(ValueError, match="unique"):
        Shipper(fast_config, spool_config, sinks=sinks)


def test_a_failing_dead_letter_write_holds_the_cursor_and_is_retried(
    fast_config: ShipperConfig,
    spool_config: SpoolConfig,
    writer: SpoolWriter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ENOSPC on the dead-letter file neither kills the sink's worker nor lets its cursor
    pass the rejected record; once the write succeeds delivery completes."""
    import errno

    from shipper.deadletter import DeadLetterFile

    real_write = DeadLetterFile.write
    failures = [3]
    positions: list[int] = []

    def flaky_write(self: DeadLetterFile, letters: Any, time_ns: int) -> int:
        if failures[0] > 0:
            failures[0] -= 1
            positions.append(shipper.stats()["sinks"]["a"]["committed"])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, letters, time_ns)

    monkeypatch.setattr(DeadLetterFile, "write", flaky_write)

    def script(rec: SinkRecord, seen: int) -> ItemResult | None:
        return ItemResult(Outcome.DEAD_LETTER, "400") if rec.offset == 10 else None

    produce(writer, 0, 30)
    sink = MemorySink("a", script=script)
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: shipper.stats()["sinks"]["a"]["committed"] == 30, what="drained")
    assert failures[0] == 0
    assert all(p <= 10 for p in positions)
    assert [e["offset"] for e in deadletters(spool_config, "a")] == [10]
    assert sink.count() == 29


def test_a_removed_sinks_cursor_is_ignored_for_gc_with_a_warning(
    fast_config: ShipperConfig,
    spool_config: SpoolConfig,
    writer: SpoolWriter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cursor left by a sink no longer configured is named in a warning and does not
    keep delivered segments on disk."""
    CursorStore(Path(spool_config.directory)).commit("old-es", 0)
    sink = MemorySink("a")
    segments = lambda: sorted(Path(spool_config.directory).glob("*.seg"))  # noqa: E731
    with running(fast_config, spool_config, writer, [sink]):
        for start in range(0, 1000, 200):
            produce(writer, start, 200, size=300)
        wait_for(lambda: sink.count() == 1000, what="delivered")
        wait_for(lambda: len(segments()) <= 2, what="segments deleted")
    assert any("'old-es'" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert CursorStore(Path(spool_config.directory)).get("old-es") == 0


def test_standalone_mode_reads_a_spool_written_elsewhere(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """Without the writer in-process the engine finds the spool's end itself: produced,
    pending and conservation are right while the sink is down, and everything is
    delivered once it is back; it never deletes segments (the writer owns GC)."""
    produce(writer, 0, 700)
    sink = MemorySink("a")
    sink.down = True
    with running(fast_config, spool_config, None, [sink]) as shipper:
        wait_for(lambda: len(sink.sends) >= 2, what="a failed send")
        assert _conservation(shipper, "a") == (1, 0, 0, 700)
        assert sample(shipper, "gpu_audit_records_produced_total") == 700
        sink.down = False
        produce(writer, 700, 300)
        wait_for(lambda: sink.count() == 1000, what="all delivered")
        assert shipper.gc() == 0
    assert sink.duplicates() == 0


def test_backlog_read_ahead_keeps_order_across_partial_retries(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """While a full batch is on the wire the next one is read ahead; retried records of a
    batch still go out before the read-ahead batch, each batch starts exactly where the
    final prefix ends, and nothing is stored twice or skipped."""
    produce(writer, 0, 1000)  # a backlog: every batch is full, so each send reads ahead

    def flaky(rec: SinkRecord, seen: int) -> ItemResult | None:
        return ItemResult(Outcome.RETRY, "busy") if rec.offset % 7 == 3 and seen == 0 else None

    sink = MemorySink("a", script=flaky, latency=0.005)
    with running(fast_config, spool_config, writer, [sink]):
        wait_for(lambda: sink.count() == 1000, what="1000 delivered")
    assert sink.duplicates() == 0
    # full sends are first attempts (one per batch, in spool order); each retry of a
    # batch's refused records follows its own batch and precedes the next batch
    batch_of = [s[0] // 100 if len(s) == 100 else None for s in sink.sends]
    assert [b for b in batch_of if b is not None] == list(range(10))
    current = -1
    for send, batch in zip(sink.sends, batch_of, strict=True):
        if batch is not None:
            current = batch
        else:
            assert all(o // 100 == current and o % 7 == 3 for o in send)
    assert CursorStore(Path(spool_config.directory)).get("a") == 1000
