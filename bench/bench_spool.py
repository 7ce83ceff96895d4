"""Spool benchmark: durable append throughput (group commit vs one fsync per record) and
read throughput, side by side in one run. ~1 KB records.

    .venv/bin/python bench/bench_spool.py [--records N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter

RECORD = 1024


def _payloads(n: int) -> list[bytes]:
    base = os.urandom(RECORD)
    return [i.to_bytes(8, "little") + base[8:] for i in range(n)]


def _config(directory: Path) -> SpoolConfig:
    return SpoolConfig(
        directory=directory, min_free_bytes=0, fsync_window_ms=50, max_bytes=64 * 1024**3
    )


def bench_batch(directory: Path, n: int, batch: int) -> float:
    records = _payloads(batch)
    with SpoolWriter(_config(directory)) as writer:
        start = time.perf_counter()
        for _ in range(n // batch):
            writer.commit(records)
        return (n // batch) * batch / (time.perf_counter() - start)


def bench_threads(directory: Path, n: int, threads: int) -> float:
    per = n // threads
    record = _payloads(1)
    with SpoolWriter(_config(directory)) as writer:

        def work() -> None:
            for _ in range(per):
                writer.commit(record)

        pool = [threading.Thread(target=work) for _ in range(threads)]
        start = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return per * threads / (time.perf_counter() - start)


def bench_naive(directory: Path, n: int) -> float:
    """One write + fsync per record: what a producer without group commit does."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "naive.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    record = _payloads(1)[0]
    start = time.perf_counter()
    for _ in range(n):
        os.write(fd, len(record).to_bytes(4, "little") + record)
        os.fsync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return n / elapsed


def bench_read(directory: Path) -> tuple[float, int]:
    count = 0
    with SpoolReader(directory) as reader:
        start = time.perf_counter()
        offset = 0
        while True:
            result = reader.read(offset, max_records=1024)
            if not result.entries:
                break
            count += len(result.entries)
            offset = result.next_offset
        return count / (time.perf_counter() - start), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--naive-records", type=int, default=2_000)
    parser.add_argument("--thread-records", type=int, default=4_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("SPOOL_BENCH_DIR")) as tmp:
        root = Path(tmp)
        results["commit_batch512_records_per_s"] = bench_batch(root / "b512", args.records, 512)
        results["commit_1thread_records_per_s"] = bench_threads(root / "t1", args.thread_records, 1)
        results["commit_4threads_records_per_s"] = bench_threads(
            root / "t4", args.thread_records, 4
        )
        results["naive_write_fsync_records_per_s"] = bench_naive(root / "naive", args.naive_records)
        rate, count = bench_read(root / "b512")
        results["read_records_per_s"] = rate
        results["read_records"] = count
    naive = results["naive_write_fsync_records_per_s"]
    results["ratio_batch512_vs_naive"] = results["commit_batch512_records_per_s"] / naive
    results["ratio_4threads_vs_naive"] = results["commit_4threads_records_per_s"] / naive
    for key, value in results.items():
        print(f"{key:40s} {value:14,.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
