"""Compare the exporter's /metrics with nvidia-smi taken at the same moment.

Used by bench/gpu_check on a real GPU machine:
    python bench/gpu_check_compare.py METRICS.txt QUERY_GPU.csv COMPUTE_APPS.csv
prints one row per value (ours vs nvidia-smi, tolerance, PASS/FAIL) and exits 1 when
any row fails. The parsing and the tolerances live here so they are unit-tested
(tests/exporter/backends/test_gpu_check_compare.py) before they ever meet a GPU.

This script must never talk to a GPU itself: it only reads the captured texts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

QUERY_GPU_FIELDS: tuple[str, ...] = (
    "uuid", "utilization.gpu", "utilization.memory", "memory.total", "memory.used",
    "memory.free", "temperature.gpu", "power.draw", "power.limit", "clocks.sm", "clocks.mem",
    "pstate", "fan.speed",
)
QUERY_GPU_ARG = ",".join(QUERY_GPU_FIELDS)
MIB = 1024 * 1024
EXPECTED_IDENTITY = {"user": "gpucheck", "project": "gpu-audit-check", "job": "gpucheck-1"}

Series = dict[str, list[tuple[dict[str, str], float]]]


def _na(value: str) -> str | None:
    v = value.strip()
    if not v or v.startswith("[") or v in ("N/A", "Not Supported"):
        return None
    return v


def parse_query_gpu(text: str) -> list[dict[str, str | None]]:
    """Rows of `nvidia-smi --query-gpu=QUERY_GPU_ARG --format=csv,noheader,nounits`."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_GPU_FIELDS):
            raise ValueError(f"expected {len(QUERY_GPU_FIELDS)} columns, got {line!r}")
        rows.append({f: _na(c) for f, c in zip(QUERY_GPU_FIELDS, cells, strict=True)})
    return rows


def parse_compute_apps(text: str) -> list[tuple[str, int, str, float | None]]:
    """Rows of `--query-compute-apps=gpu_uuid,pid,process_name,used_memory` (MiB)."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue
        # A process name may contain commas: split the fixed columns off both ends.
        uuid, pid, rest = (c.strip() for c in line.split(",", 2))
        name, mem = (c.strip() for c in rest.rsplit(",", 1))
        used = _na(mem)
        out.append((uuid, int(pid), name, float(used) if used is not None else None))
    return out


def parse_exposition(text: str) -> Series:
    """Metric samples by sample name: [(labels, value)]."""
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return series


def _ours(series: Series, name: str, uuid: str, **labels: str) -> float | None:
    for lbls, value in series.get(name, []):
        if lbls.get("uuid") == uuid and all(lbls.get(k) == v for k, v in labels.items()):
            return value
    return None


@dataclass(frozen=True, slots=True)
class Row:
    check: str
    uuid: str
    ours: float | None
    theirs: float | None
    tolerance: str
    passed: bool

    def render(self) -> str:
        def fmt(v: float | None) -> str:
            return "absent" if v is None else f"{v:.2f}"

        verdict = "PASS" if self.passed else "FAIL"
        return (f"{self.check:<26} {self.uuid[:20]:<20} {fmt(self.ours):>14} "
                f"{fmt(self.theirs):>14}  {self.tolerance:<18} {verdict}")


HEADER = (f"{'check':<26} {'uuid':<20} {'ours':>14} {'nvidia-smi':>14}  "
          f"{'tolerance':<18} result")


def _within(abs_tol: float, rel_tol: float = 0.0) -> Callable[[float, float], bool]:
    def ok(a: float, b: float) -> bool:
        return abs(a - b) <= max(abs_tol, rel_tol * abs(b))

    return ok


# (nvidia-smi field, our metric, factor from our unit to nvidia-smi's, tolerance text, test)
GPU_CHECKS: tuple[tuple[str, str, float, str, Callable[[float, float], bool]], ...] = (
    ("utilization.gpu", "gpu_utilization_ratio", 100.0, "+-15 points", _within(15)),
    ("utilization.memory", "gpu_memory_controller_utilization_ratio", 100.0, "+-15 points",
     _within(15)),
    ("memory.total", "gpu_memory_total_bytes", 1 / MIB, "+-1 MiB / 1%", _within(1, 0.01)),
    ("memory.free", "gpu_memory_free_bytes", 1 / MIB, "+-256 MiB / 2%", _within(256, 0.02)),
    ("temperature.gpu", "gpu_temperature_celsius", 1.0, "+-3 C", _within(3)),
    ("power.draw", "gpu_power_usage_watts", 1.0, "+-25 W / 15%", _within(25, 0.15)),
    ("power.limit", "gpu_power_limit_watts", 1.0, "+-1 W", _within(1)),
    ("clocks.sm", "gpu_sm_clock_hertz", 1e-6, "+-100 MHz / 10%", _within(100, 0.10)),
    ("clocks.mem", "gpu_memory_clock_hertz", 1e-6, "+-50 MHz / 5%", _within(50, 0.05)),
    ("fan.speed", "gpu_fan_speed_ratio", 100.0, "+-5 points", _within(5)),
)


def compare(series: Series, gpus: Iterable[dict[str, str | None]],
            apps: Iterable[tuple[str, int, str, float | None]]) -> list[Row]:
    """Every comparable value, ours against nvidia-smi's."""
    rows: list[Row] = []
    apps = list(apps)
    for g in gpus:
        uuid = g["uuid"] or ""
        up = _ours(series, "gpu_up", uuid)
        rows.append(Row("gpu_up", uuid, up, 1.0, "== 1", up == 1.0))
        for field, metric, factor, tol, ok in GPU_CHECKS:
            raw = g[field]
            theirs = float(raw) if raw is not None else None
            ours_raw = _ours(series, metric, uuid)
            ours = ours_raw * factor if ours_raw is not None else None
            if theirs is None or ours is None:
                # Both absent (e.g. no fan on an SXM board) is right; one side only is not.
                rows.append(Row(field, uuid, ours, theirs, "both absent", ours is theirs))
                continue
            rows.append(Row(field, uuid, ours, theirs, tol, ok(ours, theirs)))
        rows.append(_memory_used_row(series, g, uuid))
        pstate = g["pstate"]
        theirs_p = float(pstate.lstrip("P")) if pstate else None
        ours_p = _ours(series, "gpu_performance_state", uuid)
        rows.append(Row("pstate", uuid, ours_p, theirs_p, "exact", ours_p == theirs_p))
        rows.extend(_process_rows(series, uuid, [a for a in apps if a[0] == uuid]))
    return rows


def _memory_used_row(series: Series, g: dict[str, str | None], uuid: str) -> Row:
    # nvidia-smi's "used" includes driver-reserved memory on some driver versions and
    # not on others; accept either reading of ours.
    raw = g["memory.used"]
    theirs = float(raw) if raw is not None else None
    used = _ours(series, "gpu_memory_used_bytes", uuid)
    reserved = _ours(series, "gpu_memory_reserved_bytes", uuid) or 0.0
    if theirs is None or used is None:
        return Row("memory.used", uuid, used, theirs, "both absent", used is theirs)
    ok = _within(256, 0.02)
    a, b = used / MIB, (used + reserved) / MIB
    best = a if abs(a - theirs) <= abs(b - theirs) else b
    return Row("memory.used", uuid, best, theirs, "+-256 MiB / 2%", ok(best, theirs))


def _process_rows(series: Series, uuid: str,
                  apps: list[tuple[str, int, str, float | None]]) -> list[Row]:
    theirs = sum(a[3] or 0.0 for a in apps)
    mine = [(lbls, v) for lbls, v in series.get("gpu_process_memory_used_bytes", [])
            if lbls.get("uuid") == uuid]
    ours = sum(v for _, v in mine) / MIB
    rows = [Row("process memory (sum)", uuid, ours, theirs, "+-64 MiB / 5%",
                _within(64, 0.05)(ours, theirs))]
    if apps:
        labelled = any(all(lbls.get(k) == v for k, v in EXPECTED_IDENTITY.items())
                       for lbls, _ in mine)
        rows.append(Row("process user/project/job", uuid, 1.0 if labelled else 0.0, 1.0,
                        "labels " + "/".join(EXPECTED_IDENTITY.values()), labelled))
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__)
        return 2
    series = parse_exposition(Path(argv[1]).read_text())
    gpus = parse_query_gpu(Path(argv[2]).read_text())
    apps = parse_compute_apps(Path(argv[3]).read_text())
    rows = compare(series, gpus, apps)
    print(HEADER)
    for r in rows:
        print(r.render())
    failed = sum(not r.passed for r in rows)
    print(f"{len(rows) - failed} PASS, {failed} FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
