"""The launcher daemon under hostile local users, before and after its hardening, side by side.

Each scenario starts a fresh real daemon (`gpu-audit launcher serve`, root, `sim:2`) from
a checkout, and attacks it as real unix users through its socket
(tests/launcher/runtime/hostile.py):

- memory: 60 connections each send an 8 MiB line with no newline; the daemon's RSS
  before, its peak (VmHWM) after, how many got an answer, whether it still runs;
- flood: with RLIMIT_NOFILE 1024 (systemd's default), one user opens 1,100 connections
  and holds them; does the daemon survive, does another user get an answer;
- latency: a job writes 4 MiB to stdout; then 1,000 idle connections and 5 clients that
  ask for 256 KiB log chunks and never read; 250 pings sent open-loop every 20 ms
  (each timed from when it was due, so a stall shows in every ping it delays): p50,
  p99, max, failures (and the same pings on a quiet daemon first);
- submission: a user submits a 1 MiB YAML (a 250,000-word command) that takes many
  seconds to parse; the same open-loop pings meanwhile, and what the submitter is told.

"after" runs with the default limits and again with the per-uid cap raised (so that all
60 lines / all 1,000 idle connections are admitted and the byte budget and the loop
carry the load, not the cap). "before" needs a checkout of the old code:

    git worktree add /tmp/gpu-audit-before 4eb094e
    PYTHONPATH=. .venv/bin/python bench/bench_launcher_attacks.py \\
        --before /tmp/gpu-audit-before --json bench/results/launcher_attacks.json

Runs as root (it creates the attacking users and removes them afterwards).

`--load` runs the second set instead: one user trying to starve, bloat or out-quota the
daemon (bob attacks; root's pings and alice's CLI calls are the other users), each
reporting the other users' ping p50/p99/max and failures, alice's failed CLI calls, the
daemon's peak RSS (VmHWM) and the growth of its database (launcher.db with its WAL):

- events_flood: a `gpus: 0` job appends 200 KB of checkpoint_committed lines every 0.5 s
  for 30 s (the flood that made the daemon unreachable for 5.5 minutes);
- amplification: 16 submissions of a 258 KB pipeline whose top-level env (250 x 1,000
  characters) would be copied into 100 jobs, then 16 of the largest that is accepted (8
  jobs); then a restart and one `status` from a user with no jobs;
- connect_close: four processes connect and close as fast as they can for 30 s, on the
  common socket (connect_close_own: on bob's own socket); root and alice used the
  launcher before, so they have their own sockets; connect_close_sliced: on the common
  socket with bob's processes in a CPU group of their own, as systemd-logind's
  user-UID.slice puts a logged-in user's;
- first_contact: alice's first three calls (the first through the common socket) while
  bob floods it;
- projects: bob writes `project: vision` (a project of alice's group) to fill its cap;
- cpu_jobs: bob submits 600 `gpus: 0` jobs (6 x 100) that each run 3 processes;
- socket_dir: `launcher serve` run by hand creates its socket's directory; can alice
  connect?

    PYTHONPATH=. .venv/bin/python bench/bench_launcher_attacks.py --load \\
        --json bench/results/launcher_hostile_load.json
"""

from __future__ import annotations

import argparse
import json
import pwd
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from launcher.protocol import ProtocolError, call, user_socket_path
from tests.launcher.runtime.daemon import REPO, LauncherDaemon
from tests.launcher.runtime.hostile import Holding
from tests.launcher.runtime.users import (
    ALICE,
    BOB,
    job_python,
    local_user,
    remove_created,
    shared_dir,
)
from tests.polling import wait_for

MIB = 1 << 20
RAISED = {"limits": {"per_uid_connections": 4096, "max_connections": 8192,
                     "per_uid_connect_rate": 100000, "per_uid_connect_burst": 100000}}


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _daemon(repo: Path, extra: dict[str, Any] | None, nofile: int | None = None
            ) -> tuple[LauncherDaemon, Path]:
    home = shared_dir()
    d = LauncherDaemon(home, gpus=2, extra=extra, nofile=nofile, repo=repo)
    d.start()
    return d, home


def _done(d: LauncherDaemon, home: Path) -> None:
    d.stop()
    d.kill_jobs()
    shutil.rmtree(home, ignore_errors=True)


def memory(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    d, home = _daemon(repo, extra)
    try:
        assert d.proc is not None
        rss0 = _status_kb(d.proc.pid, "VmRSS")
        with Holding(BOB, "big_lines", d.socket, 60, 8 * MIB, timeout=300) as bob:
            result = bob.result
        alive = d.alive()
        peak = _status_kb(d.proc.pid, "VmHWM") if alive else None
        return {"rss_before_mb": round(rss0 / 1024, 1),
                "peak_rss_mb": round(peak / 1024, 1) if peak else None,
                "answered": result["answered"], "answers": result["answers"][:3],
                "alive": alive}
    finally:
        _done(d, home)


def flood(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    d, home = _daemon(repo, extra, nofile=1024)
    try:
        with Holding(BOB, "flood", d.socket, 1100) as bob:
            time.sleep(1.0)
            alive_during = d.alive()
            served = None
            if alive_during:
                r = d.client(ALICE, "queue", check=False, timeout=60)
                served = r.returncode == 0
        time.sleep(0.5)
        return {"connected": bob.result["connected"], "refused_answers":
                bob.result["answers"][:2], "alive_during": alive_during,
                "other_user_served": served, "alive_after": d.alive()}
    finally:
        _done(d, home)


def _pings(socket: Path, n: int, interval_s: float) -> dict[str, Any]:
    """`n` pings sent open-loop, one every `interval_s` whether or not the previous one
    was answered (so a stalled daemon cannot hide the pings it delays: each latency is
    counted from when the ping was due). A failed ping (no answer within 60 s, refused,
    reset) is counted with the time it took."""
    start = time.perf_counter() + 0.05

    def one(i: int) -> tuple[float, bool]:
        due = start + i * interval_s
        time.sleep(max(0.0, due - time.perf_counter()))
        try:
            ok = bool(call(socket, {"op": "ping"}, timeout=60).get("ok"))
        except ProtocolError:
            ok = False
        return (time.perf_counter() - due) * 1000, ok

    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(one, range(n)))
    ordered = sorted(t for t, _ in results)
    return {"pings": n, "failures": sum(1 for _, ok in results if not ok),
            "first_ms": round(results[0][0], 2),
            "p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(ordered[min(n - 1, int(n * 0.99))], 2),
            "max_ms": round(ordered[-1], 2)}


def _held(d: LauncherDaemon) -> int | None:
    """Connections the daemon holds (its gauge; None where it has none: the old code)."""
    try:
        text = d.scrape()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("gpu_audit_launcher_connections "):
            return int(float(line.split()[1]))
    return None


def latency(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    d, home = _daemon(repo, extra)
    try:
        spec = home / "chatty.yaml"
        spec.write_text(yaml.safe_dump({"name": "chatty", "gpus": 0, "command": [
            job_python(), "-c", "import sys; sys.stdout.write(('y' * 1023 + '\\n') * 4096)"]}))
        spec.chmod(0o644)
        job = int(d.client(ALICE, "submit", spec.name).stdout.split(": ", 1)[1].split()[0])
        d.wait_state(job, {"succeeded"})
        quiet = _pings(d.socket, 250, 0.02)
        request = json.dumps({"op": "logs", "id": job, "offset": 0})
        with Holding(BOB, "flood", d.socket, 1000) as idle, \
                Holding(ALICE, "non_readers", d.socket, 5, request):
            time.sleep(0.3)
            held = _held(d)
            attacked = _pings(d.socket, 250, 0.02)
        return {"quiet": quiet, "attacked": attacked, "idle_connected":
                idle.result["connected"], "daemon_held": held, "alive": d.alive()}
    finally:
        _done(d, home)


def submission(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    d, home = _daemon(repo, extra)
    try:
        spec = home / "slow.yaml"
        spec.write_text("name: slow\ncommand: [" + ", ".join(["x"] * 250_000) + "]\n")
        spec.chmod(0o644)
        done: list[Any] = []
        t = threading.Thread(target=lambda: done.append(
            d.client(ALICE, "submit", spec.name, check=False, timeout=300)))
        started = time.monotonic()
        t.start()
        time.sleep(0.5)
        pings = _pings(d.socket, 250, 0.02)
        t.join(300)
        r = done[0]
        return {"pings": pings, "submit_seconds": round(time.monotonic() - started, 1),
                "submit_exit": r.returncode, "submit_said": r.stderr.strip()[-160:],
                "alive": d.alive()}
    finally:
        _done(d, home)


# ------------------------------------------------ one user starving or bloating the daemon


def _db_bytes(d: LauncherDaemon) -> int:
    return sum(p.stat().st_size for p in d.state.glob("launcher.db*"))


def _spec(home: Path, name: str, doc: object) -> str:
    p = home / name
    p.write_text(yaml.safe_dump(doc))
    p.chmod(0o644)
    return p.name


def _measure(d: LauncherDaemon, seconds: float, cli_calls: int) -> dict[str, Any]:
    """While an attack runs: open-loop pings for `seconds` (one every 60 ms) from root,
    and `cli_calls` `gpu-audit launcher queue` as alice spread over the same time."""
    failed: list[str] = []

    def clis() -> None:
        gap = seconds / max(1, cli_calls)
        for _ in range(cli_calls):
            t = time.monotonic()
            r = d.client(ALICE, "queue", check=False, timeout=60)
            if r.returncode != 0:
                failed.append(r.stderr.strip()[-120:])
            time.sleep(max(0.0, gap - (time.monotonic() - t)))

    t = threading.Thread(target=clis)
    t.start()
    pings = _pings(d.socket, int(seconds / 0.06), 0.06)
    t.join(120)
    return {"pings": pings, "cli_calls": cli_calls, "cli_failed": len(failed),
            "cli_errors": sorted(set(failed))[:2]}


def _peak_mb(d: LauncherDaemon) -> float:
    assert d.proc is not None
    return round(_status_kb(d.proc.pid, "VmHWM") / 1024, 1)


_FLOODER = """
import json, os, time
f = open(os.environ["GPU_AUDIT_EVENTS_FILE"], "a")
pad = "p" * 120
end = time.time() + 30
step = 0
while time.time() < end:
    chunk = []
    for _ in range(1000):  # about 200 KB
        step += 1
        chunk.append(json.dumps({"event": "checkpoint_committed", "time": time.time(),
                                 "step": step, "path": "/ckpt/" + pad}))
    f.write("\\n".join(chunk) + "\\n")
    f.flush()
    time.sleep(0.5)
print(step)
"""


def events_flood(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    d, home = _daemon(repo, extra)
    try:
        db0 = _db_bytes(d)
        job = int(d.client(BOB, "submit", _spec(home, "flood.yaml", {
            "name": "flood", "gpus": 0, "command": [job_python(), "-c", _FLOODER]})
        ).stdout.split(": ", 1)[1].split()[0])
        d.wait_state(job, {"running"}, timeout=60)
        out = _measure(d, 30.0, 10)
        d.wait_state(job, {"succeeded", "failed"}, timeout=600)
        st = time.perf_counter()
        full = d.ask({"op": "status", "id": job})["job"]
        out.update({"status_ms": round((time.perf_counter() - st) * 1000, 1),
                    "lines_written": int(d.client(BOB, "logs", str(job)).stdout.strip()),
                    "events_stored": full.get("events_total", len(full["events"])),
                    "over_budget_events": sum(e["kind"] == "events_over_budget"
                                              for e in full["events"]),
                    "last_checkpoint_step": full["last_checkpoint_step"],
                    "peak_rss_mb": _peak_mb(d),
                    "db_growth_mb": round((_db_bytes(d) - db0) / MIB, 2),
                    "alive": d.alive()})
        return out
    finally:
        _done(d, home)


_BIG_ENV = {f"V{i}": "x" * 1000 for i in range(250)}


def amplification(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    d, home = _daemon(repo, extra)
    try:
        db0 = _db_bytes(d)
        py = job_python()
        jobs = [{"name": "first", "gpus": 0, "command": [py, "-c", "raise SystemExit(1)"]}]
        jobs += [{"name": f"j{i}", "gpus": 0, "after": ["first"],
                  "command": [py, "-c", "pass"]} for i in range(99)]
        big = _spec(home, "amp.yaml", {"env": _BIG_ENV, "jobs": jobs})
        small = _spec(home, "amp8.yaml", {"env": _BIG_ENV, "jobs": jobs[:8]})
        refused = accepted = 0
        result: dict[str, Any] = {}

        def submit_all() -> None:
            nonlocal refused, accepted
            for name in [big] * 16 + [small] * 16:
                r = d.client(BOB, "submit", name, check=False, timeout=120)
                accepted += r.returncode == 0
                refused += r.returncode != 0
                if r.returncode != 0 and "said" not in result:
                    result["said"] = r.stderr.strip()[-200:]

        t = threading.Thread(target=submit_all)
        t.start()
        result.update(_measure(d, 20.0, 6))
        t.join(600)
        result.update({"submissions_accepted": accepted, "submissions_refused": refused,
                       "peak_rss_mb": _peak_mb(d),
                       "db_growth_mb": round((_db_bytes(d) - db0) / MIB, 2)})
        d.stop()
        d.start()
        rss0 = d.rss_bytes()
        st = time.perf_counter()
        r = d.client(ALICE, "status", check=False)
        result.update({"restart_status_s": round(time.perf_counter() - st, 2),
                       "restart_status_ok": r.returncode == 0,
                       "rss_after_restart_mb": round(rss0 / MIB, 1),
                       "rss_after_status_mb": round(d.rss_bytes() / MIB, 1),
                       "alive": d.alive()})
        return result
    finally:
        _done(d, home)


def _user_slice() -> Path | None:
    """A cpu cgroup for bob's processes, as systemd-logind gives each logged-in user a
    user-UID.slice of equal CPU weight; None where cgroup v1's cpu controller is not
    writable (then everything shares one group: the worst case)."""
    path = Path("/sys/fs/cgroup/cpu/gpa-bench-bob")
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    return path


def connect_close(repo: Path, extra: dict[str, Any] | None, *, own: bool = False,
                  sliced: bool = False) -> dict[str, Any]:
    """bob's four connect/close loops on the common socket (own: on his own socket;
    sliced: in his own CPU group); root and alice have used the launcher before, as a
    node's users have."""
    d, home = _daemon(repo, extra)
    try:
        d.ask({"op": "ping"})
        d.client(ALICE, "queue")
        d.client(BOB, "queue")
        target = d.socket
        bobs = user_socket_path(d.socket, pwd.getpwnam(BOB).pw_uid)
        if own and bobs.exists():  # an older daemon has no own sockets: the common one
            target = bobs
        group = _user_slice() if sliced else None
        with Holding(BOB, "connect_close", target, 4, 120, cgroup=group):
            out = _measure(d, 30.0, 15)
            out["peak_rss_mb"] = _peak_mb(d)
        out["alive"] = d.alive()
        out["flooded"] = "bob's own socket" if target == bobs else "the common socket"
        out["bob_cpu_group"] = "his own" if group is not None else "shared"
        if group is not None:
            wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 30,
                     "bob's processes to end")
            group.rmdir()
        return out
    finally:
        _done(d, home)


def connect_close_own(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    return connect_close(repo, extra, own=True)


def connect_close_sliced(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    return connect_close(repo, extra, sliced=True)


def first_contact(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    """alice's very first call (no own socket yet) while bob floods the common socket:
    the one call that must still queue behind the flood."""
    d, home = _daemon(repo, extra)
    try:
        with Holding(BOB, "connect_close", d.socket, 4, 120):
            time.sleep(2.0)
            calls = []
            for _ in range(3):
                t = time.perf_counter()
                r = d.client(ALICE, "queue", check=False, timeout=60)
                calls.append({"ms": round((time.perf_counter() - t) * 1000, 1),
                              "ok": r.returncode == 0})
        return {"alice_calls": calls, "alive": d.alive()}
    finally:
        _done(d, home)


VISION = f"gpa-vision-{ALICE.rsplit('-', 1)[1]}"


def projects(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    local_user(ALICE, groups=(VISION,))
    extra = {**(extra or {}), "core": {
        "projects": {"vision": {"groups": [VISION]}},
        "quotas": {"projects": {"vision": {"max_queued_jobs": 4}}}}}
    d, home = _daemon(repo, extra)
    try:
        hold = {"gpus": 2, "command": [job_python(), "-c", "import time; time.sleep(60)"]}
        bob = d.client(BOB, "submit", _spec(home, "squat.yaml", {"project": "vision", "jobs": [
            {"name": f"s{i}", **hold} for i in range(4)]}), check=False)
        alice = d.client(ALICE, "submit", _spec(home, "mine.yaml", {
            "project": "vision", "jobs": [{"name": f"a{i}", **hold} for i in range(4)]}),
            check=False)
        return {"bob_exit": bob.returncode, "bob_said": bob.stderr.strip()[-220:],
                "alice_exit": alice.returncode, "alice_said": alice.stdout.strip()[:60]}
    finally:
        _done(d, home)


def cpu_jobs(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    d, home = _daemon(repo, extra)
    try:
        py = job_python()
        three = ("import subprocess, sys, time; ps = [subprocess.Popen([sys.executable, '-c', "
                 "'import time; time.sleep(90)']) for _ in range(2)]; time.sleep(90)")
        name = _spec(home, "cpu.yaml", {"jobs": [
            {"name": f"c{i}", "gpus": 0, "command": [py, "-c", three]} for i in range(100)]})
        outcomes = [d.client(BOB, "submit", name, check=False, timeout=120).returncode
                    for _ in range(6)]
        time.sleep(3.0)
        out = _measure(d, 30.0, 10)
        states = [j["state"] for j in d.ask({"op": "queue"})["jobs"]]
        out.update({"submissions_accepted": outcomes.count(0),
                    "running": states.count("running"),
                    "waiting": sum(s in ("queued", "requeued") for s in states),
                    "peak_rss_mb": _peak_mb(d), "alive": d.alive()})
        return out
    finally:
        _done(d, home)


def socket_dir(repo: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    home = shared_dir()
    sock = home / "run" / "gpu-audit" / "launcher.sock"
    d = LauncherDaemon(home, gpus=1, extra={**(extra or {}), "socket": str(sock)},
                       repo=repo)
    d.socket = sock
    try:
        d.start()
        r = d.client(ALICE, "queue", check=False)
        return {"dir_mode": oct(sock.parent.stat().st_mode & 0o777),
                "other_user_served": r.returncode == 0,
                "said": (r.stderr.strip() or r.stdout.strip())[-160:]}
    finally:
        _done(d, home)


LOAD: dict[str, Callable[[Path, dict[str, Any] | None], dict[str, Any]]] = {
    "events_flood": events_flood, "amplification": amplification,
    "connect_close": connect_close, "connect_close_own": connect_close_own,
    "connect_close_sliced": connect_close_sliced,
    "first_contact": first_contact, "projects": projects, "cpu_jobs": cpu_jobs,
    "socket_dir": socket_dir}

SCENARIOS: dict[str, Callable[[Path, dict[str, Any] | None], dict[str, Any]]] = {
    "memory": memory, "flood": flood, "latency": latency, "submission": submission}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path,
                    help="a checkout of the code to compare with (e.g. before a hardening)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", choices=sorted({*SCENARIOS, *LOAD}))
    ap.add_argument("--load", action="store_true",
                    help="the starve/bloat/out-quota attacks (after only, default limits)")
    args = ap.parse_args()
    local_user(ALICE)
    local_user(BOB)
    sides: list[tuple[str, Path, dict[str, Any] | None]] = []
    if args.before:
        sides.append(("before", args.before.resolve(), None))
    sides += [("after", REPO, None)]
    if not args.load:
        sides.append(("after, per-uid cap raised", REPO, RAISED))
    out: dict[str, Any] = {}
    try:
        for name, scenario in (LOAD if args.load else SCENARIOS).items():
            if args.only and name != args.only:
                continue
            for side, repo, extra in sides:
                t = time.monotonic()
                try:
                    result = scenario(repo, extra)
                except AssertionError as exc:  # e.g. the daemon died before answering
                    result = {"error": str(exc).splitlines()[0][:300]}
                result["seconds"] = round(time.monotonic() - t, 1)
                out.setdefault(name, {})[side] = result
                print(f"{name:8} {side:28} {json.dumps(result)}", flush=True)
    finally:
        remove_created()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
