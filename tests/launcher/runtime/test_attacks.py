"""Hostile local users against the real daemon through its real socket.

Every attack here runs in a process that has become an ordinary local user
(tests/launcher/runtime/hostile.py), against `gpu-audit launcher serve` running as root,
exactly as on a shared node. The daemon must never exit, never follow a link a user
planted, never let one client stall or bloat it, and refuse out-of-range numbers with
every problem named.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launcher.protocol import call
from tests.launcher.runtime.daemon import LauncherDaemon
from tests.launcher.runtime.hostile import Holding, as_user
from tests.launcher.runtime.users import ALICE, BOB, job_python, local_user
from tests.polling import wait_for

PY = job_python()
MIB = 1 << 20


@pytest.fixture
def daemon(home: Path) -> Iterator[LauncherDaemon]:
    d = LauncherDaemon(home, gpus=2).start()
    yield d
    d.stop()
    d.kill_jobs()


def _submit(d: LauncherDaemon, home: Path, user: str, doc: dict[str, object]) -> int:
    spec = home / f"spec-{secrets.token_hex(4)}.yaml"
    spec.write_text(yaml.safe_dump(doc))
    spec.chmod(0o644)
    out = d.client(user, "submit", spec.name).stdout
    return int(out.split(": ", 1)[1].split()[0])


def _root_file(home: Path, text: str, mode: int = 0o600) -> Path:
    """A file only root may read (the kind a planted link would aim at)."""
    p = home / f"root-only-{secrets.token_hex(4)}"
    p.write_text(text)
    p.chmod(mode)
    os.chown(p, 0, 0)
    return p


def _counter(metrics: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in metrics.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


# ------------------------------------------------------------------ 1. planted links


def test_log_link_planted_by_the_user_is_never_read_as_root(
        daemon: LauncherDaemon, home: Path) -> None:
    """alice swaps her running job's `1.out` for a link to a root-only file: `launcher
    logs` must not print that file (her job directory is not hers to write, and the
    daemon opens logs with O_NOFOLLOW and checks the owner)."""
    secret = _root_file(home, f"TOPSECRET-{secrets.token_hex(8)}\n")
    job = _submit(daemon, home, ALICE, {
        "name": "quiet", "command": [PY, "-c", "import time; print('hello'); time.sleep(60)"]})
    daemon.wait_state(job, {"running"})
    jobdir = daemon.state / "logs" / str(job)
    planted = as_user(ALICE, "plant_links", jobdir, f"1.out={secret}", f"1.err={secret}")
    for stream in ((), ("--stderr",)):
        r = daemon.client(ALICE, "logs", *stream, str(job), check=False)
        assert "TOPSECRET" not in r.stdout + r.stderr, (planted, r.stdout, r.stderr)
    assert daemon.alive()


def test_retry_never_hands_or_overwrites_a_file_through_planted_links(
        daemon: LauncherDaemon, home: Path) -> None:
    """Before her failed job's retry starts, alice plants `2.out`, `2.err`,
    `2.events.jsonl`, `2.exit` and `2.pid` as links to root's files: the retry must
    neither give her those files (chown) nor write into them."""
    daemon.stop()
    d = LauncherDaemon(daemon.dir, gpus=1,
                       core={"engine": {"backoff_base_seconds": 4}}).start()
    try:
        targets = {name: _root_file(home, f"original {name}\n")
                   for name in ("2.out", "2.err", "2.events.jsonl", "2.exit", "2.pid")}
        before = {n: (p.stat().st_uid, p.stat().st_mode, p.read_text())
                  for n, p in targets.items()}
        job = _submit(d, home, ALICE, {
            "name": "flaky", "max_retries": 1,
            "command": [PY, "-c", "import os,sys; print('attempt', os.environ['RUN_ATTEMPT']);"
                        "sys.exit(1 if os.environ['RUN_ATTEMPT'] == '1' else 0)"]})
        d.wait_state(job, {"requeued"}, timeout=30)
        as_user(ALICE, "plant_links", d.state / "logs" / str(job),
                *(f"{n}={p}" for n, p in targets.items()))
        done = d.wait_state(job, {"succeeded", "failed"}, timeout=60)
        after = {n: (p.stat().st_uid, p.stat().st_mode, p.read_text())
                 for n, p in targets.items()}
        assert after == before, "a planted link made the daemon chown or write root's file"
        assert done["state"] == "succeeded" and done["attempt"] == 2
        assert d.client(ALICE, "logs", str(job)).stdout == "attempt 2\n"
        out = d.state / "logs" / str(job) / "2.out"
        st = out.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == local_user(ALICE).pw_uid
    finally:
        d.stop()
        d.kill_jobs()


# ------------------------------------------------------------------- 2. connection flood


def test_connection_flood_is_refused_per_uid_and_the_daemon_keeps_serving(
        home: Path) -> None:
    """bob opens 1,000 connections against a daemon whose file limit is 128 (systemd's
    default is 1024): his connections past the per-uid cap get a clear refusal, the
    daemon neither exits nor removes its socket, and alice is served meanwhile."""
    d = LauncherDaemon(home, gpus=1, nofile=128).start()
    try:
        bob_uid = local_user(BOB).pw_uid
        with Holding(BOB, "flood", d.socket, 1000) as bob:
            assert d.alive(), d.log.read_text()[-2000:]
            r = d.client(ALICE, "queue", check=False, timeout=30)
            assert r.returncode == 0, r.stdout + r.stderr
            assert any(f"too many connections for uid {bob_uid}: " in a
                       for a in bob.result["answers"]), bob.result
        assert d.alive(), d.log.read_text()[-2000:]
        assert call(d.socket, {"op": "ping"}, timeout=10)["ok"]
        assert _counter(d.scrape(), "gpu_audit_launcher_connections_refused_total",
                        reason="per_uid") > 0
    finally:
        d.stop()


def test_accept_running_out_of_files_is_survived_logged_once_and_counted(
        home: Path) -> None:
    """With the caps set above what the file limit allows, bob's flood makes accept()
    fail with EMFILE: the daemon logs it once, backs off, counts it, keeps its socket,
    and answers again once his connections are gone."""
    d = LauncherDaemon(home, gpus=1, nofile=128, extra={
        "limits": {"max_connections": 4096, "per_uid_connections": 4096,
                   "per_uid_connect_rate": 100000, "per_uid_connect_burst": 100000,
                   "request_timeout_seconds": 2}}).start()
    try:
        with Holding(BOB, "flood", d.socket, 400) as bob:
            assert bob.result["connected"] > 0
            time.sleep(1.0)  # the daemon meets EMFILE again and again meanwhile
            assert d.alive(), d.log.read_text()[-2000:]
        assert wait_for(lambda: call(d.socket, {"op": "ping"}, timeout=10)["ok"], 30,
                        "the daemon to answer after the flood")
        log = d.log.read_text()
        assert log.count("cannot accept connections") == 1, log[-3000:]
        assert _counter(d.scrape(), "gpu_audit_launcher_accept_errors_total",
                        errno="EMFILE") > 0
    finally:
        d.stop()


# ---------------------------------------------------------------------- 3. memory


def test_oversized_lines_are_answered_and_memory_stays_bounded(home: Path) -> None:
    """60 connections each send 8 MiB with no newline (the attack that took the daemon
    from 47 to 612 MB; the per-uid cap raised so that all 60 get in): each gets "request
    too large" and is closed, and the daemon's peak resident memory grows by less than
    64 MiB."""
    daemon = LauncherDaemon(home, gpus=1, extra={"limits": {"per_uid_connections": 64}})
    daemon.start()
    try:
        _big_lines(daemon)
    finally:
        daemon.stop()


def _big_lines(daemon: LauncherDaemon) -> None:
    rss0 = daemon.rss_bytes()
    with Holding(BOB, "big_lines", daemon.socket, 60, 8 * MIB, timeout=180) as bob:
        assert bob.result["answered"] == 60, bob.result
        assert all("request too large" in a for a in bob.result["answers"]), bob.result
    assert daemon.alive()
    assert daemon.proc is not None
    peak = int(next(line.split()[1] for line in
                    Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines()
                    if line.startswith("VmHWM:"))) * 1024
    assert peak - rss0 < 64 * MIB, f"peak RSS {peak / MIB:.0f} MiB from {rss0 / MIB:.0f} MiB"
    assert call(daemon.socket, {"op": "ping"}, timeout=10)["ok"]


# ------------------------------------------------------------------ 4. slow readers


def test_clients_that_never_read_do_not_stall_anyone(daemon: LauncherDaemon,
                                                     home: Path) -> None:
    """Five of alice's connections ask for 256 KiB log chunks and never read: a ping
    from someone else is still answered at once, and the non-readers are dropped at
    their write deadline and counted."""
    job = _submit(daemon, home, ALICE, {
        "name": "chatty", "gpus": 0,
        "command": [PY, "-c", "import sys; sys.stdout.write(('y' * 1023 + '\\n') * 4096)"]})
    daemon.wait_state(job, {"succeeded"})
    request = json.dumps({"op": "logs", "id": job, "offset": 0})
    with Holding(ALICE, "non_readers", daemon.socket, 5, request) as alice:
        assert alice.result["connected"] == 5
        # the daemon has their requests and holds answers it cannot write
        wait_for(lambda: _counter(daemon.scrape(), "gpu_audit_launcher_buffered_bytes") > 0,
                 30, "the daemon to hold answers the non-readers do not read")
        started = time.monotonic()
        assert call(daemon.socket, {"op": "ping"}, timeout=5)["ok"]
        assert time.monotonic() - started < 5
        wait_for(lambda: _counter(daemon.scrape(),
                                  "gpu_audit_launcher_connections_dropped_total",
                                  reason="write_timeout") >= 5, 60,
                 "the five non-readers to be dropped")
    assert daemon.alive()


# ------------------------------------------------------------------- 5. numbers


def test_out_of_range_numbers_in_a_spec_are_refused_each_named(daemon: LauncherDaemon,
                                                               home: Path) -> None:
    """A fraction of 1e-300 (any number of jobs on one GPU), a run time of 1e308, an
    infinite one, a memory of 10**30 bytes and a retry count past its cap: every one is
    refused, exit 2, each named."""
    spec = home / "huge.yaml"
    spec.write_text(
        "jobs:\n"
        "  - {name: tiny, command: [\"true\"], gpu_fraction: 1e-300}\n"
        "  - {name: forever, command: [\"true\"], max_runtime_seconds: 1e308}\n"
        "  - {name: inf, command: [\"true\"], max_runtime_seconds: .inf}\n"
        "  - {name: big, command: [\"true\"], gpu_memory_bytes: 1000000000000000000000000000000}\n"
        "  - {name: many, command: [\"true\"], max_retries: 100000}\n")
    spec.chmod(0o644)
    r = daemon.client(ALICE, "submit", spec.name, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    for where in ("jobs.0.gpu_fraction", "jobs.1.max_runtime_seconds",
                  "jobs.2.max_runtime_seconds", "jobs.3.gpu_memory_bytes",
                  "jobs.4.max_retries"):
        assert where in r.stderr, (where, r.stderr)
    assert daemon.ask({"op": "queue"})["jobs"] == []


def test_out_of_range_numbers_in_a_request_are_refused_each_named(
        daemon: LauncherDaemon) -> None:
    """A logs request with an id, offset and attempt no job can have and an unknown
    stream is refused as a bad request naming all four, not an internal error."""
    resp = call(daemon.socket, {"op": "logs", "id": "9" * 30, "offset": 2**62,
                                "attempt": -5, "stream": "both"}, timeout=10)
    assert resp["ok"] is False and resp["error"] == "bad_request", resp
    text = " ".join(resp.get("problems", []))
    for key in ("id", "offset", "attempt", "stream"):
        assert key in text, (key, resp)
    assert daemon.alive()


# -------------------------------------------------------------- 6. too large a request


def test_too_large_submission_is_reported_by_the_client(daemon: LauncherDaemon,
                                                        home: Path) -> None:
    """A submission larger than the daemon accepts: the client reads the daemon's answer
    while still writing and says so (exit 2), instead of dying silently of SIGPIPE."""
    spec = home / "big.yaml"
    spec.write_text("name: big\ncommand: [\"true\"]\n" + "# padding\n" * (1_200_000))
    spec.chmod(0o644)
    r = daemon.client(ALICE, "submit", spec.name, check=False)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "request too large: " in r.stderr and " bytes, limit " in r.stderr, r.stderr
    assert daemon.alive()


# ------------------------------------------------------ 7. submissions slow to read


def test_a_submission_slow_to_read_never_stalls_the_daemon(home: Path) -> None:
    """A megabyte of YAML (a 250,000-word command) takes many seconds to parse: the
    daemon reads it in a worker process, answers everyone else meanwhile, and refuses
    it once it has taken longer than submit_timeout_seconds."""
    import subprocess
    import threading

    # the admin's size cap (quotas.max_spec_bytes, 256 KiB) would refuse it unread: raised
    # here to what the request limit allows, so the worker's deadline is what stops it
    d = LauncherDaemon(home, gpus=1, core={"quotas": {"max_spec_bytes": 1 << 20}},
                       extra={"limits": {"submit_timeout_seconds": 3}})
    d.start()
    try:
        spec = home / "slow.yaml"
        spec.write_text("name: slow\ncommand: [" + ", ".join(["x"] * 250_000) + "]\n")
        spec.chmod(0o644)
        result: list[subprocess.CompletedProcess[str]] = []
        t = threading.Thread(target=lambda: result.append(
            d.client(ALICE, "submit", spec.name, check=False, timeout=120)))
        t.start()
        time.sleep(1.0)  # the submission is being read
        started = time.monotonic()
        assert call(d.socket, {"op": "ping"}, timeout=5)["ok"]
        assert time.monotonic() - started < 5
        t.join(120)
        (r,) = result
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "took more than 3 s to read" in r.stderr, r.stderr
        assert d.alive()
        quick = home / "quick.yaml"
        quick.write_text(yaml.safe_dump({"name": "quick", "gpus": 0, "command": ["true"]}))
        quick.chmod(0o644)
        assert d.client(ALICE, "submit", quick.name).stdout.startswith("submitted 1 job")
    finally:
        d.stop()
        d.kill_jobs()
