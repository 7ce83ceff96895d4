"""Hand-built Snapshots for audit tests: several GPUs, one down, owned and unowned
processes, XIDs, labelled values, and a process environ holding a secret."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

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

SECRET = "hunter2-S3CRET-token"
T0 = 1_796_000_000.0  # 2026-11-29, a plausible sampling time
HOST = "gpu-node-07"

ALICE = Attribution(
    user="alice",
    project="vision",
    job="4711",
    slurm_job_id="4711",
    slurm_user="alice",
    slurm_account="cv-lab",
    sources={
        "user": "environ",
        "project": "jobmap",
        "job": "jobmap",
        "slurm_job_id": "cgroup",
        "slurm_user": "environ",
        "slurm_account": "environ",
    },
)
BOB = Attribution(
    user="bob",
    project="nlp",
    container_id="0123456789ab",
    container_runtime="docker",
    k8s_namespace="research",
    k8s_pod="trainer-0",
    k8s_container="main",
    k8s_pod_uid="5f0c6a2e-1111-2222-3333-444455556666",
    sources={
        "user": "owner",
        "container_id": "cgroup",
        "container_runtime": "cgroup",
        "k8s_namespace": "kubelet",
        "k8s_pod": "kubelet",
        "k8s_container": "kubelet",
        "k8s_pod_uid": "cgroup",
    },
)


def proc(
    pid: int,
    *,
    name: str = "python",
    mem: int | None = 4 * 1024**3,
    sm: float | None = 0.4,
    start: int | None = None,
    environ: Mapping[str, str] | None = None,
    gi: int | None = None,
) -> ProcessSample:
    identity = ProcessIdentity(
        pid=pid,
        uid=1000 + pid % 7,
        start_time_ticks=start if start is not None else 1000 + pid,
        environ=dict(environ or {"USER": "alice", "AWS_SECRET_ACCESS_KEY": SECRET}),
        cgroup=f"0::/system.slice/slurmstepd.scope/job_4711/step_0/task_{pid}\n",
    )
    return ProcessSample(
        pid=pid,
        name=name,
        uid=identity.uid,
        used_memory_bytes=mem,
        sm_util_ratio=sm,
        memory_util_ratio=0.1 if sm is not None else None,
        gpu_instance_id=gi,
        identity=identity,
    )


def gpu(
    index: int,
    *,
    up: bool = True,
    util: float | None = 0.9,
    mem_used: float | None = 20e9,
    energy: float | None = 1_000_000.0,
    power: float | None = 300.0,
    processes: Sequence[ProcessSample] = (),
    xids: Sequence[XidEvent] = (),
    extra: Mapping[str, Any] | None = None,
) -> GpuSample:
    info = GpuInfo(uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000", index=index,
                   name="NVIDIA H100 80GB HBM3")
    if not up:
        return GpuSample(info=info, up=False, error="gpu_lost")
    values: dict[str, dict[tuple[str, ...], float]] = {
        "memory_total": {(): 80e9},
        "temperature_gpu": {(): 61.0},
        "clock_sm": {(): 1.98e9},
        "clock_event_reason": {("gpu_idle",): 0.0, ("sw_power_cap",): 1.0},
        "ecc_errors": {("corrected", "volatile"): 3.0, ("uncorrected", "volatile"): 0.0},
    }
    if util is not None:
        values["utilization_gpu"] = {(): util}
    if mem_used is not None:
        values["memory_used"] = {(): mem_used}
    if energy is not None:
        values["energy"] = {(): energy}
    if power is not None:
        values["power_usage"] = {(): power}
    for k, v in (extra or {}).items():
        values[k] = v
    return GpuSample(info=info, values=values, processes=tuple(processes), new_xids=tuple(xids))


def snapshot(
    ts: float,
    gpus: Sequence[GpuSample],
    owners: Mapping[int, Attribution] | None = None,
    *,
    interval: float = 5.0,
    simulated: bool = False,
) -> Snapshot:
    """A Snapshot whose processes are attributed by pid through `owners` (else unknown)."""
    owners = owners or {}
    processes = {
        g.info.uuid: tuple(
            AttributedProcess(g.info.uuid, p, owners.get(p.pid, UNKNOWN)) for p in g.processes
        )
        for g in gpus
    }
    return Snapshot(
        timestamp=ts,
        host=HOST,
        backend=BackendInfo(name="sim" if simulated else "nvml", simulated=simulated),
        gpus=tuple(gpus),
        processes=processes,
        interval_seconds=interval,
    )


def realistic(ts: float = T0, *, energy0: float = 1_000_000.0, xids: bool = True) -> Snapshot:
    """Four GPUs: 0 with two owned processes and one unowned, 1 idle, 2 down, 3 with
    one owned process and no utilisation samples (memory split)."""
    g0 = gpu(
        0,
        util=0.85,
        mem_used=30e9,
        energy=energy0,
        processes=[proc(101, sm=0.5), proc(102, sm=0.2, mem=2 * 1024**3), proc(103, sm=0.1)],
        xids=[XidEvent("GPU-00000000-aaaa-bbbb-cccc-000000000000", 79, ts - 1.5)] if xids else (),
    )
    g1 = gpu(1, util=0.0, mem_used=0.5e9, energy=energy0 / 2, power=60.0)
    g2 = gpu(2, up=False)
    g3 = gpu(3, util=None, mem_used=10e9, energy=energy0 * 2,
             processes=[proc(301, sm=None, mem=6 * 1024**3)])
    return snapshot(ts, [g0, g1, g2, g3], {101: ALICE, 102: BOB, 301: ALICE})


def advance(snap: Snapshot, dt: float = 5.0, denergy: float = 1500.0) -> Snapshot:
    """The same node `dt` seconds later: energy counters moved on, no new XIDs."""
    gpus = []
    for g in snap.gpus:
        if not g.up:
            gpus.append(g)
            continue
        values = dict(g.values)
        e = g.scalar("energy")
        if e is not None:
            values["energy"] = {(): e + denergy * (1 + g.info.index)}
        gpus.append(replace(g, values=values, new_xids=()))
    return replace(snap, timestamp=snap.timestamp + dt, gpus=tuple(gpus))
