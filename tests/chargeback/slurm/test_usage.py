"""Per-job usage added up from exporter records (chargeback/slurm/usage.py)."""

from __future__ import annotations

from typing import Any

from pytest import approx

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


def test_the_minute_trail_gives_each_slurm_job_what_the_per_cycle_trail_gives() -> None:
    """The interval trail (schema 3, one usage record per GPU and holder per
    minute) read by the per-job meter: every Slurm job's GPU time, busy and idle-held
    time, energy and processes equal the per-cycle trail's for the same samples (before
    the meter read `usage` records, every job came out empty at the default cadence).
    Two jobs of one user share a GPU's holder in one minute: their sums split by the time
    each job's processes were seen; energy follows the bill's rule."""
    from dataclasses import replace

    import orjson

    from gpu_audit.audit.config import AuditConfig
    from gpu_audit.audit.producer import AuditProducer
    from tests.core.audit.factory import ALICE, snapshot
    from tests.core.audit.factory import gpu as gpu_sample
    from tests.core.audit.factory import proc as proc_sample
    from tests.core.audit.fakes import MemorySpool

    t0, e = 1_796_000_020.0, 5.0
    job2 = replace(ALICE, job="4712", slurm_job_id="4712")

    def snaps() -> list[Any]:
        out = []
        for k in range(48):  # 4 minutes; job 4711 ends and 4712 starts on GPU 0 at k=30
            g0 = [proc_sample(101 if k < 30 else 102, sm=0.5, mem=(8 << 30) + k)]
            gpus = [gpu_sample(0, util=0.6, energy=1000.0 * k, power=110.0, processes=g0),
                    gpu_sample(1, util=0.02, energy=300.0 * k, power=30.0,
                               processes=[proc_sample(201, sm=0.01)])]
            out.append(snapshot(t0 + e * k, gpus, {101: ALICE, 102: job2, 201: ALICE},
                                interval=e))
        return out

    def meter(interval: float) -> dict[str, Any]:
        spool = MemorySpool()
        p = AuditProducer(AuditConfig(interval_seconds=interval), spool, host="n1",
                          exporter_version="t", simulated=False)
        p.start()
        for s in snaps():
            p.on_snapshot(s)
        p.stop()
        m = UsageMeter()
        for raw in spool.payloads:
            m.add(orjson.loads(raw))
        return m.result()

    per_cycle, per_minute = meter(e), meter(60.0)
    assert set(per_cycle) == set(per_minute) == {"4711", "4712"}
    for job, a in per_cycle.items():
        b = per_minute[job]
        for name in ("gpu_seconds", "busy_gpu_seconds", "idle_held_gpu_seconds"):
            assert getattr(b, name) == approx(getattr(a, name), rel=1e-3), (job, name)
        # energy by the bill's rule (gpu_audit.audit.holders): a GPU held by owners only
        # is theirs whole, where a per-cycle process record holds its split alone
        assert a.energy_joules < b.energy_joules
        assert (b.gpus, b.hosts, b.processes) == (a.gpus, a.hosts, a.processes)
        assert b.peak_memory_bytes >= a.peak_memory_bytes > 0
        assert b.memory_total_bytes == a.memory_total_bytes > 0
    assert per_minute["4711"].idle_held_gpu_seconds > 0  # GPU 1 ran under 5 % busy
    # GPU 0: 1,000 J a sample, 29 samples of job 4711 then 18 of 4712; GPU 1: 47 x 300 J
    assert per_minute["4711"].energy_joules == approx(29 * 1000 + 47 * 300)
    assert per_minute["4712"].energy_joules == approx(18 * 1000)
