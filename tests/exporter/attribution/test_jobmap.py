"""The job-mapping directory: matching by pid and GPU, reloads, malformed files."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from exporter.attribution.jobmap import JobMap
from tests.exporter.attribution.helpers import (
    GPU0,
    GPU1,
    config,
    gpu,
    make_tree,
    only,
    proc,
    resolver,
    write_job,
)

JOB = {"version": 1, "job_id": "train-7", "user": "alice", "project": "vision",
       "gpus": [GPU0], "pids": [], "slurm_job_id": None, "account": None,
       "start_time": 1_700_000_000, "end_time": None}  # fmt: skip


def _map(directory: Path, now: float = 1_800_000_000.0) -> JobMap:
    return JobMap(directory, wall_clock=lambda: now)


def test_pid_match_wins_over_gpu_match(tmp_path: Path) -> None:
    """A job listing the pid is chosen before a job that holds the pid's GPU."""
    write_job(tmp_path, "gpu.json", JOB)
    write_job(tmp_path, "pid.json", {**JOB, "job_id": "by-pid", "gpus": [], "pids": [42]})
    jm = _map(tmp_path)
    jm.refresh()
    record, _ = jm.lookup(42, (GPU0,))
    assert record is not None and record.fields["job"] == "by-pid"
    record, _ = jm.lookup(43, (GPU0,))
    assert record is not None and record.fields["job"] == "train-7"
    assert jm.lookup(43, (GPU1,)) == (None, False)


def test_resolver_attributes_by_gpu_allocation(tmp_path: Path) -> None:
    """Through the resolver, a process on a GPU listed by a job gets the job's identity
    with jobmap as the source of each field."""
    p = proc(100, uid=1001)
    make_tree(tmp_path / "proc", p)
    write_job(tmp_path / "jobs", "j.json", {**JOB, "slurm_job_id": 99, "account": "phys"})
    r = resolver(config(tmp_path, sources=("jobmap", "owner")))
    a = only(r.attribute([gpu(GPU0, p)]))
    assert (a.job, a.user, a.project, a.slurm_job_id, a.slurm_account) == (
        "train-7", "alice", "vision", "99", "phys")
    assert all(a.sources[f] == "jobmap" for f in ("job", "user", "project", "slurm_job_id"))


def test_account_stands_in_for_missing_project(tmp_path: Path) -> None:
    """A job file with an account but no project gets the account as project."""
    write_job(tmp_path, "j.json", {**JOB, "project": None, "account": "phys"})
    jm = _map(tmp_path)
    jm.refresh()
    record, _ = jm.lookup(1, (GPU0,))
    assert record is not None and record.fields["project"] == "phys"


def test_mig_instance_allocation_matches_before_parent(tmp_path: Path) -> None:
    """A job holding one MIG instance claims processes on that instance only."""
    from gpu_audit.model.samples import MigInstance

    mig_uuid = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    p_in, p_out = proc(10, gpu_instance_id=1), proc(11, gpu_instance_id=2)
    make_tree(tmp_path / "proc", p_in, p_out)
    write_job(tmp_path / "jobs", "j.json", {**JOB, "gpus": [mig_uuid]})
    r = resolver(config(tmp_path, sources=("jobmap",)))
    sample = gpu(GPU0, p_in, p_out, mig=(MigInstance(mig_uuid, 1, 0, "1g.10gb"),))
    a_in, a_out = (x.attribution for x in r.attribute([sample])[GPU0])
    assert a_in.job == "train-7"
    assert a_out.job == ""


def test_malformed_file_reported_once_skipped_and_others_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Broken files are logged once each, counted, skipped; the good file still works,
    and a fixed file is picked up on the next cycle."""
    caplog.set_level(logging.WARNING)
    write_job(tmp_path, "a-good.json", JOB)
    bad = write_job(tmp_path, "b-bad.json", "{not json")
    write_job(tmp_path, "c-noversion.json", {**JOB, "version": 2})
    write_job(tmp_path, "d-types.json", {**JOB, "pids": ["x"], "gpus": "GPU-1", "user": 3.5})
    write_job(tmp_path, "e-huge.json", {**JOB, "project": "x" * 70_000})
    jm = _map(tmp_path)
    for _ in range(3):
        jm.refresh()
    assert jm.errors == 4
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 4
    assert "'pids' must be a list" in caplog.text and "'gpus' must be a list" in caplog.text
    record, _ = jm.lookup(1, (GPU0,))
    assert record is not None and record.fields["job"] == "train-7"
    bad.write_text('{"version": 1, "job_id": "fixed", "pids": [5]}')
    os.utime(bad, ns=(1, 1))  # a different mtime, whatever the clock resolution
    jm.refresh()
    fixed, _ = jm.lookup(5, ())
    assert fixed is not None and fixed.fields["job"] == "fixed"


def test_files_are_parsed_only_when_they_change(tmp_path: Path) -> None:
    """Refreshing an unchanged directory parses nothing; a rewritten file is re-read and
    a removed one forgotten."""
    path = write_job(tmp_path, "j.json", JOB)
    jm = _map(tmp_path)
    jm.refresh()
    jm.refresh()
    assert jm.reloads == 1
    gen = jm.generation
    path.write_text(__import__("json").dumps({**JOB, "job_id": "renamed"}))
    os.utime(path, ns=(2, 2))
    jm.refresh()
    assert jm.reloads == 2 and jm.generation > gen
    path.unlink()
    jm.refresh()
    assert jm.lookup(1, (GPU0,)) == (None, False)


def test_temp_and_hidden_files_are_ignored(tmp_path: Path) -> None:
    """Writers' temporary files (not *.json, or dot-files) are never read."""
    write_job(tmp_path, "j.json.tmp", JOB)
    write_job(tmp_path, ".j.json", JOB)
    jm = _map(tmp_path)
    jm.refresh()
    assert jm.lookup(1, (GPU0,)) == (None, False) and jm.errors == 0


def test_ended_job_no_longer_claims_its_gpus(tmp_path: Path) -> None:
    """A job whose end_time has passed stops matching, and the generation moves so
    memoised answers are dropped."""
    now = [1_000.0]
    write_job(tmp_path, "j.json", {**JOB, "start_time": 500, "end_time": 2_000})
    jm = JobMap(tmp_path, wall_clock=lambda: now[0])
    jm.refresh()
    assert jm.lookup(1, (GPU0,))[0] is not None
    gen = jm.generation
    now[0] = 2_500.0
    jm.refresh()
    assert jm.lookup(1, (GPU0,)) == (None, False)
    assert jm.generation > gen


def test_two_live_jobs_on_one_gpu_is_ambiguous(tmp_path: Path) -> None:
    """Two live jobs claiming one GPU give no answer rather than a wrong one."""
    write_job(tmp_path, "a.json", JOB)
    write_job(tmp_path, "b.json", {**JOB, "job_id": "other"})
    jm = _map(tmp_path)
    jm.refresh()
    assert jm.lookup(1, (GPU0,)) == (None, True)


def test_missing_directory_is_quiet_and_empty(tmp_path: Path) -> None:
    """No directory (no launcher on this node) means no answers and no errors."""
    jm = _map(tmp_path / "absent")
    jm.refresh()
    assert jm.lookup(1, (GPU0,)) == (None, False) and jm.errors == 0


def test_label_values_from_job_files_are_sanitised(tmp_path: Path) -> None:
    """Control characters in a job file never reach a label; a lone surrogate (not
    valid UTF-8) makes the file malformed rather than a label invalid."""
    write_job(tmp_path, "j.json", '{"version":1,"job_id":"a\\u0007b\\u00e9c","user":"x\\ny",'
                                  f'"gpus":["{GPU0}"]}}')
    write_job(tmp_path, "k.json", '{"version":1,"job_id":"a\\ud800","pids":[9]}')
    jm = _map(tmp_path)
    jm.refresh()
    record, _ = jm.lookup(1, (GPU0,))
    assert record is not None
    assert record.fields["job"] == "ab\u00e9c" and record.fields["user"] == "xy"
    assert jm.lookup(9, ()) == (None, False) and jm.errors == 1


def test_partition_of_a_slurm_job_file_is_attributed(tmp_path: Path) -> None:
    """The Slurm prolog's `partition` key becomes slurm_partition, with jobmap as its
    source, beside the account (which stands in for the project)."""
    p = proc(100, uid=1001)
    make_tree(tmp_path / "proc", p)
    write_job(tmp_path / "jobs", "slurm-5.json", {
        **JOB, "job_id": "5", "project": None, "slurm_job_id": "5", "account": "phys",
        "partition": "low"})
    r = resolver(config(tmp_path, sources=("jobmap", "owner")))
    a = only(r.attribute([gpu(GPU0, p)]))
    assert (a.slurm_partition, a.slurm_account, a.project) == ("low", "phys", "phys")
    assert a.sources["slurm_partition"] == "jobmap"
    assert a.as_dict()["slurm_partition"] == "low"
