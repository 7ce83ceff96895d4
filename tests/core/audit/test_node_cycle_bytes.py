"""The producer's bytes on a full node (8 GPUs x 64 processes, the bench's shape) are
pinned: the records, their ids and hashes, and the spool segments holding them are the
bytes the code wrote before the audit builder was tuned for speed (digests below, taken
from `main` at 1b5d6cd), and equal the plain reference path (build_records without any cache, then
seal_reference) record for record.

The input is built to reach every branch of the fast path at this scale: owned and
unowned processes (shared owners, a non-ASCII user, a JSON-hostile process name),
missing and non-finite utilisation, tiny and huge values (exponent formatting), a MIG
GPU billed by the slice, processes ending and starting, an XID, a GPU going down, a
capped long pause, HMAC and plain chains.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpu_audit.audit import AuditConfig, AuditProducer
from gpu_audit.audit.builder import build_records, exporter_event
from gpu_audit.model.attribution import UNKNOWN, AttributedProcess, Attribution
from gpu_audit.model.samples import (
    BackendInfo,
    GpuInfo,
    GpuSample,
    MigInstance,
    ProcessIdentity,
    ProcessSample,
    XidEvent,
)
from gpu_audit.model.snapshot import Snapshot
from gpu_audit.spool import SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from tests.core.audit.fakes import MemorySpool
from tests.core.audit.trails import reference_chain

HOST = "node-8x64"
VERSION = "pin-1"
T0 = 1_796_000_000.123456789
GIB = 1024**3
GPUS, PER_GPU = 8, 64
# Steps between cycles: normal, slightly short, a long pause (capped at 3 intervals).
STEPS = (5.0, 4.75, 600.0, 5.0)

OWNERS = (
    Attribution(user="alice", project="vision", job="4711", slurm_job_id="4711",
                slurm_user="alice", slurm_account="cv-lab",
                sources={"user": "environ", "project": "jobmap", "job": "jobmap",
                         "slurm_job_id": "cgroup", "slurm_user": "environ",
                         "slurm_account": "environ"}),
    Attribution(user="bob", project="nlp", container_id="0123456789ab",
                container_runtime="docker", k8s_namespace="research", k8s_pod="trainer-0",
                k8s_container="main", k8s_pod_uid="5f0c6a2e-1111-2222-3333-444455556666",
                sources={"user": "owner", "container_id": "cgroup",
                         "container_runtime": "cgroup", "k8s_namespace": "kubelet",
                         "k8s_pod": "kubelet", "k8s_container": "kubelet",
                         "k8s_pod_uid": "cgroup"}),
    Attribution(user="zo\u00eb", sources={"user": "owner"}),
    Attribution(user="carol", project='p"{,"host":"x"}', sources={"user": "owner",
                                                                 "project": "jobmap"}),
)

# (pinned digests from the code before the audit builder was tuned for speed)
PINNED = {
    "plain": ("ce83e5d2190e818f36733e19a1917f6c44976ea525560fbbfb270254a50748f4",
              "adc5fe4b022b28db7b61dc1e096d4f69ee01271751e3cda3e0579991ca6f088e"),
    "hmac": ("142d162e53669bdeb62d16f8a66aad197c3c1a4d58e90d6132e000af69e9a86a",
             "fa7f9ca95b1242a748ea8a4737432dbe8a84aceebdc58447852ec80904e4f583"),
}


def _ratio(pid: int, cycle: int, salt: int) -> float | None:
    k = (pid * 7 + cycle * 13 + salt) % 97
    if k == 0:
        return None
    if k == 1:
        return float("nan")
    if k == 2:
        return 3e-6  # busy seconds then print with an exponent
    return k / 96 if k % 3 else k / 100  # dyadic and not


def _proc(gpu: int, slot: int, cycle: int, mig: bool) -> ProcessSample:
    # slot 5 of GPU 0 ends after cycle 1; slot 6 of GPU 1 starts in cycle 2
    pid = 10_000 + gpu * 100 + slot + (1000 if (gpu, slot) == (1, 6) else 0)
    ident = ProcessIdentity(pid=pid, uid=1000 + pid % 13, start_time_ticks=70_000 + pid,
                            environ={}, cgroup="")
    name = 'py{th"on},"host":"x"}' if slot == 3 else f"python3 /srv/job{gpu}/train-{slot}.py"
    return ProcessSample(
        pid=pid, name=name, uid=ident.uid if slot % 4 else None,
        type="graphics" if slot == 9 else "compute",
        used_memory_bytes=None if slot == 11 else (slot + 1) * 256 * 1024**2 + cycle,
        sm_util_ratio=None if mig else _ratio(pid, cycle, 1),
        memory_util_ratio=_ratio(pid, cycle, 2),
        encoder_util_ratio=_ratio(pid, cycle, 3) if slot % 2 else None,
        decoder_util_ratio=0.0 if slot % 5 == 0 else None,
        gpu_instance_id=(1 + slot % 3) if mig else None,
        compute_instance_id=0 if mig else None,
        identity=ident if slot % 8 else None,
    )


def _gpu(index: int, cycle: int, ts: float) -> GpuSample:
    info = GpuInfo(uuid=f"GPU-{index:08d}-8x64-0000-1111-222222222222", index=index,
                   name="NVIDIA H100 80GB HBM3", mig_mode=index == 7)
    if index == 6 and cycle == 3:
        return GpuSample(info=info, up=False, error="gpu_lost")
    mig = index == 7
    procs = tuple(_proc(index, s, cycle, mig) for s in range(PER_GPU)
                  if not ((index, s) == (0, 5) and cycle >= 2)
                  and not ((index, s) == (1, 6) and cycle < 2))
    values: dict[str, dict[tuple[str, ...], float]] = {
        "memory_total": {(): 80 * GIB},
        "memory_used": {(): 40 * GIB + cycle * 12345.5},
        "temperature_gpu": {(): 55.0 + index},
        "power_usage": {(): 300.0 + index + cycle / 3},
        "energy": {(): 1e17 + index * 1e6 + cycle * 1500.123},
        "clock_event_reason": {("gpu_idle",): 0.0, ("sw_power_cap",): 1.0},
        "ecc_errors": {("corrected", "volatile"): 3.0, ("uncorrected", "volatile"): 0.0},
    }
    if index != 5:
        values["utilization_gpu"] = {(): 0.9 - index / 100}
    xids = (XidEvent(info.uuid, 79, ts - 1.5),) if (index, cycle) == (2, 1) else ()
    mig_instances = tuple(MigInstance(f"MIG-{gi}", gi, 0, p) for gi, p in
                          ((1, "1g.10gb"), (2, "2g.20gb"), (3, "3g.40gb"))) if mig else ()
    return GpuSample(info=info, values=values, processes=procs, new_xids=xids,
                     mig=mig_instances)


def node_cycles() -> list[Snapshot]:
    """Five cycles of the 8 x 64 node (the owners' Attribution objects are shared across
    cycles, as the resolver hands them out)."""
    out, ts = [], T0
    for cycle in range(len(STEPS) + 1):
        gpus = tuple(_gpu(i, cycle, ts) for i in range(GPUS))
        procs = {g.info.uuid: tuple(
            AttributedProcess(g.info.uuid, p,
                              UNKNOWN if p.pid % 5 == 0 else OWNERS[p.pid % len(OWNERS)])
            for p in g.processes) for g in gpus}
        out.append(Snapshot(timestamp=ts, host=HOST,
                            backend=BackendInfo(name="nvml", simulated=False), gpus=gpus,
                            processes=procs, interval_seconds=5.0))
        if cycle < len(STEPS):
            ts += STEPS[cycle]
    return out


def _key(mode: str) -> bytes | None:
    return b"8x64-secret-key" if mode == "hmac" else None


def _produce(spool: object, key: bytes | None) -> AuditProducer:
    times = iter((T0 - 1.0, T0 + 700.0))
    producer = AuditProducer(AuditConfig(interval_seconds=5.0), spool,  # type: ignore[arg-type]
                             host=HOST, exporter_version=VERSION, simulated=False,
                             clock=lambda: next(times))
    producer._key = key
    producer.start()
    for snap in node_cycles():
        producer.on_snapshot(snap)
    producer.stop()
    return producer


def _reference(key: bytes | None) -> list[bytes]:
    """The plain path: no cache, no fragments, dict records sealed by seal_reference."""
    snaps = node_cycles()
    records = [exporter_event("exporter_start", timestamp=T0 - 1.0, host=HOST,
                              stream="exporter", exporter_version=VERSION, simulated=False)]
    prev = None
    for snap in snaps:
        records += build_records(snap, prev, stream="exporter", exporter_version=VERSION,
                                 host=HOST, simulated=False)
        prev = snap
    records.append(exporter_event("exporter_stop", timestamp=T0 + 700.0, host=HOST,
                                  stream="exporter", exporter_version=VERSION,
                                  simulated=False, interval_seconds=5.0))
    return reference_chain(records, key)


def _digest(chunks: list[bytes]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(8, "little"))
        h.update(c)
    return h.hexdigest()


@pytest.mark.parametrize("mode", ["plain", "hmac"])
def test_node_cycle_records_are_the_pinned_bytes(mode: str, tmp_path: Path) -> None:
    """Five 8 x 64 cycles through the producer: every stored record equals the plain
    reference path's, the whole trail hashes to the digest pinned from the code before
    the audit stage was reworked, and so do the spool segments the real writer wrote."""
    key = _key(mode)
    memory = MemorySpool()
    _produce(memory, key)
    assert len(memory.payloads) > 5 * GPUS * PER_GPU
    reference = _reference(key)
    assert len(memory.payloads) == len(reference)
    for i, (ours, ref) in enumerate(zip(memory.payloads, reference, strict=True), 1):
        assert ours == ref, f"record {i} differs"
    writer = SpoolWriter(SpoolConfig(directory=tmp_path / "spool", min_free_bytes=0,
                                     segment_bytes=256 * 1024))
    try:
        producer = _produce(writer, key)
    finally:
        writer.close()
    assert producer.stats()["records_written"] == len(reference)
    segments = sorted((tmp_path / "spool").glob("*.seg"))
    assert len(segments) > 1  # the trail rolls over several segments
    seg_bytes = [s.name.encode() + s.read_bytes() for s in segments]
    assert (_digest(memory.payloads), _digest(seg_bytes)) == PINNED[mode]
