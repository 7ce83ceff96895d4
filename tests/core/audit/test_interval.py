"""The interval trail (schema 3): samples added up per GPU and holder over
`audit.interval_seconds`, events written when they happen, the sums a bill needs equal to
the per-cycle trail's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from gpu_audit.archive.rollup import Rollup
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.audit.schema import record_schema
from gpu_audit.audit.verify import verify_records
from gpu_audit.model.samples import GpuSample
from gpu_audit.model.snapshot import Snapshot
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot
from tests.core.audit.fakes import MemorySpool

E = 5.0
T = 1_796_000_020.0  # 40 s past a UTC minute: the first minute ends after 4 samples
V2 = Draft202012Validator(record_schema(2))
V3 = Draft202012Validator(record_schema(3))


def _gpus(k: int, *, with_103: bool = True) -> list[GpuSample]:
    procs0 = [proc(101, sm=0.5, mem=8 * 1024**3 + k), proc(102, sm=0.25)]
    if with_103:
        procs0.append(proc(103, sm=0.25))
    return [
        gpu(0, util=1.0, energy=1000.0 * k, power=110.0, processes=procs0),
        gpu(1, util=0.0, energy=500.0 * k, power=50.0),
        gpu(2, up=k % 7 != 3),
        gpu(3, util=0.02, energy=200.0 * k, power=20.0,
            processes=[proc(301, sm=0.01), proc(302, sm=0.01)]),
        gpu(4, util=0.5, energy=300.0 * k, power=30.0, processes=[proc(401, sm=0.5)]),
    ]


def _snaps(n: int = 40) -> list[Snapshot]:
    owners = {101: ALICE, 102: BOB, 301: ALICE, 302: ALICE}
    # process 103 leaves half way: a process_end event in the middle of an interval
    return [snapshot(T + E * k, _gpus(k, with_103=k < n // 2), owners, interval=E)
            for k in range(n)]


def _run(interval: float, snaps: list[Snapshot] | None = None) -> list[dict[str, Any]]:
    spool = MemorySpool()
    clock: Iterator[float] = iter([T - 1, T + 1000])
    p = AuditProducer(AuditConfig(interval_seconds=interval), spool, host="node-7",
                      exporter_version="t", simulated=False, clock=lambda: next(clock))
    p.start()
    for s in snaps if snaps is not None else _snaps():
        p.on_snapshot(s)
    p.stop()
    return [orjson.loads(raw) for raw in spool.payloads]


def _rollup(records: list[dict[str, Any]]) -> Rollup:
    r = Rollup()
    r.add_all(records)
    return r.finish()


def test_interval_sums_equal_the_per_cycle_trail_for_every_holder_and_gpu() -> None:
    """The bill's quantities (used, charged, busy, idle-held, energy, power cross-check per
    holder; up, down, held, idle-held, busy, energy per GPU) from the 60 s trail equal
    those of the per-cycle trail of the same samples, by GPU and holder."""
    per_cycle, per_minute = _rollup(_run(E)), _rollup(_run(60.0))
    assert per_cycle.holders.keys() == per_minute.holders.keys()
    assert per_cycle.fleet.keys() == per_minute.fleet.keys()
    for k, v in per_cycle.holders.items():
        assert per_minute.holders[k] == pytest.approx(v, rel=1e-7, abs=1e-3), k
    for k, v in per_cycle.fleet.items():
        assert per_minute.fleet[k] == pytest.approx(v, rel=1e-7, abs=1e-3), k


def test_one_record_per_gpu_and_holder_per_interval_gpu_sums_once() -> None:
    """At the first sample past each UTC minute, one usage record per GPU and holder;
    the GPU's own sums are on its first record only; events are written as they happen
    (schema 2), usage records are schema 3 and valid."""
    records = _run(60.0)
    usage = [r for r in records if r["kind"] == "usage"]
    assert {r["schema"] for r in usage} == {"gpu-audit.record/3"}
    for r in usage:
        V3.validate(r)
    for r in records:
        if r["kind"] != "usage":
            V2.validate(r)
    times = sorted({r["time_ns"] for r in usage})
    # samples at T, T+5, ...; minutes end at the samples at T+20, T+80, T+140; the last
    # (partial) interval is written by stop()
    assert [t / 1e9 - T for t in times] == [20.0, 80.0, 140.0, 195.0]
    first = [r for r in usage if r["time_ns"] == times[1]]
    by_gpu: dict[str, list[dict[str, Any]]] = {}
    for r in first:
        by_gpu.setdefault(r["uuid"], []).append(r)
    g0 = by_gpu[first[0]["uuid"]]
    assert [(r.get("user"), r.get("project")) for r in g0] == [
        ("alice", "vision"), ("bob", "nlp"), (None, None)]
    assert ["gs" in r for r in g0] == [True, False, False]
    assert all(r["dt"] == 60.0 and r["n"] == 12 for r in first)
    free = [rs for rs in by_gpu.values() if len(rs) == 1 and "s" not in rs[0]]
    assert len(free) == 2  # GPU 1 (free) and GPU 2 (down part of the time)
    alice = g0[0]
    assert alice["tasks"][0]["pid"] == 101 and alice["tasks"][0]["mx"] == 8 * 1024**3 + 16
    assert alice["e"] == 6000 * 1000 and alice["c"] == 30.0 and alice["s"] == 60.0
    events = [r for r in records if r["kind"] == "event"]
    ends = [r for r in events if r["event"] == "process_end"]
    assert len(ends) == 1 and ends[0]["time_ns"] / 1e9 - T == 100.0  # when it happened


def test_the_interval_trail_is_one_verified_chain_and_far_smaller() -> None:
    """Version 2 events and version 3 usage records in one hash chain verify; the
    interval trail is a small fraction of the per-cycle one."""
    per_minute = _run(60.0)
    report = verify_records(per_minute, hmac_key=None)
    assert report.ok, report.render()
    size = sum(len(orjson.dumps(r)) for r in per_minute)
    assert size * 5 < sum(len(orjson.dumps(r)) for r in _run(E))


def test_stop_writes_the_partial_interval_and_nothing_is_counted_twice() -> None:
    """stop() writes what was added since the last interval ended (ending at the last
    sample), so the trail accounts every measured second exactly once."""
    records = _run(60.0)
    r = _rollup(records)
    up_seconds = sum(f[0] for f in r.fleet.values())
    # 39 measured intervals of 5 s on 4 up GPUs, GPU 2 down now and then
    down = sum(f[1] for f in r.fleet.values())
    assert up_seconds + down == pytest.approx(5 * 39 * 5)


def test_a_gpu_down_for_part_of_the_interval_has_down_seconds() -> None:
    """GPU 2 is down in samples 3, 10, 17, ...: its records say how long."""
    records = _run(60.0)
    r = _rollup(records)
    g2 = [v for k, v in r.fleet.items() if k[3].startswith("GPU-00000002")]
    down = sum(v[1] for v in g2)
    assert down == 6 * E  # samples 3, 10, 17, 24, 31, 38
