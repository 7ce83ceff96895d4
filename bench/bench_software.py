"""Cost of the software fingerprint (/proc/<pid>/maps, once per process), side by side
with attribution without it.

The fake /proc of bench_attribution.py (8 GPUs x 64 processes, realistic environ and
Kubernetes cgroups) gets a maps file per process shaped like a PyTorch CUDA training
process's (3,000 mappings, ~390 KiB: the CUDA runtime, cuBLAS, cuDNN, NCCL and libtorch
among a few hundred other shared objects). Measured, CPU milliseconds, interleaved so
machine noise hits both alike:
  - a cold cycle (every process new: the cost paid once per process lifetime), with
    `attribution.software` on and off; the difference / 512 is the per-new-process cost;
  - warm cycles (the steady state), on and off: should be the same (nothing re-read);
  - read_maps + parse_maps of real processes through the real /proc, the kernel's cost
    of generating the text included: this benchmark's own interpreter; a child with
    3,000 file mappings (as many maps lines as a PyTorch CUDA process has), 12 of them
    CUDA library names; and a hostile child whose 3,000 mappings all name libcudart.

    .venv/bin/python bench/bench_software.py [--cold 15] [--cycles 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.bench_attribution import GPUS, PROCS_PER_GPU, build
from exporter.attribution import procfs
from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.attribution.software import parse_maps
from gpu_audit.model.samples import GpuSample

MAPPINGS = 3000
LIBS = ("/usr/local/cuda/lib64/libcudart.so.12.4.127",
        "/opt/venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.12",
        "/opt/venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2.21.5",
        "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")


def torch_like_maps() -> bytes:
    lines = []
    for i in range(MAPPINGS):
        if i % 500 == 0 and i // 500 < len(LIBS):
            path = LIBS[i // 500]
        elif i % 4 == 3:
            path = ""  # anonymous mappings
        else:
            path = (f"/opt/venv/lib/python3.12/site-packages/pkg{i % 300}/"
                    f"_ext{i % 7}.cpython-312-x86_64-linux-gnu.so")
        lines.append(f"{0x7f0000000000 + i * 0x1000:012x}-{0x7f0000001000 + i * 0x1000:012x} "
                     f"r-xp 00000000 08:01 {100000 + i:<10d} {path}\n")
    return "".join(lines).encode()


# Maps each file named on the command line `count` times (argv: count path count path
# ...); mappings of one file at offset 0 never merge, so each is a maps line.
_MANY_MAPPINGS = (
    "import mmap, sys\n"
    "keep = []\n"
    "args = sys.argv[1:]\n"
    "for count, path in zip(args[::2], args[1::2]):\n"
    "    f = open(path, 'rb')\n"
    "    keep += [mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ) for _ in range(int(count))]\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def real_read_ms(pid: int, runs: int = 200) -> tuple[float, int]:
    """Median CPU ms of read_maps + parse_maps of `pid` through /proc, and its size."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        start = procfs.parse_start_time(f.read())
    times: list[float] = []
    size = 0
    for _ in range(runs):
        def one() -> None:
            nonlocal size
            data, complete = procfs.read_maps("/proc", pid, start, 4 << 20)
            size = len(data)
            parse_maps(data, complete=complete)
        times.append(cpu_ms(one))
    return median(times), size


def many_mappings_ms(tmp: Path, *, hostile: bool) -> tuple[float, int]:
    args: list[str] = []
    libs = [] if hostile else [Path(p).name for p in LIBS]
    for name in [*libs, "libcudart.so.12.4.127" if hostile else "_ext.cpython-312.so"]:
        path = tmp / name
        path.write_bytes(b"\0" * 4096)
        args += ["2" if name in libs else str(MAPPINGS - 2 * len(libs)), str(path)]
    child = subprocess.Popen([sys.executable, "-c", _MANY_MAPPINGS, *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return real_read_ms(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def cpu_ms(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) * 1000


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def p95(xs: list[float]) -> float:
    return round(sorted(xs)[int(0.95 * len(xs))], 3)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", type=int, default=15, help="cold cycles per setting")
    parser.add_argument("--cycles", type=int, default=200, help="warm cycles per setting")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sw-") as tmp:
        samples, base = build(Path(tmp))
        maps = torch_like_maps()
        for s in samples:
            for p in s.processes:
                (Path(tmp) / "proc" / str(p.pid) / "maps").write_bytes(maps)
        on: AttributionConfig = base
        off = base.model_copy(update={"software": False})

        def cold(cfg: AttributionConfig) -> float:
            r = Resolver(cfg)
            try:
                return cpu_ms(lambda: r.attribute(samples))
            finally:
                r.close()

        cold_on: list[float] = []
        cold_off: list[float] = []
        for _ in range(args.cold):
            cold_on.append(cold(on))
            cold_off.append(cold(off))
        warm_on_r, warm_off_r = Resolver(on), Resolver(off)
        first = warm_on_r.attribute(samples)
        warm_off_r.attribute(samples)
        sw = first[samples[0].info.uuid][0].software
        warm_on: list[float] = []
        warm_off: list[float] = []
        att: Callable[[Resolver, list[GpuSample]], object] = Resolver.attribute
        for _ in range(args.cycles):
            warm_on.append(cpu_ms(lambda: att(warm_on_r, samples)))
            warm_off.append(cpu_ms(lambda: att(warm_off_r, samples)))
        reads = warm_on_r.stats()["software_reads"]
        # Real processes through the real /proc: this interpreter, and a child with
        # 3,000 mappings.
        real, size = real_read_ms(os.getpid())
        many, many_size = many_mappings_ms(Path(tmp), hostile=False)
        hostile, hostile_size = many_mappings_ms(Path(tmp), hostile=True)
    n = GPUS * PROCS_PER_GPU
    result = {
        "gpus": GPUS, "processes": n, "maps_bytes": len(maps), "maps_lines": MAPPINGS,
        "software_example": {"loaded": list(sw.loaded), "libraries": dict(sw.libraries)}
        if sw else None,
        "cold_cycle_cpu_ms_median_software_on": median(cold_on),
        "cold_cycle_cpu_ms_median_software_off": median(cold_off),
        "per_new_process_cpu_ms": round((median(cold_on) - median(cold_off)) / n, 4),
        "warm_cycle_cpu_ms_median_software_on": median(warm_on),
        "warm_cycle_cpu_ms_p95_software_on": p95(warm_on),
        "warm_cycle_cpu_ms_median_software_off": median(warm_off),
        "warm_cycle_cpu_ms_p95_software_off": p95(warm_off),
        "maps_reads_after_warm_cycles": reads,
        "real_proc_self_maps_bytes": size,
        "real_proc_read_and_parse_cpu_ms_median": real,
        "real_proc_3000_mappings_maps_bytes": many_size,
        "real_proc_3000_mappings_read_and_parse_cpu_ms_median": many,
        "real_proc_3000_libcudart_mappings_maps_bytes": hostile_size,
        "real_proc_3000_libcudart_mappings_read_and_parse_cpu_ms_median": hostile,
    }
    print(f"software fingerprint, {GPUS} GPUs x {PROCS_PER_GPU} processes, maps "
          f"{len(maps) // 1024} KiB / {MAPPINGS} lines each (CPU ms)")
    print("  cold cycle (all new), software on / off: "
          f"{result['cold_cycle_cpu_ms_median_software_on']}"
          f" / {result['cold_cycle_cpu_ms_median_software_off']}"
          f"  -> {result['per_new_process_cpu_ms']} ms per new process")
    print(f"  warm cycle median (p95), on: {result['warm_cycle_cpu_ms_median_software_on']} "
          f"({result['warm_cycle_cpu_ms_p95_software_on']}), off: "
          f"{result['warm_cycle_cpu_ms_median_software_off']} "
          f"({result['warm_cycle_cpu_ms_p95_software_off']}); maps reads after "
          f"{args.cycles + 1} cycles: {reads} (one per process)")
    print(f"  real /proc/<pid>/maps read + parse, this interpreter ({size} bytes): "
          f"{real} ms;\n    a child with {MAPPINGS} mappings ({many_size} bytes): {many} ms; "
          f"a hostile child with {MAPPINGS} libcudart mappings ({hostile_size} bytes): "
          f"{hostile} ms")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
