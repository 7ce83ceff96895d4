"""Scheduler.decide on hand-built state: the three policies on the same placement code."""

from __future__ import annotations

from launcher.config import PolicyConfig
from launcher.gpustate import GIB, GpuInfo
from launcher.policy import FairShareLedger
from launcher.scheduler import Scheduler
from launcher.spec import JobSpec
from launcher.store import JobRecord

NOW = 100_000.0


def _job(job_id: int, *, user: str = "u", submitted: float = 0.0, **spec: object) -> JobRecord:
    s = JobSpec.model_validate({"name": f"j{job_id}", "command": "x", **spec})
    return JobRecord(id=job_id, submission=job_id, spec=s, uid=1, user=user, state="queued",
                     submitted_at=submitted, queued_at=submitted)


def _gpus(n: int, used: int = 0) -> list[GpuInfo]:
    return [GpuInfo(uuid=f"G{i}", index=i, memory_total_bytes=80 * GIB, memory_used_bytes=used,
                    temperature_c=40.0 + i) for i in range(n)]


def _decide(policy: str, queued: list[JobRecord], gpus: list[GpuInfo],
            running: list[JobRecord] | None = None) -> list[tuple[int, list[str]]]:
    s = Scheduler(PolicyConfig(name=policy))  # type: ignore[arg-type]
    return s.decide(NOW, queued, running or [], gpus, FairShareLedger(3600)).starts


def test_fifo_exclusive_blocks_behind_the_head_and_gives_fractions_whole_gpus() -> None:
    queued = [_job(1, gpu_fraction=0.25), _job(2, gpus=2), _job(3, gpus=1), _job(4, gpus=1)]
    starts = _decide("fifo-exclusive", queued, _gpus(2))
    assert starts == [(1, ["G0"])]  # job 2 needs two GPUs: 3 and 4 wait behind it


def test_first_fit_starts_everything_that_fits_in_order_and_packs_fractions() -> None:
    queued = [_job(1, gpu_fraction=0.25), _job(2, gpus=2), _job(3, gpus=1),
              _job(4, gpu_fraction=0.5)]
    starts = _decide("first-fit", queued, _gpus(2))
    assert starts == [(1, ["G0"]), (3, ["G1"]), (4, ["G0"])]


def test_priority_orders_by_urgency_then_age_and_backfills() -> None:
    queued = [_job(1, urgency="low", submitted=0.0), _job(2, urgency="high", gpus=2,
                                                          submitted=NOW - 10),
              _job(3, urgency="normal", submitted=NOW - 5),
              _job(4, urgency="normal", submitted=NOW - 3600)]
    d = Scheduler(PolicyConfig()).decide(NOW, queued, [], _gpus(3), FairShareLedger(3600))
    assert d.order == [2, 4, 3, 1]
    assert d.starts == [(2, ["G0", "G1"]), (4, ["G2"])]
    assert d.breakdowns[4].age > d.breakdowns[3].age


def test_measured_memory_not_bookkeeping_decides_free() -> None:
    gpus = _gpus(2)
    gpus[0].memory_used_bytes = 30 * GIB  # someone outside the launcher
    starts = _decide("priority", [_job(1), _job(2, gpu_fraction=0.5)], gpus)
    assert starts == [(1, ["G1"]), (2, ["G0"])]
    gpus[0].memory_used_bytes = 50 * GIB  # 30 GiB left: half a GPU (40 GiB) no longer fits
    assert _decide("priority", [_job(2, gpu_fraction=0.5)], gpus[:1]) == []


def test_running_fractional_bookings_count_until_they_show_in_measurement() -> None:
    running = _job(9, gpu_fraction=0.5)
    running.state, running.gpus, running.memory_bytes = "running", ["G0"], 40 * GIB
    starts = _decide("priority", [_job(1, gpu_fraction=0.75)], _gpus(1), [running])
    assert starts == []  # measured 0 used, but 40 GiB and half the GPU are promised
    assert _decide("priority", [_job(1, gpu_fraction=0.5)], _gpus(1), [running]) == \
        [(1, ["G0"])]


def test_preemption_needs_the_wait_threshold_and_a_priority_gap() -> None:
    config = PolicyConfig(preempt_wait_seconds=300, preempt_min_runtime_seconds=0)
    victim = _job(9, urgency="low")
    victim.state, victim.gpus, victim.started_at = "running", ["G0"], NOW - 1000
    s = Scheduler(config)
    fresh = _job(1, urgency="urgent", submitted=NOW - 100)
    assert s.decide(NOW, [fresh], [victim], _gpus(1), FairShareLedger(3600)).preemptions == []
    waited = _job(1, urgency="urgent", submitted=NOW - 400)
    d = s.decide(NOW, [waited], [victim], _gpus(1), FairShareLedger(3600))
    assert d.preemptions == [(9, 1)] and d.victim_cost[9] == 1000.0
    equal = _job(1, urgency="low", submitted=NOW - 400)
    assert s.decide(NOW, [equal], [victim], _gpus(1), FairShareLedger(3600)).preemptions == []
