"""Idle reclaim and victim choice on a simulated node in virtual time: a job measured idle
(GPU utilisation under the threshold) for idle_reclaim_seconds while work waits gives way
under the priority policy; a busy job, a baseline policy or a disabled rule leaves it be;
victims that checkpoint are chosen before victims that cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import LauncherCoreConfig, PolicyConfig
from launcher.engine import Engine
from launcher.gpustate import GIB
from launcher.scheduler import Scheduler
from launcher.sim import SimBehaviour
from launcher.store import Store
from tests.launcher.harness import Node

pytestmark = pytest.mark.timeout(60)

NOTEBOOK = SimBehaviour(work_seconds=20_000, memory_bytes=8 * GIB, utilization=0.02)
BUSY = SimBehaviour(work_seconds=20_000, memory_bytes=8 * GIB, utilization=0.9)
SMALL = SimBehaviour(work_seconds=600, memory_bytes=15 * GIB, utilization=0.4)


def _node(holder: SimBehaviour, policy: PolicyConfig | None = None,
          store_path: str = ":memory:") -> Node:
    return Node(gpus=1, policy=policy or PolicyConfig(), store_path=store_path,
                behaviours={"holder": holder, "small": SMALL})


def _holder_and_small(node: Node, holder_spec: str = "") -> tuple[int, int]:
    (holder,) = node.submit(f"{{name: holder, command: x, urgency: high{holder_spec}}}",
                            uid=1001, user="jun")
    node.run(30)
    assert node.rec(holder).state == "running"
    (small,) = node.submit("{name: small, command: x, gpu_fraction: 0.25, "
                           "gpu_memory_bytes: 20GiB}", uid=1002, user="dana")
    return holder, small


def test_an_idle_notebook_is_shared_and_a_fraction_starts_beside_it() -> None:
    node = _node(NOTEBOOK)
    holder, small = _holder_and_small(node)
    node.run(600)
    assert node.rec(small).state == "queued"  # not idle long enough yet
    node.run(600)
    rec = node.rec(small)
    assert rec.state in ("running", "succeeded")
    assert rec.gpus == node.rec(holder).gpus  # on the notebook's GPU, beside it
    assert node.rec(holder).state == "running"  # the notebook was not touched
    assert not node.executor.signals
    (shared,) = node.store.events(holder, "idle_shared")
    assert shared.data["reason"] == "idle_reclaim"
    assert shared.data["idle_seconds"] >= PolicyConfig().idle_reclaim_seconds
    assert shared.data["memory_bytes"] == 8 * GIB and shared.data["fraction"] == 0.1
    share = [b for _, j, a, b in node.store.decisions(holder) if a == "share"]
    assert share and share[0]["reason"] == "idle_reclaim"
    assert node.rec(holder).memory_bytes == 8 * GIB  # booked what it measured


def test_a_busy_holder_keeps_its_gpu() -> None:
    node = _node(BUSY)
    holder, small = _holder_and_small(node)
    node.run(3600)
    assert node.rec(small).state == "queued"
    assert node.rec(holder).state == "running"
    assert not node.store.events(holder, "idle_shared") and not node.executor.signals


@pytest.mark.parametrize("policy", [PolicyConfig(name="first-fit"),
                                    PolicyConfig(idle_reclaim=False)],
                         ids=["first-fit", "disabled"])
def test_baselines_and_a_disabled_rule_do_not_reclaim(policy: PolicyConfig) -> None:
    node = _node(NOTEBOOK, policy)
    holder, small = _holder_and_small(node)
    node.run(3600)
    assert node.rec(small).state == "queued"
    assert not node.store.events(holder, "idle_shared")


def test_an_idle_job_that_checkpoints_yields_to_an_equal_priority_waiter() -> None:
    """No priority gap is needed for an idle victim: it commits and requeues."""
    node = _node(NOTEBOOK)
    (holder,) = node.submit("{name: holder, command: x, checkpoint_dir: /c}",
                            uid=1001, user="jun")
    node.run(30)
    (waiter,) = node.submit("{name: small, command: x}", uid=1002, user="dana")
    node.run(800)
    assert node.rec(waiter).state == "queued"  # idle for less than 900 s
    node.run(400)
    (pre,) = node.store.events(holder, "preempted")
    assert pre.data["reason"] == "idle_reclaim" and pre.data["for_job"] == waiter
    (decision,) = [b for _, j, a, b in node.store.decisions(holder) if a == "preempt"]
    assert decision["reason"] == "idle_reclaim" and decision["idle_seconds"] >= 900
    assert node.rec(waiter).state in ("running", "succeeded")


def test_a_busy_job_that_checkpoints_keeps_its_gpu_against_an_equal_priority_waiter(
) -> None:
    node = _node(BUSY)
    (holder,) = node.submit("{name: holder, command: x, checkpoint_dir: /c}",
                            uid=1001, user="jun")
    node.run(30)
    (waiter,) = node.submit("{name: small, command: x}", uid=1002, user="dana")
    node.run(3600)
    assert node.rec(waiter).state == "queued"
    assert not node.store.events(holder, "preempt_signal")


def test_a_victim_that_checkpoints_is_chosen_before_one_that_cannot() -> None:
    """`ck` has more un-checkpointed GPU-time (started first, commits only on the
    signal) than `nock`, but a preemption throws `nock`'s whole run away."""
    policy = PolicyConfig(preempt_wait_seconds=30, preempt_min_runtime_seconds=0)
    long = SimBehaviour(work_seconds=50_000, utilization=0.9)
    node = Node(gpus=2, policy=policy, behaviours={
        "ck": long, "nock": long, "urgent": SimBehaviour(work_seconds=100)})
    (ck,) = node.submit("{name: ck, command: x, urgency: low, checkpoint_dir: /c}",
                        uid=1001, user="ann")
    node.run(600)
    (nock,) = node.submit("{name: nock, command: x, urgency: low}", uid=1002, user="bea")
    node.run(60)
    now = node.now
    assert node.rec(ck).uncheckpointed_gpu_seconds(now) > \
        node.rec(nock).uncheckpointed_gpu_seconds(now)
    (urgent,) = node.submit("{name: urgent, command: x, urgency: urgent}", uid=1003,
                            user="eve")
    node.run(300)
    assert node.store.events(ck, "preempted")
    assert not node.store.events(nock, "preempt_signal")
    assert node.rec(urgent).state in ("running", "succeeded")


def test_a_shared_gpu_stays_shared_across_a_daemon_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "state.db")
    node = _node(NOTEBOOK, store_path=db)
    holder, _ = _holder_and_small(node)
    node.run(1200)
    assert node.engine.shared == {holder: 0.1}
    node.store.close()
    node.store = Store(db)
    node.engine = Engine(node.store, Scheduler(node.policy), node.sim, node.executor,
                         node.clock, LauncherCoreConfig(policy=node.policy))
    assert node.engine.shared == {holder: 0.1}
    (again,) = node.submit("{name: small2, command: x, gpu_fraction: 0.25, "
                           "gpu_memory_bytes: 20GiB}", uid=1002, user="dana")
    node.run(60)
    assert node.rec(again).gpus == node.rec(holder).gpus  # still placed beside it
