"""GPU inventory cost per sampling cycle, beside the render of the same cycle.

In-process, simulator backend with attribution (the shapes of bench_exporter.py: 1, 8 and
16 GPUs x 8 processes, 8 GPUs x 64): CPU ms of `Inventory.annotate` (recording state,
XID totals and owners, adding GPUs no longer enumerated, saving the file when something
changed) and of `Renderer.render` in the same cycle, p50 / p99 over N cycles. Every
cycle also changes the owners of one GPU (a job ending, another starting), so the
rate-limited owner writes are in the numbers; a state change (a GPU lost, an XID) writes
at once, which the last column counts.

    .venv/bin/python bench/bench_inventory.py [--cycles 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_exporter import SHAPES, pct, scenario_file  # noqa: E402  (the same shapes)

from exporter.attribution.config import AttributionConfig  # noqa: E402
from exporter.attribution.resolver import Resolver  # noqa: E402
from exporter.exposition.render import Renderer, RenderOptions  # noqa: E402
from exporter.inventory import open_inventory  # noqa: E402
from exporter.sim.backend import SimBackend  # noqa: E402
from exporter.sim.fakeproc import SimProcfs  # noqa: E402
from exporter.sim.scenario import load_scenario  # noqa: E402
from gpu_audit.model.attribution import AttributedProcess, Attribution  # noqa: E402
from gpu_audit.model.snapshot import Snapshot  # noqa: E402


def measure(gpus: int, per_gpu: int, cycles: int, tmp: Path) -> dict[str, Any]:
    clock = [1_790_000_000.0]
    backend = SimBackend(load_scenario(str(scenario_file(tmp, gpus, per_gpu))),
                         clock=lambda: clock[0])
    info = backend.open()
    simproc = SimProcfs()
    resolver = Resolver(AttributionConfig(procfs_root=simproc.root, passwd_file=simproc.passwd))
    renderer = Renderer(RenderOptions())
    inventory = open_inventory(tmp / f"inv-{gpus}x{per_gpu}", "sim:bench")
    store = inventory._store
    assert store is not None
    saves = [0]
    real_save = store.save

    def counting_save(doc: Any) -> bool:
        saves[0] += 1
        return real_save(doc)

    store.save = counting_save  # type: ignore[method-assign]
    gc.freeze()
    annotate_ms: list[float] = []
    render_ms: list[float] = []
    for cycle in range(cycles + 5):
        clock[0] += 5.0
        samples = tuple(backend.sample(clock[0], slow=cycle % 12 == 0))
        simproc.update(samples)
        procs = dict(resolver.attribute(samples))
        # a job change on GPU 0 every cycle: the owners differ from the last cycle's
        first = samples[0].uuid
        procs[first] = tuple(
            AttributedProcess(ap.gpu_uuid, ap.process, Attribution(user=f"u{cycle % 7}"))
            for ap in procs[first])
        snap = Snapshot(timestamp=clock[0], host="bench", backend=info, gpus=samples,
                        processes=procs, interval_seconds=5.0, cycle=cycle)
        t0 = time.thread_time()
        snap = inventory.annotate(snap)
        t1 = time.thread_time()
        renderer.render(dataclasses.replace(snap))
        t2 = time.thread_time()
        if cycle >= 5:
            annotate_ms.append((t1 - t0) * 1000)
            render_ms.append((t2 - t1) * 1000)
    inventory.close()
    resolver.close()
    simproc.remove()
    return {"gpus": gpus, "procs_per_gpu": per_gpu,
            "annotate_ms_p50": statistics.median(annotate_ms),
            "annotate_ms_p99": pct(annotate_ms, 0.99),
            "render_ms_p50": statistics.median(render_ms),
            "render_ms_p99": pct(render_ms, 0.99),
            "saves": saves[0], "cycles": cycles + 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as d:
        print("per cycle CPU ms (p50 / p99); saves: inventory files written over the run")
        print(f"{'shape':>7} {'annotate':>15} {'render':>15} {'ratio p50':>10} {'saves':>12}")
        for g, p in SHAPES:
            r = measure(g, p, args.cycles, Path(d))
            results.append(r)
            ratio = r["annotate_ms_p50"] / r["render_ms_p50"]
            print(f"{g:>3}x{p:<3} {r['annotate_ms_p50']:7.3f}/{r['annotate_ms_p99']:7.3f}"
                  f" {r['render_ms_p50']:7.2f}/{r['render_ms_p99']:7.2f} {ratio:10.3f}"
                  f" {r['saves']:>5}/{r['cycles']:<6}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
