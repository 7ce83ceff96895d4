"""Render bench_scrape's hand-built snapshot N times, for an instruction count.

Wall and CPU time on a shared 2-core machine move by 20 % or more between runs; the
number of instructions a render executes does not. Run under callgrind twice, with N
and with 1, and divide the difference by N - 1:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/render_loop.py 8 64 cached 11

`uncached`: `render_snapshot` with no kept cache (bench_scrape's "render once per cycle"
figure); `cached`: the exporter's path, one `Renderer` kept across renders. Another tree
(a `git archive` of main) is measured with ROOT=<its directory>.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("ROOT", Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_scrape import build_snapshot  # noqa: E402

from exporter.exposition.render import Renderer, RenderOptions, render_snapshot  # noqa: E402


def main() -> None:
    gpus, procs, mode, n = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    snap = build_snapshot(gpus, procs)
    opts = RenderOptions()
    renderer = Renderer(opts)
    for _ in range(n):
        if mode == "uncached":
            render_snapshot(snap, opts)
        else:
            renderer.render(snap)


if __name__ == "__main__":
    main()
