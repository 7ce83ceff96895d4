"""One month of a small fleet, as the chargeback tests (and the benchmark) feed it to
every source: OpenMetrics for a Prometheus backfill, and audit records (schema v2 fields)
for the archive and Elasticsearch sources.

The month is a scenario of whole-hour holds, so a test can check the bill by hand
(see `tests/chargeback/test_prometheus_month.py`):

- node-a GPU 0 (A100): alice/vision 0-240 h at 80 %, bob/nlp 400-520 h at 2 % (idle
  held); its energy counter restarts at 300 h (driver reload).
- node-a GPU 1 (A100): down 216-240 h (one day); carol/nlp 0-200 h at 50 %; a process
  nobody owns 300-372 h at 30 %; dave/misc (no department anywhere) 500-600 h at 100 %;
  alice/vision and erin/vision share it 600-648 h at 30 % each.
- node-b GPU 0 (H100): erin/vision the whole month at 90 %.
- node-b GPU 1 (A100, MIG mode, two instances): alice/vision on instance 1 100-300 h
  (10 GiB), bob/nlp on instance 2 200-400 h (30 GiB); no per-process SM utilisation
  (as under MIG), 20 % of the GPU each, so while both hold it its energy splits 1:3 by
  memory in every source (the energy rule's second step); its energy counter appears
  once per MIG instance (the duplicate a dcgm-style scrape gives,
  NVIDIA/dcgm-exporter#317), which a bill must count once.
- sim-0 GPU 0 (A100): a simulated GPU (`simulated="true"`), simsam/sim the whole month.

Power is idle_watts + watts_per_util x utilisation while up (nothing while down); the
energy counter integrates it exactly. A sample at time T stands for the interval
(T - step, T], like an audit record's `time`.

Backfilled data carries no staleness markers: a series that stops is still "current"
for the query lookback. Tests therefore run Prometheus with `--query.lookback-delta`
below the step (what a scrape's staleness marker does for live data).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

START = datetime(2026, 11, 1, tzinfo=UTC)
DAYS = 30
HOUR = 3600
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
GIB = 2**30


@dataclass(frozen=True)
class Hold:
    """An owner's process on a GPU over [start_h, end_h) hours of the month."""

    user: str | None
    project: str | None
    start_h: float
    end_h: float
    util: float  # its share of the GPU's utilisation
    has_sm: bool = True  # per-process SM utilisation reported (not under MIG)
    mig_instance: int | None = None
    memory: int = 10 * GIB

    def active(self, h: float) -> bool:
        return self.start_h <= h < self.end_h

    @property
    def job(self) -> str | None:
        return f"train-{self.user}" if self.user else None


@dataclass(frozen=True)
class Gpu:
    instance: str
    index: int
    uuid: str
    name: str
    holds: tuple[Hold, ...]
    idle_watts: float = 60.0
    watts_per_util: float = 300.0
    down: tuple[float, float] | None = None  # [start_h, end_h)
    energy_reset_h: float | None = None
    mig_instances: int = 0
    simulated: bool = False

    def up(self, h: float) -> bool:
        return self.down is None or not (self.down[0] <= h < self.down[1])

    def util(self, h: float) -> float:
        return min(1.0, sum(x.util for x in self.holds if x.active(h)))

    def power(self, h: float) -> float:
        return self.idle_watts + self.watts_per_util * self.util(h)


@dataclass(frozen=True)
class Month:
    gpus: tuple[Gpu, ...]
    start: datetime = START
    days: int = DAYS
    step: int = 300  # seconds between samples

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)

    @property
    def steps(self) -> int:
        return self.days * 86400 // self.step

    def times(self) -> Iterator[tuple[int, float]]:
        """(sample time in Unix seconds, hour of the month at the START of its interval)."""
        t0 = int(self.start.timestamp())
        for k in range(1, self.steps + 1):
            yield t0 + k * self.step, (k - 1) * self.step / HOUR


def scenario(step: int = 300) -> Month:
    """The month the chargeback tests check by hand (module docstring)."""
    a0 = Gpu("node-a:9400", 0, "GPU-a0000000-0000-0000-0000-000000000000", A100, (
        Hold("alice", "vision", 0, 240, 0.8),
        Hold("bob", "nlp", 400, 520, 0.02),
    ), energy_reset_h=300)
    a1 = Gpu("node-a:9400", 1, "GPU-a1000000-0000-0000-0000-000000000000", A100, (
        Hold("carol", "nlp", 0, 200, 0.5),
        Hold(None, None, 300, 372, 0.3),
        Hold("dave", "misc", 500, 600, 1.0),
        Hold("alice", "vision", 600, 648, 0.3),
        Hold("erin", "vision", 600, 648, 0.3),
    ), down=(216, 240))
    b0 = Gpu("node-b:9400", 0, "GPU-b0000000-0000-0000-0000-000000000000", H100, (
        Hold("erin", "vision", 0, 720, 0.9),
    ), idle_watts=80, watts_per_util=500)
    b1 = Gpu("node-b:9400", 1, "GPU-b1000000-0000-0000-0000-000000000000", A100, (
        Hold("alice", "vision", 100, 300, 0.2, has_sm=False, mig_instance=1),
        Hold("bob", "nlp", 200, 400, 0.2, has_sm=False, mig_instance=2, memory=30 * GIB),
    ), mig_instances=2)
    s0 = Gpu("sim-0:9400", 0, "GPU-50000000-0000-0000-0000-000000000000", A100, (
        Hold("simsam", "sim", 0, 720, 1.0),
    ), simulated=True)
    return Month((a0, a1, b0, b1, s0), step=step)


def fleet(n_gpus: int, days: int = 30, step: int = 10) -> Month:
    """A bigger, regular fleet for the benchmark: n GPUs, 8 per node, each held by one of
    eight users in 12-hour shifts with some idle gaps and a one-day outage on GPU 0."""
    gpus = []
    for i in range(n_gpus):
        holds = []
        for shift in range(days * 2):
            if (shift + i) % 5 == 4:
                continue  # an idle gap
            user = f"user{(shift + i) % 8}"
            holds.append(Hold(user, f"proj{(shift + i) % 3}", shift * 12, shift * 12 + 12,
                              0.1 + 0.8 * ((shift * 7 + i) % 10) / 9))
        gpus.append(Gpu(f"node-{i // 8}:9400", i % 8,
                        f"GPU-{i:08x}-0000-0000-0000-000000000000",
                        H100 if i % 2 else A100, tuple(holds),
                        down=(48, 72) if i == 0 else None))
    return Month(tuple(gpus), days=days, step=step)


# ---------------------------------------------------------------------------- OpenMetrics


def _labels(pairs: list[tuple[str, str | None]]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs if v is not None) + "}"


def _gpu_labels(g: Gpu) -> list[tuple[str, str | None]]:
    return [("instance", g.instance), ("gpu", str(g.index)), ("uuid", g.uuid)]


def _sim(g: Gpu) -> list[tuple[str, str | None]]:
    return [("simulated", "true")] if g.simulated else []


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


@dataclass
class _Family:
    name: str
    type: str
    lines: list[str] = field(default_factory=list)


def write_openmetrics(month: Month, out: TextIO) -> int:
    """Write the month as OpenMetrics text for `promtool tsdb create-blocks-from
    openmetrics`; returns the number of samples written."""
    n = 0
    times = list(month.times())

    def family(name: str, type_: str) -> None:
        out.write(f"# TYPE {name} {type_}\n")

    def series(metric: str, labels: str, values: Iterator[tuple[int, float]]) -> None:
        nonlocal n
        buf = []
        for t, v in values:
            buf.append(f"{metric}{labels} {_num(v)} {t}\n")
        n += len(buf)
        out.write("".join(buf))

    family("gpu_up", "gauge")
    for g in month.gpus:
        series("gpu_up", _labels(_gpu_labels(g) + _sim(g)),
               ((t, 1.0 if g.up(h) else 0.0) for t, h in times))
    family("gpu_info", "gauge")
    for g in month.gpus:
        lab = _labels([*_gpu_labels(g), ("name", g.name),
                       ("mig_mode", "enabled" if g.mig_instances else "disabled"), *_sim(g)])
        series("gpu_info", lab, ((t, 1.0) for t, _ in times))
    family("gpu_utilization_ratio", "gauge")
    for g in month.gpus:
        series("gpu_utilization_ratio", _labels(_gpu_labels(g) + _sim(g)),
               ((t, g.util(h)) for t, h in times if g.up(h)))
    family("gpu_power_usage_watts", "gauge")
    for g in month.gpus:
        series("gpu_power_usage_watts", _labels(_gpu_labels(g) + _sim(g)),
               ((t, g.power(h)) for t, h in times if g.up(h)))
    family("gpu_energy_joules", "counter")
    for g in month.gpus:
        counter = _energy_counter(month, g)
        copies: list[list[tuple[str, str | None]]] = (
            [[("gpu_instance_id", str(i + 1))] for i in range(g.mig_instances)]
            if g.mig_instances else [[]])
        for extra in copies:
            series("gpu_energy_joules_total", _labels(_gpu_labels(g) + extra + _sim(g)),
                   iter(counter))
    for name, value in (("gpu_process_memory_used_bytes", "memory"),
                        ("gpu_process_sm_utilization_ratio", "sm")):
        family(name, "gauge")
        for g in month.gpus:
            for x in g.holds:
                if value == "sm" and not x.has_sm:
                    continue
                lab = _labels([*_gpu_labels(g), ("user", x.user), ("project", x.project),
                               ("job", x.job), ("process_name", "python"), *_sim(g)])
                series(name, lab, ((t, float(x.memory) if value == "memory" else x.util)
                                   for t, h in times if x.active(h) and g.up(h)))
    family("gpu_allocation_info", "gauge")
    for g in month.gpus:
        for x in g.holds:
            if x.user is None:
                continue
            lab = _labels([*_gpu_labels(g), ("job", x.job), ("user", x.user),
                           ("project", x.project), ("source", "jobmap"), *_sim(g)])
            series("gpu_allocation_info", lab,
                   ((t, 1.0) for t, h in times if x.active(h) and g.up(h)))
    out.write("# EOF\n")
    return n


def _energy_counter(month: Month, g: Gpu) -> list[tuple[int, float]]:
    """The counter's readings while up: joules since the last (re)start."""
    value = 1_000_000.0  # since boot, before the month
    readings = []
    for t, h in month.times():
        if not g.up(h):
            continue
        if g.energy_reset_h is not None and h == g.energy_reset_h:
            value = 0.0
        value += g.power(h) * month.step
        readings.append((t, value))
    return readings


def write_openmetrics_file(month: Month, path: Path) -> int:
    with path.open("w", encoding="utf-8") as out:
        return write_openmetrics(month, out)


# ---------------------------------------------------------------------------- audit records


def _rfc3339(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.000000000Z")


def audit_records(month: Month) -> Iterator[dict[str, Any]]:
    """The same month as audit records (schema v2 fields, docs/AUDIT.md accounting), in
    time order per host: gpu, process and unattributed records for every interval.

    Without `id`, `seq`, `prev_hash` and `hash` (the writer that chains them adds those).
    Energy is split as docs/AUDIT.md says: by SM utilisation among the attributed
    processes and the unattributed record (the GPU utilisation no attributed process
    explains), else by memory (MIG), else all unattributed.
    """
    base: dict[str, Any] = {"schema": "gpu-audit.record/2", "interval_seconds": month.step,
                            "elapsed_seconds": month.step, "exporter_version": "0.1.0"}
    step = float(month.step)
    for t, h in month.times():
        time_ns = t * 1_000_000_000
        for g in month.gpus:
            common = dict(base, time=_rfc3339(t), time_ns=time_ns, host=g.instance.split(":")[0],
                          stream=g.instance.split(":")[0], simulated=g.simulated)
            gpu = {"uuid": g.uuid, "index": g.index, "name": g.name, "up": g.up(h)}
            if not g.up(h):
                yield dict(common, kind="gpu", gpu=gpu, gpu_seconds=0.0, busy_gpu_seconds=0.0,
                           values={})
                continue
            util, power = g.util(h), g.power(h)
            energy = power * step
            yield dict(common, kind="gpu", gpu=gpu, gpu_seconds=step,
                       busy_gpu_seconds=util * step, energy_joules=energy,
                       energy_source="counter_reset" if h == g.energy_reset_h else "counter",
                       values={"utilization_ratio": util, "power_usage_watts": power})
            active = [x for x in g.holds if x.active(h)]
            owned = [x for x in active if x.user is not None]
            unexplained = max(0.0, util - sum(x.util for x in owned if x.has_sm))
            sm_weights = [x.util if x.has_sm else 0.0 for x in owned]
            if any(x.has_sm for x in active) and (sum(sm_weights) + unexplained) > 0:
                weights, rest_w = sm_weights, unexplained
            elif owned:
                weights = [float(x.memory) for x in owned]
                rest_w = float(sum(x.memory for x in active if x.user is None))
            else:
                weights, rest_w = [], 1.0
            total_w = sum(weights) + rest_w
            for x, w in zip(owned, weights, strict=True):
                attribution = {"user": x.user, "project": x.project, "job": x.job,
                               "sources": {"user": "jobmap", "project": "jobmap",
                                           "job": "jobmap"}}
                proc: dict[str, Any] = {"pid": 1000 + g.holds.index(x), "type": "compute",
                                        "name": "python"}
                if x.mig_instance is not None:
                    proc["gpu_instance_id"] = x.mig_instance
                yield dict(common, kind="process", gpu=gpu, process=proc, attributed=True,
                           attribution=attribution, gpu_seconds=step,
                           busy_gpu_seconds=(x.util if x.has_sm else 0.0) * step,
                           energy_joules=energy * w / total_w,
                           values={"memory_used_bytes": x.memory,
                                   **({"utilization_ratio": x.util} if x.has_sm else {})})
            for x in active:
                if x.user is None:
                    yield dict(common, kind="process", gpu=gpu, attributed=False,
                               process={"pid": 1000 + g.holds.index(x), "type": "compute",
                                        "name": "python"},
                               gpu_seconds=step, busy_gpu_seconds=x.util * step,
                               values={"memory_used_bytes": x.memory,
                                       "utilization_ratio": x.util})
            yield dict(common, kind="unattributed", gpu=gpu,
                       gpu_seconds=0.0 if owned else step,
                       busy_gpu_seconds=unexplained * step,
                       energy_joules=energy * rest_w / total_w if total_w else 0.0,
                       values={"processes": sum(1 for x in active if x.user is None),
                               "utilization_ratio": unexplained})


def check() -> None:
    """Sanity of the scenario itself (cheap): every hold inside the month."""
    m = scenario()
    for g in m.gpus:
        for x in g.holds:
            assert 0 <= x.start_h < x.end_h <= m.days * 24, x
            assert math.isclose((x.end_h * HOUR) % m.step, 0), x
