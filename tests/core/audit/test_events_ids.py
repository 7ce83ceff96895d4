"""Events across snapshots, deterministic ids, and privacy of records."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from gpu_audit.audit.builder import build_records
from gpu_audit.audit.canonical import ZERO_HASH, seal
from gpu_audit.model.attribution import IDENTITY_FIELDS
from gpu_audit.model.samples import XidEvent
from tests.core.audit.factory import (
    ALICE,
    SECRET,
    T0,
    advance,
    gpu,
    proc,
    realistic,
    snapshot,
)


def _events(records: list[dict[str, Any]]) -> list[tuple[str, int, int | None]]:
    return [
        (r["event"], r["gpu"]["index"] if "gpu" in r else -1, r.get("process", {}).get("pid"))
        for r in records
        if r["kind"] == "event"
    ]


def _build(prev: Any, snap: Any, stream: str = "exporter") -> list[dict[str, Any]]:
    return build_records(snap, prev, stream=stream, exporter_version="t")


def test_first_snapshot_reports_visible_processes_started_and_down_gpu_lost() -> None:
    """On the first snapshot every visible process is a process_start, a down GPU is
    gpu_lost, and new XIDs are xid events."""
    ev = _events(_build(None, realistic()))
    assert ("gpu_lost", 2, None) in ev
    assert {p for e, _, p in ev if e == "process_start"} == {101, 102, 103, 301}
    assert ("xid", 0, None) in ev


def test_process_start_and_end_across_snapshots() -> None:
    """A pid that disappears is process_end (with its owner), a new one process_start;
    a pid reused with a new start time is an end plus a start; unchanged ones are silent."""
    g_a = gpu(0, processes=[proc(1), proc(2), proc(3, start=500)])
    g_b = gpu(0, processes=[proc(1), proc(4), proc(3, start=900)])
    s1 = snapshot(T0, [g_a], {1: ALICE, 2: ALICE})
    s2 = snapshot(T0 + 5, [g_b], {1: ALICE})
    recs = _build(s1, s2)
    ev = sorted((e, p) for e, _, p in _events(recs))
    assert ev == [("process_end", 2), ("process_end", 3), ("process_start", 3),
                  ("process_start", 4)]
    end2 = next(r for r in recs if r.get("event") == "process_end" and r["process"]["pid"] == 2)
    assert end2["attribution"]["user"] == "alice" and end2["attributed"] is True


def test_gpu_lost_recovered_and_missing() -> None:
    """up -> down is gpu_lost (its processes end), down -> up gpu_recovered, a GPU
    missing from the snapshot counts as lost."""
    s1 = snapshot(T0, [gpu(0, processes=[proc(1)]), gpu(1)])
    s2 = snapshot(T0 + 5, [gpu(0, up=False)])
    s3 = snapshot(T0 + 10, [gpu(0)])
    ev2 = _events(_build(s1, s2))
    assert ("gpu_lost", 0, None) in ev2 and ("gpu_lost", 1, None) in ev2
    assert ("process_end", 0, 1) in ev2
    missing = next(r for r in _build(s1, s2) if r.get("event") == "gpu_lost"
                   and r["gpu"]["index"] == 1)
    assert missing["gpu"]["up"] is False and missing["gpu"]["error"] == "missing"
    assert _events(_build(s2, s3)) == [("gpu_recovered", 0, None)]


def test_down_gpu_gets_a_record_without_values() -> None:
    """A down GPU still has its gpu record: up=false, the error kind, no values."""
    s1 = realistic()
    (down,) = [r for r in _build(s1, advance(s1)) if r["kind"] == "gpu" and not r["gpu"]["up"]]
    assert down["values"] == {} and down["gpu"]["error"] == "gpu_lost"
    assert down["gpu_seconds"] == 0.0


def test_xid_event_carries_code_and_time() -> None:
    """An xid event names the XID code and when it happened."""
    (x,) = [r for r in _build(None, realistic()) if r.get("event") == "xid"]
    assert x["xid"]["code"] == 79 and x["xid"]["time_ns"] == round((T0 - 1.5) * 1e9)


def test_ids_are_deterministic_and_independent_of_chain() -> None:
    """Building the same snapshot twice gives the same ids; sealing with any seq or
    prev_hash does not change them; ids are unique within a cycle."""
    s1 = realistic()
    s2 = advance(s1)
    a = _build(s1, s2)
    b = _build(s1, s2)
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert len({r["id"] for r in a}) == len(a)
    ids = [r["id"] for r in a]
    for i, r in enumerate(b):
        seal(r, 1000 + i, "f" * 64, None)
    assert [r["id"] for r in b] == ids


def test_ids_differ_by_time_host_stream_and_xid() -> None:
    """A different time, host, stream or XID gives a different id."""
    s1 = realistic()
    base = {r["id"] for r in _build(None, s1)}
    assert base.isdisjoint(r["id"] for r in _build(None, replace(s1, timestamp=T0 + 0.001)))
    assert base.isdisjoint(r["id"] for r in _build(None, replace(s1, host="other")))
    assert base.isdisjoint(r["id"] for r in _build(None, s1, stream="launcher"))
    g = s1.gpus[0]
    two = replace(g, new_xids=(XidEvent(g.uuid, 79, T0 - 1.5), XidEvent(g.uuid, 79, T0 - 1.0)))
    recs = _build(None, replace(s1, gpus=(two, *s1.gpus[1:])))
    xids = [r["id"] for r in recs if r.get("event") == "xid"]
    assert len(set(xids)) == 2


def test_records_carry_only_allow_listed_attribution_never_environ() -> None:
    """Privacy: a secret in a process's environ (and its cgroup text) never reaches a
    record; attribution holds only identity fields (the known ones) and their sources."""
    recs = _build(None, realistic()) + _build(realistic(), advance(realistic()))
    blob = b"".join(seal(r, i + 1, ZERO_HASH, None) for i, r in enumerate(recs))
    assert SECRET.encode() not in blob
    assert b"AWS_SECRET_ACCESS_KEY" not in blob and b"slurmstepd.scope" not in blob
    for r in recs:
        if "attribution" in r:
            assert set(r["attribution"]) <= {*IDENTITY_FIELDS, "sources"}
            assert "sources" in r["attribution"]
    owned = next(r for r in recs if r["kind"] == "process" and r["attributed"])
    assert orjson.loads(orjson.dumps(owned))["attribution"]["sources"]["project"] == "jobmap"


def test_simulated_flag_follows_the_backend() -> None:
    """Records of a simulated snapshot say simulated=true; real ones false."""
    sim = snapshot(T0, [gpu(0)], simulated=True)
    sim2 = snapshot(T0 + 5, [gpu(0)], simulated=True)
    assert {r["simulated"] for r in _build(sim, sim2)} == {True}
    s1 = realistic()
    assert {r["simulated"] for r in _build(s1, advance(s1))} == {False}


def test_stored_bytes_are_canonical_json_even_with_tricky_strings() -> None:
    """seal() returns exactly the sorted compact JSON of the record with its hash, also
    when strings hold braces, quotes and a fake `,"host":` member."""
    tricky = realistic()
    g = tricky.gpus[0]
    p0 = replace(g.processes[0], name='py{th"on},"host":"x"}{')
    recs = _build(None, replace(tricky, gpus=(replace(g, processes=(p0, *g.processes[1:])),
                                             *tricky.gpus[1:])))
    recs.append({"schema": "x", "host": "h", "a": {"a": 0, "host": 1, "z": {"b": 1, "host": 2}}})
    h = ZERO_HASH
    for i, r in enumerate(recs, 1):
        stored = seal(r, i, h, None)
        assert stored == orjson.dumps(r, option=orjson.OPT_SORT_KEYS)
        h = r["hash"]
