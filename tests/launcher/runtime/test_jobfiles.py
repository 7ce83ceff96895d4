"""Per-job files and the directories the daemon writes in, against a hostile user who
plants links, FIFOs and hard links (launcher/safefs.py, launcher/jobfiles.py)."""

from __future__ import annotations

import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from launcher.jobfiles import MAX_EVENT_LINE, JobFiles, LineSplitter
from launcher.jobmap import JobMapWriter
from launcher.safefs import RefusedFile, UnsafePath, create_new, open_checked, open_dir
from tests.launcher.runtime.hostile import as_user
from tests.launcher.runtime.users import ALICE, local_user, shared_dir


@pytest.fixture
def shared() -> Iterator[Path]:
    d = shared_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _root_file(d: Path, text: str) -> Path:
    p = d / f"root-{text}"
    p.write_text(text)
    p.chmod(0o600)
    return p


def test_open_dir_refuses_what_another_user_could_swap(shared: Path) -> None:
    """A link on the way, a component another user owns, a parent writable by others
    without the sticky bit: each refused with the component named. A sticky parent
    (like /tmp) is fine, and the daemon's own directory gets the mode asked for."""
    alice = local_user(ALICE)
    real = shared / "real"
    real.mkdir()
    (shared / "link").symlink_to(real)
    with pytest.raises(UnsafePath, match="link"):
        open_dir(shared / "link" / "state", mode=0o711)
    hers = shared / "hers"
    hers.mkdir()
    os.chown(hers, alice.pw_uid, alice.pw_gid)
    with pytest.raises(UnsafePath, match=f"belongs to uid {alice.pw_uid}"):
        open_dir(hers / "state", mode=0o711)
    open_ = shared / "open"
    open_.mkdir()
    open_.chmod(0o777)
    with pytest.raises(UnsafePath, match="without the sticky bit"):
        open_dir(open_ / "state", mode=0o711)
    fd = open_dir(shared / "ok" / "state", mode=0o711)
    os.close(fd)
    assert stat.S_IMODE((shared / "ok" / "state").stat().st_mode) == 0o711
    assert stat.S_IMODE((shared / "ok").stat().st_mode) == 0o755


def test_create_new_removes_a_planted_link_and_never_touches_its_target(
        shared: Path) -> None:
    """The file is made fresh (O_EXCL) after the link with its name is removed: the
    target keeps its owner, mode and content."""
    alice = local_user(ALICE)
    target = _root_file(shared, "target")
    d = shared / "d"
    d.mkdir()
    (d / "1.out").symlink_to(target)
    dfd = open_dir(d, mode=0o711)
    try:
        fd = create_new(dfd, "1.out", mode=0o640, uid=alice.pw_uid, gid=0)
        os.write(fd, b"job output\n")
        os.close(fd)
    finally:
        os.close(dfd)
    st = target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode), target.read_text()) == (0, 0o600, "target")
    made = (d / "1.out").lstat()
    assert stat.S_ISREG(made.st_mode) and made.st_uid == alice.pw_uid


def test_open_checked_refuses_links_fifos_strangers_and_hard_links(shared: Path) -> None:
    """A link, a FIFO (opened without blocking), a file of another owner and a file with
    a second hard link are refused; the daemon's own regular file is read."""
    alice = local_user(ALICE)
    d = shared / "d"
    d.mkdir()
    (d / "link").symlink_to(_root_file(shared, "secret"))
    os.mkfifo(d / "fifo")
    os.chown(d / "fifo", alice.pw_uid, alice.pw_gid)
    (d / "rootfile").write_text("root's")
    (d / "hers").write_text("hers")
    os.chown(d / "hers", alice.pw_uid, alice.pw_gid)
    os.link(d / "hers", d / "hers2")
    (d / "mine").write_text("mine")
    os.chown(d / "mine", alice.pw_uid, alice.pw_gid)
    dfd = open_dir(d, mode=None)
    try:
        for name, why in (("link", "symbolic link"), ("fifo", "not a regular file"),
                          ("rootfile", "belongs to uid 0"), ("hers", "2 hard links")):
            with pytest.raises(RefusedFile, match=why):
                open_checked(dfd, name, owner=alice.pw_uid)
        fd, _ = open_checked(dfd, "mine", owner=alice.pw_uid)
        assert os.read(fd, 10) == b"mine"
        os.close(fd)
    finally:
        os.close(dfd)


def test_an_older_daemons_job_directory_is_closed_and_its_planted_links_removed(
        shared: Path) -> None:
    """An older daemon left a job directory root:<alice's group> 0770, and alice planted
    links to root's files for the next attempt's names: the new attempt's files are
    fresh files of hers, the directory becomes the daemon's 0711, root's files are
    untouched, and reading a planted log is refused."""
    alice = local_user(ALICE)
    files = JobFiles(shared / "state" / "logs")
    jobdir = shared / "state" / "logs" / "7"
    jobdir.mkdir()
    os.chown(jobdir, 0, alice.pw_gid)
    jobdir.chmod(0o770)
    (shared / "state").chmod(0o755)
    targets = {n: _root_file(shared, n.replace(".", "_")) for n in
               ("2.out", "2.err", "2.events.jsonl", "2.exit", "1.out")}
    planted = as_user(ALICE, "plant_links", jobdir, *(f"{n}={p}" for n, p in targets.items()))
    assert set(planted.values()) == {"linked"}, planted
    attempt = files.create_attempt(7, 2, alice.pw_uid)
    attempt.close()
    st = jobdir.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, os.getegid(), 0o711)
    for name, target in targets.items():
        assert target.read_text() == name.replace(".", "_") and target.stat().st_uid == 0
        if name.startswith("2."):
            made = (jobdir / name).lstat()
            assert stat.S_ISREG(made.st_mode) and made.st_uid == alice.pw_uid, name
    with pytest.raises(RefusedFile, match="symbolic link"):
        files.read(7, 1, "out", owner=alice.pw_uid, offset=0, size=100)
    again = as_user(ALICE, "plant_links", jobdir, f"2.out={targets['1.out']}")
    assert again == {"2.out": "EACCES"}, "alice can still write her job's directory"
    files.close()


def test_events_are_read_in_bounded_lines() -> None:
    """An events line longer than MAX_EVENT_LINE is dropped whole, however it arrives,
    and the lines around it are kept; nothing of it is buffered."""
    s = LineSplitter()
    got = s.feed(b'{"a":1}\n' + b"x" * (MAX_EVENT_LINE // 2))
    got += s.feed(b"x" * MAX_EVENT_LINE)
    assert s.partial == b"" and s.skipping
    got += s.feed(b"x" * MAX_EVENT_LINE + b'\n{"b":2}\n{"c"')
    got += s.feed(b':3}\n')
    assert got == [b'{"a":1}', b'{"b":2}', b'{"c":3}']


def test_the_newest_checkpoint_is_found_from_the_end_past_a_huge_line(shared: Path) -> None:
    """A restart looks for the newest commit from the end of the events file, skipping
    lines too long to be events and reading a bounded amount."""
    alice = local_user(ALICE)
    files = JobFiles(shared / "state" / "logs")
    files.create_attempt(3, 1, alice.pw_uid).close()
    events = shared / "state" / "logs" / "3" / "1.events.jsonl"
    lines = [orjson.dumps({"event": "checkpoint_committed", "step": 5, "time": 100.0}),
             b"y" * (3 * MAX_EVENT_LINE),
             orjson.dumps({"event": "checkpoint_committed", "step": 9, "time": 200.0}),
             orjson.dumps({"event": "metrics", "step": 10, "loss": 0.1}),
             b'{"event": "checkpoint_committed", "step": -4, "time": 1e300}']
    events.write_bytes(b"\n".join(lines) + b"\n" + b"z" * 1000)
    # the newest commit line names no valid time or step: both read as unknown
    assert files.newest_checkpoint(3, 1, owner=alice.pw_uid) == (None, None)
    events.write_bytes(b"\n".join(lines[:4]) + b"\n")
    assert files.newest_checkpoint(3, 1, owner=alice.pw_uid) == (200.0, 9)
    files.close()


def test_a_fifo_as_events_file_never_blocks_the_daemon(shared: Path) -> None:
    """A job that swaps its events file for a FIFO (its directory is not its own, so only
    an older layout allows that) gets its reports refused; the read never blocks."""
    alice = local_user(ALICE)
    files = JobFiles(shared / "state" / "logs")
    files.create_attempt(4, 1, alice.pw_uid).close()
    path = shared / "state" / "logs" / "4" / "1.events.jsonl"
    path.unlink()
    os.mkfifo(path)
    os.chown(path, alice.pw_uid, alice.pw_gid)
    done = threading.Event()

    def read() -> None:
        with pytest.raises(RefusedFile, match="not a regular file"):
            files.read(4, 1, "events.jsonl", owner=alice.pw_uid, offset=0, size=10)
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "reading a FIFO blocked"
    files.close()


def test_job_mapping_directory_must_be_safe(shared: Path) -> None:
    """The job-mapping directory is refused under a directory others may write without
    the sticky bit; in a safe one, files are written through its descriptor, 0644."""
    bad = shared / "open"
    bad.mkdir()
    bad.chmod(0o777)
    with pytest.raises(UnsafePath):
        JobMapWriter(bad / "jobs")
    w = JobMapWriter(shared / "jobs", clock=lambda: 5.0, keep_seconds=0)
    w.started("9", user="u", project=None, gpus=["GPU-x"], pids=[1], start_time=1.0,
              attempt=1)
    path = shared / "jobs" / "job-9.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    w.ended("9")
    assert orjson.loads(path.read_bytes())["end_time"] == 5.0
    assert [p.name for p in (shared / "jobs").iterdir()] == ["job-9.json"]
    assert w.sweep() == ["9"] and not path.exists()
    w.close()
