"""The fixed input of the golden audit trails in tests/core/audit/golden/.

Everything here is spelled out (no factory defaults), so the golden files depend only on
this module and on the record format: a change in serialisation, ids, hashing or
accounting shows up as a byte difference against the checked-in files, not as a change
nobody notices because every test seals and verifies with the same code.

The trail: exporter_start, three cycles 5 s apart on a 4-GPU node (owned, unowned and
unmeasured processes, a down GPU, an XID, a process that ends and one that starts),
exporter_stop. `produce(hmac_key)` runs it through the real AuditProducer and returns
the stored bytes, one record per line.

Regenerate the version-2 files only on purpose (a deliberate format change):
`.venv/bin/python -m tests.core.audit.golden_input --write`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from gpu_audit.audit import AuditConfig, AuditProducer
from gpu_audit.model.attribution import UNKNOWN, AttributedProcess, Attribution
from gpu_audit.model.samples import (
    BackendInfo,
    GpuInfo,
    GpuSample,
    ProcessIdentity,
    ProcessSample,
    XidEvent,
)
from gpu_audit.model.snapshot import Snapshot
from tests.core.audit.fakes import MemorySpool

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
HMAC_KEY_FILE = GOLDEN_DIR / "hmac.key"
HOST = "golden-node-01"
VERSION = "golden-1.0"
T0 = 1_796_000_000.0  # 2026-11-30T00:53:20Z
GIB = 1024**3

ALICE = Attribution(
    user="alice", project="vision", job="4711", slurm_job_id="4711", slurm_user="alice",
    slurm_account="cv-lab",
    sources={"user": "environ", "project": "jobmap", "job": "jobmap",
             "slurm_job_id": "cgroup", "slurm_user": "environ", "slurm_account": "environ"},
)
BOB = Attribution(
    user="bob", project="nlp", container_id="0123456789ab", container_runtime="docker",
    k8s_namespace="research", k8s_pod="trainer-0", k8s_container="main",
    k8s_pod_uid="5f0c6a2e-1111-2222-3333-444455556666",
    sources={"user": "owner", "container_id": "cgroup", "container_runtime": "cgroup",
             "k8s_namespace": "kubelet", "k8s_pod": "kubelet", "k8s_container": "kubelet",
             "k8s_pod_uid": "cgroup"},
)
OWNERS = {101: ALICE, 102: BOB, 301: ALICE, 104: BOB}


def _proc(pid: int, *, mem: int, sm: float | None, memu: float | None) -> ProcessSample:
    ident = ProcessIdentity(pid=pid, uid=1000 + pid % 7, start_time_ticks=5000 + pid,
                            environ={}, cgroup="")
    return ProcessSample(pid=pid, name=f"train-{pid}", uid=ident.uid, used_memory_bytes=mem,
                         sm_util_ratio=sm, memory_util_ratio=memu, identity=ident)


def _info(index: int) -> GpuInfo:
    return GpuInfo(uuid=f"GPU-{index:08d}-0000-1111-2222-333333333333", index=index,
                   name="NVIDIA H100 80GB HBM3")


def _gpu(index: int, cycle: int, procs: tuple[ProcessSample, ...], *, util: float | None,
         mem_used: float, watts: float, xids: tuple[XidEvent, ...] = ()) -> GpuSample:
    values: dict[str, dict[tuple[str, ...], float]] = {
        "memory_total": {(): 80 * GIB},
        "memory_used": {(): mem_used},
        "temperature_gpu": {(): 60.0 + index},
        "power_usage": {(): watts},
        # 1 MJ at start, then `watts` x 5 s per cycle plus a little (not a power estimate)
        "energy": {(): 1_000_000.0 * (index + 1) + cycle * (watts * 5 + 0.125)},
        "clock_event_reason": {("gpu_idle",): 0.0, ("sw_power_cap",): 1.0},
        "ecc_errors": {("corrected", "volatile"): 3.0, ("uncorrected", "volatile"): 0.0},
    }
    if util is not None:
        values["utilization_gpu"] = {(): util}
    return GpuSample(info=_info(index), values=values, processes=procs, new_xids=xids)


def snapshots(t0: float = T0) -> Iterator[Snapshot]:
    """The three cycles of the golden trail (the first at `t0`)."""
    for cycle in range(3):
        ts = t0 + 5.0 * cycle
        g0_procs = [_proc(101, mem=8 * GIB, sm=0.5, memu=0.25),
                    _proc(102, mem=2 * GIB, sm=0.2, memu=0.125)]
        # 103 (nobody's) runs in cycles 0 and 1; 104 (bob's) starts in cycle 2
        g0_procs.append(_proc(103, mem=1 * GIB, sm=0.125, memu=None) if cycle < 2
                        else _proc(104, mem=3 * GIB, sm=0.0625, memu=0.0))
        xids = (XidEvent(_info(0).uuid, 79, ts - 1.5),) if cycle == 1 else ()
        gpus = (
            _gpu(0, cycle, tuple(g0_procs), util=0.875, mem_used=12 * GIB, watts=350.0,
                 xids=xids),
            _gpu(1, cycle, (), util=0.0, mem_used=0.5 * GIB, watts=60.0),
            GpuSample(info=_info(2), up=False, error="gpu_lost"),
            _gpu(3, cycle, (_proc(301, mem=6 * GIB, sm=None, memu=None),), util=None,
                 mem_used=7 * GIB, watts=200.0),
        )
        yield Snapshot(
            timestamp=ts, host=HOST, backend=BackendInfo(name="nvml", simulated=False),
            gpus=gpus,
            processes={g.info.uuid: tuple(AttributedProcess(g.info.uuid, p,
                                                            OWNERS.get(p.pid, UNKNOWN))
                                          for p in g.processes) for g in gpus},
            interval_seconds=5.0,
        )


class _Clock:
    """exporter_start one second before the first cycle, exporter_stop after the last."""

    def __init__(self, t0: float) -> None:
        self._times = iter((t0 - 1.0, t0 + 11.0))

    def __call__(self) -> float:
        return next(self._times)


def produce(
    hmac_key: bytes | None, spool: MemorySpool | None = None, t0: float = T0
) -> list[bytes]:
    """The stored bytes of every record of the golden trail, in order (with another
    `t0`: the same trail later, for a producer that continues an existing spool)."""
    spool = spool if spool is not None else MemorySpool()
    config = AuditConfig(interval_seconds=5.0)  # the per-cycle trail
    producer = AuditProducer(config, spool, host=HOST, exporter_version=VERSION,
                             simulated=False, clock=_Clock(t0))
    if hmac_key is not None:
        producer._key = hmac_key
    producer.start()
    for snap in snapshots(t0):
        producer.on_snapshot(snap)
    producer.stop()
    return list(spool.payloads)


def golden_key() -> bytes:
    from gpu_audit.audit import load_hmac_key

    return load_hmac_key(HMAC_KEY_FILE)


def write(prefix: str) -> None:
    """Write `<prefix>.jsonl` and `<prefix>-hmac.jsonl` from the current code."""
    for name, key in ((f"{prefix}.jsonl", None), (f"{prefix}-hmac.jsonl", golden_key())):
        (GOLDEN_DIR / name).write_bytes(b"".join(p + b"\n" for p in produce(key)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the v2 golden trails")
    parser.add_argument("--prefix", default="trail-v2")
    args = parser.parse_args()
    if args.write:
        write(args.prefix)


if __name__ == "__main__":
    main()
