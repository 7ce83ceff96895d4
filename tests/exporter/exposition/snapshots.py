"""Hand-built snapshots for the render and HTTP tests: small, explicit, and covering
the awkward cases (a down GPU, unsupported fields, MIG, attributed and unattributed
processes, label values that need escaping)."""

from __future__ import annotations

from gpu_audit.model.attribution import UNKNOWN, AttributedProcess, Attribution
from gpu_audit.model.samples import (
    BackendInfo,
    GpuInfo,
    GpuSample,
    MigInstance,
    ProcessSample,
    XidEvent,
)
from gpu_audit.model.snapshot import Snapshot

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
GIB = 1024**3


def alice(job: str = "42") -> Attribution:
    return Attribution(user="alice", project="vision", job=job,
                       sources={"user": "environ", "project": "environ", "job": "jobmap"})


def proc(pid: int, mem: int | None, sm: float | None = None, name: str = "python",
         memu: float | None = None) -> ProcessSample:
    return ProcessSample(pid=pid, name=name, uid=1000, used_memory_bytes=mem,
                         sm_util_ratio=sm, memory_util_ratio=memu)


def small_snapshot() -> Snapshot:
    """2 GPUs (GPU 1 down), unsupported fields, processes with attributions, MIG."""
    info0 = GpuInfo(uuid=UUID0, index=0, name="NVIDIA A100-SXM4-80GB", serial="1323",
                    pci_bus_id="00000000:07:00.0", driver_version="535.104.05",
                    cuda_version="12.2", vbios_version="92.00.36.00.01", mig_mode=True)
    info1 = GpuInfo(uuid=UUID1, index=1, name="NVIDIA A100-SXM4-80GB", serial="1324",
                    pci_bus_id="00000000:0F:00.0", driver_version="535.104.05",
                    cuda_version="12.2", vbios_version="92.00.36.00.01")
    g0 = GpuSample(
        info=info0,
        values={
            "utilization_gpu": {(): 0.9},
            "utilization_memory": {(): 0.25},
            "memory_total": {(): 80 * GIB},
            "memory_used": {(): 30 * GIB},
            "memory_free": {(): 50 * GIB},
            "temperature_gpu": {(): 64.0},
            "power_usage": {(): 312.5},
            "energy": {(): 1234567.891},
            "clock_sm": {(): 1.41e9},
            "clock_event_reason": {("gpu_idle",): 0, ("hw_thermal_slowdown",): 1},
            "ecc_errors": {("corrected", "volatile"): 3, ("uncorrected", "aggregate"): 0},
            "remapped_rows": {("correctable",): 1, ("uncorrectable",): 0},
            "pcie_replay": {(): 7},
            "violation_time": {("power",): 2.5, ("thermal",): 0.75},
            "nvlink_bytes": {("0", "transmit"): 4096.0, ("0", "receive"): 8192.0},
        },
        unsupported=frozenset({"fan_speed", "temperature_memory"}),
        processes=(),
        mig=(MigInstance(uuid="MIG-aaaa", gpu_instance_id=1, compute_instance_id=0,
                         profile="3g.40gb", memory_total_bytes=40 * GIB,
                         memory_used_bytes=10 * GIB),),
        xid_totals={13: 2},
        xid_last_timestamp=1_700_000_000.5,
        new_xids=(XidEvent(uuid=UUID0, xid=13, timestamp=1_700_000_000.5),),
    )
    g1 = GpuSample(info=info1, up=False, error="gpu_lost", xid_totals={79: 1},
                   xid_last_timestamp=1_700_000_001.0)
    procs = (
        AttributedProcess(UUID0, proc(101, 10 * GIB, 0.4), alice()),
        AttributedProcess(UUID0, proc(102, 6 * GIB, 0.3), alice()),
        AttributedProcess(UUID0, proc(201, 4 * GIB, 0.1, name='odd "name"\\x'),
                          Attribution(user="bob", k8s_namespace="ml", k8s_pod="trainer-0",
                                      k8s_container="main",
                                      sources={"user": "owner", "k8s_pod": "cgroup",
                                               "k8s_namespace": "cgroup",
                                               "k8s_container": "cgroup"})),
        AttributedProcess(UUID0, proc(301, 5 * GIB, None, name="Xorg"), UNKNOWN),
    )
    return Snapshot(
        timestamp=1_700_000_010.0,
        host="node-1",
        backend=BackendInfo(name="sim", driver_version="535.104.05", cuda_version="12.2",
                            simulated=True),
        gpus=(g0, g1),
        processes={UUID0: procs},
        interval_seconds=5.0,
        sample_duration_seconds=0.0125,
        cycle=3,
        error_counts={"gpu_lost": 1},
    )
