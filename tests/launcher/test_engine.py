"""The engine on a simulated node in virtual time: dependencies, retries, preemption,
victim choice, health, the release barrier, identity, authorization, fair share."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from launcher.config import EngineConfig, LauncherCoreConfig, PolicyConfig
from launcher.constants import EXIT_PREEMPTED, EXIT_SIGKILL
from launcher.engine import BadState, Engine, LauncherError, PermissionDenied, Report
from launcher.gpustate import GIB
from launcher.scheduler import Scheduler
from launcher.sim import SimBehaviour
from launcher.spec import load_submission
from launcher.store import Store
from tests.launcher.harness import Node

PIPELINE = """
user: alice
project: vision
jobs:
  - {name: prepare, command: python prep.py, gpus: 0}
  - {name: train, command: [python, train.py], gpus: 2, after: [prepare],
     checkpoint_dir: /ckpt/train}
  - {name: evaluate, command: python eval.py, gpu_fraction: 0.5, after: [train]}
  - {name: report, command: python report.py, gpus: 0, after: [evaluate]}
"""


def _started(node: Node, job_id: int) -> list[float]:
    return [e.time for e in node.store.events(job_id)
            if e.kind in ("started", "resumed", "restarted")]


def test_pipeline_runs_in_dependency_order_with_identity() -> None:
    node = Node(behaviours={"prepare": SimBehaviour(work_seconds=60),
                            "train": SimBehaviour(work_seconds=600),
                            "evaluate": SimBehaviour(work_seconds=120),
                            "report": SimBehaviour(work_seconds=30)})
    ids = node.submit(PIPELINE)
    node.run(3600)
    assert [node.rec(i).state for i in ids] == ["succeeded"] * 4
    finished = {i: node.rec(i).finished_at for i in ids}
    for before, after in itertools.pairwise(ids):
        (start,) = _started(node, after)
        assert start >= finished[before]  # type: ignore[operator]
    env = {job: e for _, job, _, _, e in node.executor.started}[ids[1]]
    assert env["JOB_ID"] == str(ids[1]) and env["USER"] == "alice"
    assert env["PROJECT_NAME"] == "vision" and env["RUN_ATTEMPT"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    uuids = env["GPU_AUDIT_GPU_UUIDS"].split(",")
    assert len(uuids) == 2 and env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["GPU_AUDIT_CHECKPOINT_DIR"] == "/ckpt/train"
    assert env["GPU_AUDIT_PREEMPT_SIGNAL"] == "SIGUSR1"
    prep_env = {job: e for _, job, _, _, e in node.executor.started}[ids[0]]
    assert prep_env["CUDA_VISIBLE_DEVICES"] == ""


def test_failed_dependency_cancels_the_rest_with_reason() -> None:
    node = Node(behaviours={"prepare": SimBehaviour(work_seconds=600, fail_after_seconds=30)})
    ids = node.submit(PIPELINE)
    node.run(600)
    states = [node.rec(i).state for i in ids]
    assert states == ["failed", "cancelled", "cancelled", "cancelled"]
    assert node.rec(ids[1]).reason == f"dependency job {ids[0]} failed"
    assert node.rec(ids[3]).reason == f"dependency job {ids[2]} cancelled"
    assert node.executor.started and all(j == ids[0] for _, j, *_ in node.executor.started)


def test_requeue_with_exponential_backoff_up_to_max_retries() -> None:
    node = Node(engine_config=EngineConfig(backoff_base_seconds=60),
                default=SimBehaviour(fail_after_seconds=20, exit_code=3))
    (job,) = node.submit("{name: flaky, command: x, max_retries: 2}")
    node.run(2000, step=5)
    rec = node.rec(job)
    assert rec.state == "failed" and rec.attempt == 3 and rec.failures == 3
    assert rec.reason == "exit code 3 (after 2 retries)"
    starts = _started(node, job)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # each attempt runs 20 s, then waits 60 s, then 120 s (tick granularity 5 s)
    assert 80 <= gaps[0] < 90 and 140 <= gaps[1] < 150
    assert node.kinds(job).count("requeued") == 2


def test_retry_that_succeeds_and_oom_is_classified() -> None:
    node = Node(default=SimBehaviour(work_seconds=100, fail_after_seconds=10, oom=True,
                                     exit_code=1, fail_attempts=1))
    (job,) = node.submit("{name: big, command: x, max_retries: 1}")
    node.run(1000)
    assert node.rec(job).state == "succeeded"
    (req,) = node.store.events(job, "requeued")
    assert req.data["kind"] == "oom"


def test_max_runtime_signals_then_times_out() -> None:
    node = Node(default=SimBehaviour(work_seconds=10_000, checkpoint_seconds=5))
    (job,) = node.submit("{name: long, command: x, max_runtime_seconds: 300,"
                         " checkpoint_dir: /c, max_retries: 3}")
    node.run(1000)
    rec = node.rec(job)
    assert rec.state == "timed_out" and rec.attempt == 1
    assert node.store.events(job, "preempt_signal")[0].data["reason"] == "timeout"


def test_preemption_checkpoints_requeues_and_resumes_with_measurements() -> None:
    policy = PolicyConfig(preempt_wait_seconds=60, preempt_min_runtime_seconds=60)
    node = Node(gpus=1, policy=policy, behaviours={
        "low": SimBehaviour(work_seconds=1000, checkpoint_interval_seconds=100,
                            checkpoint_seconds=4, exit_after_commit_seconds=2),
        "urgent": SimBehaviour(work_seconds=200)})
    (low,) = node.submit("{name: low, command: x, urgency: low, checkpoint_dir: /c}")
    node.run(250)
    (urgent,) = node.submit("{name: urgent, command: x, urgency: urgent}", uid=1001,
                            user="bob")
    node.run(3000)
    assert node.rec(low).state == "succeeded" and node.rec(urgent).state == "succeeded"
    (pre,) = node.store.events(low, "preempted")
    assert pre.data["clean"] and pre.data["code"] == EXIT_PREEMPTED
    assert pre.data["signal_to_commit_seconds"] == pytest.approx(4)
    assert pre.data["commit_to_exit_seconds"] == pytest.approx(2)
    assert pre.data["lost_gpu_seconds"] == pytest.approx(2)  # only commit -> exit
    assert pre.data["for_job"] == urgent
    (resumed,) = node.store.events(low, "resumed")
    assert resumed.data["attempt"] == 2 and resumed.data["checkpoint_step"] > 300
    assert node.rec(low).attempt == 2 and node.rec(low).failures == 0
    # the urgent job started on the GPU only after the victim left it
    (u_start,) = _started(node, urgent)
    assert u_start >= pre.time
    assert u_start - node.store.events(urgent, "queued")[0].time < 60 + 60
    (dec,) = [d for d in node.store.decisions(low) if d[2] == "preempt"]
    assert dec[3]["for_job"] == urgent and dec[3]["victim"]["total"] < dec[3]["waiter"]["total"]


def test_a_job_ignoring_the_signal_is_killed_after_the_grace() -> None:
    policy = PolicyConfig(preempt_wait_seconds=0, preempt_min_runtime_seconds=0)
    node = Node(gpus=1, policy=policy, engine_config=EngineConfig(preempt_grace_seconds=90),
                behaviours={"stubborn": SimBehaviour(work_seconds=5000, ignores_signal=True,
                                                     checkpoint_interval_seconds=50),
                            "urgent": SimBehaviour(work_seconds=100)})
    (stubborn,) = node.submit("{name: stubborn, command: x, urgency: low, checkpoint_dir: /c}")
    node.run(120)
    node.submit("{name: urgent, command: x, urgency: urgent}")
    node.run(400)
    (kill,) = node.store.events(stubborn, "preempt_kill")
    assert kill.data["after_seconds"] == pytest.approx(90, abs=10)
    (pre,) = node.store.events(stubborn, "preempted")
    assert pre.data["code"] == EXIT_SIGKILL and not pre.data["clean"]
    # it kept its periodic checkpoints, so only the work since the last one is lost
    assert 0 < pre.data["lost_gpu_seconds"] <= 50


def test_victim_is_the_running_job_with_least_uncheckpointed_gpu_time() -> None:
    policy = PolicyConfig(preempt_wait_seconds=30, preempt_min_runtime_seconds=0)
    intervals = {"a": 900, "b": 120, "c": 400, "d": None}
    node = Node(gpus=4, policy=policy, behaviours={
        n: SimBehaviour(work_seconds=50_000, checkpoint_interval_seconds=i)
        for n, i in intervals.items()} | {"urgent": SimBehaviour(work_seconds=100)})
    users = {"a": "ann", "b": "bea", "c": "cal", "d": "dan"}
    ids = {n: node.submit(f"{{name: {n}, command: x, urgency: low, checkpoint_dir: /c}}",
                          uid=2000 + k, user=users[n])[0]
           for k, n in enumerate(intervals)}
    node.run(1000)  # a: ckpt at 900 (100 s ago), b: at 960 (~40 s), c: at 800, d: never
    uncheckpointed = {n: node.rec(i).uncheckpointed_gpu_seconds(node.now)
                      for n, i in ids.items()}
    assert min(uncheckpointed, key=uncheckpointed.__getitem__) == "b"
    (urgent,) = node.submit("{name: urgent, command: x, urgency: urgent}", uid=3000,
                            user="eve")
    node.run(300)
    preempted = [n for n, i in ids.items() if node.store.events(i, "preempted")]
    assert preempted == ["b"]
    assert node.rec(urgent).state in ("running", "succeeded")


def test_dozen_jobs_from_several_users_start_by_priority_and_fair_share() -> None:
    policy = PolicyConfig(preemption=False, w_fairshare_user=100.0)
    node = Node(gpus=4, policy=policy, default=SimBehaviour(work_seconds=600))
    # heavy has already used 2 GPU-hours (measured) this week
    node.engine.ledger.charge(node.now, "heavy", "p1", 2 * 3600)
    ids: dict[str, int] = {}
    plan = [("heavy", "h1", "normal"), ("heavy", "h2", "normal"), ("heavy", "h3", "normal"),
            ("heavy", "h4", "normal"), ("light", "l1", "normal"), ("light", "l2", "normal"),
            ("light", "l3", "low"), ("mid", "m1", "high"), ("mid", "m2", "normal"),
            ("mid", "m3", "low"), ("light", "l4", "urgent"), ("heavy", "h5", "low")]
    uids = {"heavy": 1001, "light": 1002, "mid": 1003}
    for user, name, urg in plan:
        ids[name] = node.submit(f"{{name: {name}, command: x, urgency: {urg}}}",
                                uid=uids[user], user=user)[0]
        node.now += 1
    node.run(4000)
    assert all(node.rec(i).state == "succeeded" for i in ids.values())
    names = {i: n for n, i in ids.items()}
    order = [names[d[1]] for d in node.store.decisions() if d[2] == "start"]  # as decided
    first_wave = set(order[:4])
    assert first_wave == {"l4", "m1", "l1", "l2"}  # urgent, high, then light's normal
    # among normal-urgency jobs the heavy user's come after everybody else's
    normals = [n for n in order if n in {"h1", "h2", "h3", "h4", "l1", "l2", "m2"}]
    assert normals[:3] == ["l1", "l2", "m2"]
    # every start is stored with its breakdown
    starts = [d for d in node.store.decisions() if d[2] == "start"]
    assert len(starts) == 12
    assert all({"total", "urgency", "tier", "age", "fairshare_user"} <= d[3].keys()
               for d in starts)


def test_hot_throttling_and_xid_gpus_are_skipped() -> None:
    node = Node(gpus=4, default=SimBehaviour(work_seconds=10_000))
    node.sim.set_temperature(0, 92.0)
    node.sim.xid(1, node.now - 60)
    node.sim.set_throttling(2, True)
    (one,) = node.submit("{name: one, command: x}")
    (two,) = node.submit("{name: two, command: x, gpus: 2}")
    node.run(60)
    assert node.rec(one).gpus == [node.sim.gpu(3).uuid]
    assert node.rec(two).state == "queued"
    d = node.engine.last_decision
    assert d is not None and d.unusable[node.sim.gpu(0).uuid].startswith("too hot")
    assert d.unusable[node.sim.gpu(1).uuid] == "recent XID"
    assert d.unusable[node.sim.gpu(2).uuid] == "throttling"
    node.sim.set_temperature(0, 60.0)
    node.sim.set_throttling(2, False)
    node.run(30)
    assert sorted(node.rec(two).gpus) == [node.sim.gpu(0).uuid, node.sim.gpu(2).uuid]


def test_release_barrier_catches_a_leaked_process() -> None:
    node = Node(gpus=1, behaviours={"leaky": SimBehaviour(work_seconds=100, leak=True),
                                    "next": SimBehaviour(work_seconds=100)})
    (leaky,) = node.submit("{name: leaky, command: x}")
    (nxt,) = node.submit("{name: next, command: x}")
    gpu = node.sim.gpu(0)
    node.run(110, step=10)  # leaky exits at ~t+110
    assert node.rec(leaky).state == "succeeded"
    (leak,) = node.store.events(leaky, "leak")
    assert leak.data["gpu"] == gpu.uuid and leak.data["bytes"] == 256 * 2**20
    assert node.rec(nxt).state == "queued"  # not placed while the leak held the GPU
    node.run(30)
    assert node.store.events(leaky, "leak_cleared")
    assert node.rec(nxt).state == "running"
    assert _started(node, nxt)[0] > leak.time


def test_a_foreign_process_makes_a_gpu_busy_whatever_the_bookkeeping_says() -> None:
    node = Node(gpus=2, default=SimBehaviour(work_seconds=10_000, memory_bytes=20 * GIB))
    node.sim.gpu(0).foreign_used_bytes = 40 * GIB
    (whole,) = node.submit("{name: whole, command: x}")
    (frac,) = node.submit("{name: frac, command: x, gpu_fraction: 0.25, "
                          "gpu_memory_bytes: 20GiB}")
    (whole2,) = node.submit("{name: whole2, command: x}")
    node.run(30)
    assert node.rec(whole).gpus == [node.sim.gpu(1).uuid]
    assert node.rec(frac).gpus == [node.sim.gpu(0).uuid]  # 40 GiB free is enough for it
    assert node.rec(whole2).state == "queued"


def test_fractions_pack_by_memory_and_overuse_is_an_event() -> None:
    node = Node(gpus=2, default=SimBehaviour(work_seconds=10_000, memory_bytes=15 * GIB),
                behaviours={"greedy": SimBehaviour(work_seconds=10_000, memory_bytes=30 * GIB)})
    ids = [node.submit(f"{{name: f{k}, command: x, gpu_fraction: 0.25, "
                       "gpu_memory_bytes: 20GiB}")[0] for k in range(4)]
    (greedy,) = node.submit("{name: greedy, command: x, gpu_fraction: 0.25,"
                            " gpu_memory_bytes: 16GiB}")
    node.run(60)
    gpus = {tuple(node.rec(i).gpus) for i in ids}
    assert len(gpus) == 1  # packed onto one GPU, the other left whole
    assert node.rec(greedy).state == "running"
    node.run(30)
    (over,) = node.store.events(greedy, "over_fraction")
    assert over.data["used_bytes"] == 30 * GIB and over.data["admitted_bytes"] == 16 * GIB


@pytest.mark.parametrize("fault", ["XID", "lost"])
def test_gpu_fault_checkpoints_and_requeues_on_a_healthy_one(fault: str) -> None:
    node = Node(gpus=2, default=SimBehaviour(work_seconds=2000, checkpoint_interval_seconds=300))
    (job,) = node.submit("{name: j, command: x, checkpoint_dir: /c}")
    node.run(400)
    first = node.rec(job).gpus[0]
    if fault == "XID":
        node.sim.xid(first, node.now)
    else:
        node.sim.set_up(first, False)
    node.run(4000)
    rec = node.rec(job)
    assert rec.state == "succeeded" and rec.failures == 0 and rec.attempt == 2
    assert rec.gpus != [first]
    (event,) = node.store.events(job, "gpu_fault")
    assert event.data == {"gpus": [first], "fault": fault}
    (pre,) = node.store.events(job, "preempted")
    assert pre.data["reason"] == f"gpu_{fault.lower()}" and pre.data["clean"]


def test_only_the_owner_or_an_admin_may_cancel_hold_or_release() -> None:
    node = Node(gpus=1, default=SimBehaviour(work_seconds=10_000))
    (running,) = node.submit("{name: r, command: x}", uid=1000, user="alice")
    (waiting,) = node.submit("{name: w, command: x}", uid=1000, user="alice")
    node.run(20)
    with pytest.raises(PermissionDenied):
        node.engine.cancel(waiting, uid=1001)
    with pytest.raises(PermissionDenied):
        node.engine.hold(waiting, uid=1001)
    assert node.rec(waiting).state == "queued"
    node.engine.hold(waiting, uid=1000)
    with pytest.raises(BadState):
        node.engine.hold(waiting, uid=1000)
    node.engine.release(waiting, uid=1000)
    node.engine.cancel(running, uid=1001, is_admin=True)
    node.run(20)
    assert node.rec(running).state == "cancelled"
    assert node.rec(waiting).state == "running"
    with pytest.raises(PermissionDenied):
        node.engine.submit([node.job("x", user="bob")], uid=1000, user="alice")


def test_fair_share_charges_measured_use_not_allocation() -> None:
    node = Node(gpus=2, policy=PolicyConfig(preemption=False), behaviours={
        "notebook": SimBehaviour(work_seconds=3600, utilization=0.0),
        "train": SimBehaviour(work_seconds=3600, utilization=0.9)})
    (nb,) = node.submit("{name: notebook, command: x, project: pa}", uid=1, user="idle")
    (tr,) = node.submit("{name: train, command: x, project: pb}", uid=2, user="busy")
    node.run(3700)
    assert node.rec(nb).allocated_gpu_seconds == pytest.approx(node.rec(tr).allocated_gpu_seconds)
    assert node.rec(nb).measured_gpu_seconds == 0.0
    assert node.rec(tr).measured_gpu_seconds == pytest.approx(0.9 * 3600, rel=0.02)
    assert node.engine.ledger.usage("user", "idle", node.now) == 0.0
    assert node.engine.ledger.usage("project", "pb", node.now) > 3000
    # the next jobs: the busy user's now ranks below the idle one's
    a = node.submit("{name: a, command: x}", uid=1, user="idle")[0]
    b = node.submit("{name: b, command: x}", uid=2, user="busy")[0]
    view = [j.id for j, _ in node.engine.queue_view()]
    assert view.index(a) < view.index(b)


def test_engine_restart_mid_queue_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """A daemon restarted mid-queue (new Store and Engine on the same file; the jobs'
    processes live on) finishes every job exactly once and keeps the fair-share ledger
    and the release barrier."""
    node = Node(gpus=4, store_path=str(tmp_path / "state.db"),
                default=SimBehaviour(work_seconds=300),
                behaviours={"leaky": SimBehaviour(work_seconds=85, leak=True)})
    reap = node.executor.kill_group
    node.executor.kill_group = lambda _job: None  # type: ignore[method-assign]
    ids = [node.submit(f"{{name: j{k}, command: x, urgency: {['low', 'high'][k % 2]}}}",
                       uid=1000 + k % 3, user=f"u{k % 3}")[0] for k in range(11)]
    ids.append(node.submit("{name: leaky, command: x, urgency: urgent}")[0])
    node.run(100)  # the leaky job has exited and its worker still holds the GPU
    assert node.store.barriers()
    usage = node.engine.ledger.usage("user", "u1", node.now)
    node.store.close()
    node.store = Store(str(tmp_path / "state.db"))
    node.engine = Engine(node.store, Scheduler(node.policy), node.sim, node.executor,
                         node.clock, LauncherCoreConfig(policy=node.policy))
    assert node.engine.ledger.usage("user", "u1", node.now) == pytest.approx(usage)
    assert node.engine.blocked_gpus == {node.store.events(ids[-1], "started")[0].data[
        "gpus"][0]}
    node.executor.kill_group = reap  # type: ignore[method-assign]
    node.run(3000)
    assert [node.rec(i).state for i in ids] == ["succeeded"] * 12
    starts = [job for _, job, *_ in node.executor.started]
    assert sorted(starts) == sorted(ids)  # each exactly once


def test_a_job_asking_for_more_gpus_than_the_node_has_is_refused() -> None:
    node = Node(gpus=2)
    node.run(10)
    with pytest.raises(LauncherError) as info:
        node.submit("{name: big, command: x, gpus: 4}")
    assert info.value.problems == ["big: needs 4 GPUs; this node has 2: it can never run"]


def test_freed_gpus_are_kept_for_the_waiter_not_taken_by_lower_jobs() -> None:
    """A 2-GPU urgent job preempts both running jobs; the GPUs they free one after the
    other go to it, not to the low-urgency job waiting behind it."""
    policy = PolicyConfig(preempt_wait_seconds=60, preempt_min_runtime_seconds=0)
    node = Node(gpus=2, policy=policy, behaviours={
        "fast": SimBehaviour(work_seconds=50_000, checkpoint_seconds=2),
        "slow": SimBehaviour(work_seconds=50_000, checkpoint_seconds=60),
        "big": SimBehaviour(work_seconds=100)})
    node.submit("{name: fast, command: x, urgency: low, checkpoint_dir: /c}")
    node.submit("{name: slow, command: x, urgency: low, checkpoint_dir: /c}")
    node.run(100)
    (big,) = node.submit("{name: big, command: x, gpus: 2, urgency: urgent}")
    node.run(20)
    (behind,) = node.submit("{name: behind, command: x, urgency: normal}")
    node.run(300)
    victims = {e.job_id for e in node.store.events(kind="preempt_signal")}
    assert len(victims) == 2
    assert node.rec(big).state in ("running", "succeeded")
    (big_start,) = _started(node, big)
    behind_starts = _started(node, behind)
    assert not behind_starts or behind_starts[0] >= big_start


def test_step_reports_are_kept_as_job_events_at_most_once_an_interval() -> None:
    """A training loop reports every step; storing each would be a row per step."""
    node = Node(gpus=1, default=SimBehaviour(work_seconds=10_000),
                engine_config=EngineConfig(telemetry_event_interval_seconds=60.0))
    (job,) = node.submit("{name: t, command: x}")
    node.run(10)
    for step in range(300):  # 300 steps over 150 s
        node.executor._reports.append(
            Report(job, node.now + step * 0.5, "telemetry", {"step": step, "loss": 1.0}))
    node.run(10)
    kept = [e.data["step"] for e in node.store.events(job, "telemetry")]
    assert kept == [0, 120, 240]


@pytest.mark.parametrize(("preempt_by", "preempts"), [("priority", True), ("urgency", False)])
def test_preempt_by_urgency_lets_fair_share_order_the_queue_but_not_preempt(
        preempt_by: str, preempts: bool) -> None:
    """Two normal-urgency jobs: the waiter's fair share puts it 1,000 points above the
    running one. `preempt_by: priority` preempts for that; `preempt_by: urgency` (Slurm's
    preemption by QOS) waits, since both are the same level."""
    policy = PolicyConfig(preempt_wait_seconds=0, preempt_min_runtime_seconds=0,
                          preempt_by=preempt_by)  # type: ignore[arg-type]
    node = Node(gpus=1, policy=policy, default=SimBehaviour(work_seconds=50_000))
    node.engine.ledger.charge(node.now, "heavy", "p-heavy", 100 * 3600.0)
    (running,) = node.engine.submit(load_submission(
        "{name: long, command: x, checkpoint_dir: /c, project: p-heavy}"), 1001, "heavy")
    node.run(20)
    node.submit("{name: mine, command: x}")
    node.run(20)
    assert ("preempt_signal" in node.kinds(running)) is preempts


def test_a_jobs_reported_events_are_capped_and_its_newest_checkpoint_kept() -> None:
    """A job reporting a checkpoint every round for ever: past engine.max_report_events
    one reports_capped event is stored and nothing more, while its record still follows
    its newest checkpoint."""
    node = Node(gpus=1, default=SimBehaviour(work_seconds=10_000),
                engine_config=EngineConfig(max_report_events=100))
    (job,) = node.submit("{name: t, command: x}")
    node.run(5)
    for step in range(300):
        node.executor._reports.append(
            Report(job, node.now + step * 0.01, "anomaly", {"reason": f"r{step}"}))
        if step % 10 == 9:
            node.run(1)
    node.executor._reports.append(Report(job, node.now, "checkpoint", {"step": 4242}))
    node.run(1)
    kinds = [e.kind for e in node.store.events(job)]
    assert kinds.count("anomaly") + kinds.count("checkpoint_committed") == 100
    assert kinds.count("reports_capped") == 1
    assert node.rec(job).last_checkpoint_step == 4242
