"""Why each job waits: one current reason per waiting job, stored,
with the numbers; a job that can never run is refused at submission instead."""

from __future__ import annotations

import pytest

from launcher import reasons as r
from launcher.config import PolicyConfig
from launcher.engine import LauncherError
from launcher.sim import SimBehaviour
from tests.launcher.harness import Node


def _why(node: Node, job: int) -> tuple[str, str]:
    rec = node.rec(job)
    return rec.wait_reason, rec.wait_detail


def test_a_request_no_gpu_here_can_hold_is_refused_at_submission() -> None:
    """500 GiB on 80 GiB GPUs, or a fraction with more memory than any GPU has, used to
    be queued and wait forever; now the submission is refused naming the numbers."""
    node = Node(gpus=2)
    node.run(10)
    with pytest.raises(LauncherError) as info:
        node.submit("""
jobs:
  - {name: huge, command: x, gpu_memory_bytes: 500GiB}
  - {name: slice, command: x, gpu_fraction: 0.25, gpu_memory_bytes: 100GiB}
  - {name: pair, command: x, gpus: 2, gpu_memory_bytes: 81GiB}
  - {name: fine, command: x, gpu_memory_bytes: 80GiB}
""")
    assert info.value.problems == [
        "huge: needs 500 GiB on one GPU; the largest GPU here has 80 GiB: it can never run",
        "slice: needs 100 GiB on one GPU for 0.25 of it; the largest GPU here has 80 GiB: "
        "it can never run",
        "pair: needs 2 GPUs with 81 GiB each; 0 here have that much: it can never run"]
    assert node.store.jobs() == [], "nothing of a refused submission is queued"


def test_before_the_gpus_were_ever_read_such_a_job_waits_saying_why() -> None:
    """A submission never waits on a GPU read of its own (the daemon ticks before it
    serves): before any read there is nothing to compare with, so the job is queued, and
    the first round says what it lacks."""
    node = Node(gpus=1)
    (job,) = node.submit("{name: huge, command: x, gpu_memory_bytes: 500GiB}")
    node.run(10)
    assert _why(node, job) == (r.RESOURCES, "needs 1 whole GPU with 500 GiB; 0 of 1 free: "
                                            "GPU 0 has less than 500 GiB")
    with pytest.raises(LauncherError, match="cannot be queued"):
        node.submit("{name: huge2, command: x, gpu_memory_bytes: 500GiB}")


def test_every_waiting_job_has_one_current_reason_with_its_numbers() -> None:
    """Held, dependency, backoff, resources and priority: each waiting job's row says which
    and why, in words with the numbers; a started job's reason is cleared."""
    node = Node(gpus=2, behaviours={
        "big": SimBehaviour(work_seconds=5000), "flaky": SimBehaviour(
            work_seconds=5000, fail_after_seconds=5, fail_attempts=1)},
        default=SimBehaviour(work_seconds=5000))
    (big,) = node.submit("{name: big, command: x, gpus: 2, urgency: high}")
    (new,) = node.submit("{name: later, command: x}")
    assert _why(node, new)[0] == r.NEW
    node.run(10)
    # in the round big starts, the other would have fit on what was free: priority
    assert _why(node, new) == (r.PRIORITY, "1 job ahead with higher priority took the "
                                           "free GPUs")
    node.run(10)
    assert node.rec(big).state == "running" and _why(node, big) == ("", "")
    kind, detail = _why(node, new)
    assert kind == r.RESOURCES
    assert detail == "needs 1 whole GPU; 0 of 2 free: GPU 0 and 1 held by job 1"
    first, second = node.submit("""
jobs:
  - {name: first, command: x}
  - {name: second, command: x, after: [first]}
""")
    node.engine.hold(first, 1000)
    node.run(10)
    assert _why(node, first)[0] == r.HELD and "release 3" in _why(node, first)[1]
    assert _why(node, second) == (r.DEPENDENCY, "waiting for job 3 (first: held)")
    assert node.store.wait_reason_counts() == {r.RESOURCES: 1, r.HELD: 1, r.DEPENDENCY: 1}


def test_a_failed_attempt_waits_with_its_backoff_time() -> None:
    """A failed attempt waiting out its retry delay says until when, and after what."""
    node = Node(gpus=1, default=SimBehaviour(work_seconds=500, fail_after_seconds=5,
                                             fail_attempts=1))
    (job,) = node.submit("{name: flaky, command: x, max_retries: 2}")
    node.run(20, step=10)
    kind, detail = _why(node, job)
    assert node.rec(job).state == "requeued" and kind == r.BACKOFF
    assert detail.startswith("backoff until ") and "retry 1 of 2" in detail


def test_jobs_that_would_fit_but_for_higher_priority_ones_wait_for_priority() -> None:
    """Two jobs want the one free GPU: the urgent one starts, the other says a job ahead
    of it took it."""
    node = Node(gpus=1, policy=PolicyConfig(preemption=False),
                default=SimBehaviour(work_seconds=5000))
    (low,) = node.submit("{name: low, command: x, urgency: low}")
    (urgent,) = node.submit("{name: urgent, command: x, urgency: urgent}")
    node.run(10)
    assert node.rec(urgent).state == "running"
    assert _why(node, low) == (r.PRIORITY, "1 job ahead with higher priority took the free "
                                           "GPUs")


def test_a_fraction_that_finds_a_share_but_not_its_memory_says_so() -> None:
    """A GPU has room for the share (0.25 + 0.5) but not for the memory: gpu_memory, with
    the most that is free and where."""
    node = Node(gpus=1, default=SimBehaviour(work_seconds=5000, memory_bytes=50 * 2**30))
    node.submit("{name: a, command: x, gpu_fraction: 0.5, gpu_memory_bytes: 50GiB}")
    (b,) = node.submit("{name: b, command: x, gpu_fraction: 0.25, gpu_memory_bytes: 40GiB}")
    node.run(20)
    assert _why(node, b) == (r.GPU_MEMORY, "needs 40 GiB on one GPU for 0.25 of it; the "
                                           "most free is 30 GiB (GPU 0)")


def test_the_job_waiting_for_its_victims_says_whom_it_preempts() -> None:
    """The preempting job says whom it preempts, then that it waits for them to checkpoint
    and leave."""
    policy = PolicyConfig(preempt_wait_seconds=0, preempt_min_runtime_seconds=0)
    node = Node(gpus=1, policy=policy, behaviours={
        "train": SimBehaviour(work_seconds=50_000, checkpoint_seconds=60)})
    (train,) = node.submit("{name: train, command: x, urgency: low, checkpoint_dir: /c}")
    node.run(10)
    (urgent,) = node.submit("{name: eval, command: x, urgency: urgent}")
    node.run(10)
    assert _why(node, urgent) == (r.PREEMPTING, f"preempting job {train} for its GPUs (they "
                                                "checkpoint and leave)")
    node.run(10)
    assert node.rec(train).state == "preempting"
    assert _why(node, urgent) == (r.PREEMPTING, f"waiting for job {train} it preempted to "
                                                "checkpoint and leave")


def test_a_job_that_may_preempt_later_says_whom_and_when() -> None:
    """Before preempt_wait_seconds have passed, the reason names the job it may preempt and
    from when."""
    policy = PolicyConfig(preempt_wait_seconds=300, preempt_min_runtime_seconds=0)
    node = Node(gpus=1, policy=policy, default=SimBehaviour(work_seconds=50_000))
    (train,) = node.submit("{name: train, command: x, urgency: low, checkpoint_dir: /c}")
    node.run(10)
    (urgent,) = node.submit("{name: eval, command: x, urgency: urgent}")
    node.run(20)
    kind, detail = _why(node, urgent)
    assert kind == r.RESOURCES
    assert detail.startswith(f"needs 1 whole GPU; 0 of 1 free: GPU 0 held by job {train}; "
                             f"may preempt lower-priority job {train} from ")


def test_reasons_are_written_only_when_they_change() -> None:
    """A queue of waiting jobs costs no row write per tick: the reason is stored when it
    changes."""
    node = Node(gpus=1, default=SimBehaviour(work_seconds=50_000))
    node.submit("{name: a, command: x}")
    waiting = node.submit("\n".join(["jobs:"] + [f"  - {{name: w{i}, command: x}}"
                                                 for i in range(5)]))
    node.run(20)
    writes: list[int] = []
    update = node.store.update

    def counting(job_id: int, **values: object) -> None:
        if "wait_reason" in values:
            writes.append(job_id)
        update(job_id, **values)

    node.store.update = counting  # type: ignore[method-assign]
    node.run(50)
    assert writes == [] and all(_why(node, j)[0] == r.RESOURCES for j in waiting)
