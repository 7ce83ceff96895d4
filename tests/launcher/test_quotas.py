"""Policy the admin sets: urgency levels are the admin's names with
points and groups; per-user and per-project limits (running GPUs, waiting jobs,
GPU-hours per window); caps on jobs per submission and on a submission's size. Every
refusal names the limit's configuration key."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from launcher import reasons as r
from launcher.config import (
    LauncherCoreConfig,
    PolicyConfig,
    QuotaConfig,
    QuotaLimits,
    UrgencyLevel,
    UserQuotaLimits,
)
from launcher.engine import Engine, LauncherError
from launcher.executor import ProcessExecutor
from launcher.peer import Caller
from launcher.protocol import parse_request
from launcher.scheduler import Scheduler
from launcher.service import Service
from launcher.sim import SimBehaviour
from launcher.sim.gpus import SimGpuSource
from launcher.store import Store
from launcher.telemetry import Telemetry
from tests.launcher.harness import Node

LEVELS = {"routine": UrgencyLevel(points=0), "paper": UrgencyLevel(points=1500),
          "deadline": UrgencyLevel(points=5000, groups=["phd"])}


def _node(quotas: QuotaConfig | None = None, policy: PolicyConfig | None = None,
          gpus: int = 4) -> Node:
    node = Node(gpus=gpus, policy=policy or PolicyConfig(),
                default=SimBehaviour(work_seconds=50_000))
    if quotas is not None:  # the harness builds the engine with the default core config
        node.engine = Engine(node.store, Scheduler(node.policy), node.sim, node.executor,
                             node.clock, LauncherCoreConfig(policy=node.policy, quotas=quotas))
    return node


def _problems(node: Node, text: str, user: str = "alice", uid: int = 1000,
              groups: tuple[str, ...] = ()) -> list[str]:
    from launcher.spec import load_submission

    with pytest.raises(LauncherError) as info:
        node.engine.submit(load_submission(text), uid, user, groups=groups)
    return info.value.problems


def test_a_user_cannot_declare_an_urgency_beyond_the_admins_levels() -> None:
    """`urgency: 10` used to give 10,000 points (urgent is 3,000); now a number is no
    level, and a name the admin did not define is refused listing those that exist."""
    from gpu_audit.errors import ConfigError
    from launcher.spec import load_submission

    with pytest.raises(ConfigError, match="not a number"):
        load_submission("{name: a, command: x, urgency: 10}")
    node = _node()
    node.run(10)
    assert _problems(node, "{name: a, command: x, urgency: critical}") == [
        "a: urgency 'critical' is not a level here (one of low, normal, high, urgent; "
        "policy.urgency_levels)"]


def test_levels_are_the_admins_names_points_and_groups() -> None:
    """A level restricted to a group is refused to others and taken by its members (and
    by admins); its points are the urgency term of the priority."""
    policy = PolicyConfig(urgency_levels=LEVELS, default_urgency="routine")
    node = _node(policy=policy, gpus=1)
    node.run(10)
    assert _problems(node, "{name: a, command: x, urgency: deadline}", groups=("users",)) == [
        "a: urgency 'deadline' is for members of phd (policy.urgency_levels.deadline.groups)"]
    from launcher.spec import load_submission

    (mine,) = node.engine.submit(load_submission("{name: b, command: x, urgency: deadline}"),
                                 1001, "bob", groups=("users", "phd"))
    (plain,) = node.engine.submit(load_submission("{name: c, command: x}"), 1000, "alice")
    (admin,) = node.engine.submit(load_submission("{name: d, command: x, urgency: paper}"),
                                  0, "root", is_admin=True)
    view = {rec.id: bd for rec, bd in node.engine.queue_view()}
    assert view[mine].urgency == 5000 and view[mine].urgency_level == "deadline"
    assert view[plain].urgency == 0 and node.rec(plain).spec.urgency == "routine"
    assert view[admin].urgency == 1500


def test_the_level_configuration_is_checked() -> None:
    """The default level must exist and be open to everyone; level names and points are
    checked."""
    with pytest.raises(ValidationError, match="default_urgency"):
        PolicyConfig(urgency_levels=LEVELS, default_urgency="normal")
    with pytest.raises(ValidationError, match="must be open to everyone"):
        PolicyConfig(urgency_levels=LEVELS, default_urgency="deadline")
    with pytest.raises(ValidationError, match="not a level name"):
        PolicyConfig(urgency_levels={"Bad Name": UrgencyLevel(points=1), **LEVELS},
                     default_urgency="routine")
    with pytest.raises(ValidationError):
        UrgencyLevel(points=float("inf"))


def test_running_gpus_per_user_hold_the_rest_back_with_the_limit_named() -> None:
    """alice may hold 2 GPUs: her third and fourth jobs wait (user_limit) while bob's job
    takes a free GPU; a job asking alone for more than the limit is refused."""
    node = _node(QuotaConfig(user=UserQuotaLimits(max_running_gpus=2)))
    jobs = node.submit("\n".join(["jobs:"] + [f"  - {{name: a{i}, command: x}}"
                                              for i in range(4)]))
    from launcher.spec import load_submission

    (bobs,) = node.engine.submit(load_submission("{name: b, command: x}"), 1001, "bob")
    node.run(20)
    states = [node.rec(j).state for j in jobs]
    assert states == ["running", "running", "queued", "queued"]
    assert node.rec(bobs).state == "running"
    assert (node.rec(jobs[2]).wait_reason, node.rec(jobs[2]).wait_detail) == (
        r.USER_LIMIT, "user alice's running jobs hold 2 of 2 GPUs; this job needs 1 more "
                      "(quotas.user.max_running_gpus)")
    assert _problems(node, "{name: big, command: x, gpus: 3}") == [
        "big: needs 3 GPUs; user alice may hold at most 2 (quotas.user.max_running_gpus): "
        "it can never run"]


def test_a_per_user_override_replaces_only_the_keys_it_sets() -> None:
    """users.alice.max_running_gpus replaces the user default; alice's other limits are
    inherited, and a refusal names the override's key."""
    quotas = QuotaConfig(user=UserQuotaLimits(max_running_gpus=1, max_queued_jobs=2),
                         users={"alice": QuotaLimits(max_running_gpus=3)})
    assert quotas.limits_for("user", "alice").model_dump() == QuotaLimits(
        max_running_gpus=3, max_queued_jobs=2, max_running_jobs=32).model_dump()
    node = _node(quotas)
    node.run(10)
    assert _problems(node, "{name: big, command: x, gpus: 4}") == [
        "big: needs 4 GPUs; user alice may hold at most 3 "
        "(quotas.users.alice.max_running_gpus): it can never run"]


def test_waiting_jobs_per_user_and_per_project_are_capped() -> None:
    """The 3,000-job flood: a user may have only so many jobs waiting."""
    node = _node(QuotaConfig(user=UserQuotaLimits(max_queued_jobs=3),
                             projects={"big": QuotaLimits(max_queued_jobs=1)}), gpus=1)
    node.submit("{name: run, command: x}")
    node.run(10)
    node.submit("jobs:\n  - {name: a, command: x}\n  - {name: b, command: x}")
    assert _problems(node, "jobs:\n  - {name: c, command: x}\n  - {name: d, command: x}") == [
        "user alice has 2 jobs waiting; 2 more would pass the limit of 3 "
        "(quotas.user.max_queued_jobs)"]
    assert _problems(node, "project: big\njobs:\n  - {name: c, command: x}\n"
                           "  - {name: d, command: x}", user="bob", uid=1001) == [
        "project big has 0 jobs waiting; 2 more would pass the limit of 1 "
        "(quotas.projects.big.max_queued_jobs)"]


def test_jobs_per_submission_are_capped_by_the_admin() -> None:
    """A submission over quotas.max_jobs_per_submission is refused whole, naming the key."""
    node = _node(QuotaConfig(max_jobs_per_submission=5))
    text = "jobs:\n" + "".join(f"  - {{name: j{i}, command: x}}\n" for i in range(6))
    assert _problems(node, text) == [
        "6 jobs in one submission; at most 5 (quotas.max_jobs_per_submission)"]
    assert QuotaConfig().max_jobs_per_submission == 100  # a small lab's default


def test_gpu_hours_per_window_hold_jobs_until_usage_slides_out() -> None:
    """1 GPU-hour per 2 h window: once alice's first job has held a GPU for an hour, her
    next waits (naming the limit); when the usage leaves the window it starts."""
    quotas = QuotaConfig(window_seconds=7200.0,
                         user=UserQuotaLimits(max_gpu_hours=1.0))
    node = _node(quotas, gpus=2)
    node.behaviours["first"] = SimBehaviour(work_seconds=3700)
    node.behaviours["second"] = SimBehaviour(work_seconds=600)
    (first,) = node.submit("{name: first, command: x}")
    node.run(3800, step=60)
    assert node.rec(first).state == "succeeded"
    (second,) = node.submit("{name: second, command: x}")
    node.run(120, step=60)
    rec = node.rec(second)
    assert rec.state == "queued" and rec.wait_reason == r.USER_LIMIT
    assert rec.wait_detail.startswith("user alice held 1.0") and \
        rec.wait_detail.endswith("GPU-hours in the last 2 h (quotas.user.max_gpu_hours)")
    node.run(7200, step=60, until=lambda: node.rec(second).state != "queued")
    assert node.rec(second).state == "running"
    assert node.engine.usage.used("user", "alice", node.now) < 3600


def test_usage_survives_a_restart_of_the_engine(tmp_path: Path) -> None:
    """The window's buckets are in the store: a restarted daemon still knows them."""
    node = Node(gpus=1, store_path=str(tmp_path / "l.db"),
                default=SimBehaviour(work_seconds=50_000))
    node.submit("{name: a, command: x}")
    node.run(600, step=60)
    used = node.engine.usage.used("user", "alice", node.now)
    again = Engine(Store(str(tmp_path / "l.db")), Scheduler(PolicyConfig()), node.sim,
                   node.executor, node.clock)
    assert used > 0 and again.usage.used("user", "alice", node.now) == pytest.approx(used)


def test_the_submission_size_is_capped_before_it_is_read(tmp_path: Path) -> None:
    """A submission larger than quotas.max_spec_bytes is refused without parsing it."""
    executor = ProcessExecutor(tmp_path / "state", switch_users=False)
    store = Store(tmp_path / "l.db")
    core = LauncherCoreConfig(quotas=QuotaConfig(max_spec_bytes=1024))
    engine = Engine(store, Scheduler(core.policy), SimGpuSource(1), executor,
                    lambda: 1.0, core)
    svc = Service(engine, store, executor, jobmap=None, audit=None, telemetry=Telemetry(),
                  clock=lambda: 1.0)
    caller = Caller(pid=2, uid=4242, gid=4242, groups=frozenset(), user="u", admin=False)
    spec = "{name: a, command: [x]}  #" + "x" * 2000
    request = parse_request(orjson.dumps({"op": "submit", "spec": spec}))
    assert not isinstance(request, dict)
    answer = svc.handle(caller, request)
    assert answer["ok"] is False and answer["error"] == "invalid"
    assert answer["problems"] == [f"{len(spec)} bytes of YAML; at most 1024 "
                                  "(quotas.max_spec_bytes)"]
    assert store.jobs() == []
