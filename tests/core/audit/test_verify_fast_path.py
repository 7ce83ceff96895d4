"""The one verification path: `Verifier.feed_line` hashes the stored line as written and
reads the chain members by position, and gives the spec's verdict (`feed`: parse,
re-serialise canonically, hash) on every line, intact or damaged."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import orjson
import pytest

from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.audit.verify import Verifier
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot
from tests.core.audit.fakes import MemorySpool

T = 1_796_000_020.0


def _trail(key: bytes | None = None, tmp: object = None) -> list[bytes]:
    spool = MemorySpool()
    clock: Iterator[float] = iter([T - 1, T + 900])
    p = AuditProducer(AuditConfig(), spool, host="gpu-node-07", exporter_version="t",
                      simulated=False, clock=lambda: next(clock))
    p._key = key  # keyed chain without a key file (the producer reads one in production)
    p.start()
    for k in range(60):
        procs = [proc(101, sm=0.5)] + ([proc(102, sm=0.2)] if k % 20 < 10 else [])
        p.on_snapshot(snapshot(T + 5 * k, [
            gpu(0, util=0.7, energy=100.0 * k, power=20.0, processes=procs),
            gpu(1, util=0.0, energy=10.0 * k)], {101: ALICE, 102: BOB}))
    p.stop()
    return list(spool.payloads)


def _verdict(lines: list[bytes], *, fast: bool, key: bytes | None = None,
             ) -> tuple[Counter[str], int]:
    v = Verifier(hmac_key=key, complete=True)
    for i, line in enumerate(lines, 1):
        if fast:
            v.feed_line(line, ("t", i))
        else:
            v.feed(line, ("t", i))
    r = v.report()
    return r.counts, v.fast_lines


@pytest.mark.parametrize("key", [None, b"k3y"])
def test_usage_records_take_the_fast_path_and_verify(key: bytes | None) -> None:
    """Every schema-3 usage record (and every event without nested parts) is verified
    from its stored bytes without a parse; the verdict is the spec's: intact."""
    lines = _trail(key)
    counts, fast = _verdict(lines, fast=True, key=key)
    assert counts == Counter()
    usage = sum(1 for line in lines if b'"kind":"usage"' in line)
    assert usage > 10 and fast >= usage
    assert _verdict(lines, fast=False, key=key)[0] == Counter()


def test_every_single_byte_change_gets_the_spec_verdict() -> None:
    """Each byte of a usage record in the middle of the trail flipped, in turn: the
    problems feed_line finds are exactly those the full parse finds."""
    lines = _trail()
    victim = next(i for i, line in enumerate(lines) if b'"kind":"usage"' in line and i > 5)
    raw = lines[victim]
    for pos in range(len(raw)):
        for flip in (0x01, 0x20):
            bad = bytearray(raw)
            bad[pos] ^= flip
            changed = [*lines[:victim], bytes(bad), *lines[victim + 1:]]
            assert _verdict(changed, fast=True)[0] == _verdict(changed, fast=False)[0], (
                pos, flip, bytes(bad))


def test_a_re_serialised_record_is_judged_by_its_content() -> None:
    """A sink that stored a record with other spacing or key order: the stored bytes do
    not hash, so the full parse decides, and the record is intact."""
    lines = _trail()
    victim = next(i for i, line in enumerate(lines) if b'"kind":"usage"' in line)
    doc = orjson.loads(lines[victim])
    lines[victim] = orjson.dumps(dict(reversed(list(doc.items()))))
    assert _verdict(lines, fast=True)[0] == Counter()
