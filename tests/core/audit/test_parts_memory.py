"""The audit builder's long-lived pre-serialised parts are right-sized."""

from __future__ import annotations

import subprocess
import sys

# Keeps 5,000 shared parts, as the producer's cache keeps one per live process, and
# prints the RSS they cost per part (in a fresh interpreter, so no freed memory is reused).
PROGRAM = """
import re
from gpu_audit.audit.parts import PartsCache
from gpu_audit.model.attribution import Attribution
from gpu_audit.model.samples import ProcessSample

def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))

cache = PartsCache(fragments=True)
owners = [Attribution(user=f"user{i}", project="p", job=str(i), sources={"user": "owner"})
          for i in range(5000)]
procs = [ProcessSample(pid=1000 + i, name=f"python3 /srv/job{i}/train.py", uid=i)
         for i in range(5000)]
before = rss()
for a, p in zip(owners, procs):
    cache.owner(a)
    cache.process("GPU-0", p)
    [str(j) for j in range(3)]  # other allocations between, as in a real cycle
print((rss() - before) * 1024 / 5000)
"""


def test_cached_parts_cost_their_size_not_orjsons_buffer() -> None:
    """The parts kept per owner and per process (their canonical bytes, ~50-150 bytes
    each, and the cache entries) cost a few hundred bytes of RSS, not the ~4 KB output
    buffer orjson allocated to write each (1,024 of them made ~4 MB at 8 x 64)."""
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                         check=True, timeout=120)
    per_part = float(out.stdout)
    assert per_part < 2048, f"{per_part:.0f} bytes of RSS per owner and process cached"


CYCLE_PROGRAM = """
import tracemalloc
from gpu_audit.audit.builder import PartsCache, build_cycle
from tests.core.audit.test_node_cycle_bytes import node_cycles

snaps = node_cycles()
parts = PartsCache(fragments=True)
build_cycle(snaps[1], snaps[0], stream="s", exporter_version="t", parts=parts)  # warm
tracemalloc.start()
records = build_cycle(snaps[2], snaps[1], stream="s", exporter_version="t", parts=parts)
size, _peak = tracemalloc.get_traced_memory()
print(size / len(records))
"""


def test_a_cycles_records_awaiting_their_seal_cost_their_size() -> None:
    """Every record of a cycle is built before the commit seals them, so what each keeps
    is peak heap: about 1 KB a record, not orjson's ~4 KB output buffer per values
    object (~2 MB more at 8 x 64; the exporter's RSS rose by as much before)."""
    out = subprocess.run([sys.executable, "-c", CYCLE_PROGRAM], capture_output=True,
                         text=True, check=True, timeout=120)
    per_record = float(out.stdout)
    assert per_record < 2048, f"{per_record:.0f} bytes per record awaiting its seal"
