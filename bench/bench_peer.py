"""gpu-audit against nvitop-exporter, side by side, on the same fake NVML.

Both exporters load NVML through nvidia-ml-py's ctypes `CDLL("libnvidia-ml.so.1")`;
LD_LIBRARY_PATH points both at one fake library written in C
(bench/fake_libnvml/fake_nvml.c, compiled here with gcc), so the fake costs neither any
Python time and both do exactly their own work above the ctypes boundary. The fake's
processes are real (`sleep`), so both exporters' /proc lookups succeed.

nvitop-exporter is installed by this script into its own venv (.bench-cache/nvitop-venv,
`pip install nvitop-exporter==VERSION`), never into the project's.

For each shape (GPUs x processes per GPU) every exporter runs as its own process,
all at once, each sampling every --interval seconds (both exporters' option):
1. quiet: --quiet seconds without scrapes; CPU per sampling cycle = CPU / cycles;
2. scrapes: --scrapes back-to-back scrapes (gzip, a new connection each, as
   Prometheus without keep-alive), one exporter at a time; scrape CPU = (CPU - the
   cycles' CPU over the same wall time) / scrapes;
3. soak: --minutes of one scrape per --soak-every seconds; CPU per hour over the soak,
   and RSS at its end (the issue's "RSS after 10 minutes of scrapes").
CPU is user + system of the whole process from /proc/<pid>/stat (10 ms ticks, hence the
long windows). MALLOC_ARENA_MAX is the same for every exporter (--arena-max; 2 is what
the gpu-audit unit and image set; 0 leaves it unset).

    .venv/bin/python bench/bench_peer.py [--shapes 1x8,8x8,8x64] [--minutes 10]
        [--ours LABEL=TREE ...] [--json bench/results/peer.json]

--ours LABEL=TREE adds a gpu-audit checkout (e.g. a `git archive` of main), installed
into its own venv (.bench-cache/gpu-audit-venv-LABEL, a plain `pip install TREE`), for
before/after in one run; the default is this checkout as "gpu-audit".
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peerlib import (
    CACHE,
    ROOT,
    Sleepers,
    build_fake_nvml,
    fake_env,
    proc_cpu_seconds,
    proc_rss_mb,
)

NVITOP_VERSION = "1.7.2"


def nvitop_venv() -> Path:
    """nvitop-exporter's own venv, created on first use."""
    venv = CACHE / "nvitop-venv"
    exe = venv / "bin" / "nvitop-exporter"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q",
                        f"nvitop-exporter=={NVITOP_VERSION}"], check=True)
    return exe


def ours_venv(label: str, tree: Path) -> Path:
    """A venv with gpu-audit installed from `tree` as a user installs it (a plain,
    non-editable `pip install`, base dependencies only), so neither side pays for a
    development checkout's start-up (the editable finder, the test extras' .pth files)."""
    venv = CACHE / f"gpu-audit-venv-{label}"
    pip = venv / "bin" / "pip"
    if not pip.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(pip), "install", "-q", str(tree)], check=True)
    else:  # same dependencies: only the project itself is replaced
        subprocess.run([str(pip), "install", "-q", "--no-deps", "--force-reinstall",
                        str(tree)], check=True)
    return venv / "bin" / "gpu-audit"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Exporter:
    label: str
    shape: tuple[int, int]
    argv: list[str]
    env: dict[str, str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    results: dict[str, Any] = field(default_factory=dict)

    def start(self, log: Path) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log.open("wb"),
                                     stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def scrape(self) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{self.label}: HTTP {resp.status}")
            if resp.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return len(body)
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} {self.shape} exited {self.proc.returncode}")
            try:
                if self.scrape() > 0:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.label} {self.shape}: no /metrics after {timeout} s")


def series_count(ex: Exporter) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", ex.port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def ours_argv(exe: Path, port: int, spool: Path, interval: float) -> list[str]:
    return [str(exe), "exporter", "--backend", "nvml",
            "--listen", f"127.0.0.1:{port}", "--spool-dir", str(spool),
            "--interval", f"{interval:g}"]


def nvitop_argv(exe: Path, port: int, interval: float) -> list[str]:
    return [str(exe), "--bind-address", "127.0.0.1", "--port", str(port),
            "--interval", f"{interval:g}", "--hostname", "bench"]


def measure(exporters: list[Exporter], args: argparse.Namespace) -> None:
    # 1. quiet: sampling cycles only
    c0 = {ex.label + str(ex.shape): proc_cpu_seconds(ex.pid) for ex in exporters}
    time.sleep(args.quiet)
    for ex in exporters:
        cpu = proc_cpu_seconds(ex.pid) - c0[ex.label + str(ex.shape)]
        ex.results["cycle_cpu_ms"] = cpu / (args.quiet / args.interval) * 1000
    # 2. back-to-back scrapes, one exporter at a time
    for ex in exporters:
        t0, c = time.monotonic(), proc_cpu_seconds(ex.pid)
        sizes = [ex.scrape() for _ in range(args.scrapes)]
        wall = time.monotonic() - t0
        cpu = proc_cpu_seconds(ex.pid) - c
        cycles_cpu = ex.results["cycle_cpu_ms"] / 1000 * wall / args.interval
        ex.results["scrape_cpu_ms"] = max(0.0, cpu - cycles_cpu) / args.scrapes * 1000
        ex.results["exposition_bytes"] = statistics.median(sizes)
        ex.results["series"] = series_count(ex)
    # 3. soak: scrapes at a steady rate for --minutes, all exporters at once
    stop = threading.Event()

    def scraper(ex: Exporter) -> None:
        nxt = time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(OSError):
                ex.scrape()
            nxt += args.soak_every
            stop.wait(max(0.0, nxt - time.monotonic()))

    c0 = {id(ex): proc_cpu_seconds(ex.pid) for ex in exporters}
    rss_peak = {id(ex): 0.0 for ex in exporters}
    threads = [threading.Thread(target=scraper, args=(ex,), daemon=True) for ex in exporters]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.minutes * 60:
        time.sleep(5)
        for ex in exporters:
            rss_peak[id(ex)] = max(rss_peak[id(ex)], proc_rss_mb(ex.pid))
    stop.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    for ex in exporters:
        cpu = proc_cpu_seconds(ex.pid) - c0[id(ex)]
        ex.results["cpu_s_per_hour"] = cpu / wall * 3600
        ex.results["rss_mb"] = proc_rss_mb(ex.pid)
        ex.results["rss_peak_mb"] = rss_peak[id(ex)]
        # the same work at a production cadence: a cycle every 5 s, a scrape every 15 s
        ex.results["cpu_s_per_hour_5s_15s"] = (ex.results["cycle_cpu_ms"] * 720
                                               + ex.results["scrape_cpu_ms"] * 240) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x8,8x8,8x64")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="sampling interval of both exporters (nvitop-exporter's default)")
    ap.add_argument("--quiet", type=float, default=60.0)
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--soak-every", type=float, default=1.0)
    ap.add_argument("--arena-max", type=int, default=2)
    ap.add_argument("--ours", action="append", default=[], metavar="LABEL=TREE")
    ap.add_argument("--no-nvitop", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    trees = [(lbl, Path(t).resolve()) for lbl, t in (o.split("=", 1) for o in args.ours)]
    if not trees:
        trees = [("gpu-audit", ROOT)]
    installed = {label: ours_venv(label, tree) for label, tree in trees}
    lib = build_fake_nvml()
    nvitop = None if args.no_nvitop else nvitop_venv()
    tmp = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    most = max(g * p for g, p in shapes)
    sleepers = Sleepers(most, tmp / "pids")
    base = dict(os.environ)
    if args.arena_max:
        base["MALLOC_ARENA_MAX"] = str(args.arena_max)
    exporters: list[Exporter] = []
    for gpus, per_gpu in shapes:
        env = fake_env(lib, gpus, per_gpu, sleepers.pid_file, base)
        for label, exe in installed.items():
            port = free_port()
            spool = tmp / f"spool-{label}-{gpus}x{per_gpu}"
            exporters.append(Exporter(label, (gpus, per_gpu),
                                      ours_argv(exe, port, spool, args.interval), env, port))
        if nvitop is not None:
            port = free_port()
            exporters.append(Exporter("nvitop-exporter", (gpus, per_gpu),
                                      nvitop_argv(nvitop, port, args.interval), env, port))
    try:
        for i, ex in enumerate(exporters):
            ex.start(tmp / f"log-{i}.txt")
        for ex in exporters:
            ex.wait_ready()
        time.sleep(3 * args.interval + 2)  # past start-up and the first slow-tier reads
        measure(exporters, args)
    finally:
        for ex in exporters:
            if ex.proc is not None:
                ex.proc.terminate()
        for ex in exporters:
            if ex.proc is not None:
                try:
                    ex.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    ex.proc.kill()
        sleepers.stop()
    report(exporters, args)
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "results": [{"exporter": ex.label, "gpus": ex.shape[0],
                         "procs_per_gpu": ex.shape[1], **ex.results} for ex in exporters],
        }, indent=2) + "\n")


def report(exporters: list[Exporter], args: argparse.Namespace) -> None:
    print(f"interval {args.interval:g} s, quiet {args.quiet:g} s, {args.scrapes} scrapes, "
          f"soak {args.minutes:g} min at one scrape per {args.soak_every:g} s, "
          f"MALLOC_ARENA_MAX={args.arena_max or 'unset'}")
    cols = ("cycle_cpu_ms", "scrape_cpu_ms", "cpu_s_per_hour", "cpu_s_per_hour_5s_15s",
            "rss_mb", "rss_peak_mb", "series", "exposition_bytes")
    print("| shape | exporter | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for ex in exporters:
        vals = " | ".join(f"{ex.results.get(c, float('nan')):.2f}" if isinstance(
            ex.results.get(c), float) else str(ex.results.get(c)) for c in cols)
        print(f"| {ex.shape[0]}x{ex.shape[1]} | {ex.label} | {vals} |")
    peer = {ex.shape: ex for ex in exporters if ex.label == "nvitop-exporter"}
    if peer:
        print("\nratios to nvitop-exporter (same shape, same run):")
        for ex in exporters:
            p = peer.get(ex.shape)
            if p is None or ex is p:
                continue
            r = {c: ex.results[c] / p.results[c] if p.results.get(c) else float("nan")
                 for c in ("cycle_cpu_ms", "scrape_cpu_ms", "cpu_s_per_hour", "rss_mb")}
            print(f"  {ex.shape[0]}x{ex.shape[1]} {ex.label}: " + ", ".join(
                f"{k} {v:.2f}x" for k, v in r.items()))


if __name__ == "__main__":
    main()
