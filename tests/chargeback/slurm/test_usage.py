"""Per-job usage added up from exporter records (chargeback/slurm/usage.py)."""

from __future__ import annotations

from typing import Any

from chargeback.slurm.usage import UsageMeter

GPU = "GPU-1"
S = 1_000_000_000


def gpu(t: int, util: float, host: str = "n1", uuid: str = GPU) -> dict[str, Any]:
    return {"kind": "gpu", "time_ns": t * S, "host": host, "elapsed_seconds": 5.0,
            "gpu": {"uuid": uuid}, "values": {"utilization_ratio": util,
                                               "memory_total_bytes": 80e9}}


def proc(t: int, pid: int, job: str, *, mem: int = 10, busy: float = 2.0,
         energy: float = 100.0, host: str = "n1", uuid: str = GPU,
         simulated: bool = False) -> dict[str, Any]:
    return {"kind": "process", "time_ns": t * S, "host": host, "elapsed_seconds": 5.0,
            "gpu": {"uuid": uuid}, "process": {"pid": pid, "start_time_ticks": pid},
            "attribution": {"slurm_job_id": job}, "values": {"memory_used_bytes": mem},
            "busy_gpu_seconds": busy, "energy_joules": energy, "simulated": simulated}


def test_a_gpu_held_by_two_processes_of_a_job_counts_once() -> None:
    """Two processes of job 7 on one GPU in one cycle: the interval once, busy and energy
    summed, peak memory is their sum; the next cycle's interval again once."""
    m = UsageMeter()
    for r in (gpu(10, 0.8), proc(10, 1, "7", mem=10), proc(10, 2, "7", mem=5),
              gpu(15, 0.8), proc(15, 1, "7", mem=3)):
        m.add(r)
    u = m.result()["7"]
    assert (u.gpu_seconds, u.samples, u.busy_gpu_seconds, u.energy_joules) == (10.0, 2, 6.0,
                                                                               300.0)
    assert (u.peak_memory_bytes, u.memory_total_bytes, u.processes) == (15, 80e9, 2)
    assert u.idle_held_gpu_seconds == 0


def test_idle_held_time_follows_the_gpus_utilisation_and_window_is_half_open() -> None:
    """Held while the GPU was under 5 % busy counts as idle-held; a record at the window's
    start accounts for time before it and is left out, one at its end is in."""
    m = UsageMeter(start_ns=10 * S, end_ns=20 * S)
    for r in (gpu(10, 0.0), proc(10, 1, "7"), gpu(15, 0.01), proc(15, 1, "7"),
              gpu(20, 0.9), proc(20, 1, "7"), gpu(25, 0.0), proc(25, 1, "7")):
        m.add(r)
    u = m.result()["7"]
    assert (u.gpu_seconds, u.idle_held_gpu_seconds) == (10.0, 5.0)


def test_jobs_hosts_and_simulated_records_are_kept_apart() -> None:
    """Two jobs on two nodes stay separate; simulated records are counted out on request
    and mark the usage simulated otherwise; a process nobody attributed is nobody's."""
    m = UsageMeter(include_simulated=False)
    m.add(proc(10, 1, "7", host="n1"))
    m.add(proc(10, 1, "8", host="n2"))
    m.add(proc(10, 2, "9", simulated=True))
    m.add({**proc(10, 3, "x"), "attribution": {}})
    jobs = m.result()
    assert sorted(jobs) == ["7", "8"] and m.simulated_left_out == 1
    assert jobs["8"].hosts == {"n2"}
    m2 = UsageMeter()
    m2.add(proc(10, 2, "9", simulated=True))
    assert m2.result()["9"].simulated
