"""Checkpoint commit cost: gpu_audit_ckpt's atomic commit vs a naive np.save, side by side.

For each state size (float32 NumPy arrays in four tensors, like a model + optimizer state):
- naive: np.save of each array straight to its final path (no fsync, not atomic: a kill
  mid-write leaves a torn file where the checkpoint should be);
- naive+fsync: the same, then fsync of the file (durable, still not atomic);
- gpu_audit_ckpt: Checkpointer.save (temp dir, SHA-256 while writing, fsync of every file
  and directory, rename, manifest, retention), including the RNG file;
and the resume side: np.load of the naive files vs Checkpointer.restore (which verifies
every file's SHA-256 first). Methods alternate within each repetition; `sync` runs
between timings so one method's dirty pages are not flushed on another's clock.

    .venv/bin/python bench/bench_ckpt.py [--sizes-mb 100 1000] [--reps 3] [--dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpu_audit_ckpt import Checkpointer


def make_state(mb: int) -> dict[str, Any]:
    n = mb * 1024 * 1024 // 4 // 4
    rng = np.random.default_rng(0)
    return {
        "model": {"w0": rng.random(n, dtype=np.float32), "w1": rng.random(n, dtype=np.float32)},
        "optim": {"m": rng.random(n, dtype=np.float32), "v": rng.random(n, dtype=np.float32)},
    }


def _flat(state: dict[str, Any]) -> dict[str, Any]:
    return {f"{k}.{j}": a for k, sub in state.items() for j, a in sub.items()}


def naive(directory: Path, state: dict[str, Any], fsync: bool) -> float:
    """np.save of each array straight to its final path (what a training script does)."""
    t = time.perf_counter()
    directory.mkdir(exist_ok=True)
    for key, arr in _flat(state).items():
        with open(directory / f"{key}.npy", "wb") as fh:
            np.save(fh, arr)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
    return time.perf_counter() - t


def ours(ckpt: Checkpointer, step: int, state: dict[str, Any]) -> float:
    t = time.perf_counter()
    ckpt.save(step, state)
    return time.perf_counter() - t


def sha256_only(state: dict[str, Any]) -> float:
    """SHA-256 of the state's memory alone: the part of the commit that buys verification."""
    t = time.perf_counter()
    for arr in _flat(state).values():
        hashlib.sha256(memoryview(arr.reshape(-1).view(np.uint8))).hexdigest()
    return time.perf_counter() - t


def load_naive(directory: Path) -> float:
    t = time.perf_counter()
    for f in sorted(directory.iterdir()):
        np.load(f)
    return time.perf_counter() - t


def load_ours(ckpt: Checkpointer) -> float:
    t = time.perf_counter()
    assert ckpt.restore() is not None
    return time.perf_counter() - t


class Timings:
    """Wall and CPU seconds (all threads: the hashing thread counts) per measured kind."""

    KINDS = ("naive", "naive_fsync", "ours", "sha256", "load_naive", "load_ours")

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {k: [] for k in self.KINDS}
        self.cpu: dict[str, list[float]] = {k: [] for k in self.KINDS}

    def time(self, kind: str, fn: Callable[[], float]) -> None:
        c0 = time.process_time()
        self.wall[kind].append(fn())
        self.cpu[kind].append(time.process_time() - c0)


def run_size(base: Path, mb: int, reps: int) -> dict[str, Any]:
    state = make_state(mb)
    ckpt = Checkpointer(base / f"ck-{mb}", keep_last=1)
    path = base / f"naive-{mb}"
    t = Timings()
    for rep in range(reps):
        os.sync()
        t.time("naive", lambda: naive(path, state, fsync=False))
        os.sync()
        t.time("naive_fsync", lambda: naive(path, state, fsync=True))
        os.sync()
        t.time("ours", lambda: ours(ckpt, rep + 1, state))  # noqa: B023 - called at once
        t.time("sha256", lambda: sha256_only(state))
        os.sync()
        t.time("load_naive", lambda: load_naive(path))
        t.time("load_ours", lambda: load_ours(ckpt))
        shutil.rmtree(path)
    shutil.rmtree(base / f"ck-{mb}")
    med = {k: statistics.median(v) for k, v in t.wall.items()}
    cpu = {k: statistics.median(v) for k, v in t.cpu.items()}
    print(
        f"{mb:>5} MB  commit: naive {med['naive']:.3f} s | naive+fsync "
        f"{med['naive_fsync']:.3f} s | gpu_audit_ckpt {med['ours']:.3f} s "
        f"({med['ours'] / med['naive']:.2f}x naive, "
        f"{med['ours'] / med['naive_fsync']:.2f}x naive+fsync, {mb / med['ours']:.0f} MB/s; "
        f"sha256 alone {med['sha256']:.3f} s)   resume: np.load "
        f"{med['load_naive']:.3f} s | restore+verify {med['load_ours']:.3f} s\n"
        f"{'':>5}    CPU:    naive {cpu['naive']:.3f} s | naive+fsync "
        f"{cpu['naive_fsync']:.3f} s | gpu_audit_ckpt {cpu['ours']:.3f} s | "
        f"sha256 alone {cpu['sha256']:.3f} s   resume: np.load "
        f"{cpu['load_naive']:.3f} s | restore+verify {cpu['load_ours']:.3f} s",
        flush=True,
    )
    return {"size_mb": mb, "reps": reps, "bytes": mb * 1024 * 1024,
            "median_s": med, "median_cpu_s": cpu, "all_s": t.wall, "all_cpu_s": t.cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        need = max(args.sizes_mb) * 1024 * 1024 * 3
        free = shutil.disk_usage(base).free
        if free < need:
            raise SystemExit(f"{base}: {free >> 20} MiB free, need {need >> 20} MiB")
        results = [run_size(base, mb, args.reps) for mb in args.sizes_mb]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        meta = {"python": platform.python_version(), "numpy": np.__version__,
                "machine": platform.machine(), "cpus": os.cpu_count()}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
