"""The launcher's job-mapping files are what the exporter's attribution reads."""

from __future__ import annotations

from pathlib import Path

from launcher.jobmap import JobMapWriter
from tests.exporter.attribution.helpers import GPU0, GPU1, config, gpu, make_tree, proc, resolver


def test_exporter_attributes_launcher_job_by_pid_and_gpu(tmp_path: Path) -> None:
    """A started job is attributed (job, user, project from `jobmap`) by its pid, and a
    process of it the file does not list is attributed through the job's GPU."""
    now = [1000.0]
    w = JobMapWriter(tmp_path / "jobs", clock=lambda: now[0])
    w.started("42", user="alice", project="vision", gpus=[GPU0], pids=[4242],
              start_time=now[0], attempt=2)
    p_listed, p_forked = proc(4242, uid=1001), proc(4250, uid=1001)
    make_tree(tmp_path / "proc", p_listed, p_forked)
    r = resolver(config(tmp_path, sources=("jobmap",)), wall_clock=lambda: now[0])
    result = r.attribute([gpu(GPU0, p_listed, p_forked), gpu(GPU1, proc(7, uid=1001),
                                                              index=1)])
    for ap in result[GPU0]:
        a = ap.attribution
        assert (a.job, a.user, a.project) == ("42", "alice", "vision")
        assert a.sources["job"] == "jobmap"
    (other,) = result[GPU1]
    assert not other.attribution.job, "a GPU the job does not hold was attributed to it"


def test_ended_job_stops_claiming_and_file_is_swept(tmp_path: Path) -> None:
    """After the attempt ends the exporter stops attributing to it; the file goes later."""
    now = [1000.0]
    w = JobMapWriter(tmp_path / "jobs", keep_seconds=60, clock=lambda: now[0])
    w.started("7", user="bob", project="nlp", gpus=[GPU0], pids=[77], start_time=now[0],
              attempt=1)
    p = proc(77)
    make_tree(tmp_path / "proc", p)
    now[0] = 1010.0
    w.ended("7")
    now[0] = 1011.0
    r = resolver(config(tmp_path, sources=("jobmap",)), wall_clock=lambda: now[0])
    (ap,) = r.attribute([gpu(GPU0, p)])[GPU0]
    assert not ap.attribution.job
    assert w.path("7").exists()
    now[0] = 1071.0
    assert w.sweep() == ["7"] and not w.path("7").exists()
