"""Version 2 records are usable by a dashboard builder as they are: one name per
quantity across record kinds, unknown fields left out (no empty-string buckets), no row
of zeros on the first cycle after a start, and a schema that says what `time` and
`elapsed_seconds` cover."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import orjson

from gpu_audit.audit import SCHEMA_ID, AuditConfig, AuditProducer
from gpu_audit.audit.builder import build_records
from gpu_audit.audit.schema import record_schema
from tests.core.audit.factory import ALICE, HOST, advance, realistic
from tests.core.audit.fakes import MemorySpool

USAGE_KINDS = {"gpu", "process", "unattributed"}


def _build(prev: Any, snap: Any) -> list[dict[str, Any]]:
    return build_records(snap, prev, stream="exporter", exporter_version="t")


def _strings(obj: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(obj, str):
        yield path, obj


def test_schema_version_is_2() -> None:
    """Records say `gpu-audit.record/2`, and the published schema is the v2 one."""
    s1 = realistic()
    recs = _build(s1, advance(s1))
    assert {r["schema"] for r in recs} == {"gpu-audit.record/2"} == {SCHEMA_ID}
    assert record_schema()["properties"]["schema"]["const"] == "gpu-audit.record/2"
    assert record_schema()["$id"].endswith("audit-record-v2.json")


def test_one_name_per_quantity_across_kinds() -> None:
    """Memory used and the utilisation ratios have the same value name in gpu, process
    and unattributed records (the v1 names `used_memory_bytes`, `sm_utilization_ratio`,
    `memory_utilization_ratio` are gone), so one chart query works for every kind."""
    s1 = realistic()
    recs = _build(s1, advance(s1))
    names: dict[str, set[str]] = defaultdict(set)
    for r in recs:
        if r["kind"] in USAGE_KINDS:
            names[r["kind"]].update(r["values"])
    assert not {"used_memory_bytes", "sm_utilization_ratio",
                "memory_utilization_ratio"} & set().union(*names.values())
    for kind in ("process", "unattributed"):
        assert {"memory_used_bytes", "utilization_ratio"} <= names[kind], kind
    assert "memory_controller_utilization_ratio" in names["process"]
    gpu_names = names["gpu"]
    assert {"memory_used_bytes", "utilization_ratio"} <= gpu_names
    # every process value name is a gpu value name: the same quantity, one name
    assert names["process"] <= {*gpu_names, "memory_controller_utilization_ratio",
                                "encoder_utilization_ratio", "decoder_utilization_ratio"}


def test_process_and_unattributed_utilisation_add_up_to_the_gpu() -> None:
    """With one name per quantity the identity a dashboard stacks on holds: per GPU,
    sum(utilization_ratio of attributed processes) + unattributed utilization_ratio ==
    the GPU's utilization_ratio (when the GPU figure covers them)."""
    s1 = realistic()
    recs = _build(s1, advance(s1))
    g0 = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
    gpu = next(r for r in recs if r["kind"] == "gpu" and r["gpu"]["uuid"] == g0)
    owned = [r for r in recs if r["kind"] == "process" and r["gpu"]["uuid"] == g0
             and r["attributed"]]
    un = next(r for r in recs if r["kind"] == "unattributed" and r["gpu"]["uuid"] == g0)
    total = sum(r["values"]["utilization_ratio"] for r in owned) + un["values"][
        "utilization_ratio"]
    assert abs(total - gpu["values"]["utilization_ratio"]) < 1e-12


def test_unknown_fields_are_left_out_never_empty_strings() -> None:
    """No record holds an empty string anywhere: an unknown owner field is absent (an
    unowned process and the unattributed record have no `attribution` at all; an owned
    one lists only what is known), so charts get no empty buckets."""
    s1 = realistic()
    trail = _build(None, s1) + _build(s1, advance(s1))
    empty = [(r["kind"], r.get("event"), path) for r in trail
             for path, v in _strings(r) if v == ""]
    assert empty == []
    unowned = [r for r in trail if r["kind"] == "process" and not r["attributed"]]
    assert unowned and all("attribution" not in r for r in unowned)
    assert all("attribution" not in r for r in trail if r["kind"] == "unattributed")
    alice = next(r for r in trail if r["kind"] == "process" and r["process"]["pid"] == 101)
    assert alice["attribution"] == {
        "user": "alice", "project": "vision", "job": "4711", "slurm_job_id": "4711",
        "slurm_user": "alice", "slurm_account": "cv-lab", "sources": dict(ALICE.sources)}


def test_first_cycle_after_a_start_writes_no_usage_rows() -> None:
    """The first snapshot of a run measured no interval: it writes events only (process
    starts, lost GPUs, XIDs), never a gpu/process/unattributed row of zeros."""
    recs = _build(None, realistic())
    assert recs, "the first cycle still writes its events"
    assert {r["kind"] for r in recs} == {"event"}
    assert {r["event"] for r in recs} >= {"process_start", "gpu_lost", "xid"}


def test_gpu_seconds_sum_exactly_to_the_observed_time() -> None:
    """Over a run, each up GPU's gpu_seconds sum to exactly the time between its first
    and last snapshot (nothing before the first was observed; nothing is double-counted),
    and process gpu_seconds of a process seen throughout sum to the same."""
    spool = MemorySpool()
    prod = AuditProducer(AuditConfig(interval_seconds=5.0), spool, host=HOST, exporter_version="t",
                         simulated=False, clock=lambda: 0.0)
    prod.start()
    snaps = [realistic()]
    for _ in range(7):
        snaps.append(advance(snaps[-1], dt=5.0))
    for s in snaps:
        prod.on_snapshot(s)
    prod.stop()
    recs = [orjson.loads(p) for p in spool.payloads]
    per_gpu: dict[str, float] = defaultdict(float)
    per_proc: dict[int, float] = defaultdict(float)
    for r in recs:
        if r["kind"] == "gpu" and r["gpu"]["up"]:
            per_gpu[r["gpu"]["uuid"]] += r["gpu_seconds"]
        if r["kind"] == "process":
            per_proc[r["process"]["pid"]] += r["gpu_seconds"]
    observed = snaps[-1].timestamp - snaps[0].timestamp
    assert set(per_gpu.values()) == {observed}
    assert set(per_proc.values()) == {observed}
    assert min(r["elapsed_seconds"] for r in recs if r["kind"] in USAGE_KINDS) > 0


def test_schema_says_what_time_and_elapsed_cover() -> None:
    """The JSON schema itself documents the interval: a usage record covers
    (time - elapsed_seconds, time], its values read at `time`."""
    props = record_schema()["properties"]
    assert "(time - elapsed_seconds, time]" in props["elapsed_seconds"]["description"]
    assert "elapsed_seconds" in props["time"]["description"]
    assert "read" in props["time"]["description"]


def test_consecutive_cycles_tile_time_without_overlap() -> None:
    """The intervals usage records cover are back to back: each cycle's
    (time - elapsed, time] starts where the previous one ended."""
    snaps = [realistic()]
    for _ in range(3):
        snaps.append(advance(snaps[-1], dt=5.0))
    ends = []
    for prev, snap in itertools.pairwise(snaps):
        g = next(r for r in _build(prev, snap) if r["kind"] == "gpu")
        ends.append((g["time_ns"] - round(g["elapsed_seconds"] * 1e9), g["time_ns"]))
    for (_, end), (start, _) in itertools.pairwise(ends):
        assert start == end
