"""The resolver end to end over a fake /proc: precedence, sources, caching, eviction,
vanished processes and bad input."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from exporter.attribution import procfs
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
)  # fmt: skip

CID = "0a1b22ec1361a97c3511db37a4bae932d41b22264e5b97611748f8b662312574"
SLURM_CGROUP = "0::/system.slice/slurmstepd.scope/job_900/step_0/user/task_0"


def _everything(tmp_path: Path) -> object:
    """One process that every source knows something different about."""
    p = proc(
        50,
        uid=1001,  # owner -> bob
        environ={"JOB_ID": "env-job", "USER": "env-user", "PROJECT_NAME": "env-proj"},
        cgroup=SLURM_CGROUP,  # cgroup -> job 900
    )
    make_tree(tmp_path / "proc", p)
    write_job(tmp_path / "jobs", "j.json", {"version": 1, "job_id": "map-job", "user": "map-user",
                                            "pids": [50]})
    return p


@pytest.mark.parametrize(
    ("sources", "job", "user"),
    [
        (("jobmap", "environ", "cgroup", "owner"), ("map-job", "jobmap"), ("map-user", "jobmap")),
        (("environ", "jobmap", "cgroup", "owner"), ("env-job", "environ"), ("env-user", "environ")),
        (("cgroup", "owner", "environ", "jobmap"), ("900", "cgroup"), ("bob", "owner")),
        (("owner", "cgroup"), ("900", "cgroup"), ("bob", "owner")),
    ],
    ids=["jobmap-first", "environ-first", "cgroup-first", "owner-first"],
)
def test_precedence_order_picks_the_winning_source(
    tmp_path: Path, sources: tuple[str, ...], job: tuple[str, str], user: tuple[str, str]
) -> None:
    """The first configured source that knows a field wins it, and the winner is
    recorded as that field's source."""
    p = _everything(tmp_path)
    r = resolver(config(tmp_path, sources=sources))
    a = only(r.attribute([gpu(GPU0, p)]))  # type: ignore[arg-type]
    assert (a.job, a.sources["job"]) == job
    assert (a.user, a.sources["user"]) == user


def test_fields_fall_through_to_later_sources(tmp_path: Path) -> None:
    """Fields the first source does not know come from later ones, each with its own
    recorded source; unknown fields have no source entry."""
    p = _everything(tmp_path)
    a = only(resolver(config(tmp_path)).attribute([gpu(GPU0, p)]))  # type: ignore[arg-type]
    assert a.sources == {
        "job": "jobmap", "user": "jobmap", "project": "environ", "slurm_job_id": "cgroup",
    }  # fmt: skip
    assert a.project == "env-proj" and a.slurm_job_id == "900"


def test_owner_name_and_uid_fallback(tmp_path: Path) -> None:
    """The real uid maps to a user name; an unknown uid shows as uid:<n>."""
    known, unknown = proc(1, uid=1000), proc(2, uid=4242)
    make_tree(tmp_path / "proc", known, unknown)
    r = resolver(config(tmp_path, sources=("owner",)))
    a, b = (x.attribution for x in r.attribute([gpu(GPU0, known, unknown)])[GPU0])
    assert (a.user, a.sources) == ("alice", {"user": "owner"})
    assert b.user == "uid:4242"


def test_passwd_file_supplies_user_names(tmp_path: Path) -> None:
    """With passwd_file set, names come from that file, not the host's database."""
    p = proc(3, uid=3000)
    make_tree(tmp_path / "proc", p)
    passwd = tmp_path / "passwd"
    passwd.write_text("# sim users\nroot:x:0:0::/root:/bin/sh\ndana:x:3000:3000::/h:/bin/sh\n")
    from exporter.attribution.resolver import Resolver

    r = Resolver(config(tmp_path, sources=("owner",), passwd_file=passwd))
    assert only(r.attribute([gpu(GPU0, p)])).user == "dana"


def test_vanished_process_is_quiet_and_falls_back_to_nvml(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process that exited before /proc was read is counted, not logged, and still
    attributed from what the backend reported (its uid) and the job map."""
    caplog.set_level(logging.DEBUG)
    p = proc(77, uid=1000)
    (tmp_path / "proc").mkdir()
    write_job(tmp_path / "jobs", "j.json", {"version": 1, "job_id": "J", "gpus": [GPU0]})
    r = resolver(config(tmp_path))
    a = only(r.attribute([gpu(GPU0, p)]))
    assert (a.user, a.job, a.sources) == ("alice", "J", {"user": "owner", "job": "jobmap"})
    assert r.stats()["proc_vanished"] == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]


def test_process_vanishing_between_reads_is_handled(tmp_path: Path) -> None:
    """stat readable but the other files gone (exit mid-read): counted as vanished."""
    p = proc(78, environ={"USER": "x"})
    make_tree(tmp_path / "proc", p)
    for name in ("status", "environ", "cgroup"):
        (tmp_path / "proc" / "78" / name).unlink()
    r = resolver(config(tmp_path))
    a = only(r.attribute([gpu(GPU0, p)]))
    assert a.user == "alice"  # from the sample's uid
    assert r.stats()["proc_vanished"] == 1


def test_cache_hit_on_second_cycle_and_reread_on_pid_reuse(tmp_path: Path) -> None:
    """The second cycle reads only stat (cache hit); a new start time under the same
    pid (pid reuse) re-reads everything and yields the new process's identity."""
    root = tmp_path / "proc"
    first = proc(9, environ={"JOB_ID": "old"}, start=100)
    make_tree(root, first)
    r = resolver(config(tmp_path, sources=("environ",)))
    assert only(r.attribute([gpu(GPU0, first)])).job == "old"
    # Same start time: even a changed environ file is not re-read.
    (root / "9" / "environ").write_bytes(b"JOB_ID=changed\0")
    assert only(r.attribute([gpu(GPU0, first)])).job == "old"
    assert (r.stats()["cache_misses"], r.stats()["cache_hits"]) == (1, 1)
    reused = proc(9, environ={"JOB_ID": "new"}, start=200)
    make_tree(root, reused)
    assert only(r.attribute([gpu(GPU0, reused)])).job == "new"
    assert r.stats()["cache_misses"] == 2


def test_pids_not_seen_are_evicted(tmp_path: Path) -> None:
    """A pid absent from a cycle leaves the cache; if it comes back it is re-read."""
    a, b = proc(1), proc(2)
    make_tree(tmp_path / "proc", a, b)
    r = resolver(config(tmp_path, sources=("owner",)))
    r.attribute([gpu(GPU0, a, b)])
    r.attribute([gpu(GPU0, a)])
    assert r.stats()["evictions"] == 1
    r.attribute([gpu(GPU0, a, b)])
    assert r.stats()["cache_misses"] == 3


def test_same_pid_on_two_gpus_read_once(tmp_path: Path) -> None:
    """A process using two GPUs is read once per cycle and attributed on both."""
    p = proc(5)
    make_tree(tmp_path / "proc", p)
    r = resolver(config(tmp_path, sources=("owner",)))
    out = r.attribute([gpu(GPU0, p), gpu(GPU1, p, index=1)])
    assert out[GPU0][0].attribution.user == out[GPU1][0].attribution.user == "alice"
    assert r.stats()["cache_misses"] == 1 and r.stats()["cache_hits"] == 0


def test_symlink_loop_in_procfs_root(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A procfs root that is a symlink loop (ELOOP) never raises: counted, logged once."""
    root = tmp_path / "proc"
    os.symlink(root, root)  # proc -> proc
    p = proc(3)
    r = resolver(config(tmp_path))
    for _ in range(3):
        a = only(r.attribute([gpu(GPU0, p)]))
    assert a.user == "alice"  # the backend's uid still answers
    assert r.stats()["proc_loop"] == 3
    assert len([rec for rec in caplog.records if "proc_loop" in rec.getMessage()]) == 1


def test_garbage_in_stat_and_status(tmp_path: Path) -> None:
    """Unparseable stat and status are counted; environ and cgroup are still used and
    nothing garbage-derived is cached."""
    root = tmp_path / "proc"
    p = proc(4, environ={"JOB_ID": "ok"}, cgroup=f"0::/system.slice/docker-{CID}.scope")
    make_tree(root, p)
    (root / "4" / "stat").write_bytes(b"\xff\xfe garbage without fields")
    (root / "4" / "status").write_bytes(b"Name:\tx\nUid:\tnot-a-number\n")
    r = resolver(config(tmp_path))
    a = only(r.attribute([gpu(GPU0, p)]))
    assert (a.job, a.container_id, a.container_runtime) == ("ok", CID, "docker")
    assert a.user == ""  # the real uid is unknown: never guessed from elsewhere
    assert r.stats()["proc_parse_errors"] == 2
    r.attribute([gpu(GPU0, p)])
    assert r.stats()["cache_hits"] == 0


def test_stat_with_spaces_and_parens_in_command_name(tmp_path: Path) -> None:
    """A command name like 'a) (b c' does not shift the start-time field."""
    stat = b"12 (a) (b c) S 1 12 12 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0\n"
    assert procfs.parse_start_time(stat) == 98765


def test_huge_environ_is_bounded(tmp_path: Path) -> None:
    """An environ larger than environ_max_bytes is read only up to the limit, counted
    as truncated, and keys before the cut still answer."""
    root = tmp_path / "proc"
    p = proc(6)
    make_tree(root, p)
    (root / "6" / "environ").write_bytes(b"JOB_ID=early\0" + b"PAD=" + b"x" * 1_000_000
                                         + b"\0USER=late\0")
    r = resolver(config(tmp_path, sources=("environ",), environ_max_bytes=8192))
    a = only(r.attribute([gpu(GPU0, p)]))
    assert a.job == "early" and a.user == ""
    assert r.stats()["environ_truncated"] == 1


def test_non_utf8_environ(tmp_path: Path) -> None:
    """Invalid UTF-8 in environ yields clean, valid UTF-8 label values."""
    root = tmp_path / "proc"
    p = proc(7)
    make_tree(root, p)
    (root / "7" / "environ").write_bytes(b"USER=\xc3\x28bad\xa0\0PROJECT_NAME=\xe2\x82\0")
    a = only(resolver(config(tmp_path, sources=("environ",))).attribute([gpu(GPU0, p)]))
    assert a.user == "(bad"
    assert a.project == ""
    assert "project" not in a.sources


def test_environ_permission_denied_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EACCES on another user's environ (no CAP_SYS_PTRACE) is counted quietly; the
    other sources still answer. (The tests run as root, so the kernel's refusal is
    injected at os.open with the errno it would raise.)"""
    caplog.set_level(logging.DEBUG)
    root = tmp_path / "proc"
    p = proc(8, environ={"USER": "hidden"}, cgroup=f"0::/system.slice/docker-{CID}.scope")
    make_tree(root, p)
    real_open = os.open

    def guarded_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if str(path).endswith("/environ"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(procfs.os, "open", guarded_open)
    r = resolver(config(tmp_path))
    a = only(r.attribute([gpu(GPU0, p)]))
    assert (a.user, a.sources["user"]) == ("alice", "owner")
    assert a.container_id == CID
    assert r.stats()["environ_denied"] == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]


def test_unexpected_errno_is_counted_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An I/O error (EIO) on cgroup is counted as proc_error, logged once, no raise."""
    root = tmp_path / "proc"
    p = proc(11)
    make_tree(root, p)
    real_open = os.open

    def eio_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if str(path).endswith("/cgroup"):
            raise OSError(errno.EIO, "I/O error", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(procfs.os, "open", eio_open)
    r = resolver(config(tmp_path))
    for i in range(2):
        r.attribute([gpu(GPU0, proc(11 + i * 100))])
        make_tree(root, proc(111))
    assert r.stats()["proc_error"] == 2
    assert len([rec for rec in caplog.records if "proc_error" in rec.getMessage()]) == 1


def test_output_keeps_gpu_and_process_order(tmp_path: Path) -> None:
    """One AttributedProcess per ProcessSample, in order, keyed by GPU uuid; a GPU with
    no processes maps to an empty tuple."""
    ps = [proc(i, uid=1000 + (i % 2)) for i in range(1, 6)]
    make_tree(tmp_path / "proc", *ps)
    out = resolver(config(tmp_path)).attribute([gpu(GPU0, *ps), gpu(GPU1, index=1)])
    assert [x.process.pid for x in out[GPU0]] == [1, 2, 3, 4, 5]
    assert all(x.gpu_uuid == GPU0 for x in out[GPU0])
    assert out[GPU1] == ()


def test_missing_procfs_root_warns_once_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A procfs_root that does not exist is named in a warning with the fix."""
    resolver(config(tmp_path))
    assert "mount the host's /proc" in caplog.text


def _age(root: Path, pid: int, seconds: float = 60.0) -> None:
    """Make a pid's files look written `seconds` ago (past the racy-clean window)."""
    for f in (root / str(pid)).iterdir():
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def _count_start_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = procfs.read_start_time

    def counting(path: str) -> int:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(procfs, "read_start_time", counting)
    return reads


def test_unchanged_stat_file_is_not_read_again_and_answer_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a cached pid whose stat file is untouched (same inode and times) a cycle costs
    one stat(2): the start time is not re-read, and the very same Attribution object is
    handed out again (so consumers can cache by it)."""
    root = tmp_path / "proc"
    p = proc(21, environ={"JOB_ID": "j"}, start=500)
    make_tree(root, p)
    _age(root, 21)
    reads = _count_start_reads(monkeypatch)
    r = resolver(config(tmp_path, sources=("environ", "owner")))
    first = only(r.attribute([gpu(GPU0, p)]))
    again = [only(r.attribute([gpu(GPU0, p)])) for _ in range(3)]
    assert len(reads) == 1
    assert all(a is first for a in again)
    assert (r.stats()["cache_misses"], r.stats()["cache_hits"]) == (1, 3)


def test_pid_reuse_is_detected_when_stat_is_rewritten_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stat file rewritten in place (same inode, same size) with a new start time is
    noticed by its changed mtime: the pid is re-read and the cached answer dropped."""
    root = tmp_path / "proc"
    old = proc(22, environ={"JOB_ID": "old"}, start=100)
    make_tree(root, old)
    _age(root, 22)
    r = resolver(config(tmp_path, sources=("environ",)))
    first = only(r.attribute([gpu(GPU0, old)]))
    assert first.job == "old"
    stat = root / "22" / "stat"
    stat.write_bytes(stat.read_bytes().replace(b" 100 ", b" 200 "))  # same length
    (root / "22" / "environ").write_bytes(b"JOB_ID=new\0")
    new = only(r.attribute([gpu(GPU0, proc(22, environ={"JOB_ID": "new"}, start=200))]))
    assert new.job == "new" and new is not first
    assert r.stats()["cache_misses"] == 2


def test_fresh_stat_file_is_read_every_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stat file modified within the timestamp granularity window is not trusted by
    its stat(2) alone (a rewrite in the same tick could keep the times): its start time
    is read again, and while it stays the same the entry is still a cache hit."""
    root = tmp_path / "proc"
    p = proc(23, start=300)
    make_tree(root, p)
    reads = _count_start_reads(monkeypatch)
    r = resolver(config(tmp_path, sources=("owner",)))
    for _ in range(3):
        assert only(r.attribute([gpu(GPU0, p)])).user == "alice"
    assert len(reads) == 3
    assert (r.stats()["cache_misses"], r.stats()["cache_hits"]) == (1, 2)


def test_cached_pid_that_vanishes_is_counted_and_evicted(tmp_path: Path) -> None:
    """A cached, trusted pid whose /proc directory disappears is counted as vanished,
    falls back to the backend's uid, and is read afresh if the pid comes back."""
    root = tmp_path / "proc"
    p = proc(24, environ={"JOB_ID": "j"}, start=400)
    make_tree(root, p)
    _age(root, 24)
    r = resolver(config(tmp_path, sources=("environ", "owner")))
    assert only(r.attribute([gpu(GPU0, p)])).job == "j"
    for f in (root / "24").iterdir():
        f.unlink()
    (root / "24").rmdir()
    gone = only(r.attribute([gpu(GPU0, p)]))
    assert (gone.job, gone.user) == ("", "alice")
    assert r.stats()["proc_vanished"] == 1
    make_tree(root, p)
    assert only(r.attribute([gpu(GPU0, p)])).job == "j"
    assert r.stats()["cache_misses"] == 2
