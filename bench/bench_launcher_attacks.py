"""The launcher daemon under hostile local users, before and after issue 20, side by side.

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
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from launcher.protocol import ProtocolError, call
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


SCENARIOS: dict[str, Callable[[Path, dict[str, Any] | None], dict[str, Any]]] = {
    "memory": memory, "flood": flood, "latency": latency, "submission": submission}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a checkout of the code before issue 20")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", choices=sorted(SCENARIOS))
    args = ap.parse_args()
    local_user(ALICE)
    local_user(BOB)
    sides: list[tuple[str, Path, dict[str, Any] | None]] = []
    if args.before:
        sides.append(("before", args.before.resolve(), None))
    sides += [("after", REPO, None), ("after, per-uid cap raised", REPO, RAISED)]
    out: dict[str, Any] = {}
    try:
        for name, scenario in SCENARIOS.items():
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
