"""Each stage of a gpu-audit cycle against a floor loop doing the same job.

The floor loop is the least a Python exporter can do for the same output, on the same
fake libnvidia-ml.so.1 (bench/fake_libnvml, loaded through nvidia-ml-py's ctypes as in
bench_peer.py), with real processes behind the PIDs:

- sampling + attribution: exactly the NVML calls our backend made in a recorded fast
  cycle (same functions, same arguments, replayed through nvidia-ml-py), plus one
  stat() per PID against an identity cache (user and command line read once per PID
  lifetime), which is what reuse detection needs;
- render: the same exposition lines as ours, written from cached `name{labels} `
  prefixes with the value alone formatted each cycle, joined and encoded;
- audit records: the same records as ours (our builder's output for the cycle, as
  templates), each dict -> sorted orjson -> SHA-256 chained onto the previous hash,
  one write + one fsync per cycle.

Ours: the real NVML backend, attribution resolver (real /proc), renderer and audit
producer (per-cycle trail, audit.interval_seconds = the sampling interval, so every
cycle writes records as the floor's does; the 60 s default is measured too), group-
commit spool. CPU per stage from time.thread_time (no other thread runs), p50 over
--cycles after 5 warm-up cycles; ours and the floor alternate cycle by cycle, so a change
of load on the (shared) machine weighs on both alike. A last phase times sampling +
attribution alone on both sides (no render or audit between cycles), which shows what
the other stages' garbage and cache traffic add to it.

    .venv/bin/python bench/bench_floor.py [--shapes 1x8,8x8,8x64] [--cycles 60]
        [--gc-threshold N|off] [--json bench/results/floor.json]

--gc-threshold sets the collector's young-generation threshold (700 by default; "off"
disables it) in the measured process, for both sides: what tuning the collector would
buy the exporter, which keeps Python's default.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pwd
import statistics
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from peerlib import Sleepers, build_fake_nvml, fake_env  # noqa: E402

STAGES = ("sample_attr", "render", "audit")


class _Recorder:
    """Records the binding's top-level calls (the backend's, not pynvml's own inner
    ones) while installed on the pynvml module."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.depth = 0
        self.originals = {n: getattr(module, n) for n in dir(module)
                          if n.startswith("nvml") and callable(getattr(module, n))}
        for n, fn in self.originals.items():
            setattr(module, n, self._wrap(fn))

    def _wrap(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.depth == 0:
                self.calls.append((fn, args, kwargs))
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
        return call

    def restore(self) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
        for n, fn in self.originals.items():
            setattr(self.module, n, fn)
        return self.calls


Cycles = Generator[tuple[float, float, float], None, None]  # CPU ms of each stage


def ours(gpus: int, per_gpu: int, tmp: Path, audit_interval: float,
         extra: dict[str, Any], *, sampling_only: bool = False) -> Cycles:
    """Our cycles, one per next(): CPU ms of (sampling + attribution, render, audit).
    Cycle 4 records what the floor needs into `extra`."""
    import pynvml

    from exporter.attribution.config import AttributionConfig
    from exporter.attribution.resolver import Resolver
    from exporter.backends.nvml import NvmlBackend
    from exporter.config import ExporterConfig
    from exporter.exposition.render import Renderer, RenderOptions
    from gpu_audit.audit.builder import build_records
    from gpu_audit.audit.config import AuditConfig
    from gpu_audit.audit.producer import AuditProducer
    from gpu_audit.model.snapshot import Snapshot
    from gpu_audit.spool import SpoolConfig, SpoolWriter

    backend = NvmlBackend(ExporterConfig(backend="nvml"))
    info = backend.open()
    resolver = Resolver(AttributionConfig())
    renderer = Renderer(RenderOptions())
    spool = SpoolWriter(SpoolConfig(directory=tmp / f"spool-{gpus}x{per_gpu}-{audit_interval:g}",
                                    min_free_bytes=0))
    producer = AuditProducer(AuditConfig(interval_seconds=audit_interval), spool,
                             host="bench", exporter_version="bench",
                             simulated=False)
    producer.start()
    gc.freeze()
    now = time.time()
    prev: Snapshot | None = None
    written0 = 0
    cycle = -1
    try:
        while True:
            cycle += 1
            now += 5.0
            recorder = _Recorder(pynvml) if cycle == 4 else None  # the calls the floor replays
            t0 = time.thread_time()
            samples = tuple(backend.sample(now, slow=cycle % 12 == 0))
            procs = resolver.attribute(samples)
            t1 = time.thread_time()
            if recorder is not None:
                extra["nvml_calls"] = recorder.restore()
            if sampling_only:
                yield (t1 - t0) * 1000, 0.0, 0.0
                continue
            snap = Snapshot(timestamp=now, host="bench", backend=info, gpus=samples,
                            processes=procs, interval_seconds=5.0,
                            elapsed_seconds=5.0 if prev else 0.0, cycle=cycle)
            rendered = renderer.render(snap)
            t2 = time.thread_time()
            producer.on_snapshot(snap)
            t3 = time.thread_time()
            if cycle == 4:
                extra["exposition"] = bytes(rendered.body)
                extra["records"] = build_records(snap, prev, stream="floor",
                                                 exporter_version="bench")
                extra["pids"] = sorted({p.process.pid for ps in procs.values() for p in ps})
                written0 = producer.stats().get("records_written", 0)
            prev = snap
            extra["records_written"] = producer.stats().get("records_written", 0) - written0
            yield (t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000
    finally:
        producer.stop()
        spool.close()
        resolver.close()
        backend.close()


def floor(tmp: Path, *, calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]],
          exposition: bytes, records: list[dict[str, Any]],
          pids: list[int], sampling_only: bool = False) -> Cycles:
    """The floor loop's cycles, one per next(), timed as ours."""
    import orjson

    # render: the exposition's sample lines as (cached prefix, value)
    lines = exposition.decode().splitlines()
    headers = [ln + "\n" for ln in lines if ln.startswith("#")]
    samples = []
    for ln in lines:
        if ln and not ln.startswith("#"):
            prefix, _, value = ln.rpartition(" ")
            samples.append((prefix + " ", float(value)))
    templates = [orjson.loads(orjson.dumps(r)) for r in records]
    identity: dict[int, tuple[float, str, str]] = {}
    fd = os.open(tmp / "floor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    prev_hash = "0" * 64
    seq = 0
    now = time.time()
    cycle = -1
    try:
        while True:
            cycle += 1
            now += 5.0
            t0 = time.thread_time()
            for fn, args, kwargs in calls:
                fn(*args, **kwargs)
            for pid in pids:
                st = os.stat(f"/proc/{pid}")
                hit = identity.get(pid)
                if hit is None or hit[0] != st.st_ctime:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        name = f.read().split(b"\0", 1)[0].decode(errors="replace")
                    identity[pid] = (st.st_ctime, pwd.getpwuid(st.st_uid).pw_name, name)
            t1 = time.thread_time()
            if sampling_only:
                yield (t1 - t0) * 1000, 0.0, 0.0
                continue
            bump = cycle % 7
            out = [f"{p}{v + bump if v > 1 else v}\n" for p, v in samples]
            body = ("".join(headers) + "".join(out)).encode()
            t2 = time.thread_time()
            chunks = []
            for tpl in templates:
                rec = dict(tpl)
                rec["time"] = now
                rec["seq"] = seq
                rec["prev_hash"] = prev_hash
                raw = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS)
                prev_hash = hashlib.sha256(prev_hash.encode() + raw).hexdigest()
                chunks.append(raw[:-1] + b',"hash":"' + prev_hash.encode() + b'"}\n')
                seq += 1
            os.write(fd, b"".join(chunks))
            os.fsync(fd)
            t3 = time.thread_time()
            del body
            yield (t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000
    finally:
        os.close(fd)


def run_shape(gpus: int, per_gpu: int, cycles: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    extra: dict[str, Any] = {}
    o = ours(gpus, per_gpu, tmp, 5.0, extra)
    for _ in range(5):  # warm-up; cycle 4 records the calls, lines and records
        next(o)
    written0 = extra["records_written"]
    f = floor(tmp, calls=extra["nvml_calls"], exposition=extra["exposition"],
              records=extra["records"], pids=extra["pids"])
    for _ in range(5):
        next(f)
    # Alternating, one of ours then one of the floor's: load on this shared machine
    # changes over a run, and then weighs on both sides alike.
    ours_t: dict[str, list[float]] = {k: [] for k in STAGES}
    floor_t: dict[str, list[float]] = {k: [] for k in STAGES}
    for _ in range(cycles):
        for side, gen in ((ours_t, o), (floor_t, f)):
            for k, ms in zip(STAGES, next(gen), strict=True):
                side[k].append(ms)
    written = extra["records_written"] - written0
    o.close()
    f.close()
    default_extra: dict[str, Any] = {}
    d = ours(gpus, per_gpu, tmp, 60.0, default_extra)
    for _ in range(5):
        next(d)
    d_written0 = default_extra["records_written"]
    default_t: dict[str, list[float]] = {k: [] for k in STAGES}
    for _ in range(cycles):
        for k, ms in zip(STAGES, next(d), strict=True):
            default_t[k].append(ms)
    d_written = default_extra["records_written"] - d_written0
    d.close()
    # The first stage alone, both sides alternating as above, with no render or audit
    # between cycles: what the other stages' garbage and cache traffic add to it.
    o = ours(gpus, per_gpu, tmp, 5.0, {}, sampling_only=True)
    f = floor(tmp, calls=extra["nvml_calls"], exposition=extra["exposition"],
              records=extra["records"], pids=extra["pids"], sampling_only=True)
    alone: dict[str, list[float]] = {"ours": [], "floor": []}
    for _ in range(5):
        next(o)
        next(f)
    for _ in range(cycles):
        alone["ours"].append(next(o)[0])
        alone["floor"].append(next(f)[0])
    o.close()
    f.close()
    n_records = len(extra["records"])
    out: dict[str, Any] = {"gpus": gpus, "procs_per_gpu": per_gpu,
                           "nvml_calls_per_cycle": len(extra["nvml_calls"]),
                           "exposition_lines": extra["exposition"].count(b"\n"),
                           "records_per_cycle": n_records}
    for k in STAGES:
        out[f"ours_{k}_ms"] = statistics.median(ours_t[k])
        out[f"floor_{k}_ms"] = statistics.median(floor_t[k])
        out[f"ratio_{k}"] = out[f"ours_{k}_ms"] / out[f"floor_{k}_ms"]
    # records per CPU-second over the whole run (all cycles' audit CPU / records)
    out["ours_records_per_cpu_s"] = written / (sum(ours_t["audit"]) / 1000)
    out["floor_records_per_cpu_s"] = n_records * cycles / (sum(floor_t["audit"]) / 1000)
    out["ours_default60_audit_ms"] = statistics.median(default_t["audit"])
    out["ours_default60_audit_ms_mean"] = statistics.fmean(default_t["audit"])
    out["ours_default60_records_per_cycle"] = d_written / cycles
    out["ours_sample_attr_alone_ms"] = statistics.median(alone["ours"])
    out["floor_sample_attr_alone_ms"] = statistics.median(alone["floor"])
    out["ratio_sample_attr_alone"] = (out["ours_sample_attr_alone_ms"]
                                      / out["floor_sample_attr_alone_ms"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x8,8x8,8x64")
    ap.add_argument("--cycles", type=int, default=60)
    ap.add_argument("--gc-threshold", default="",
                    help="young-generation threshold in the measured process, or off")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if "FAKE_NVML_GPUS" not in os.environ:  # re-run under the fake NVML, one shape each
        lib = build_fake_nvml()
        tmp = Path(tempfile.mkdtemp(prefix="bench-floor-"))
        sleepers = Sleepers(max(g * p for g, p in shapes), tmp / "pids")
        results = []
        try:
            for g, p in shapes:
                env = fake_env(lib, g, p, sleepers.pid_file)
                import subprocess

                out = subprocess.run([sys.executable, __file__, "--shapes", f"{g}x{p}",
                                      "--cycles", str(args.cycles),
                                      "--gc-threshold", args.gc_threshold], env=env, check=True,
                                     capture_output=True, text=True)
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        finally:
            sleepers.stop()
        report(results)
        if args.json:
            args.json.write_text(json.dumps({"cycles": args.cycles, "results": results},
                                            indent=2) + "\n")
        return
    if args.gc_threshold == "off":
        gc.disable()
    elif args.gc_threshold:
        gc.set_threshold(int(args.gc_threshold), *gc.get_threshold()[1:])
    (g, p), = shapes
    print(json.dumps(run_shape(g, p, args.cycles)))


def report(results: list[dict[str, Any]]) -> None:
    print("CPU ms per cycle, p50; ratio = ours / floor")
    print("| shape | NVML calls | lines | records | sampling+attribution ours / floor (x) "
          "| render ours / floor (x) | audit ours / floor (x) | records per CPU-s ours / floor "
          "| audit at the 60 s default, ms per cycle (mean) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cells = [f"{r[f'ours_{k}_ms']:.2f} / {r[f'floor_{k}_ms']:.2f} ({r[f'ratio_{k}']:.2f}x)"
                 for k in STAGES]
        print(f"| {r['gpus']}x{r['procs_per_gpu']} | {r['nvml_calls_per_cycle']} "
              f"| {r['exposition_lines']} | {r['records_per_cycle']} | " + " | ".join(cells)
              + f" | {r['ours_records_per_cpu_s']:,.0f} / {r['floor_records_per_cpu_s']:,.0f}"
              f" | {r['ours_default60_audit_ms_mean']:.2f} |")
    print("\nsampling + attribution alone (no render or audit between cycles), ours / floor")
    for r in results:
        print(f"{r['gpus']}x{r['procs_per_gpu']}: {r['ours_sample_attr_alone_ms']:.2f} / "
              f"{r['floor_sample_attr_alone_ms']:.2f} ({r['ratio_sample_attr_alone']:.2f}x)")


if __name__ == "__main__":
    main()
