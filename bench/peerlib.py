"""Shared pieces of the peer and floor benchmarks (bench_peer.py, bench_floor.py).

- the fake libnvidia-ml.so.1 (bench/fake_libnvml/fake_nvml.c), compiled once with gcc into
  a cache folder; a process started with `fake_env(...)` loads it instead of a driver's;
- real processes for the fake GPUs' process lists (`sleep`), so /proc lookups (user,
  command line, cgroup) succeed for every exporter as on a real node;
- per-process CPU seconds and RSS from /proc.

Benchmark support only: nothing in the product imports it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE_SOURCE = ROOT / "bench" / "fake_libnvml" / "fake_nvml.c"
CACHE = ROOT / ".bench-cache"


def build_fake_nvml() -> Path:
    """The folder holding the compiled fake libnvidia-ml.so.1 (rebuilt when the source
    is newer)."""
    out = CACHE / "fake-libnvml"
    lib = out / "libnvidia-ml.so.1"
    if not lib.exists() or lib.stat().st_mtime < FAKE_SOURCE.stat().st_mtime:
        out.mkdir(parents=True, exist_ok=True)
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            raise SystemExit("bench: gcc is needed to build the fake libnvidia-ml.so.1")
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(FAKE_SOURCE)],
                       check=True)
    return out


class Sleepers:
    """n real processes (`sleep`) whose PIDs the fake NVML reports, in a PID file."""

    def __init__(self, n: int, pid_file: Path) -> None:
        self.procs = [subprocess.Popen(["sleep", "86400"]) for _ in range(n)]
        self.pid_file = pid_file
        pid_file.write_text("\n".join(str(p.pid) for p in self.procs) + "\n")

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def fake_env(lib_dir: Path, gpus: int, per_gpu: int, pid_file: Path,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which NVML is the fake, with gpus x per_gpu processes."""
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = f"{lib_dir}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
    env["FAKE_NVML_GPUS"] = str(gpus)
    env["FAKE_NVML_PROCS"] = str(per_gpu)
    env["FAKE_NVML_PID_FILE"] = str(pid_file)
    return env


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int) -> float:
    """Resident set size of a process, MB (MiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
