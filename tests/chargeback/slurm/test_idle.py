"""The idle-GPU policy's decisions (chargeback/slurm/idle.py)."""

from __future__ import annotations

from chargeback.slurm.idle import Measured, PendingJob, Policy, RunningJob, decide

POLICY = Policy(threshold=0.05, window_s=600, min_runtime_s=600, action="requeue",
                exempt_accounts=frozenset({"vip"}), exempt_partitions=frozenset({"debug"}))
WAITING = [PendingJob("99", "Resources", True)]


def job(job_id: str, *, runtime: float = 3600, account: str = "physics",
        partition: str = "gpu") -> RunningJob:
    return RunningJob(job_id, "alice", account, partition, runtime)


def test_only_an_idle_judged_unexempt_job_with_waiters_is_acted_on() -> None:
    """Of six GPU jobs only the idle one, seen long enough, old enough, not exempt, is
    requeued; each other decision says why it was left; a job with no GPU is skipped."""
    running = [job("1"), job("2"), job("3", runtime=60), job("4", account="vip"),
               job("5", partition="debug"), job("6"), job("7")]
    measured = {"1": Measured(0.01, 1.0), "2": Measured(0.5, 1.0), "3": Measured(0.0, 1.0),
                "4": Measured(0.0, 1.0), "5": Measured(0.0, 1.0), "6": Measured(0.0, 0.3)}
    d = {x.job.job_id: x for x in decide(POLICY, running, measured, WAITING)}
    assert sorted(d) == ["1", "2", "3", "4", "5", "6"]
    assert d["1"].action == "requeue" and "while 1 GPU job(s) wait" in d["1"].why
    assert all(d[j].action is None for j in "23456")
    assert "not idle" in d["2"].why and "not judged yet" in d["3"].why
    assert "exempt" in d["4"].why and "exempt" in d["5"].why and "30%" in d["6"].why


def test_nobody_waiting_means_no_action_unless_told() -> None:
    """Without a GPU job waiting for resources (a CPU job, or one held for another reason,
    does not count), idle GPUs are left alone, unless the policy says otherwise."""
    measured = {"1": Measured(0.0, 1.0)}
    others = [PendingJob("98", "Resources", False), PendingJob("97", "Dependency", True)]
    (d,) = decide(POLICY, [job("1")], measured, others)
    assert d.action is None and "no GPU job is waiting" in d.why
    eager = Policy(threshold=0.05, window_s=600, min_runtime_s=600, action="flag",
                   require_waiters=False)
    (d,) = decide(eager, [job("1")], measured, others)
    assert d.action == "flag"
