"""The SQLite store: round trips, atomic submissions, and a writer killed mid-write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.spec import JobSpec, load_submission
from launcher.store import Event, Store

PIPE = load_submission("""jobs:
  - {name: a, command: x}
  - {name: b, command: x, after: [a]}
  - {name: c, command: x, after: [a, b]}
""")


def test_round_trip_and_dependency_ids(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    ids = store.add_jobs(PIPE, uid=1000, user="alice", now=10.0)
    store.update(ids[0], state="running", gpus=["GPU-1"], cancel_requested=True)
    store.add_event(Event(11.0, ids[0], "started", {"gpus": ["GPU-1"]}))
    store.add_decision(11.0, ids[0], "start", {"total": 1000.0})
    store.save_fairshare([("user", "alice", 5.0, 11.0)])
    store.close()
    again = Store(tmp_path / "s.db")
    a, b, c = (again.get(i) for i in ids)
    assert a is not None and b is not None and c is not None
    assert a.state == "running" and a.gpus == ["GPU-1"] and a.cancel_requested
    assert b.after_ids == [ids[0]] and c.after_ids == [ids[0], ids[1]]
    assert again.events(ids[0]) == [Event(11.0, ids[0], "started", {"gpus": ["GPU-1"]})]
    assert again.decisions(ids[0]) == [(11.0, ids[0], "start", {"total": 1000.0})]
    assert again.load_fairshare() == [("user", "alice", 5.0, 11.0)]
    assert [j.id for j in again.jobs(("queued",))] == ids[1:]


def test_a_failed_transaction_leaves_nothing() -> None:
    store = Store(":memory:")
    with pytest.raises(RuntimeError), store.transaction():
        store.add_jobs(PIPE, uid=1, user="u", now=1.0)
        raise RuntimeError("crash in the middle")
    assert store.jobs() == []
    with pytest.raises(ValueError, match="not updatable"):
        store.update(1, spec="{}")


WRITER = textwrap.dedent("""
    import sys
    from launcher.spec import load_submission
    from launcher.store import Event, Store
    specs = load_submission(sys.argv[2])
    store = Store(sys.argv[1])
    n = 0
    while True:
        with store.transaction():
            ids = store.add_jobs(specs, uid=1, user="u", now=float(n))
            for i in ids:
                store.add_event(Event(float(n), i, "queued", {}))
            store.update(ids[0], state="running", attempt=1)
        n += 1
        print(n, flush=True)
""")


@pytest.mark.timeout(60)
def test_writer_killed_mid_write_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    text = "jobs:\n" + "".join(f"  - {{name: j{k}, command: x}}\n" for k in range(20))
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), text],
                                stdout=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parents[2])
        assert proc.stdout is not None
        acknowledged = 0
        deadline = time.monotonic() + 30
        while acknowledged < 15 + 10 * round_ and time.monotonic() < deadline:
            acknowledged = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)  # mid-loop: likely inside a transaction
        proc.wait(timeout=10)
        store = Store(db)
        jobs = store.jobs()
        by_submission: dict[int, list[int]] = {}
        for j in jobs:
            by_submission.setdefault(j.submission, []).append(j.id)
        assert all(len(v) == 20 for v in by_submission.values())  # whole or absent
        assert len({j.id for j in jobs}) == len(jobs)
        assert sorted(by_submission) == list(range(1, len(by_submission) + 1))
        events = store.events(kind="queued")
        assert sorted(e.job_id for e in events) == sorted(j.id for j in jobs)  # type: ignore[misc]
        assert all(store.get(v[0]).state == "running"  # type: ignore[union-attr]
                   for v in by_submission.values())
        store.close()
    assert len(by_submission) >= acknowledged


def test_events_after_a_sequence_number_and_state_counts() -> None:
    store = Store(":memory:")
    ids = store.add_jobs(PIPE, uid=1, user="u", now=1.0)
    for k in range(5):
        store.add_event(Event(float(k), ids[0], f"e{k}", {"k": k}))
    first = store.events_after(0, limit=2)
    assert [e.kind for _, e in first] == ["e0", "e1"]
    rest = store.events_after(first[-1][0])
    assert [e.kind for _, e in rest] == ["e2", "e3", "e4"]
    assert store.last_event_seq() == rest[-1][0] and store.events_after(rest[-1][0]) == []
    store.update(ids[0], state="running")
    assert store.state_counts() == {"queued": 2, "running": 1}


def test_a_version_1_state_is_upgraded_in_place_and_its_jobs_read_back(
        tmp_path: Path) -> None:
    """A lab's queue survives the upgrade to named urgency levels: a schema-1 database (no wait
    reasons, no usage window; urgency stored as a number) opens, gains the new columns
    and table, and its queued job reads back with the level its number meant."""
    import sqlite3

    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript("""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema', '1');
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, submission INTEGER NOT NULL, name TEXT NOT NULL,
    spec TEXT NOT NULL, uid INTEGER NOT NULL, user TEXT NOT NULL, state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0,
    after_ids TEXT NOT NULL DEFAULT '[]', gpus TEXT NOT NULL DEFAULT '[]',
    memory_bytes INTEGER, submitted_at REAL NOT NULL, queued_at REAL NOT NULL,
    started_at REAL, finished_at REAL, backoff_until REAL NOT NULL DEFAULT 0,
    last_checkpoint_time REAL, last_checkpoint_step INTEGER,
    measured_gpu_seconds REAL NOT NULL DEFAULT 0, allocated_gpu_seconds REAL NOT NULL
    DEFAULT 0, lost_gpu_seconds REAL NOT NULL DEFAULT 0, preempt_signal_at REAL,
    preempt_reason TEXT, preempt_for INTEGER, cancel_requested INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER, reason TEXT NOT NULL DEFAULT '');
""")
    db.execute("INSERT INTO jobs (submission, name, spec, uid, user, state, submitted_at, "
               "queued_at) VALUES (1, 'old', ?, 1000, 'alice', 'queued', 1.0, 1.0)",
               ('{"name": "old", "command": ["x"], "urgency": 3, "max_retries": 0}',))
    db.commit()
    db.close()
    store = Store(path)
    (job,) = store.jobs()
    assert job.spec.urgency == "urgent" and job.spec.max_retries == 0
    assert (job.wait_reason, job.wait_detail, job.start_priority) == ("", "", None)
    store.update(job.id, wait_reason="resources", wait_detail="needs 1 GPU")
    store.add_usage([("user", "alice", 5, 10.0)])
    store.close()
    again = Store(path)
    assert again.get(job.id).wait_reason == "resources"  # type: ignore[union-attr]
    assert again.load_usage(0) == [("user", "alice", 5, 10.0)]
    with pytest.raises(RuntimeError, match="schema 99"):
        sqlite3.connect(path).execute("UPDATE meta SET value='99'").connection.commit()
        Store(path)


def test_the_spec_cache_is_bounded_by_bytes_and_shared_envs_stored_once(
        tmp_path: Path) -> None:
    """Many jobs with a large shared env: one blob row, specs read back whole, and the
    parsed-spec cache stays under its byte budget however many jobs are read."""
    from launcher import store as store_mod

    store = Store(tmp_path / "s.db")
    env = {f"V{i}": "y" * 1000 for i in range(200)}
    big = [JobSpec(name=f"j{i}", command="true", env=env, gpus=0) for i in range(50)]
    ids = store.add_jobs(big, 1000, "alice", 1.0)
    small = [JobSpec(name=f"s{i}", command=["echo", "x" * 100_000], gpus=0)
             for i in range(120)]
    store.add_jobs(small, 1000, "alice", 2.0)
    assert store._db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 1
    assert all(j.spec.env == env for j in store.jobs() if j.id in ids)
    assert store.spec_cache_bytes <= store_mod.SPEC_CACHE_BYTES
    assert len(store.jobs_of(1000, 5)) == 5 and store.jobs_of(1001, 5) == []


def test_prune_keeps_what_a_waiting_job_depends_on_and_the_newest_per_user(
        tmp_path: Path) -> None:
    """Finished jobs past the per-user count go with their events; one a waiting job's
    `after` names stays, as do the newest of each user and other users' jobs."""
    store = Store(tmp_path / "s.db")
    done = store.add_jobs([JobSpec(name=f"d{i}", command="true") for i in range(6)],
                          1000, "alice", 1.0)
    for i in done:
        store.update(i, state="succeeded", finished_at=2.0)
        store.add_event(Event(2.0, i, "succeeded", {}))
    [waiter] = store.add_jobs([JobSpec(name="w", command="true", after=[done[0]])],
                              1000, "alice", 3.0)
    bobs = store.add_jobs([JobSpec(name="b", command="true")], 1001, "bob", 1.0)
    store.update(bobs[0], state="failed", finished_at=2.0)
    assert store.prune(10.0, per_user=2, retention_seconds=1e9) == 3
    left = {j.id for j in store.jobs()}
    assert left == {done[0], done[4], done[5], waiter, bobs[0]}
    assert store.events(done[1]) == []
    assert store.prune(1e6, per_user=2, retention_seconds=10.0) == 3  # age: all but d0
    assert {j.id for j in store.jobs()} == {done[0], waiter}
