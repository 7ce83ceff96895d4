"""Pipelines that resume: `after:` on earlier jobs of the same
user, `retry` of a failed job with the dependents its failure cancelled, `restarted`
(not `resumed`) for an attempt without a checkpoint, and a default retry budget for
checkpointing jobs killed by a signal or out of memory."""

from __future__ import annotations

import pytest

from launcher.config import EngineConfig
from launcher.engine import BadState, LauncherError, PermissionDenied
from launcher.sim import SimBehaviour
from launcher.spec import load_submission
from tests.launcher.harness import Node


def _kinds(node: Node, job: int) -> list[str]:
    return [k for k in node.kinds(job) if k in ("started", "resumed", "restarted",
                                                 "requeued", "failed", "succeeded",
                                                 "cancelled", "retried")]


def test_after_names_an_earlier_job_of_the_same_user_by_id() -> None:
    """`after: [16]` used to be refused (only names of the same submission); now a new
    step can follow a job submitted earlier, and starts once it succeeded."""
    node = Node(gpus=1, behaviours={"train": SimBehaviour(work_seconds=300),
                                    "eval": SimBehaviour(work_seconds=60)})
    (train,) = node.submit("{name: train, command: x}")
    (ev,) = node.submit(f"{{name: eval, command: x, after: [{train}]}}")
    assert node.rec(ev).after_ids == [train]
    node.run(200)
    assert node.rec(ev).state == "queued" and node.rec(ev).wait_reason == "dependency"
    node.run(400)
    assert node.rec(train).state == node.rec(ev).state == "succeeded"
    assert node.rec(ev).started_at >= node.rec(train).finished_at  # type: ignore[operator]


def test_after_ids_must_be_the_users_own_jobs_that_did_not_fail() -> None:
    """after ids of another user's job, of a failed job or of no job are each refused, all
    at once."""
    node = Node(gpus=1, default=SimBehaviour(work_seconds=10, fail_after_seconds=5))
    (bobs,) = node.engine.submit(load_submission("{name: b, command: x}"), 1001, "bob")
    (mine,) = node.submit("{name: m, command: x, max_retries: 0}")
    node.run(60)
    assert node.rec(mine).state == "failed"
    with pytest.raises(LauncherError) as info:
        node.submit(f"{{name: n, command: x, after: [{bobs}, {mine}, 999]}}")
    assert info.value.problems == [
        f"n: after: job {bobs} belongs to bob; `after` names only your own jobs",
        f"n: after: job {mine} failed; retry it first (gpu-audit launcher retry {mine})",
        "n: after: there is no job 999"]
    with pytest.raises(Exception, match="after"):
        load_submission("{name: n, command: x, after: [true]}")


def test_retry_reruns_the_failed_step_and_the_dependents_it_cancelled() -> None:
    """train fails (no retries left), which cancels eval and report; `retry train` queues
    the three again, train resumes from its checkpoint, and the pipeline finishes."""
    node = Node(gpus=1, behaviours={
        "prep": SimBehaviour(work_seconds=30),
        "train": SimBehaviour(work_seconds=600, checkpoint_interval_seconds=100,
                              fail_after_seconds=250, exit_code=1, fail_attempts=1),
        "eval": SimBehaviour(work_seconds=30), "report": SimBehaviour(work_seconds=10)})
    prep, train, ev, report = node.submit("""
jobs:
  - {name: prep, command: x}
  - {name: train, command: x, after: [prep], checkpoint_dir: /c, max_retries: 0}
  - {name: eval, command: x, after: [train]}
  - {name: report, command: x, after: [eval]}
""")
    (other,) = node.submit(f"{{name: other, command: x, gpus: 0, after: [{prep}]}}")
    node.run(400)
    assert [node.rec(j).state for j in (prep, train, ev, report)] == [
        "succeeded", "failed", "cancelled", "cancelled"]
    with pytest.raises(PermissionDenied):
        node.engine.retry(train, 1001)
    with pytest.raises(BadState, match=f"waits for job {train}, which failed"):
        node.engine.retry(ev, 1000)
    other_state = node.rec(other).state
    assert node.engine.retry(train, 1000) == [train, ev, report]
    assert node.rec(other).state == other_state  # not a dependent of train
    with pytest.raises(BadState, match="only a failed, timed out or cancelled job"):
        node.engine.retry(prep, 1000)
    node.run(1200)
    assert [node.rec(j).state for j in (train, ev, report)] == ["succeeded"] * 3
    assert _kinds(node, train) == ["started", "failed", "retried", "resumed", "succeeded"]
    resumed = next(e for e in node.store.events(train) if e.kind == "resumed")
    assert resumed.data["checkpoint_step"] == 200  # from its newest checkpoint
    assert _kinds(node, ev)[:3] == ["cancelled", "retried", "started"]


def test_an_attempt_without_a_checkpoint_is_restarted_not_resumed() -> None:
    """A retry that has no checkpoint to resume from starts over, and says so."""
    node = Node(gpus=1, behaviours={"flaky": SimBehaviour(
        work_seconds=300, fail_after_seconds=50, fail_attempts=1)})
    (job,) = node.submit("{name: flaky, command: x, max_retries: 1}")
    node.run(800)
    assert node.rec(job).state == "succeeded"
    assert _kinds(node, job) == ["started", "requeued", "restarted", "succeeded"]


@pytest.mark.parametrize(("behaviour", "outcome"), [
    (SimBehaviour(work_seconds=600, checkpoint_interval_seconds=100,
                  fail_after_seconds=150, exit_code=137, fail_attempts=2), "succeeded"),
    (SimBehaviour(work_seconds=600, checkpoint_interval_seconds=100,
                  fail_after_seconds=150, exit_code=1, oom=True, fail_attempts=1),
     "succeeded"),
    (SimBehaviour(work_seconds=600, checkpoint_interval_seconds=100,
                  fail_after_seconds=150, exit_code=1, fail_attempts=1), "failed"),
    (SimBehaviour(work_seconds=600, checkpoint_interval_seconds=100,
                  fail_after_seconds=150, exit_code=137, fail_attempts=9), "failed"),
], ids=["sigkill-twice", "oom", "plain-exit-1", "killed-past-the-budget"])
def test_a_checkpointing_job_gets_a_default_retry_budget_for_signals_and_oom(
        behaviour: SimBehaviour, outcome: str) -> None:
    """max_retries used to default to 0: one SIGKILL or OOM failed a job that checkpoints.
    Now such a job resumes (up to engine.checkpoint_retries, with backoff); a plain
    non-zero exit still fails, as does a job that keeps being killed."""
    node = Node(gpus=1, behaviours={"train": behaviour},
                engine_config=EngineConfig(backoff_base_seconds=30, checkpoint_retries=3))
    (job,) = node.submit("{name: train, command: x, checkpoint_dir: /c}")
    node.run(5000)
    rec = node.rec(job)
    assert rec.state == outcome
    if outcome == "succeeded":
        assert "resumed" in node.kinds(job)
        requeued = [e for e in node.store.events(job) if e.kind == "requeued"]
        assert requeued and requeued[0].data["retry_budget"] == 3
        assert requeued[0].data["backoff_seconds"] == 30
    else:
        assert rec.attempt == (4 if behaviour.fail_attempts == 9 else 1)


def test_without_a_checkpoint_dir_a_kill_is_not_retried_by_default() -> None:
    """The default retry budget is for jobs that checkpoint: one that cannot resume is not
    rerun from scratch unasked."""
    node = Node(gpus=1, behaviours={"nb": SimBehaviour(
        work_seconds=600, fail_after_seconds=100, exit_code=137, fail_attempts=1)})
    (job,) = node.submit("{name: nb, command: x}")
    node.run(1000)
    assert node.rec(job).state == "failed" and node.rec(job).attempt == 1
