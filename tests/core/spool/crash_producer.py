"""Subprocess for the kill -9 test: commits records forever, printing each acknowledgement.

Line printed after commit() returns: "<first offset> <run> <first seq> <count>".
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from gpu_audit.spool import SpoolConfig, SpoolWriter


def payload(run: int, seq: int) -> bytes:
    return f"run={run} seq={seq} ".encode() * (1 + seq % 7)


def main() -> None:
    directory, run = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(run)
    cfg = SpoolConfig(directory=directory, segment_bytes=16384, min_free_bytes=0, fsync_window_ms=5)
    writer = SpoolWriter(cfg)
    seq = 0
    while True:
        count = rng.randint(1, 40)
        first = writer.commit([payload(run, seq + i) for i in range(count)])
        sys.stdout.write(f"{first} {run} {seq} {count}\n")
        sys.stdout.flush()
        seq += count


if __name__ == "__main__":
    main()
