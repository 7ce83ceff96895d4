"""The launcher protocol fuzz at bench size: 100,000+ random and mutated frames through the
daemon's frame parser and every request handler (launcher.server.handle_line), and the
same frames cut into random pieces through the real socket loop of a real daemon.

Part 1 (in process): hypothesis draws frames from tests/launcher/fuzzing.py (bytes of any
kind, hostile request objects, byte-level mutations of valid requests) as an admin and as
an ordinary user; every answer must be a bounded JSON object with a known error code,
never an exception or an internal error.

Part 2 (real daemon, `--socket-frames N`): N of those frames sent to a running
`gpu-audit launcher serve` in 1-7 pieces each (a new connection per frame); the daemon
must answer each (or close it when it is not a request line) and still answer a ping.

    PYTHONPATH=. .venv/bin/python bench/bench_launcher_fuzz.py --examples 100000 \\
        --socket-frames 5000 --json bench/results/launcher_fuzz.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, seed, settings

from launcher.peer import Caller
from launcher.protocol import call
from launcher.server import handle_line
from tests.launcher import fuzzing


def _chunk(examples: int, seed_value: int, outcomes: Counter[str]) -> None:
    """`examples` frames against a fresh service (the jobs the fuzz submits pile up in
    the store, and `queue` and `status` grow with them)."""
    d = Path(tempfile.mkdtemp(prefix="gpu-audit-fuzz-"))
    d.chmod(0o755)
    svc = fuzzing.service(d / "state")

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(frame=fuzzing.frames, caller=fuzzing.callers)
    def run(frame: bytes, caller: Caller) -> None:
        answer = handle_line(svc, caller, frame)
        fuzzing.check(answer)
        outcomes["ok" if answer["ok"] else str(answer["error"])] += 1

    try:
        run()
    finally:
        svc.close()
        shutil.rmtree(d, ignore_errors=True)


def in_process(examples: int, chunk: int, first_seed: int) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    t = time.monotonic()
    done = 0
    while done < examples:
        n = min(chunk, examples - done)
        _chunk(n, first_seed + done, outcomes)
        done += n
        print(f"  {sum(outcomes.values())} inputs, {time.monotonic() - t:.0f} s", flush=True)
    seconds = time.monotonic() - t
    total = sum(outcomes.values())
    return {"inputs": total, "seconds": round(seconds, 1), "per_second": round(total / seconds),
            "outcomes": dict(outcomes.most_common())}


def through_socket(count: int, seed: int) -> dict[str, Any]:
    from tests.launcher.runtime.daemon import LauncherDaemon
    from tests.launcher.runtime.users import shared_dir

    frames: list[bytes] = []

    @settings(max_examples=count, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(frame=fuzzing.frames)
    def collect(frame: bytes) -> None:
        frames.append(frame)

    collect()
    rng = random.Random(seed)
    home = shared_dir()
    d = LauncherDaemon(home, gpus=1).start()
    answered = closed = 0
    t = time.monotonic()
    try:
        for frame in frames:
            data = frame.replace(b"\n", b" ") + b"\n"
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1,
                                                            rng.randint(0, 6))))
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            s.connect(str(d.socket))
            for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
                s.sendall(data[a:b])
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            s.close()
            if buf:
                fuzzing.check(orjson.loads(buf))
                answered += 1
            else:
                closed += 1
        assert d.alive(), "the daemon died"
        assert call(d.socket, {"op": "ping"}, timeout=10)["ok"]
    finally:
        d.stop()
        shutil.rmtree(home, ignore_errors=True)
    return {"frames": len(frames), "answered": answered, "closed_without_answer": closed,
            "seconds": round(time.monotonic() - t, 1), "daemon_alive": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=5000, help="inputs per fresh service")
    ap.add_argument("--socket-frames", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    out = {"in_process": in_process(args.examples, args.chunk, args.seed)}
    print(json.dumps(out["in_process"]), flush=True)
    if args.socket_frames:
        out["socket"] = through_socket(args.socket_frames, args.seed)
        print(json.dumps(out["socket"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
