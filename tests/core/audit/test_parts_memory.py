"""The audit builder's long-lived pre-serialised parts are right-sized (issue 27)."""

from __future__ import annotations

import subprocess
import sys

# Keeps 5,000 shared parts, as the producer's cache keeps one per live process, and
# prints the RSS they cost per part (in a fresh interpreter, so no freed memory is reused).
PROGRAM = """
import re
from gpu_audit.audit.parts import PartsCache

def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))

cache = PartsCache(fragments=True)
before = rss()
keep = []
for i in range(5000):
    keep.append(cache.shared({"user": f"user{i}", "project": "p", "job": str(i)}))
    [str(j) for j in range(3)]  # other allocations between, as in a real cycle
print((rss() - before) * 1024 / 5000)
"""


def test_cached_parts_cost_their_size_not_orjsons_buffer() -> None:
    """A cached 50-byte part costs a few hundred bytes of RSS, not the ~4 KB output
    buffer orjson allocated to write it (1,024 of them made ~4 MB at 8 x 64)."""
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                         check=True, timeout=120)
    per_part = float(out.stdout)
    assert per_part < 1024, f"{per_part:.0f} bytes of RSS per cached part"
