"""Attribution cost per sampling cycle: cached Resolver vs the naive approach.

Builds a fake /proc on disk (exporter.sim.fakeproc.write_fake_proc) for 8 GPUs x
64 processes with realistic environ (~3 KiB each) and Kubernetes cgroup lines, plus a
job-mapping directory with one file per GPU, then measures CPU milliseconds per
attribution cycle for
  (a) the Resolver as shipped: one /proc/<pid>/stat read per process, the rest cached
      per (pid, start time), answers memoised;
  (b) the naive approach: the same Resolver with its cache emptied before every cycle,
      so every /proc file is re-read and re-parsed each cycle (same parsing code).
Both run interleaved in one process so machine noise hits them alike.

    .venv/bin/python bench/bench_attribution.py [--cycles 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.sim.fakeproc import write_fake_proc
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.samples import GpuInfo, GpuSample, ProcessIdentity, ProcessSample

GPUS = 8
PROCS_PER_GPU = 64


class NaiveResolver(Resolver):
    """Re-reads every /proc file of every process every cycle."""

    def attribute(self, gpus: Sequence[GpuSample]) -> dict[str, tuple[AttributedProcess, ...]]:
        self._cache.clear()
        return super().attribute(gpus)


def build(root: Path) -> tuple[list[GpuSample], AttributionConfig]:
    samples = []
    filler = {f"VAR_{i}": "x" * 40 for i in range(60)}  # ~3 KiB of unrelated environment
    for g in range(GPUS):
        uuid = f"GPU-{g:08x}-0000-0000-0000-000000000000"
        procs = []
        for i in range(PROCS_PER_GPU):
            pid = 10_000 + g * PROCS_PER_GPU + i
            pod = f"{g:08x}-{i:04x}-0000-0000-000000000000".replace("-", "_")
            cid = f"{pid:064x}"
            ident = ProcessIdentity(
                pid=pid,
                uid=1000 + i % 16,
                start_time_ticks=50_000 + pid,
                environ={**filler, "USER": f"user{i % 16}", "PROJECT_NAME": f"proj{g}",
                         "JOB_ID": f"job-{g}-{i}"},
                cgroup="0::/kubepods.slice/kubepods-burstable.slice/"
                f"kubepods-burstable-pod{pod}.slice/cri-containerd-{cid}.scope",
            )
            procs.append(ProcessSample(pid=pid, name="python3", uid=ident.uid,
                                       used_memory_bytes=1 << 30, identity=ident))
        samples.append(GpuSample(info=GpuInfo(uuid=uuid, index=g), processes=tuple(procs)))
    write_fake_proc(root / "proc", [p for s in samples for p in s.processes])
    jobs = root / "jobs"
    jobs.mkdir()
    for g, s in enumerate(samples):
        (jobs / f"job{g}.json").write_text(json.dumps(
            {"version": 1, "job_id": f"alloc-{g}", "user": "sched", "gpus": [s.uuid]}))
    passwd = root / "passwd"
    passwd.write_text("".join(f"user{i}:x:{1000 + i}:{1000 + i}::/h:/bin/sh\n" for i in range(16)))
    cfg = AttributionConfig(procfs_root=root / "proc", jobmap_dir=jobs, passwd_file=passwd)
    return samples, cfg


def cpu_ms(resolver: Resolver, samples: list[GpuSample]) -> float:
    start = time.process_time()
    resolver.attribute(samples)
    return (time.process_time() - start) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-attr-") as tmp:
        samples, cfg = build(Path(tmp))
        cached, naive = Resolver(cfg), NaiveResolver(cfg)
        cached.attribute(samples)  # the first cycle fills the cache; steady state is measured
        naive.attribute(samples)
        cached_ms: list[float] = []
        naive_ms: list[float] = []
        for _ in range(args.cycles):
            cached_ms.append(cpu_ms(cached, samples))
            naive_ms.append(cpu_ms(naive, samples))
        stats = dict(cached.stats())
    result = {
        "gpus": GPUS,
        "processes": GPUS * PROCS_PER_GPU,
        "cycles": args.cycles,
        "cached_cpu_ms_median": round(statistics.median(cached_ms), 3),
        "cached_cpu_ms_p95": round(sorted(cached_ms)[int(0.95 * len(cached_ms))], 3),
        "naive_cpu_ms_median": round(statistics.median(naive_ms), 3),
        "naive_cpu_ms_p95": round(sorted(naive_ms)[int(0.95 * len(naive_ms))], 3),
        "cache_hits": stats["cache_hits"],
        "cache_misses": stats["cache_misses"],
    }
    result["naive_over_cached"] = round(
        result["naive_cpu_ms_median"] / max(result["cached_cpu_ms_median"], 1e-9), 2
    )
    print(f"attribution, {GPUS} GPUs x {PROCS_PER_GPU} processes, {args.cycles} cycles "
          f"(CPU ms per cycle, median / p95)")
    print(f"  cached resolver: {result['cached_cpu_ms_median']:8.3f} / "
          f"{result['cached_cpu_ms_p95']:.3f}")
    print(f"  naive re-read:   {result['naive_cpu_ms_median']:8.3f} / "
          f"{result['naive_cpu_ms_p95']:.3f}")
    print(f"  naive / cached:  {result['naive_over_cached']}x  (target: cached <= 10 ms)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
