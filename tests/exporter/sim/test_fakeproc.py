"""write_fake_proc builds a tree the resolver reads back exactly as the identity said."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.attribution import procfs
from exporter.sim.fakeproc import write_fake_proc
from gpu_audit.model.samples import ProcessSample
from tests.exporter.attribution.helpers import GPU0, config, gpu, proc, resolver

CID = "0a1b22ec1361a97c3511db37a4bae932d41b22264e5b97611748f8b662312574"


def test_round_trip_through_the_resolver(tmp_path: Path) -> None:
    """Each identity field written (uid, environ, cgroup, start time) is what the
    resolver and the procfs readers read back."""
    p = proc(
        4321,
        uid=1001,
        start=5555,
        name="/opt/conda/bin/python3.11-with-a-long-name",
        environ={"JOB_ID": "j9", "PROJECT_NAME": "nlp", "HOME": "/home/bob"},
        cgroup=f"0::/system.slice/slurmstepd.scope/job_31/step_0/docker-{CID}.scope",
    )
    root = tmp_path / "proc"
    assert write_fake_proc(root, [p, p]) == {4321}
    paths = procfs.ProcPaths.for_pid(str(root), 4321)
    assert procfs.read_start_time(paths.stat) == 5555
    assert procfs.read_real_uid(paths) == 1001
    assert (root / "4321" / "comm").read_text() == "python3.11-with\n"
    assert b"btime 1700000000" in (root / "stat").read_bytes()
    a = resolver(config(tmp_path)).attribute([gpu(GPU0, p)])[GPU0][0].attribution
    assert a.as_dict() | {} == {
        "user": "bob", "project": "nlp", "job": "j9", "container_id": CID,
        "container_runtime": "docker", "k8s_namespace": "", "k8s_pod": "",
        "k8s_container": "", "k8s_pod_uid": "", "slurm_job_id": "31",
        "slurm_user": "", "slurm_account": "", "slurm_partition": "",
    }  # fmt: skip


def test_process_without_identity_and_prune(tmp_path: Path) -> None:
    """A bare ProcessSample gets a readable tree (uid from the sample, v2 root cgroup,
    stable start time); prune removes pids no longer given."""
    root = tmp_path / "proc"
    bare = ProcessSample(pid=10, name="x", uid=1000)
    write_fake_proc(root, [bare, proc(11)])
    first = procfs.read_start_time(f"{root}/10/stat")
    write_fake_proc(root, [bare], prune=True)
    assert procfs.read_start_time(f"{root}/10/stat") == first
    assert not (root / "11").exists()
    assert (root / "10" / "cgroup").read_text() == "0::/\n"
    a = resolver(config(tmp_path)).attribute([gpu(GPU0, bare)])[GPU0][0].attribution
    assert (a.user, a.sources) == ("alice", {"user": "owner"})


def test_refuses_a_real_procfs(tmp_path: Path) -> None:
    """A root with a `self` symlink (a live procfs) is never written to."""
    (tmp_path / "self").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="real procfs"):
        write_fake_proc(tmp_path, [proc(1)])
