"""The launcher's durable state in SQLite: jobs, their events, scheduling decisions and
the fair-share ledger.

WAL journal, synchronous=FULL, and every change that belongs together in one
transaction (`with store.transaction():`), so a daemon killed at any point reopens with
each submission either wholly present or absent and no job twice. `Store(":memory:")`
serves replay.

What one user can make it hold is bounded: a job's `env` of 1 KiB or more is stored
once per distinct content (`blobs`), so a pipeline's shared env is not copied into each
of its jobs; parsed specs are cached up to SPEC_CACHE_BYTES (least recently used out);
finished jobs past `prune()`'s per-user count or age are deleted with their events and
decisions; lists are filtered and limited in SQL, never by loading every job.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from launcher.spec import TRUSTED, JobSpec

JobState = Literal["queued", "held", "running", "preempting", "requeued", "succeeded",
                   "failed", "cancelled", "timed_out"]
WAITING: frozenset[str] = frozenset({"queued", "requeued"})
ACTIVE: frozenset[str] = frozenset({"running", "preempting"})
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "timed_out"})

SCHEMA_VERSION = 4
# What each older schema lacks, added in place when a newer daemon opens it (a lab's
# queue survives the upgrade): version 1 had no wait reasons, no starting priority and
# no usage window.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE jobs ADD COLUMN wait_reason TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN wait_detail TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN start_priority REAL"),
    # version 2 stored every job's env inline: a pipeline's shared env once per job
    2: ("ALTER TABLE jobs ADD COLUMN env_blob TEXT",),
    # version 3 kept no progress (launcher/progress.py) and no environment of a job
    3: ("ALTER TABLE jobs ADD COLUMN progress TEXT",
        "ALTER TABLE jobs ADD COLUMN environment TEXT"),
}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    submission INTEGER NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    after_ids TEXT NOT NULL DEFAULT '[]',
    gpus TEXT NOT NULL DEFAULT '[]',
    memory_bytes INTEGER,
    submitted_at REAL NOT NULL,
    queued_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    backoff_until REAL NOT NULL DEFAULT 0,
    last_checkpoint_time REAL,
    last_checkpoint_step INTEGER,
    measured_gpu_seconds REAL NOT NULL DEFAULT 0,
    allocated_gpu_seconds REAL NOT NULL DEFAULT 0,
    lost_gpu_seconds REAL NOT NULL DEFAULT 0,
    preempt_signal_at REAL,
    preempt_reason TEXT,
    preempt_for INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    wait_reason TEXT NOT NULL DEFAULT '',
    wait_detail TEXT NOT NULL DEFAULT '',
    start_priority REAL,
    env_blob TEXT,
    progress TEXT,
    environment TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_uid ON jobs(uid, id);
CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id);
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    job_id INTEGER NOT NULL,
    action TEXT NOT NULL,
    breakdown TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS barriers (
    uuid TEXT NOT NULL,
    job_id INTEGER NOT NULL,
    since REAL NOT NULL,
    leak_reported INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (uuid, job_id)
);
CREATE TABLE IF NOT EXISTS usage (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    hour INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL,
    PRIMARY KEY (kind, name, hour)
);
CREATE TABLE IF NOT EXISTS fairshare (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    value REAL NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (kind, name)
);
"""

# the event kinds a job's own reports become (engine.max_report_events counts these)
REPORT_KINDS = ("checkpoint_committed", "telemetry", "anomaly", "events_over_budget",
                "reports_capped")
SPEC_CACHE_BYTES = 8 << 20  # parsed specs kept in memory, by the size of their JSON
ENV_BLOB_BYTES = 1024  # an env at least this large is stored once per content
_TERMINAL_SQL = "('succeeded', 'failed', 'cancelled', 'timed_out')"

# columns a caller may set through update(); anything else is a programming error
_MUTABLE = frozenset({
    "state", "attempt", "failures", "gpus", "memory_bytes", "queued_at", "started_at",
    "finished_at", "backoff_until", "last_checkpoint_time", "last_checkpoint_step",
    "measured_gpu_seconds", "allocated_gpu_seconds", "lost_gpu_seconds", "preempt_signal_at",
    "preempt_reason", "preempt_for", "cancel_requested", "exit_code", "reason",
    "wait_reason", "wait_detail", "start_priority", "submitted_at", "progress",
    "environment"})
_JSON_COLUMNS = frozenset({"gpus", "progress", "environment"})


@dataclass
class JobRecord:
    """One job as stored. `gpus` are the uuids of its current (or last) placement."""

    id: int
    submission: int
    spec: JobSpec
    uid: int
    user: str
    state: str
    attempt: int = 0
    failures: int = 0
    after_ids: list[int] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    memory_bytes: int | None = None
    submitted_at: float = 0.0
    queued_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    backoff_until: float = 0.0
    last_checkpoint_time: float | None = None
    last_checkpoint_step: int | None = None
    measured_gpu_seconds: float = 0.0
    allocated_gpu_seconds: float = 0.0
    lost_gpu_seconds: float = 0.0
    preempt_signal_at: float | None = None
    preempt_reason: str | None = None
    preempt_for: int | None = None
    cancel_requested: bool = False
    exit_code: int | None = None
    reason: str = ""
    # why a waiting job waits (launcher/reasons.py: a kind from a small fixed set, and
    # a sentence with the numbers); the priority a running job started with
    wait_reason: str = ""
    wait_detail: str = ""
    start_priority: float | None = None
    # the newest sanitised progress report (launcher/progress.py Progress.as_dict) and
    # the software the job's newest attempt reported it runs (its `environment` event)
    progress: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def project(self) -> str:
        return self.spec.project

    def uncheckpointed_gpu_seconds(self, now: float) -> float:
        """GPU-seconds of work since the newest committed checkpoint of this attempt (or
        since the start): what a preemption now would lose."""
        if self.started_at is None or self.state not in ACTIVE:
            return 0.0
        since = self.started_at
        if self.last_checkpoint_time is not None and self.last_checkpoint_time > since:
            since = self.last_checkpoint_time
        return max(0.0, now - since) * self.spec.gpu_share


@dataclass(frozen=True)
class Event:
    """One thing that happened to a job (job_id None: to the node, e.g. a GPU leak)."""

    time: float
    job_id: int | None
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


# every column but the spec, which is immutable and parsed once per job (Store._specs)
_COLUMNS = ("id", "submission", "uid", "user", "state", "attempt", "failures",
            "after_ids", "gpus", "memory_bytes", "submitted_at", "queued_at", "started_at",
            "finished_at", "backoff_until", "last_checkpoint_time", "last_checkpoint_step",
            "measured_gpu_seconds", "allocated_gpu_seconds", "lost_gpu_seconds",
            "preempt_signal_at", "preempt_reason", "preempt_for", "cancel_requested",
            "exit_code", "reason", "wait_reason", "wait_detail", "start_priority",
            "progress", "environment")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM jobs"  # noqa: S608 - constant column names


def _record(row: Sequence[Any], specs: dict[int, JobSpec]) -> JobRecord:
    d = dict(zip(_COLUMNS, row, strict=True))
    d["spec"] = specs[d["id"]]
    d["after_ids"] = [] if d["after_ids"] == "[]" else json.loads(d["after_ids"])
    d["gpus"] = [] if d["gpus"] == "[]" else json.loads(d["gpus"])
    d["cancel_requested"] = bool(d["cancel_requested"])
    for key in ("progress", "environment"):
        d[key] = _json_object(d[key])
    return JobRecord(**d)


def _json_object(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def _private(path: Path) -> None:
    """Create the database file owner-only (specs hold the users' environments), or
    make an older one so, through a descriptor that followed no link; SQLite gives its
    -wal and -shm files the database's mode."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class Store:
    """SQLite state. One connection, serialised by a lock (the daemon's threads share it)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        self._depth = 0
        self._specs: OrderedDict[int, tuple[JobSpec, int]] = OrderedDict()  # id -> (spec, cost)
        self._spec_bytes = 0
        if self.path != ":memory:":
            _private(Path(self.path))
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=30.0)
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self.transaction():
            row = None
            has_meta = self._db.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                        "AND name='meta'").fetchone()
            if has_meta:
                row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            version = int(row[0]) if row is not None else SCHEMA_VERSION
            if version > SCHEMA_VERSION or (version < SCHEMA_VERSION
                                            and version not in _MIGRATIONS):
                raise RuntimeError(f"{self.path}: launcher state schema {version}, this "
                                   f"version reads {SCHEMA_VERSION}")
            while version < SCHEMA_VERSION:  # upgrade in place, in this one transaction
                for statement in _MIGRATIONS[version]:
                    self._db.execute(statement)
                version += 1
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            self._db.execute("INSERT INTO meta VALUES ('schema', ?) ON CONFLICT(key) DO "
                             "UPDATE SET value=excluded.value", (str(SCHEMA_VERSION),))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All changes inside commit together or not at all; nests (inner is a no-op)."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            except BaseException:
                self._depth = 0
                self._db.execute("ROLLBACK")
                raise
            self._depth = 0
            self._db.execute("COMMIT")

    # ----------------------------------------------------------------------------- jobs

    def add_jobs(self, specs: Sequence[JobSpec], uid: int, user: str, now: float,
                 state: str = "queued") -> list[int]:
        """Store one submission atomically; `after` names resolve to the new jobs' ids."""
        with self.transaction():
            row = self._db.execute("SELECT COALESCE(MAX(submission), 0) + 1 FROM jobs").fetchone()
            submission = int(row[0])
            ids: dict[str, int] = {}
            for spec in specs:
                text, blob = self._spec_text(spec)
                cur = self._db.execute(
                    "INSERT INTO jobs (submission, name, spec, uid, user, state, after_ids, "
                    "submitted_at, queued_at, env_blob) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (submission, spec.name, text, uid, user, state, "[]", now, now, blob))
                assert cur.lastrowid is not None
                ids[spec.name] = cur.lastrowid
            for spec in specs:
                if spec.after:
                    after = [ids[d] if isinstance(d, str) else d for d in spec.after]
                    self._db.execute("UPDATE jobs SET after_ids=? WHERE id=?",
                                     (json.dumps(after), ids[spec.name]))
            return [ids[s.name] for s in specs]

    def get(self, job_id: int) -> JobRecord | None:
        with self._lock:
            row = self._db.execute(_SELECT + " WHERE id=?", (job_id,)).fetchone()
        return self._records([row])[0] if row else None

    def _spec_text(self, spec: JobSpec) -> tuple[str, str | None]:
        """The spec's JSON as stored, and the hash of its env where that is stored once
        in `blobs` (inside the caller's transaction)."""
        if spec.env:
            env = json.dumps(spec.env, sort_keys=True)
            if len(env) >= ENV_BLOB_BYTES:
                digest = hashlib.sha256(env.encode("utf-8", "surrogatepass")).hexdigest()
                self._db.execute("INSERT INTO blobs VALUES (?, ?) ON CONFLICT(hash) DO "
                                 "NOTHING", (digest, env))
                return spec.model_copy(update={"env": {}}).model_dump_json(), digest
        return spec.model_dump_json(), None

    def _records(self, rows: Sequence[Sequence[Any]]) -> list[JobRecord]:
        found: dict[int, JobSpec] = {}
        missing: list[int] = []
        for r in rows:
            cached = self._specs.get(r[0])
            if cached is None:
                missing.append(r[0])
            else:
                self._specs.move_to_end(r[0])
                found[r[0]] = cached[0]
        envs: dict[str, dict[str, str]] = {}  # blobs read in this call: one dict shared
        for start in range(0, len(missing), 500):
            chunk = missing[start:start + 500]
            marks = ",".join("?" * len(chunk))
            with self._lock:
                got = self._db.execute(
                    f"SELECT id, spec, env_blob FROM jobs WHERE id IN ({marks})",  # noqa: S608
                    chunk).fetchall()
                need = sorted({b for _, _, b in got if b is not None and b not in envs})
                for h in need:
                    row = self._db.execute("SELECT data FROM blobs WHERE hash=?",
                                           (h,)).fetchone()
                    envs[h] = json.loads(row[0]) if row else {}
            for job_id, text, blob in got:  # specs never change once stored
                spec = JobSpec.model_validate_json(text, context=TRUSTED)
                cost = len(text)
                if blob is not None:
                    spec = spec.model_copy(update={"env": envs[blob]})
                    cost += 64  # the env is shared by every job of its blob
                found[job_id] = spec
                self._cache(job_id, spec, cost)
        return [_record(r, found) for r in rows]

    def _cache(self, job_id: int, spec: JobSpec, cost: int) -> None:
        """Keep a parsed spec, evicting the least recently used past SPEC_CACHE_BYTES."""
        old = self._specs.pop(job_id, None)
        if old is not None:
            self._spec_bytes -= old[1]
        self._specs[job_id] = (spec, cost)
        self._spec_bytes += cost
        while self._spec_bytes > SPEC_CACHE_BYTES and len(self._specs) > 1:
            _, (_, gone) = self._specs.popitem(last=False)
            self._spec_bytes -= gone

    @property
    def spec_cache_bytes(self) -> int:
        return self._spec_bytes

    def jobs_of(self, uid: int | None, limit: int) -> list[JobRecord]:
        """The newest `limit` jobs of `uid` (None: of everyone), in id order: filtered
        and limited in SQL."""
        where, args = ("WHERE uid=? ", [uid]) if uid is not None else ("", [])
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM ({_SELECT} {where}ORDER BY id DESC LIMIT ?) ORDER BY id",  # noqa: S608
                [*args, limit]).fetchall()
        return self._records(rows)

    def prune(self, now: float, per_user: int, retention_seconds: float) -> int:
        """Delete finished jobs beyond `per_user` per user (the oldest first) or finished
        more than `retention_seconds` ago, with their events and decisions; never one a
        job that has not finished still depends on, nor one whose GPU release is still
        being watched. Returns how many went."""
        with self.transaction():
            ids = [int(r[0]) for r in self._db.execute(
                f"SELECT id FROM (SELECT id, finished_at, ROW_NUMBER() OVER (PARTITION BY "  # noqa: S608
                f"uid ORDER BY id DESC) AS n FROM jobs WHERE state IN {_TERMINAL_SQL}) "
                "WHERE (n > ? OR finished_at < ?) "
                "AND id NOT IN (SELECT json_each.value FROM jobs AS w, "
                f"json_each(w.after_ids) WHERE w.after_ids != '[]' AND w.state NOT IN "
                f"{_TERMINAL_SQL}) AND id NOT IN (SELECT job_id FROM barriers)",
                (per_user, now - retention_seconds)).fetchall()]
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                marks = ",".join("?" * len(chunk))
                for table, col in (("events", "job_id"), ("decisions", "job_id"),
                                   ("jobs", "id")):
                    self._db.execute(f"DELETE FROM {table} WHERE {col} IN ({marks})",  # noqa: S608
                                     chunk)
            if ids:
                self._db.execute("DELETE FROM blobs WHERE hash NOT IN (SELECT env_blob FROM "
                                 "jobs WHERE env_blob IS NOT NULL)")
        for job_id in ids:
            gone = self._specs.pop(job_id, None)
            if gone is not None:
                self._spec_bytes -= gone[1]
        return len(ids)

    def jobs(self, states: Iterable[str] | None = None,
             with_dependencies: bool = False) -> list[JobRecord]:
        """Jobs in id order, optionally only those in `states` (and only those with
        dependencies)."""
        where, args = [], []
        if states is not None:
            wanted = sorted(set(states))
            where.append(f"state IN ({','.join('?' * len(wanted))})")
            args.extend(wanted)
        if with_dependencies:
            where.append("after_ids != '[]'")
        sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return self._records(rows)

    def waiting_counts(self) -> dict[str, dict[str, int]]:
        """Waiting jobs (queued, requeued, held) per user and per project:
        {"user": {name: n}, "project": {name: n}} (the queued-jobs quotas)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT user, json_extract(spec, '$.project'), COUNT(*) FROM jobs WHERE "
                "state IN ('queued', 'requeued', 'held') GROUP BY 1, 2").fetchall()
        out: dict[str, dict[str, int]] = {"user": {}, "project": {}}
        for user, project, n in rows:
            out["user"][user] = out["user"].get(user, 0) + int(n)
            out["project"][str(project)] = out["project"].get(str(project), 0) + int(n)
        return out

    def dependents(self, job_id: int) -> list[JobRecord]:
        """Jobs whose `after` names `job_id`."""
        with self._lock:
            rows = self._db.execute(
                _SELECT + " WHERE after_ids != '[]' AND EXISTS (SELECT 1 FROM "  # noqa: S608
                "json_each(jobs.after_ids) WHERE json_each.value = ?) ORDER BY id",
                (job_id,)).fetchall()
        return self._records(rows)

    def owners(self, ids: Iterable[int]) -> dict[int, tuple[str, str, str]]:
        """(user, state, name) of each of `ids` that exists."""
        wanted = list(set(ids))
        out: dict[int, tuple[str, str, str]] = {}
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            with self._lock:
                rows = self._db.execute(
                    f"SELECT id, user, state, name FROM jobs WHERE id IN "  # noqa: S608
                    f"({','.join('?' * len(chunk))})", chunk).fetchall()
            out.update({int(i): (str(u), str(s), str(n)) for i, u, s, n in rows})
        return out

    def states(self, ids: Iterable[int]) -> dict[int, str]:
        wanted = list(set(ids))
        if not wanted:
            return {}
        with self._lock:
            marks = ",".join("?" * len(wanted))
            rows = self._db.execute(f"SELECT id, state FROM jobs WHERE id IN ({marks})",  # noqa: S608
                                    wanted).fetchall()
        return {int(i): str(s) for i, s in rows}

    def update(self, job_id: int, **values: Any) -> None:
        """Set columns of one job (names as in JobRecord)."""
        bad = set(values) - _MUTABLE
        if bad:
            raise ValueError(f"not updatable: {sorted(bad)}")
        cols, args = [], []
        for k, v in values.items():
            cols.append(f"{k}=?")
            args.append((None if v is None else json.dumps(v, sort_keys=True))
                        if k in _JSON_COLUMNS else int(v) if isinstance(v, bool) else v)
        with self.transaction():
            # column names checked against _MUTABLE above; values are parameters
            self._db.execute(f"UPDATE jobs SET {', '.join(cols)} WHERE id=?",  # noqa: S608
                             (*args, job_id))

    # ----------------------------------------------------------------- events, decisions

    def add_event(self, event: Event) -> None:
        with self.transaction():
            self._db.execute("INSERT INTO events (job_id, time, kind, data) VALUES (?, ?, ?, ?)",
                             (event.job_id, event.time, event.kind,
                              json.dumps(event.data, sort_keys=True)))

    def events(self, job_id: int | None = None, kind: str | None = None) -> list[Event]:
        sql = "SELECT time, job_id, kind, data FROM events"
        args: list[object] = []
        where = []
        if job_id is not None:
            where.append("job_id=?")
            args.append(job_id)
        if kind is not None:
            where.append("kind=?")
            args.append(kind)
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq", args).fetchall()
        return [Event(t, j, k, json.loads(d)) for t, j, k, d in rows]

    def events_page(self, job_id: int, start: int | None,
                    limit: int) -> tuple[int, int, list[Event]]:
        """(how many events the job has, the index of the first returned, at most `limit`
        of them from index `start`; None: the newest `limit`), read by SQL, not by loading
        every event of a chatty job."""
        with self._lock:
            total = int(self._db.execute("SELECT COUNT(*) FROM events WHERE job_id=?",
                                         (job_id,)).fetchone()[0])
            first = max(0, total - limit) if start is None else min(start, total)
            rows = self._db.execute("SELECT time, job_id, kind, data FROM events WHERE "
                                    "job_id=? ORDER BY seq LIMIT ? OFFSET ?",
                                    (job_id, limit, first)).fetchall()
        return total, first, [Event(t, j, k, json.loads(d)) for t, j, k, d in rows]

    def report_event_count(self, job_id: int) -> int:
        """Events of `job_id` that came from its own reports (the engine's cap)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM events WHERE job_id=? AND kind IN (?, ?, ?, ?, ?)",
                (job_id, *REPORT_KINDS)).fetchone()
        return int(row[0])

    def events_after(self, seq: int, limit: int = 10_000) -> list[tuple[int, Event]]:
        """Events stored after sequence number `seq` (0: from the start), with their
        sequence numbers, oldest first: a follower (audit, telemetry) keeps the last seq
        it handled instead of re-reading every event each tick."""
        with self._lock:
            rows = self._db.execute("SELECT seq, time, job_id, kind, data FROM events "
                                    "WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (seq, limit)).fetchall()
        return [(int(q), Event(t, j, k, json.loads(d))) for q, t, j, k, d in rows]

    def last_event_seq(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        return int(row[0])

    def state_counts(self) -> dict[str, int]:
        """Number of jobs in each state."""
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {str(s): int(n) for s, n in rows}

    def wait_reason_counts(self) -> dict[str, int]:
        """Waiting jobs (queued, requeued, held) per current reason kind."""
        with self._lock:
            rows = self._db.execute("SELECT wait_reason, COUNT(*) FROM jobs WHERE state IN "
                                    "('queued', 'requeued', 'held') GROUP BY 1").fetchall()
        return {str(k): int(n) for k, n in rows}

    def add_decision(self, now: float, job_id: int, action: str,
                     breakdown: dict[str, Any]) -> None:
        with self.transaction():
            self._db.execute("INSERT INTO decisions (time, job_id, action, breakdown) "
                             "VALUES (?, ?, ?, ?)",
                             (now, job_id, action, json.dumps(breakdown, sort_keys=True)))

    def decisions(self, job_id: int | None = None, *, newest: int | None = None,
                  ) -> list[tuple[float, int, str, dict[str, Any]]]:
        """Decisions in order (of one job); `newest`: only the newest that many."""
        sql = "SELECT seq, time, job_id, action, breakdown FROM decisions"
        args: tuple[int, ...] = ()
        if job_id is not None:
            sql, args = sql + " WHERE job_id=?", (job_id,)
        if newest is not None:
            # an integer and our own constant SQL: no value of a caller's in the text
            sql = f"SELECT * FROM ({sql} ORDER BY seq DESC LIMIT {int(newest)})"  # noqa: S608
        with self._lock:
            rows = [r[1:] for r in self._db.execute(sql + " ORDER BY seq", args).fetchall()]
        return [(t, j, a, json.loads(b)) for t, j, a, b in rows]

    # ------------------------------------------------------------------------ fair share

    def save_fairshare(self, rows: Iterable[tuple[str, str, float, float]]) -> None:
        """(kind, name, decayed value, as of time) rows of the fair-share ledger."""
        with self.transaction():
            self._db.executemany("INSERT INTO fairshare VALUES (?, ?, ?, ?) ON CONFLICT(kind, "
                                 "name) DO UPDATE SET value=excluded.value, at=excluded.at",
                                 list(rows))

    def load_fairshare(self) -> list[tuple[str, str, float, float]]:
        with self._lock:
            rows = self._db.execute("SELECT kind, name, value, at FROM fairshare").fetchall()
        return [(str(k), str(n), float(v), float(a)) for k, n, v, a in rows]

    # ----------------------------------------------------------------------- usage window

    def add_usage(self, rows: Iterable[tuple[str, str, int, float]]) -> None:
        """Add allocated GPU-seconds to (kind, name, hour) buckets."""
        with self.transaction():
            self._db.executemany("INSERT INTO usage VALUES (?, ?, ?, ?) ON CONFLICT(kind, "
                                 "name, hour) DO UPDATE SET gpu_seconds=gpu_seconds + "
                                 "excluded.gpu_seconds", list(rows))

    def load_usage(self, since_hour: int) -> list[tuple[str, str, int, float]]:
        """Usage buckets from `since_hour` on; older ones are deleted (they left every
        window)."""
        with self.transaction():
            self._db.execute("DELETE FROM usage WHERE hour < ?", (since_hour,))
            rows = self._db.execute("SELECT kind, name, hour, gpu_seconds FROM usage"
                                    ).fetchall()
        return [(str(k), str(n), int(h), float(g)) for k, n, h, g in rows]

    # ------------------------------------------------------------------ release barrier

    def set_barrier(self, uuid: str, job_id: int, since: float, leak_reported: bool) -> None:
        """A GPU `job_id` left, not yet confirmed free of its processes."""
        with self.transaction():
            self._db.execute("INSERT INTO barriers VALUES (?, ?, ?, ?) ON CONFLICT(uuid, job_id)"
                             " DO UPDATE SET leak_reported=excluded.leak_reported",
                             (uuid, job_id, since, int(leak_reported)))

    def clear_barrier(self, uuid: str, job_id: int) -> None:
        with self.transaction():
            self._db.execute("DELETE FROM barriers WHERE uuid=? AND job_id=?", (uuid, job_id))

    def barriers(self) -> list[tuple[str, int, float, bool]]:
        with self._lock:
            rows = self._db.execute("SELECT uuid, job_id, since, leak_reported FROM barriers "
                                    "ORDER BY since").fetchall()
        return [(str(u), int(j), float(t), bool(r)) for u, j, t, r in rows]
