"""The published JSON Schema accepts every record the builder and producer make."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from gpu_audit.audit.builder import build_records, exporter_event
from gpu_audit.audit.canonical import ZERO_HASH, seal
from gpu_audit.audit.jobevents import JOB_EVENTS, job_event
from gpu_audit.audit.schema import record_schema
from gpu_audit.model.attribution import Attribution
from gpu_audit.model.snapshot import Snapshot
from tests.core.audit.factory import HOST, T0, advance, gpu, proc, realistic, snapshot

VALIDATOR = Draft202012Validator(record_schema())


def _sealed_trail() -> list[dict[str, Any]]:
    s1 = realistic()
    s2 = advance(s1)
    # s3: process 103 ended, GPU 2 recovered, GPU 1 vanished, a new process appeared.
    g = list(s2.gpus)
    g0 = g[0]
    g[0] = replace(g0, processes=(g0.processes[0], g0.processes[1], proc(104)))
    g[2] = gpu(2)
    del g[1]
    s3 = snapshot(s2.timestamp + 5, g, {101: _owner(s1, 101), 102: _owner(s1, 102)})
    records = [exporter_event("exporter_start", timestamp=T0 - 1, host=HOST, stream="exporter",
                              exporter_version="0.1.0", simulated=False)]
    prev = None
    for s in (s1, s2, s3):
        records += build_records(s, prev, stream="exporter", exporter_version="0.1.0")
        prev = s
    records.append(exporter_event("exporter_stop", timestamp=s3.timestamp + 1, host=HOST,
                                  stream="exporter", exporter_version="0.1.0", simulated=False))
    # the launcher's lifecycle events (its own stream in production; one chain here)
    job = {"id": "j1", "attempt": 2, "user": "alice", "uid": 1000, "project": "vision",
           "gpus": ["GPU-1"], "exit_code": 75, "exit_class": "preempted",
           "allocated_gpu_seconds": 12.5, "signal_to_commit_seconds": 0.2,
           "fingerprint": {"python": "3.11.2"}}
    for i, event in enumerate(JOB_EVENTS):
        part = None if event.startswith("launcher_") else job
        records.append(job_event(event, timestamp=s3.timestamp + 2 + i, host=HOST,
                                 stream="launcher", version="0.1.0", job=part))
    h = ZERO_HASH
    out = []
    for i, r in enumerate(records, 1):
        out.append(orjson.loads(seal(r, i, h, None)))
        h = r["hash"]
    return out


def _owner(s: Snapshot, pid: int) -> Attribution:
    for aps in s.processes.values():
        for ap in aps:
            if ap.process.pid == pid:
                return ap.attribution
    raise KeyError(pid)


TRAIL = _sealed_trail()


def test_job_event_without_its_job_is_rejected() -> None:
    """A job lifecycle record must say which job it is about; launcher_start must not."""
    rec = job_event("job_started", timestamp=T0, host=HOST, stream="launcher", version="0")
    bad = orjson.loads(seal(rec, 1, ZERO_HASH, None))
    assert list(VALIDATOR.iter_errors(bad)), "job_started without `job` validated"
    rec = job_event("launcher_start", timestamp=T0, host=HOST, stream="launcher", version="0",
                    job={"id": "x"})
    bad = orjson.loads(seal(rec, 1, ZERO_HASH, None))
    assert list(VALIDATOR.iter_errors(bad)), "launcher_start with `job` validated"


def test_schema_is_valid_draft_2020_12() -> None:
    """The checked-in schema itself is a valid draft 2020-12 JSON Schema."""
    Draft202012Validator.check_schema(record_schema())


def test_trail_covers_every_kind_and_event() -> None:
    """The test trail exercises every record kind and every event the schema names."""
    kinds = {r["kind"] for r in TRAIL}
    events = {r["event"] for r in TRAIL if r["kind"] == "event"}
    assert kinds == {"gpu", "process", "unattributed", "event"}
    assert events == set(record_schema()["properties"]["event"]["enum"])


@pytest.mark.parametrize("index", range(len(TRAIL)))
def test_every_record_validates(index: int) -> None:
    """Every sealed record of a realistic trail satisfies the published schema."""
    errors = [e.message for e in VALIDATOR.iter_errors(TRAIL[index])]
    assert errors == [], (TRAIL[index]["kind"], TRAIL[index].get("event"), errors)


def test_schema_rejects_event_without_name_and_unknown_fields() -> None:
    """The schema is strict: an event record without `event`, an unknown top-level
    field and a non-event with `event` are all refused."""
    ev = next(r for r in TRAIL if r["kind"] == "event")
    gp = next(r for r in TRAIL if r["kind"] == "gpu")
    assert not VALIDATOR.is_valid({k: v for k, v in ev.items() if k != "event"})
    assert not VALIDATOR.is_valid({**gp, "environ": {"X": "y"}})
    assert not VALIDATOR.is_valid({**gp, "event": "xid"})


def test_time_format_is_rfc3339_utc_with_nanoseconds() -> None:
    """`time` is RFC 3339 UTC with nine fraction digits and Z, and agrees with time_ns."""
    r = TRAIL[1]
    assert r["time"].endswith("Z") and len(r["time"].split(".")[1]) == 10
    parsed = datetime.strptime(r["time"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    assert int(parsed.timestamp()) * 10**9 + int(r["time"][20:29]) == r["time_ns"]


def test_labelled_values_are_objects_keyed_by_label_values() -> None:
    """Labelled catalogue values become objects keyed by label values joined with '/',
    named by the metric name without `gpu_`."""
    gp = next(r for r in TRAIL if r["kind"] == "gpu" and r["gpu"]["up"])
    assert gp["values"]["ecc_errors_total"] == {"corrected/volatile": 3.0,
                                                 "uncorrected/volatile": 0.0}
    assert gp["values"]["clock_event_reason_active"]["sw_power_cap"] == 1.0
    assert gp["values"]["memory_total_bytes"] == 80e9


SLURM_JOB = {"id": "918273", "attempt": 1, "user": "alice", "uid": 1001,
             "project": "physics", "account": "physics", "partition": "gpu",
             "gpus": ["GPU-1", "GPU-2"], "exit_code": 0, "start_time": 1_800_000_000.0,
             "end_time": 1_800_003_600.0, "time_source": "slurm",
             "allocated_gpu_seconds": 7200.0,
             "usage": {"gpu_seconds": 7100.0, "busy_gpu_seconds": 4260.0,
                       "idle_held_gpu_seconds": 120.0, "energy_joules": 2.5e6,
                       "peak_memory_bytes": 42949672960, "processes": 2}}


def test_a_slurm_jobs_end_record_validates() -> None:
    """The Slurm epilog's record (stream `slurm`): the run's account, partition,
    allocation interval and where its times came from, and its measured usage."""
    rec = job_event("job_finished", timestamp=T0, host=HOST, stream="slurm", version="0",
                    job=SLURM_JOB)
    doc = orjson.loads(seal(rec, 1, ZERO_HASH, None))
    assert not list(VALIDATOR.iter_errors(doc))
    for bad in ({"usage": {"gpu_seconds": -1.0}}, {"usage": {"secret": 1}},
                {"time_source": "guess"}, {"end_time": -5.0}):
        rec = job_event("job_finished", timestamp=T0, host=HOST, stream="slurm",
                        version="0", job={**SLURM_JOB, **bad})
        doc = orjson.loads(seal(rec, 1, ZERO_HASH, None))
        assert list(VALIDATOR.iter_errors(doc)), f"{bad} validated"
