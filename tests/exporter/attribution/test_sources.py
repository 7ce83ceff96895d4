"""Attribution sources as objects: a component's own source joins the ordered list."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from exporter.attribution.registry import build_sources
from exporter.attribution.resolver import Resolver
from exporter.attribution.sources.base import PROC_ENVIRON, Query
from exporter.attribution.sources.cgroup import CgroupSource
from exporter.attribution.sources.environ import EnvironSource
from exporter.attribution.sources.jobmap import JobMapSource
from exporter.attribution.sources.owner import OwnerSource
from tests.exporter.attribution.helpers import GPU0, USERS, config, gpu, make_tree, only, proc


class LauncherSource:
    """A source as the launcher would add one: it knows jobs by pid."""

    name = "launcher"
    proc_needs: frozenset[str] = frozenset()

    def __init__(self, jobs: dict[int, str]) -> None:
        self.jobs = jobs
        self.generation = 0
        self.asked = 0
        self.closed = False

    def begin_cycle(self) -> int:
        return self.generation

    def resolve(self, query: Query) -> Mapping[str, str]:
        self.asked += 1
        job = self.jobs.get(query.process.pid)
        return {"job": job, "project": "launched"} if job else {}

    def stats(self) -> Mapping[str, int]:
        return {"launcher_asked": self.asked}

    def close(self) -> None:
        self.closed = True


def test_build_sources_follows_the_configured_order(tmp_path: Path) -> None:
    """The built-in sources are built in the configured order; the kubelet source is left
    out while the kubelet is disabled."""
    cfg = config(tmp_path, sources=("owner", "kubelet", "cgroup", "jobmap", "environ"))
    built = build_sources(cfg, user_lookup=USERS.get)
    assert [type(s) for s in built] == [OwnerSource, CgroupSource, JobMapSource, EnvironSource]
    assert [s.name for s in built] == ["owner", "cgroup", "jobmap", "environ"]


def test_a_registered_source_takes_its_place_in_precedence(tmp_path: Path) -> None:
    """A source passed to the resolver is asked in list order: it wins the fields it
    knows ahead of later sources, leaves the rest to them, is recorded by name, adds its
    counters to the resolver's, and is closed with it."""
    p = proc(50, uid=1001, environ={"JOB_ID": "env-job", "PROJECT_NAME": "env-proj"})
    make_tree(tmp_path / "proc", p)
    cfg = config(tmp_path, sources=("environ", "owner"))
    launcher = LauncherSource({50: "train-42"})
    resolver = Resolver(cfg, sources=[launcher, *build_sources(cfg, user_lookup=USERS.get)])
    a = only(resolver.attribute([gpu(GPU0, p)]))
    assert (a.job, a.project, a.user) == ("train-42", "launched", "bob")
    assert a.sources == {"job": "launcher", "project": "launcher", "user": "owner"}
    assert resolver.stats()["launcher_asked"] == 1
    resolver.close()
    assert launcher.closed


def test_a_source_generation_change_drops_memoised_answers(tmp_path: Path) -> None:
    """Answers are memoised per process while every source's generation is unchanged;
    a new generation makes the resolver ask again."""
    p = proc(51)
    make_tree(tmp_path / "proc", p)
    cfg = config(tmp_path, sources=("owner",))
    launcher = LauncherSource({})
    resolver = Resolver(cfg, sources=[launcher])
    for _ in range(3):
        assert only(resolver.attribute([gpu(GPU0, p)])).job == ""
    assert launcher.asked == 1
    launcher.jobs[51] = "late-job"
    launcher.generation += 1
    assert only(resolver.attribute([gpu(GPU0, p)])).job == "late-job"
    assert launcher.asked == 2


def test_proc_files_are_read_only_for_sources_that_need_them(tmp_path: Path) -> None:
    """With only a source that needs no /proc facts, environ and cgroup are not read:
    the environ source then has nothing to answer from."""
    p = proc(52, environ={"JOB_ID": "env-job"})
    make_tree(tmp_path / "proc", p)
    cfg = config(tmp_path)
    resolver = Resolver(cfg, sources=[LauncherSource({})])
    assert only(resolver.attribute([gpu(GPU0, p)])).job == ""
    env = EnvironSource()
    assert PROC_ENVIRON in env.proc_needs
    resolver = Resolver(cfg, sources=[env])
    assert only(resolver.attribute([gpu(GPU0, p)])).job == "env-job"
