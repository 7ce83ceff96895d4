"""A real audit trail for the InfluxDB sink tests: every record kind the audit builder
produces, chained by the producer's own `seal`, with the collisions a point key must
survive (several XIDs on one GPU in one cycle, several processes of one owner on one
GPU, one pid on two MIG instances of one GPU).

Built with the real builder rather than hand-written dicts, so renamed or dropped record
fields (another part of the code base owns them) are what the sink tests see.
"""

from __future__ import annotations

from collections import Counter

from gpu_audit.audit.builder import build_records, exporter_event
from gpu_audit.audit.canonical import ZERO_HASH, seal
from gpu_audit.model.samples import XidEvent
from shipper.sinks.base import SinkRecord
from tests.core.audit.factory import ALICE, BOB, HOST, T0, gpu, proc, snapshot

UUID0 = "GPU-00000000-aaaa-bbbb-cccc-000000000000"


def _cycles() -> list[list[dict[str, object]]]:
    # cycle 1: first snapshot. GPU 0: three processes of alice, one of bob, one unowned,
    # pid 105 on two MIG instances, three XIDs (two with the same code); GPU 1 idle;
    # GPU 2 down (gpu_lost on the first snapshot).
    g0 = gpu(
        0,
        processes=[proc(101), proc(102), proc(104), proc(103), proc(107),
                   proc(105, gi=1), proc(105, gi=2)],
        xids=[XidEvent(UUID0, 79, T0 - 1.5), XidEvent(UUID0, 79, T0 - 1.0),
              XidEvent(UUID0, 48, T0 - 1.2)],
    )
    owners = {101: ALICE, 102: ALICE, 104: ALICE, 103: BOB, 105: ALICE}
    s1 = snapshot(T0, [g0, gpu(1, util=0.0), gpu(2, up=False)], owners)
    # cycle 2: 102 ended and 106 started on GPU 0, two more XIDs there; GPU 1 missing
    # (gpu_lost, error "missing"); GPU 2 recovered.
    g0b = gpu(
        0,
        energy=1_002_000.0,
        processes=[proc(101), proc(104), proc(103), proc(107), proc(105, gi=1),
                   proc(105, gi=2), proc(106)],
        xids=[XidEvent(UUID0, 13, T0 + 4.0), XidEvent(UUID0, 13, T0 + 4.5)],
    )
    s2 = snapshot(T0 + 5, [g0b, gpu(2)], {**owners, 106: BOB})
    start = exporter_event("exporter_start", timestamp=T0 - 2, host=HOST, stream="exporter",
                           exporter_version="test", simulated=False, interval_seconds=5.0)
    stop = exporter_event("exporter_stop", timestamp=T0 + 7, host=HOST, stream="exporter",
                          exporter_version="test", simulated=False, interval_seconds=5.0)
    return [
        [start],
        build_records(s1, None, stream="exporter", exporter_version="test"),
        build_records(s2, s1, stream="exporter", exporter_version="test"),
        [stop],
    ]


def audit_trail() -> list[SinkRecord]:
    """Every record of the trail, sealed as the producer seals them (seq 1, 2, ...)."""
    out: list[SinkRecord] = []
    prev = ZERO_HASH
    seq = 0
    for cycle in _cycles():
        for rec in cycle:
            seq += 1
            raw = seal(rec, seq, prev, None)
            prev = str(rec["hash"])
            out.append(SinkRecord(offset=seq - 1, record_id=str(rec["id"]), doc=rec, raw=raw))
    return out


def kinds(records: list[SinkRecord]) -> Counter[str]:
    """How many records of each measurement suffix (kind) the trail holds."""
    return Counter(str(r.doc["kind"]) for r in records)


def trail_window() -> tuple[int, int]:
    """A [start, end) in ns that holds every record of the trail."""
    return int((T0 - 60) * 1e9), int((T0 + 60) * 1e9)
