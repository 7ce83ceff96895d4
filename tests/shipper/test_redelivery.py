"""`gpu_audit_shipper_records_redelivered_total` counts every record send that repeats an
earlier one, whatever the reason: a RETRY/HOLD answer, a re-send inside the sink (a
bisected partial write, a split 413), or a delivery round that failed and started again;
the conservation check stays exact meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from gpu_audit.spool import SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from shipper import deadletter
from shipper.config import ShipperConfig
from shipper.engine import Shipper
from shipper.sinks.base import ItemResult, Outcome, SinkRecord
from tests.polling import wait_for
from tests.shipper.conftest import produce


class ScriptedSink:
    """Answers each record with `answer(offset, times sent before)`; counts every send."""

    kind = "scripted"

    def __init__(self, answer: Any) -> None:
        self.name = "s"
        self.answer = answer
        self.seen: dict[int, int] = {}
        self.lock = threading.Lock()

    def start(self) -> None:
        pass

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        out = []
        with self.lock:
            for rec in batch:
                before = self.seen.get(rec.offset, 0)
                self.seen[rec.offset] = before + 1
                out.append(self.answer(rec.offset, before))
        return out

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        return iter(())

    def close(self) -> None:
        pass

    def sends(self) -> int:
        with self.lock:
            return sum(self.seen.values())


@contextmanager
def running(cfg: ShipperConfig, spool: SpoolConfig, writer: SpoolWriter,
            sink: ScriptedSink) -> Iterator[Shipper]:
    shipper = Shipper(cfg, spool, writer=writer, sinks=[sink])
    shipper.start()
    try:
        yield shipper
    finally:
        shipper.stop(5)


def _drained(shipper: Shipper, n: int) -> dict[str, Any]:
    wait_for(lambda: shipper.stats()["sinks"]["s"]["position"] == n, what=f"{n} final")
    stats: dict[str, Any] = shipper.stats()["sinks"]["s"]
    return stats


def test_records_answered_retry_are_counted_when_sent_again(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """Every record answered RETRY once is sent a second time: redelivered = retried = N,
    delivered = N, and the conservation check holds."""
    produce(writer, 0, 60)

    def answer(offset: int, before: int) -> ItemResult:
        return ItemResult(Outcome.RETRY, "busy") if before == 0 else ItemResult(
            Outcome.DELIVERED)

    sink = ScriptedSink(answer)
    with running(fast_config, spool_config, writer, sink) as shipper:
        st = _drained(shipper, 60)
        assert (st["delivered"], st["retried"], st["redelivered"]) == (60, 60, 60)
        assert st["conservation_ok"]
    assert sink.sends() == 120


def test_resends_inside_the_sink_are_counted(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """A sink that had to put some records on the wire twice within one send (bisecting a
    partial write) reports it in ItemResult.sends, and the worker counts each extra send."""
    produce(writer, 0, 50)

    def answer(offset: int, before: int) -> ItemResult:
        return ItemResult(Outcome.DELIVERED, sends=3 if offset % 10 == 0 else 1)

    with running(fast_config, spool_config, writer, ScriptedSink(answer)) as shipper:
        st = _drained(shipper, 50)
        assert (st["delivered"], st["retried"], st["redelivered"]) == (50, 0, 10)


def test_a_failed_delivery_round_counts_the_records_it_sends_again(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When writing a dead letter fails after a send, the round starts again from the
    position and the whole batch goes out once more: each of those sends is counted, and
    nothing is counted as delivered twice."""
    produce(writer, 0, 40)
    real_write = deadletter.DeadLetterFile.write
    failures = iter([OSError(28, "No space left on device")])

    def flaky(self: deadletter.DeadLetterFile, *args: Any, **kw: Any) -> Any:
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return real_write(self, *args, **kw)

    monkeypatch.setattr(deadletter.DeadLetterFile, "write", flaky)

    def answer(offset: int, before: int) -> ItemResult:
        return ItemResult(Outcome.DEAD_LETTER, "bad") if offset == 7 else ItemResult(
            Outcome.DELIVERED)

    sink = ScriptedSink(answer)
    with running(fast_config, spool_config, writer, sink) as shipper:
        st = _drained(shipper, 40)
        assert (st["delivered"], st["dead_lettered"]) == (39, 1)
        assert st["redelivered"] == sink.sends() - 40 > 0
        assert st["conservation_ok"]
