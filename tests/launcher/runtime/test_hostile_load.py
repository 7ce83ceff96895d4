"""Hostile local users who try to starve, bloat or out-quota the daemon, as real unix
users against the real daemon (tests/launcher/runtime/daemon.py, hostile.py):

- a job's own events file flooded with checkpoint and anomaly lines;
- a pipeline whose shared defaults are copied into every one of its jobs;
- a connect/close loop that keeps the listen backlog full (of the common socket, or of
  the user's own);
- a `project:` naming a project its user is no member of;
- hundreds of CPU-only jobs at once;
- a daemon started by hand that creates its own socket directory.

Each test fails on the daemon before its bound existed; none asserts a duration.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launcher.protocol import user_socket_dir, user_socket_path
from tests.launcher.runtime.daemon import LauncherDaemon
from tests.launcher.runtime.hostile import Holding, as_user
from tests.launcher.runtime.users import ALICE, BOB, job_python, local_user
from tests.polling import wait_for

PY = job_python()


def _submit(d: LauncherDaemon, home: Path, user: str, doc: object,
            check: bool = True) -> tuple[list[int], str]:
    spec = home / f"spec-{secrets.token_hex(4)}.yaml"
    spec.write_text(yaml.safe_dump(doc))
    spec.chmod(0o644)
    r = d.client(user, "submit", spec.name, check=check)
    if r.returncode != 0:
        return [], r.stdout + r.stderr
    pairs = r.stdout.split(": ", 1)[1].split(", ")
    return [int(p.split()[0]) for p in pairs], r.stdout


# ------------------------------------------------------------ 1. an events file flood

_FLOOD = """
import json, os, time
f = open(os.environ["GPU_AUDIT_EVENTS_FILE"], "a")
pad = "p" * 150
for i in range(40000):
    kind = "checkpoint_committed" if i % 4 else "anomaly"
    f.write(json.dumps({"event": kind, "time": time.time(), "step": i,
                        "reason": "nan-%d" % (i % 50), "path": "/ckpt/" + pad}) + "\\n")
f.write(json.dumps({"event": "checkpoint_committed", "time": time.time(),
                    "step": 99999, "path": "/ckpt/final"}) + "\\n")
f.close()
time.sleep(1.5)
"""


@pytest.fixture
def flood_daemon(home: Path) -> Iterator[LauncherDaemon]:
    d = LauncherDaemon(home, gpus=1, extra={"limits": {
        "events_window_seconds": 1, "events_max_bytes": 64 * 1024,
        "events_max_lines": 500}}).start()
    yield d
    d.stop()
    d.kill_jobs()


def test_an_events_flood_is_bounded_coalesced_and_named(flood_daemon: LauncherDaemon,
                                                        home: Path) -> None:
    """alice's CPU-only job writes 40,000 checkpoint and anomaly lines (8 MB) to its
    events file at once: the daemon reads at most its budget, stores a handful of
    coalesced events, still sees the job's final checkpoint, names the job in its log and
    its record, and bob's CLI calls all succeed meanwhile."""
    d = flood_daemon
    [job], _ = _submit(d, home, ALICE, {"name": "flood", "gpus": 0,
                                        "command": [PY, "-c", _FLOOD]})
    d.wait_state(job, {"running"}, timeout=30)
    for _ in range(4):
        r = d.client(BOB, "queue", check=False, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
    done = d.wait_state(job, {"succeeded", "failed"}, timeout=60)
    assert done["state"] == "succeeded", done
    assert done["last_checkpoint_step"] == 99999, done  # the newest commit is not lost
    full = d.ask({"op": "status", "id": job})["job"]
    kinds = [e["kind"] for e in full["events"]]
    assert "events_over_budget" in kinds, kinds
    assert full["events_total"] < 400, full["events_total"]  # 40,000 lines before
    ckpts = [e for e in full["events"] if e["kind"] == "checkpoint_committed"]
    assert any(e.get("count", 1) > 1 for e in ckpts), ckpts[:3]
    log = d.log.read_text()
    assert f"job {job} (uid " in log and "events_max_bytes" in log
    assert d.alive()


def test_status_pages_a_jobs_events(flood_daemon: LauncherDaemon, home: Path) -> None:
    """A job with more events than one page: `status` carries the newest page and the
    total, and --events-from gets an older one."""
    d = flood_daemon
    script = ("import json, os, time\nf = open(os.environ['GPU_AUDIT_EVENTS_FILE'], 'a')\n"
              "for i in range(300):\n"
              "    f.write(json.dumps({'event': 'anomaly', 'time': time.time(),"
              " 'reason': 'r%d' % i}) + '\\n'); f.flush(); time.sleep(0.012)\n")
    [job], _ = _submit(d, home, ALICE, {"name": "pages", "gpus": 0,
                                        "command": [PY, "-c", script]})
    d.wait_state(job, {"succeeded"}, timeout=60)
    first = d.ask({"op": "status", "id": job})["job"]
    total = first["events_total"]
    assert len(first["events"]) == min(total, 200)
    assert total > 200 and first["events_from"] == total - 200
    r = d.client(ALICE, "status", str(job), "--events-from", "0", "--json")
    page = json.loads(r.stdout)["job"]
    assert page["events_from"] == 0 and page["events"][0]["kind"] == "queued"


# ------------------------------------------------------- 3. a connect/close loop


def test_a_connect_close_loop_locks_nobody_out(home: Path) -> None:
    """bob runs four processes that connect and close as fast as they can (the listen
    queue used to stay full: `queue` failed 13 times in 15 with EAGAIN); alice's CLI
    calls all succeed meanwhile, and bob's excess is refused per uid and counted."""
    d = LauncherDaemon(home, gpus=1).start()
    try:
        with Holding(BOB, "connect_close", d.socket, 3, 60):
            failed = []
            for _ in range(4):
                r = d.client(ALICE, "queue", check=False, timeout=60)
                if r.returncode != 0:
                    failed.append(r.stderr.strip()[-200:])
            assert not failed, failed
        assert d.alive()
        metrics = d.scrape()
        assert 'gpu_audit_launcher_connections_refused_total{reason="per_uid_rate"}' \
            in metrics
    finally:
        d.stop()


def test_each_user_gets_a_socket_of_their_own_that_nobody_else_may_use(home: Path) -> None:
    """After a user's first call, the daemon listens for that uid alone on
    `<socket>.d/<uid>` (owned by the uid, 0600, in the daemon's own 0755 directory), so a
    flood of the common socket's single queue is not in front of their next call; another
    user cannot connect to it. What a dead daemon left in the directory is removed at start,
    never followed."""
    own_dir = user_socket_dir(home / "launcher.sock")
    own_dir.mkdir(mode=0o755)
    outside = home / "outside.txt"
    outside.write_text("keep")
    (own_dir / "1234").symlink_to(outside)
    d = LauncherDaemon(home, gpus=1).start()
    try:
        assert not (own_dir / "1234").is_symlink() and outside.read_text() == "keep"
        d.client(ALICE, "queue")
        alice = pwd.getpwnam(ALICE).pw_uid
        mine = user_socket_path(d.socket, alice)
        st = os.lstat(mine)
        assert stat.S_ISSOCK(st.st_mode) and st.st_uid == alice, st
        assert stat.S_IMODE(st.st_mode) == 0o600
        dst = os.stat(own_dir)
        assert dst.st_uid == 0 and stat.S_IMODE(dst.st_mode) == 0o755
        assert as_user(BOB, "connect_to", mine)["result"] == "EACCES"
        assert as_user(ALICE, "connect_to", mine)["result"] == "ok"
        with Holding(BOB, "connect_close", d.socket, 3, 60):
            for _ in range(4):
                d.client(ALICE, "queue", timeout=60)
        assert d.alive()
    finally:
        d.stop()
    assert not mine.exists()  # removed with the daemon


def test_a_flood_of_a_users_own_socket_pauses_only_that_socket(home: Path) -> None:
    """bob loops connect/close on his own socket: the daemon stops listening there while
    he is over his rate (said once in its log) and alice's calls go on."""
    d = LauncherDaemon(home, gpus=1).start()
    try:
        d.client(BOB, "queue")
        d.client(ALICE, "queue")
        bobs = user_socket_path(d.socket, pwd.getpwnam(BOB).pw_uid)
        with Holding(BOB, "connect_close", bobs, 3, 60):
            wait_for(lambda: "over its connect rate on its own socket" in d.log.read_text(),
                     30, "the daemon to pause bob's own socket")
            for _ in range(4):
                d.client(ALICE, "queue", timeout=60)
        assert d.alive()
        d.client(BOB, "queue")  # his socket is listened on again once he stops
    finally:
        d.stop()


# -------------------------------------------------------- 4. projects have members

VISION = f"gpa-vision-{ALICE.rsplit('-', 1)[1]}"


def test_only_members_may_queue_against_a_project(home: Path) -> None:
    """bob writes `project: vision` to fill vision's waiting-job cap (2): refused, naming
    the project and how its membership is configured; alice, a member of its unix group,
    queues against it; a project nobody configured is refused too (no escape from a
    capped project by naming another)."""
    local_user(ALICE, groups=(VISION,))
    d = LauncherDaemon(home, gpus=1, core={
        "projects": {"vision": {"groups": [VISION]}, "nlp": {"users": [ALICE]}},
        "quotas": {"projects": {"vision": {"max_queued_jobs": 2}}}}).start()
    try:
        hold = {"gpus": 1, "command": [PY, "-c", "import time; time.sleep(60)"]}
        ids, said = _submit(d, home, BOB, {"project": "vision", "jobs": [
            {"name": "squat1", **hold}, {"name": "squat2", **hold}]}, check=False)
        assert not ids, said
        assert "project 'vision' is for members of group " + VISION in said, said
        assert "core.projects.vision" in said and f"{BOB} is not a member" in said, said
        ids, said = _submit(d, home, BOB, {"project": "anything", "name": "escape",
                                            **hold}, check=False)
        assert not ids and "project 'anything' is not a project here" in said, said
        ids, said = _submit(d, home, BOB, {"name": "own", "gpus": 0,
                                            "command": [PY, "-c", "pass"]})
        assert ids, said  # no project: the default one, open to all
        mine, said = _submit(d, home, ALICE, {"project": "vision", "jobs": [
            {"name": "a1", **hold}, {"name": "a2", **hold}]})
        assert len(mine) == 2, said
        nlp, said = _submit(d, home, ALICE, {"project": "nlp", "name": "n", "gpus": 0,
                                              "command": [PY, "-c", "pass"]})
        assert nlp, said
    finally:
        d.stop()
        d.kill_jobs()


# ---------------------------------------------- 6. the socket directory it creates


def test_serve_by_hand_creates_a_socket_directory_others_can_reach(home: Path) -> None:
    """`launcher serve` run by hand (umask 077 inside) with a socket in a directory that
    does not exist yet: the directory is made 0755, so alice, another user, is served."""
    sock = home / "run" / "gpu-audit" / "launcher.sock"
    d = LauncherDaemon(home, gpus=1, extra={"socket": str(sock), "socket_mode": 0o666})
    d.socket = sock
    d.start()
    try:
        r = d.client(ALICE, "queue", check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o755
        assert stat.S_IMODE((home / "run").stat().st_mode) == 0o755
    finally:
        d.stop()


def test_a_socket_directory_others_cannot_search_is_refused_clearly(home: Path) -> None:
    """An existing 0700 directory for a 0666 socket: serve exits naming the directory,
    its mode and the fix, instead of serving a socket nobody else can reach."""
    closed = home / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    d = LauncherDaemon(home, gpus=1, extra={"socket": str(closed / "launcher.sock")})
    d.socket = closed / "launcher.sock"
    with pytest.raises(AssertionError) as err:
        d.start()
    assert f"{closed} is mode 0700: other users cannot reach the socket" in str(err.value)
    assert "chmod o+x" in str(err.value)


# -------------------------------------------- 5. CPU-only jobs have a running cap


def test_cpu_only_jobs_count_against_a_users_running_cap(home: Path) -> None:
    """alice submits eight `gpus: 0` jobs with a running cap of 3: three run, the others
    wait as user_limit naming quotas.user.max_running_jobs; bob's job still starts."""
    d = LauncherDaemon(home, gpus=1, core={
        "quotas": {"user": {"max_running_jobs": 3}}}).start()
    try:
        sleep = {"gpus": 0, "command": [PY, "-c", "import time; time.sleep(60)"]}
        ids, said = _submit(d, home, ALICE, {"jobs": [
            {"name": f"cpu{i}", **sleep} for i in range(8)]})
        assert len(ids) == 8, said
        [bobs], _ = _submit(d, home, BOB, {"name": "bob", **sleep})
        d.wait_state(bobs, {"running"}, timeout=30)
        wait_for(lambda: sum(d.job(i)["state"] == "running" for i in ids) == 3, 30,
                 "three of alice's jobs to run")
        waiting = [d.job(i) for i in ids if d.job(i)["state"] != "running"]
        assert len(waiting) == 5
        for j in waiting:
            assert j["wait_reason"] == "user_limit", j
            assert "quotas.user.max_running_jobs" in j["wait_detail"], j
        assert sum(d.job(i)["state"] == "running" for i in ids) == 3
    finally:
        d.stop()
        d.kill_jobs()


# ------------------------------------------------------ 2. spec amplification

_BIG_ENV = {f"V{i}": "x" * 1000 for i in range(250)}  # 250 KB, under max_spec_bytes


def _db(d: LauncherDaemon, sql: str) -> object:
    db = sqlite3.connect(f"file:{d.state / 'launcher.db'}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(sql).fetchone()[0]
    finally:
        db.close()


def test_a_pipeline_cannot_amplify_its_defaults_into_the_state(home: Path) -> None:
    """bob's 250 KB pipeline whose top-level env is copied into 100 jobs (25 MB once
    expanded) is refused naming quotas.max_expanded_bytes; a smaller one is stored with
    its shared env once, not once per job."""
    d = LauncherDaemon(home, gpus=1).start()
    try:
        jobs = [{"name": "first", "gpus": 0, "command": [PY, "-c", "raise SystemExit(1)"]}]
        jobs += [{"name": f"j{i}", "gpus": 0, "after": ["first"],
                  "command": [PY, "-c", "pass"]} for i in range(99)]
        ids, said = _submit(d, home, BOB, {"env": _BIG_ENV, "jobs": jobs}, check=False)
        assert not ids, said
        assert "quotas.max_expanded_bytes" in said and "expands to" in said, said
        ids, said = _submit(d, home, BOB, {"env": _BIG_ENV, "jobs": jobs[:8]})
        assert len(ids) == 8, said
        assert _db(d, "SELECT COUNT(*) FROM blobs") == 1
        stored = _db(d, "SELECT SUM(LENGTH(spec)) FROM jobs")
        assert isinstance(stored, int) and stored < 20_000, stored  # 8 x 250 KB before
        job = d.ask({"op": "status", "id": ids[1]})["job"]
        assert job["spec"]["env"] == _BIG_ENV  # read back whole
    finally:
        d.stop()
        d.kill_jobs()


def test_finished_jobs_past_a_users_cap_are_deleted_and_status_stays_own(
        home: Path) -> None:
    """alice finishes 14 jobs with max_finished_jobs_per_user 10: after a restart only
    her newest 10 are kept, with their events; bob's `status` lists none of hers."""
    d = LauncherDaemon(home, gpus=1, core={
        "quotas": {"max_finished_jobs_per_user": 10}}).start()
    try:
        ids, _ = _submit(d, home, ALICE, {"jobs": [
            {"name": f"t{i}", "gpus": 0, "command": [PY, "-c", "pass"]} for i in range(14)]})
        for i in ids:
            d.wait_state(i, {"succeeded"}, timeout=60)
        d.stop()
        d.start()
        mine = json.loads(d.client(ALICE, "status", "--json").stdout)["jobs"]
        assert [j["id"] for j in mine] == ids[-10:]
        assert _db(d, f"SELECT COUNT(*) FROM events WHERE job_id IN ({ids[0]}, {ids[3]})") \
            == 0
        theirs = json.loads(d.client(BOB, "status", "--json").stdout)["jobs"]
        assert theirs == []
    finally:
        d.stop()
        d.kill_jobs()


def test_the_daemon_outranks_users_for_cpu_but_its_jobs_do_not(home: Path) -> None:
    """The daemon raises its own CPU priority (limits.daemon_nice) so users' busy loops
    cannot starve its loop; a job it starts, and its submission reader, run at the
    priority it was started with."""
    d = LauncherDaemon(home, gpus=1).start()
    try:
        assert d.proc is not None
        fields = Path(f"/proc/{d.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(fields[16]) == -10  # nice, field 19 of stat
        [job], _ = _submit(d, home, ALICE, {"name": "nice", "gpus": 0, "command": [
            PY, "-c", "import os; print(os.nice(0))"]})
        d.wait_state(job, {"succeeded"}, timeout=60)
        assert d.client(ALICE, "logs", str(job)).stdout.strip() == str(os.nice(0))
        # the submission reader it started reads users' YAML: back at that priority too
        workers = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                   and b"launcher.parseworker" in _read(p / "cmdline")
                   and _read(p / "stat").rsplit(b")", 1)[1].split()[1] ==
                   str(d.proc.pid).encode()]
        assert len(workers) == 1, workers
        stat_of = _read(workers[0] / "stat").rsplit(b")", 1)[1].split()
        assert int(stat_of[16]) == os.nice(0)
    finally:
        d.stop()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
