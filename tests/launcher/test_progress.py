"""The remaining-time estimate and what is kept of a job's progress report: a job is
hostile, so every field is bounded and a report without what an estimate needs gives
none (never an invented one)."""

from __future__ import annotations

import json
import math

import pytest

from launcher.progress import (
    MAX_REMAINING_SECONDS,
    MAX_STEPS,
    Progress,
    clean_environment,
    estimate_remaining,
    format_duration,
    fraction,
    progress_of,
)
from launcher.store import Store
from launcher.telemetry import Telemetry


def _p(**doc: object) -> Progress:
    return progress_of(doc, 1000.0, 1)


def test_eta_is_remaining_steps_over_throughput_less_time_since() -> None:
    p = _p(step=40, total_steps=100, steps_per_second=2.0, loss=0.5, epoch=1)
    assert estimate_remaining(p, 1000.0) == 30.0
    assert estimate_remaining(p, 1010.0) == 20.0
    assert estimate_remaining(p, 2000.0) == 0.0  # overdue: 0, never negative
    assert fraction(p) == 0.4


def test_no_estimate_without_what_it_needs() -> None:
    assert estimate_remaining(None, 0) is None
    assert estimate_remaining(_p(step=1, total_steps=10), 1000) is None  # no throughput
    assert estimate_remaining(_p(step=1, steps_per_second=3.0), 1000) is None  # no total
    assert estimate_remaining(_p(total_steps=10, steps_per_second=3.0), 1000) is None
    assert fraction(_p(step=3)) is None


@pytest.mark.parametrize("field,value", [
    ("step", math.nan), ("step", -1), ("step", 1.5), ("step", True), ("step", "12"),
    ("step", math.inf), ("step", MAX_STEPS + 1), ("step", 1e300), ("step", None),
])
def test_a_hostile_step_is_dropped(field: str, value: object) -> None:
    p = _p(**{field: value, "total_steps": 100, "steps_per_second": 1.0})
    assert p.step is None and estimate_remaining(p, 1000) is None


@pytest.mark.parametrize("doc", [
    {"total_steps": 10**30}, {"total_steps": -5}, {"total_steps": 0},
    {"total_steps": math.nan}, {"total_steps": "inf"},
    {"steps_per_second": 0}, {"steps_per_second": -3.0}, {"steps_per_second": math.nan},
    {"steps_per_second": math.inf}, {"steps_per_second": 1e15}, {"steps_per_second": "nan"},
])
def test_hostile_totals_and_throughputs_give_no_estimate(doc: dict[str, object]) -> None:
    p = _p(**{"step": 5, "total_steps": 100, "steps_per_second": 1.0, **doc})
    assert estimate_remaining(p, 1000) is None


def test_an_absurd_estimate_is_none_and_a_step_past_the_total_is_done() -> None:
    slow = _p(step=0, total_steps=MAX_STEPS, steps_per_second=1e-9)
    assert estimate_remaining(slow, 1000) is None
    edge = _p(step=0, total_steps=int(MAX_REMAINING_SECONDS), steps_per_second=1.0)
    assert estimate_remaining(edge, 1000) == MAX_REMAINING_SECONDS
    past = _p(step=150, total_steps=100, steps_per_second=1.0)
    assert fraction(past) == 1.0 and estimate_remaining(past, 1000) == 0.0


def test_hostile_loss_and_epoch_are_dropped() -> None:
    for loss in (math.nan, math.inf, -math.inf, "nan", 1e308, True):
        assert _p(step=1, loss=loss).loss is None
    assert _p(step=1, loss=-2.5).loss == -2.5
    for epoch in (-1, 0.5, math.nan, 10**12):
        assert _p(step=1, epoch=epoch).epoch is None


def test_stored_progress_round_trips_and_damage_reads_as_none() -> None:
    p = _p(step=3, total_steps=9, steps_per_second=1.5, loss=0.1, epoch=0)
    assert Progress.from_dict(json.loads(json.dumps(p.as_dict()))) == p
    assert Progress.from_dict({"time": "x", "attempt": 1}) is None
    assert Progress.from_dict({"time": 1.0, "attempt": None}) is None


def test_environment_is_bounded_and_cleaned() -> None:
    doc: dict[str, object] = {"python": "3.12.3", "torch": "2.6.0+cu124", "cudnn": 90100,
                              "nccl": None, "event": "environment", "pid": 7,
                              "Bad Key": "x", "nested": {"a": 1}, "flag": True,
                              "long": "x" * 10_000, "ctl": "a\x1b[31mb\n"}
    doc.update({f"k{i:03d}": "v" for i in range(100)})
    env = clean_environment(doc)
    assert env["python"] == "3.12.3" and env["cudnn"] == 90100 and env["nccl"] is None
    assert "event" not in env and "pid" not in env and "Bad Key" not in env
    assert "nested" not in env and "flag" not in env
    assert len(env) <= 24 and all(len(str(v)) <= 64 for v in env.values())


def test_format_duration() -> None:
    assert [format_duration(s) for s in (None, 5, 125, 3 * 3600 + 420, 2 * 86400 + 4 * 3600)] \
        == ["-", "5s", "2m05s", "3h07m", "2d04h"]


def test_store_keeps_progress_and_environment() -> None:
    from launcher.spec import JobSpec

    s = Store(":memory:")
    (job,) = s.add_jobs([JobSpec(name="a", command=["true"])], 1000, "alice", 1.0)
    assert s.get(job).progress is None  # type: ignore[union-attr]
    s.update(job, progress=_p(step=2, total_steps=4).as_dict(),
             environment={"python": "3.12.3"})
    rec = s.get(job)
    assert rec is not None and rec.progress is not None
    assert Progress.from_dict(rec.progress) == _p(step=2, total_steps=4)
    assert rec.environment == {"python": "3.12.3"}


def test_telemetry_exports_progress_and_drops_hostile_values() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    now = [1000.0]
    t = Telemetry(clock=lambda: now[0])
    t.job_started(1, "a", "u", "p", 1)
    t.job_event(1, {"event": "metrics", "time": 1000.0, "step": 50, "total_steps": 100,
                    "steps_per_second": 5.0, "epoch": 2, "loss": 0.3})
    t.job_started(2, "b", "u", "p", 1)
    t.job_event(2, {"event": "metrics", "time": 5e10, "step": 1, "total_steps": 1e40,
                    "steps_per_second": math.nan, "loss": math.inf, "epoch": -1})
    now[0] = 1004.0
    reg = CollectorRegistry()
    reg.register(t)
    fams = {f.name: {s.labels["job"]: s.value for s in f.samples}
            for f in text_string_to_metric_families(generate_latest(reg).decode())
            if f.name.startswith("gpu_audit_launcher_job_")}
    assert fams["gpu_audit_launcher_job_eta_seconds"] == {"1": 6.0}
    assert fams["gpu_audit_launcher_job_progress_ratio"] == {"1": 0.5}
    assert fams["gpu_audit_launcher_job_total_steps"] == {"1": 100}
    assert fams["gpu_audit_launcher_job_epoch"] == {"1": 2}
    assert fams["gpu_audit_launcher_job_loss"] == {"1": 0.3}
    assert fams["gpu_audit_launcher_job_step"] == {"1": 50, "2": 1}
    assert fams["gpu_audit_launcher_job_metric"] == {}  # progress fields are not user metrics
