"""Time in the launcher: `deadline:` and `expected_runtime:` in the spec, resolved at
submission (a local `HH:MM` is the next one; the site's evening default), a warning when
the deadline cannot be met even on an empty node, runtime estimates from the user's
history, least-slack-first ordering within a band, and the joint feasibility test."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from launcher.config import PolicyConfig
from launcher.deadlines import (
    DeadlineJob,
    Estimate,
    forecast_starts,
    jointly_feasible,
    parse_duration,
    runtime_estimate,
)
from launcher.gpustate import GIB, GpuInfo
from launcher.policy import FairShareLedger
from launcher.scheduler import Scheduler
from launcher.sim import SimBehaviour
from launcher.spec import JobSpec, load_submission
from launcher.store import JobRecord
from tests.launcher.harness import Node

HOUR = 3600.0
# 2023-11-14 22:00 UTC: a Tuesday evening on the node's clock for these tests
EVENING = dt.datetime(2023, 11, 14, 22, 0, tzinfo=dt.UTC).timestamp()


def _utc(user: str, t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)


def test_the_spec_takes_a_deadline_and_an_expected_runtime_and_names_every_bad_one() -> None:
    spec = JobSpec(name="a", command="x", deadline="9:00", expected_runtime="4h")
    assert (spec.deadline, spec.expected_runtime) == ("09:00", 4 * HOUR)
    assert JobSpec(name="a", command="x",
                   deadline="2026-03-04T09:00+01:00").deadline == pytest.approx(
        dt.datetime(2026, 3, 4, 8, 0, tzinfo=dt.UTC).timestamp())
    assert parse_duration("90m") == 5400.0 and parse_duration(120) == 120.0
    from gpu_audit.errors import ConfigError

    with pytest.raises(ConfigError) as bad:
        load_submission("name: a\ncommand: x\ndeadline: tomorrow\nexpected_runtime: soon\n")
    text = str(bad.value)
    assert "deadline" in text and "tomorrow" in text and "expected_runtime" in text


def test_a_local_deadline_is_the_next_one_and_stored_absolute() -> None:
    node = Node(gpus=1, now=EVENING)
    node.engine.local_time = _utc
    (job,) = node.submit("name: a\ncommand: x\ndeadline: '09:00'\nexpected_runtime: 2h\n")
    assert node.rec(job).spec.deadline == pytest.approx(EVENING + 11 * HOUR)
    queued = next(e for e in node.store.events(job) if e.kind == "queued")
    assert queued.data["runtime_estimate"] == {"seconds": 2 * HOUR, "source": "spec",
                                            "detail": "the spec"}


def test_the_evening_policy_gives_evening_jobs_the_next_morning_and_is_off_by_default(
        ) -> None:
    assert PolicyConfig().evening_deadline is None
    off = Node(gpus=1, now=EVENING)
    off.engine.local_time = _utc
    (a,) = off.submit("name: a\ncommand: x\n")
    assert off.rec(a).spec.deadline is None
    on = Node(gpus=1, now=EVENING, policy=PolicyConfig(evening_deadline="09:00"))
    on.engine.local_time = _utc
    (b,) = on.submit("name: b\ncommand: x\n")
    assert on.rec(b).spec.deadline == pytest.approx(EVENING + 11 * HOUR)
    on.now = EVENING - 10 * HOUR  # 12:00: a day submission gets none
    (c,) = on.submit("name: c\ncommand: x\n")
    assert on.rec(c).spec.deadline is None


def test_a_deadline_that_cannot_be_met_is_accepted_with_a_loud_warning() -> None:
    """Accepted (the work may still be wanted), never silently: the reason and the
    queued event say it cannot finish in time even on an empty node."""
    node = Node(gpus=1, now=EVENING)
    node.engine.local_time = _utc
    (job,) = node.submit("name: a\ncommand: x\ndeadline: '23:00'\nexpected_runtime: 4h\n")
    rec = node.rec(job)
    assert rec.wait_detail.startswith("DEADLINE CANNOT BE MET: needs ~4.0 h, 1.0 h left")
    queued = next(e for e in node.store.events(job) if e.kind == "queued")
    assert queued.data["warning"].startswith("DEADLINE CANNOT BE MET")


def test_a_runtime_estimate_comes_from_the_users_history_of_the_same_job() -> None:
    node = Node(gpus=1, now=EVENING - 20 * HOUR)
    node.engine.local_time = _utc
    node.submit("name: train\ncommand: x\n")
    node.run(2 * HOUR, step=60.0)  # the simulated job runs its default time
    done = [j for j in node.store.jobs() if j.state == "succeeded"]
    assert done, "the first run must have finished to be history"
    took = (done[0].finished_at or 0) - (done[0].started_at or 0)
    node.now = EVENING
    (again,) = node.submit("name: train\ncommand: x\ndeadline: '09:00'\n")
    est = next(e for e in node.store.events(again) if e.kind == "queued").data[
        "runtime_estimate"]
    assert est["seconds"] == pytest.approx(took)
    assert est["source"] == "history:name"
    assert est["detail"] == "history: 1 run(s) of this name"


def _rec(job_id: int, submitted: float, **spec: object) -> JobRecord:
    s = JobSpec.model_validate({"name": f"j{job_id}", "command": "x", **spec})
    return JobRecord(id=job_id, submission=job_id, spec=s, uid=1, user="u", state="queued",
                     submitted_at=submitted, queued_at=submitted)


def test_least_slack_first_within_a_band_and_other_bands_keep_their_places() -> None:
    now = 100_000.0
    queued = [
        _rec(1, 0.0),  # oldest, no deadline
        _rec(2, 50_000.0, deadline=now + 10 * HOUR, expected_runtime=2 * HOUR),
        _rec(3, 60_000.0, deadline=now + 5 * HOUR, expected_runtime=4 * HOUR),
        _rec(4, 99_000.0, urgency="urgent"),
    ]
    gpus = [GpuInfo(uuid="G0", index=0, memory_total_bytes=80 * GIB, memory_used_bytes=0,
                    temperature_c=40.0)]
    d = Scheduler(PolicyConfig()).decide(now, queued, [], gpus, FairShareLedger(3600))
    assert d.order == [4, 3, 2, 1]
    d = Scheduler(PolicyConfig(deadline_order=False)).decide(
        now, queued, [], gpus, FairShareLedger(3600))
    assert d.order == [4, 1, 2, 3]


def test_joint_feasibility_drops_what_cannot_make_it_together() -> None:
    """Two 1-GPU jobs of 6 h due in 8 h fit a 1-GPU node only one at a time; the third,
    alone impossible, is never counted."""
    jobs = [DeadlineJob("a", 0, 6 * HOUR, 1.0, 8 * HOUR),
            DeadlineJob("b", 0, 6 * HOUR, 1.0, 8 * HOUR),
            DeadlineJob("c", 0, 1 * HOUR, 1.0, 2 * HOUR),
            DeadlineJob("x", 0, 9 * HOUR, 1.0, 8 * HOUR)]
    assert jointly_feasible(jobs, 1.0) in ({"a", "c"}, {"b", "c"})
    assert jointly_feasible(jobs, 2.0) == {"a", "b", "c"}
    quarter = [DeadlineJob(k, 0, 4 * HOUR, 0.25, 4 * HOUR) for k in "pqrs"]
    assert jointly_feasible(quarter, 1.0) == set("pqrs")


def _gpu() -> list[GpuInfo]:
    return [GpuInfo(uuid="G0", index=0, memory_total_bytes=80 * GIB, memory_used_bytes=0,
                    temperature_c=40.0)]


def _running(job_id: int, now: float, **spec: object) -> JobRecord:
    rec = _rec(job_id, now - 50 * HOUR, **spec)
    rec.state, rec.gpus, rec.started_at = "running", ["G0"], now - HOUR
    return rec


def test_a_deadline_job_in_trouble_preempts_checkpointing_work_without_a_deadline() -> None:
    """Same urgency level, the running job older (it outranks the waiter by age): the
    waiter whose slack is under the threshold still takes its GPU; with plenty of slack,
    or with deadline order off, it does not."""
    now = 500_000.0
    config = PolicyConfig(preempt_wait_seconds=300, preempt_min_runtime_seconds=0)
    victim = _running(9, now, checkpoint_dir="/ckpt/9")
    tight = _rec(1, now - 400, deadline=now + 3 * HOUR, expected_runtime=2 * HOUR)
    d = Scheduler(config).decide(now, [tight], [victim], _gpu(), FairShareLedger(3600))
    assert d.preemptions == [(9, 1)]
    loose = _rec(1, now - 400, deadline=now + 10 * HOUR, expected_runtime=2 * HOUR)
    assert Scheduler(config).decide(now, [loose], [victim], _gpu(),
                                    FairShareLedger(3600)).preemptions == []
    off = config.model_copy(update={"deadline_order": False})
    assert Scheduler(off).decide(now, [tight], [victim], _gpu(),
                                 FairShareLedger(3600)).preemptions == []
    uncheckpointed = _running(9, now)
    assert Scheduler(config).decide(now, [tight], [uncheckpointed], _gpu(),
                                    FairShareLedger(3600)).preemptions == []


def test_a_running_deadline_job_is_not_preempted_by_age_alone() -> None:
    """A normal job that outranks a running deadline job only by its age (w_age) would
    make it miss: it waits. An urgent one still preempts it."""
    now = 500_000.0
    config = PolicyConfig(preempt_wait_seconds=300, preempt_min_runtime_seconds=0,
                          preempt_by="priority")
    victim = _running(9, now, checkpoint_dir="/ckpt/9", deadline=now + 6 * HOUR,
                      expected_runtime=6 * HOUR)
    victim.submitted_at = now - HOUR
    old = _rec(1, now - 200 * HOUR)  # normal too, 200 h of age
    d = Scheduler(config).decide(now, [old], [victim], _gpu(), FairShareLedger(3600))
    assert d.preemptions == []
    unprotected = Scheduler(config.model_copy(update={"deadline_order": False})).decide(
        now, [old], [victim], _gpu(), FairShareLedger(3600))
    assert unprotected.preemptions == [(9, 1)]
    urgent = _rec(1, now - 400, urgency="urgent")
    assert Scheduler(config).decide(now, [urgent], [victim], _gpu(),
                                    FairShareLedger(3600)).preemptions == [(9, 1)]


def test_a_job_that_can_no_longer_make_its_deadline_is_deferred_and_says_so() -> None:
    """Least slack first would put every late job ahead of those that can still make it
    (earliest deadline first's domino effect): a late one waits in priority order."""
    now = 500_000.0
    late = _rec(1, now - 60, deadline=now - 600.0, expected_runtime=HOUR)
    can = _rec(2, now - 30, deadline=now + 3 * HOUR, expected_runtime=HOUR)
    older = _rec(3, now - 7200)
    d = Scheduler(PolicyConfig()).decide(now, [late, can, older], [], [], FairShareLedger(3600))
    assert d.order == [2, 3, 1]
    assert d.waits[1][1].startswith("deadline can no longer be met")
    assert d.waits[2][1].startswith("deadline slack 2.0 h")


def test_submit_prints_the_estimated_finish_the_deadline_and_the_warning(
        tmp_path: Path) -> None:
    """`gpu-audit launcher submit` answer: the earliest finish from the estimate, the
    deadline as stored, and the warning when it cannot be met."""
    import orjson

    from gpu_audit_app.launcher.main import _render
    from launcher.config import LauncherCoreConfig
    from launcher.engine import Engine
    from launcher.executor import ProcessExecutor
    from launcher.peer import Caller
    from launcher.protocol import parse_request
    from launcher.service import Service
    from launcher.sim.gpus import SimGpuSource
    from launcher.store import Store
    from launcher.telemetry import Telemetry

    executor = ProcessExecutor(tmp_path / "state", switch_users=False)
    store = Store(tmp_path / "l.db")
    core = LauncherCoreConfig()
    engine = Engine(store, Scheduler(core.policy), SimGpuSource(1), executor,
                    lambda: EVENING, core)
    engine.local_time = _utc
    svc = Service(engine, store, executor, jobmap=None, audit=None, telemetry=Telemetry(),
                  clock=lambda: EVENING)
    caller = Caller(pid=2, uid=4242, gid=4242, groups=frozenset(), user="u", admin=False)
    spec = "{name: a, command: [x], deadline: '23:00', expected_runtime: 4h}"
    request = parse_request(orjson.dumps({"op": "submit", "spec": spec}))
    assert not isinstance(request, dict)
    answer = svc.handle(caller, request)
    assert answer["ok"] is True, answer
    (timing,) = answer["timing"]
    assert timing["deadline"] == pytest.approx(EVENING + HOUR)
    assert timing["earliest_finish"] == pytest.approx(EVENING + 4 * HOUR)
    assert timing["warning"].startswith("DEADLINE CANNOT BE MET")
    text = _render("submit", answer)
    assert "estimated finish" in text and "WARNING: DEADLINE CANNOT BE MET" in text


def test_deadline_jobs_that_cannot_all_make_it_together_defer_one_and_say_so() -> None:
    """One GPU, two 3-hour jobs due in 4 h: each could make it alone, not both. The
    one the joint test drops waits in priority order and its reason says why; the other
    keeps its slack order. A running deadline job counts against the capacity."""
    now = 500_000.0
    a = _rec(1, now - 60, deadline=now + 4 * HOUR, expected_runtime=3 * HOUR)
    b = _rec(2, now - 30, deadline=now + 4 * HOUR + 60, expected_runtime=3 * HOUR)
    busy = [GpuInfo(uuid="G0", index=0, memory_total_bytes=80 * GIB,
                    memory_used_bytes=80 * GIB, temperature_c=40.0)]  # another tenant's
    d = Scheduler(PolicyConfig()).decide(now, [a, b], [], busy, FairShareLedger(3600))
    kept = [j for j in (1, 2) if not d.waits[j][1].startswith("deadline cannot be met "
                                                               "together")]
    assert len(kept) == 1
    deferred = 3 - kept[0]
    assert d.waits[deferred][1].startswith("deadline cannot be met together with the other")
    two = [_gpu()[0], GpuInfo(uuid="G1", index=1, memory_total_bytes=80 * GIB,
                              memory_used_bytes=0, temperature_c=40.0)]
    running = _running(9, now, deadline=now + 4 * HOUR, expected_runtime=4 * HOUR)
    running.gpus = ["G1"]
    d = Scheduler(PolicyConfig()).decide(now, [a, b], [running], two,
                                         FairShareLedger(3600))
    assert d.starts and len(d.starts) == 1  # one free GPU
    waiting = [j for j in (1, 2) if j in d.waits]
    assert len(waiting) == 1
    assert d.waits[waiting[0]][1].startswith("deadline cannot be met together")


def test_a_reservation_keeps_backfill_from_making_a_wide_deadline_job_miss() -> None:
    """Two GPUs; job `a` holds one for another hour. A 2-GPU deadline job (1.5 h, due in
    3 h) cannot start until `a` ends; three 2-hour jobs without a deadline could each
    take a GPU as it frees. Without a reservation they do, one after another, and the
    deadline job starts past 3 h and misses; with one, none starts on a GPU the deadline
    job needs at 1 h (each would still run then), so it starts at 1 h and makes it."""
    def play(reserve: bool) -> tuple[JobRecord, list[JobRecord]]:
        node = Node(gpus=2, policy=PolicyConfig(deadline_reservations=reserve),
                    behaviours={"a": SimBehaviour(work_seconds=HOUR),
                                "wide": SimBehaviour(work_seconds=1.5 * HOUR),
                                **{f"b{i}": SimBehaviour(work_seconds=2 * HOUR)
                                   for i in range(3)}})
        node.submit("name: a\ncommand: x\nexpected_runtime: 1h\n")
        node.run(30.0)
        (wide,) = node.submit(f"name: wide\ncommand: x\ngpus: 2\nexpected_runtime: 90m\n"
                              f"deadline: {node.now + 3 * HOUR}\n")
        fill = [node.submit(f"name: b{i}\ncommand: x\nexpected_runtime: 2h\n")[0]
                for i in range(3)]
        node.run(30.0)
        if reserve:  # said, with when and where
            assert "reserved for it from" in node.rec(wide).wait_detail
            assert "reserved for deadline job" in node.rec(fill[0]).wait_detail
        node.run(7 * HOUR, step=60.0)
        return node.rec(wide), [node.rec(i) for i in fill]

    late, _ = play(reserve=False)
    assert late.finished_at is not None and late.spec.deadline is not None
    assert late.finished_at > late.spec.deadline  # the scenario is a real miss without
    met, fill = play(reserve=True)
    assert met.state == "succeeded" and met.spec.deadline is not None
    assert met.finished_at is not None and met.finished_at <= met.spec.deadline
    assert all(f.state == "succeeded" for f in fill)  # delayed, not starved


def test_backfill_still_starts_what_ends_before_the_reservation_or_uses_other_gpus(
        ) -> None:
    """The reservation holds back only what would delay it: a job that ends before the
    reserved start takes the free GPU, and so does one placed on a GPU the reservation
    does not need."""
    now = 500_000.0
    gpus = [GpuInfo(uuid=f"G{i}", index=i, memory_total_bytes=80 * GIB, memory_used_bytes=0,
                    temperature_c=40.0) for i in range(5)]
    holder = _running(9, now, gpus=2, expected_runtime=2 * HOUR)  # ran 1 h: ends in 1 h
    holder.gpus = ["G0", "G1"]
    wide = _rec(1, now - 60, gpus=4, deadline=now + 4 * HOUR, expected_runtime=2 * HOUR)
    short = _rec(2, now - 50, expected_runtime=0.5 * HOUR)
    long_ = _rec(3, now - 40, expected_runtime=5 * HOUR)
    unknown = _rec(4, now - 30)  # no estimate, no max_runtime: it might never end
    d = Scheduler(PolicyConfig()).decide(now, [wide, short, long_, unknown], [holder],
                                         gpus, FairShareLedger(3600))
    start, uuids = d.reservations[1]
    assert start == pytest.approx(now + HOUR)
    # the busy GPUs first, then free ones: one free GPU stays out of the reservation
    assert set(uuids) == {"G0", "G1", "G2", "G3"}
    started = dict(d.starts)
    assert started[2] == ["G2"]  # ends before the reservation: takes a reserved GPU
    assert started[3] == ["G4"]  # would still run then: only on the GPU not reserved
    assert 4 not in started and "reserved for deadline job 1" in d.waits[4][1]
    assert "reserved for it from" in d.waits[1][1]
    off = Scheduler(PolicyConfig(deadline_reservations=False)).decide(
        now, [wide, short, long_, unknown], [holder], gpus, FairShareLedger(3600))
    assert not off.reservations and len(off.starts) == 3
    # a reservation that starts too late for the deadline would only idle GPUs: none
    hopeless = _rec(1, now - 60, gpus=4, deadline=now + 2.5 * HOUR,
                    expected_runtime=2 * HOUR)
    late = Scheduler(PolicyConfig()).decide(now, [hopeless, short, long_, unknown],
                                            [holder], gpus, FairShareLedger(3600))
    assert not late.reservations and len(late.starts) == 3


def test_a_running_jobs_estimate_comes_from_its_progress_first() -> None:
    """The spec said 10 h; the job reports it is 90 % through at a rate that leaves 1 h:
    the reservation behind it, its slack and the sources say so. A report from an earlier
    attempt, or one without a throughput, does not count; past its spec estimate
    without progress, a job is taken to need until its max_runtime."""
    now = 500_000.0
    holder = _running(9, now, gpus=1, expected_runtime=10 * HOUR, deadline=now + 1.5 * HOUR)
    holder.attempt = 2
    holder.progress = {"time": now - 60, "attempt": 2, "step": 9000, "total_steps": 10000,
                       "steps_per_second": 1000 / (HOUR + 60)}
    est = runtime_estimate(holder, now)
    assert est.source == "progress" and est.remaining == pytest.approx(HOUR)
    assert est.total == pytest.approx(2 * HOUR)  # ran 1 h, 1 h left
    wide = _rec(1, now - 60, gpus=1, deadline=now + 4 * HOUR, expected_runtime=HOUR)
    sched = Scheduler(PolicyConfig())
    d = sched.decide(now, [wide], [holder], _gpu(), FairShareLedger(3600))
    assert d.reservations[1][0] == pytest.approx(now + HOUR)
    assert sched._running_slack(holder) == pytest.approx(0.5 * HOUR)

    stale = {**holder.progress, "attempt": 1}
    holder.progress = stale
    assert runtime_estimate(holder, now).source == "spec"
    holder.progress = {"time": now - 60, "attempt": 2, "step": 9000, "total_steps": 10000}
    assert runtime_estimate(holder, now).remaining == pytest.approx(9 * HOUR)
    late = _running(8, now, expected_runtime=0.5 * HOUR, max_runtime_seconds=3 * HOUR)
    assert runtime_estimate(late, now) == Estimate(3 * HOUR, 2 * HOUR, "max_runtime")
    waiting = _rec(7, now, max_runtime_seconds=HOUR)
    assert runtime_estimate(waiting, now) == Estimate(HOUR, HOUR, "max_runtime")
    assert runtime_estimate(_rec(6, now), now) == Estimate(None, None, "none")
    hist = _rec(5, now, expected_runtime=HOUR, expected_runtime_source="history:command")
    assert runtime_estimate(hist, now).source == "history:command"


def test_forecast_starts_follow_the_order_from_the_running_jobs_estimated_ends() -> None:
    now = 1000.0
    # two GPUs: one free now, one until 1000 s from now
    starts = forecast_starts(now, 2.0, [(now + 1000, 1.0)],
                             [(1, 1.0, 500.0), (2, 2.0, 100.0), (3, 1.0, None),
                              (4, 0.5, 10.0), (5, 2.0, 10.0), (6, 3.0, 1.0)])
    assert starts[1] == now  # the free GPU
    assert starts[2] == now + 1000  # both GPUs: when the running one ends
    assert starts[3] == now + 1100 and starts[4] == now + 1100
    assert starts[5] is None  # behind a job with no estimate holding a GPU for good
    assert starts[6] is None  # more GPUs than the node has


def test_a_gpu_is_reserved_for_one_deadline_job_at_a_time() -> None:
    """Two deadline jobs wait for the one GPU: the first (least slack) reserves it; the
    second gets no reservation on the same GPU (it would be a promise nobody keeps), and
    1,000 such jobs cost one search per shape."""
    now = 500_000.0
    holder = _running(9, now, expected_runtime=2 * HOUR)
    first = _rec(1, now - 60, deadline=now + 3 * HOUR, expected_runtime=HOUR)
    second = _rec(2, now - 50, deadline=now + 4 * HOUR, expected_runtime=HOUR)
    d = Scheduler(PolicyConfig()).decide(now, [first, second], [holder], _gpu(),
                                         FairShareLedger(3600))
    assert list(d.reservations) == [1] and d.reservations[1][1] == ["G0"]
    many = [_rec(10 + i, now - i, deadline=now + 10 * HOUR + i, expected_runtime=HOUR)
            for i in range(1000)]
    d = Scheduler(PolicyConfig()).decide(now, many, [holder], _gpu(), FairShareLedger(3600))
    assert len(d.reservations) == 1


def test_a_job_past_the_end_its_progress_promised_is_not_ending_now_forever() -> None:
    """A job whose reported throughput said it would be done an hour ago and is still
    running (stalled, or lying) would otherwise read "0 s left" at every decision, and a
    reservation behind it would keep free GPUs idle: it falls back to the spec and its
    limit."""
    now = 500_000.0
    stalled = _running(9, now, expected_runtime=0.5 * HOUR, max_runtime_seconds=4 * HOUR)
    # 36 min ago: one step of 20 left at 10 steps/h, so done 30 min ago by its word
    stalled.progress = {"time": now - 0.6 * HOUR, "attempt": 0, "step": 19,
                        "total_steps": 20, "steps_per_second": 10 / HOUR}
    est = runtime_estimate(stalled, now)
    assert est.source == "max_runtime" and est.remaining == pytest.approx(3 * HOUR)
