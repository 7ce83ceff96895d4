"""Launcher preemption latency end to end: signal -> checkpoint commit -> exit -> restart.

Runs a real `gpu-audit launcher serve` on one simulated GPU and, per repetition, a
low-urgency training job (examples/train_toy.py, 10 ms steps, a periodic checkpoint every
`--every-steps` steps) that an urgent job preempts at a random moment. Two modes, run
interleaved in one sitting:

  (a) checkpoint-first (this launcher): the preemption signal only sets the helper's flag;
      the loop commits at the next step boundary and exits 75; the job resumes from that
      commit;
  (b) kill-and-requeue (the obvious alternative: Slurm REQUEUE without a user signal,
      task-spooler's kill, a Kubernetes eviction a trainer does not handle): SIGTERM ends
      the job at once; it resumes from its newest periodic checkpoint.

Reported per mode (median / max over the repetitions): signal->commit, commit->exit,
signal->exit, exit->restart (includes the urgent job's run and the GPU release barrier)
and the work lost (steps re-done, GPU-seconds). The daemon runs as root with
allow_root_jobs (a benchmark shortcut; production refuses root jobs).

    .venv/bin/python bench/bench_launcher_preempt.py [--reps 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from launcher.protocol import ProtocolError, call

REPO = Path(__file__).resolve().parents[1]
STEP_SLEEP = 0.01


def _wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def _job(sock: Path, job: int) -> dict[str, Any]:
    resp = call(sock, {"op": "status", "id": job})
    return dict(resp["job"])


def _steps_at(events_file: Path) -> int:
    step = 0
    try:
        for line in events_file.read_text().splitlines():
            doc = json.loads(line)
            if doc.get("event") == "metrics":
                step = max(step, int(doc.get("step", 0)))
    except (OSError, ValueError):
        pass
    return step


def run_one(sock: Path, state: Path, work: Path, *, mode: str, rep: int,
            every_steps: int) -> dict[str, float]:
    ck = work / f"ck-{mode}-{rep}"
    cmd = [sys.executable, str(REPO / "examples/train_toy.py"), "--steps", "100000",
           "--every-steps", str(every_steps), "--step-sleep", str(STEP_SLEEP),
           "--out", str(work / f"w-{mode}-{rep}.json"), "--checkpoint-dir", str(ck)]
    spec: dict[str, Any] = {"name": f"low-{mode}-{rep}", "urgency": "low",
                            "env": {"PYTHONPATH": str(REPO)}}
    if mode == "kill":
        # the trainer listens for a signal nobody sends; SIGTERM's default action ends it
        spec["preempt_signal"] = "SIGTERM"
        spec["command"] = ["env", "GPU_AUDIT_PREEMPT_SIGNAL=SIGUSR2", *cmd]
    else:
        spec["command"] = cmd
    low = call(sock, {"op": "submit", "spec": yaml.safe_dump(spec), "cwd": str(work)})["ids"][0]
    _wait(lambda: _job(sock, low)["state"] == "running", 30, "the low job to start")
    time.sleep(random.uniform(1.5, 3.0))
    urgent = {"name": f"urgent-{mode}-{rep}", "urgency": "urgent", "command": ["true"]}
    call(sock, {"op": "submit", "spec": yaml.safe_dump(urgent), "cwd": str(work)})
    j = _wait(lambda: (x := _job(sock, low))["attempt"] >= 2 and x["state"] == "running"
              and x, 60, "the low job to resume")
    ev = {e["kind"]: e for e in j["events"]}
    sig = ev["preempt_signal"]["time"]
    pre = ev["preempted"]
    exit_t = pre["time"]
    restart = ev["resumed"]["time"]
    ckpt_step = pre.get("checkpoint_step") or 0
    events_1 = state / "logs" / str(low) / "1.events.jsonl"
    step_at_exit = _steps_at(events_1)
    call(sock, {"op": "cancel", "id": low})
    _wait(lambda: _job(sock, low)["state"] == "cancelled", 30, "the cancel")
    return {
        "signal_to_commit_s": pre.get("signal_to_commit_seconds") or float("nan"),
        "commit_to_exit_s": pre.get("commit_to_exit_seconds") or float("nan"),
        "signal_to_exit_s": exit_t - sig,
        "exit_to_restart_s": restart - exit_t,
        "signal_to_restart_s": restart - sig,
        "steps_redone": float(max(0, step_at_exit - ckpt_step)),
        "lost_gpu_seconds": float(pre.get("lost_gpu_seconds") or 0.0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--every-steps", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-launcher-"))
    state = work / "state"
    sock = work / "launcher.sock"
    cfg = {"state_dir": str(state), "socket": str(sock), "gpus": "sim:1",
           "tick_seconds": 0.05, "jobmap_dir": str(work / "jobs"), "allow_root_jobs": True,
           "log_level": "warning",
           "core": {"policy": {"preempt_wait_seconds": 0, "preempt_min_runtime_seconds": 0,
                               "preempt_min_priority_gap": 100},
                    "engine": {"preempt_grace_seconds": 30}}}
    (work / "launcher.yaml").write_text(yaml.safe_dump(cfg))
    log = open(work / "daemon.log", "wb")  # noqa: SIM115 - lives as long as the daemon
    daemon = subprocess.Popen([sys.executable, "-m", "gpu_audit_app", "launcher", "serve",
                               "--config", str(work / "launcher.yaml")],
                              stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def up() -> bool:
        try:
            return bool(call(sock, {"op": "ping"}, timeout=2).get("ok"))
        except ProtocolError:
            return False

    _wait(up, 30, "the daemon")
    results: dict[str, list[dict[str, float]]] = {"checkpoint": [], "kill": []}
    try:
        for rep in range(args.reps):
            for mode in ("checkpoint", "kill"):
                results[mode].append(run_one(sock, state, work, mode=mode, rep=rep,
                                            every_steps=args.every_steps))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        log.close()
    keys = list(results["checkpoint"][0])
    print(f"launcher preemption, {args.reps} repetitions per mode, 10 ms steps, periodic "
          f"checkpoint every {args.every_steps} steps, tick 50 ms, python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print("| metric | checkpoint-first median | max | kill-and-requeue median | max |")
    print("|---|---|---|---|---|")
    summary: dict[str, dict[str, float]] = {}
    for k in keys:
        row = []
        for mode in ("checkpoint", "kill"):
            vals = [r[k] for r in results[mode] if r[k] == r[k]]
            med = statistics.median(vals) if vals else float("nan")
            mx = max(vals) if vals else float("nan")
            summary[f"{mode}.{k}"] = {"median": med, "max": mx}
            row += [f"{med:.3f}", f"{mx:.3f}"]
        print(f"| {k} | " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
