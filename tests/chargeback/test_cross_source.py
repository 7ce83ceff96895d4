"""One bill whatever the source: the simulator's mig, busy and leak scenarios
played once, each cycle's snapshot written by the real audit producer into an archive
and rendered by the exporter's real renderer into a Prometheus (backfilled with
promtool), then billed from both with the same rates and directory. Every row's
GPU-hours and energy agree within 0.5 %.

The run is simulated, so Prometheus is read with --include-simulated (the recording
rules' expressions over the raw series, chargeback.sources.prometheus.RULES, which
tests/chargeback/test_prometheus_month.py holds equal to alerts/rules/recording.yaml).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chargeback.compute import build_bill
from chargeback.directory import load_directory
from chargeback.model import Bill, Request
from chargeback.rates import load_rates
from chargeback.sources.archive import read_archive
from chargeback.sources.prometheus import read_prometheus
from exporter.exposition.render import Renderer, RenderOptions
from gpu_audit.model.snapshot import Snapshot
from gpu_audit_app.chargeback.sim import simulate_archive
from tests.chargeback.promfill import backfilled_prometheus

pytestmark = pytest.mark.timeout(300)

EXAMPLES = Path(__file__).resolve().parents[2] / "chargeback" / "examples"
START = datetime(2026, 11, 3, tzinfo=UTC)
HOURS = 12
STEP = 60
TOLERANCE = 0.005  # relative, per row and quantity
FLOOR = 0.002  # hours or kWh: a difference below this is rounding, whatever the ratio
_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


@dataclass(frozen=True)
class Run:
    start: datetime
    end: datetime
    step: int


class OpenMetrics:
    """Every cycle's exposition, kept per metric name and series, written as one
    OpenMetrics file (families contiguous, each series in time order)."""

    def __init__(self) -> None:
        self.renderer = Renderer(RenderOptions())
        self.series: dict[str, dict[str, list[str]]] = {}

    def __call__(self, snap: Snapshot) -> None:
        body = self.renderer.render(snap, now=snap.timestamp).body.decode()
        for line in body.splitlines():
            if not line or line.startswith("#"):
                continue
            m = _NAME.match(line)
            assert m is not None, line
            key, value = line.rsplit(" ", 1)
            self.series.setdefault(m.group(1), {}).setdefault(key, []).append(
                f"{key} {value} {snap.timestamp:.3f}\n")

    def write(self, path: Path) -> int:
        n = 0
        with path.open("w") as out:
            for fam in self.series.values():
                for lines in fam.values():
                    out.writelines(lines)
                    n += len(lines)
            out.write("# EOF\n")
        return n


def _bills(scenario: str, tmp: Path) -> tuple[Bill, Bill]:
    end = START + timedelta(hours=HOURS)
    om = OpenMetrics()
    archive = tmp / "archive"
    simulate_archive(scenario, START, end, archive, tmp / "sim.yaml", step=STEP,
                     observe=om)
    rates = load_rates(EXAMPLES / "rates.yaml")
    directory = load_directory(EXAMPLES / "directory.yaml")
    req = Request(start=START, end=end, source="archive", config=None, prometheus_url=None,
                  rates=None, directory=None, idle_policy="none", out=str(tmp / "out"),
                  include_simulated=True)
    a = build_bill(read_archive(req, archive), rates, directory, "none")
    with backfilled_prometheus(tmp, Run(START, end, STEP),  # type: ignore[arg-type]
                               records={"gpu:gpu_up:max"}, writer=om.write) as prom:
        p = build_bill(read_prometheus(dataclasses.replace(
            req, source="prometheus", prometheus_url=prom.url)), rates, directory, "none")
    return a, p


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= max(TOLERANCE * max(abs(x), abs(y)), FLOOR)


_BILLS: dict[str, tuple[Bill, Bill]] = {}


def _bills_once(scenario: str, factory: pytest.TempPathFactory) -> tuple[Bill, Bill]:
    if scenario not in _BILLS:
        _BILLS[scenario] = _bills(scenario, factory.mktemp(scenario))
    return _BILLS[scenario]


@pytest.mark.parametrize("scenario", ["mig", "busy", "leak"])
def test_archive_and_prometheus_bill_the_same_run_alike(
        scenario: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same rows from both sources, and each row's used, charged, busy and
    idle-held GPU-hours and energy within 0.5 % (the MIG tenants' energy split by the
    one rule: no per-process SM, so by memory, in both)."""
    a, p = _bills_once(scenario, tmp_path_factory)
    keys = [(r.kind, r.department, r.project, r.user) for r in a.rows]
    assert keys == [(r.kind, r.department, r.project, r.user) for r in p.rows]
    off = []
    for x, y in zip(a.rows, p.rows, strict=True):
        for f in ("used_gpu_hours", "charged_gpu_hours", "busy_gpu_hours",
                  "idle_held_gpu_hours", "energy_kwh"):
            if not _close(getattr(x, f), getattr(y, f)):
                off.append((x.kind, x.user, f, getattr(x, f), getattr(y, f)))
    assert not off, off
    assert _close(a.reconciliation.fleet_energy_kwh, p.reconciliation.fleet_energy_kwh)


def test_mig_tenants_are_billed_by_the_slice(tmp_path_factory: pytest.TempPathFactory) -> None:
    """On the mig scenario's A100-80GB (3g.40gb + 2 x 2g.20gb), the 3g.40gb tenant is
    charged and uses 3/7 of the GPU's time and a 2g.20gb tenant 2/7 (compute slices),
    from the archive and from Prometheus alike, not 1/3 or the whole GPU; the whole
    A100 beside it is billed whole, and the slices nobody holds stay idle."""
    for bill in _bills_once("mig", tmp_path_factory):
        rows = {r.project: r for r in bill.rows if r.kind == "owner"}
        fd, rs, ocr = rows["fraud-detection"], rows["recsys"], rows["ocr"]
        for r, slices in ((fd, 3), (rs, 2)):  # both run the whole window
            for got in (r.charged_gpu_hours, r.used_gpu_hours):
                assert got == pytest.approx(HOURS * slices / 7, rel=0.002), (bill.source, r)
        # ocr starts 600 s into the scenario's hour, then holds its 2g.20gb
        assert ocr.charged_gpu_hours < HOURS * 2 / 7
        assert ocr.charged_gpu_hours == pytest.approx(ocr.used_gpu_hours, rel=0.002)
        assert rows["nlp"].charged_gpu_hours == pytest.approx(HOURS, rel=0.002)
        rec = bill.reconciliation
        assert rec.idle_gpu_hours == pytest.approx(
            2 * HOURS - sum(r.charged_gpu_hours for r in rows.values()), abs=0.002)
        assert rec.idle_gpu_hours > 0


def test_mig_allocations_are_seen_from_prometheus(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """MIG tenants' allocations reach the Prometheus bill (a MIG
    parent reports no GPU utilisation, which the allocation used to be read through, so
    they counted 0), weighted by the slice like their time; the archive, which sees no
    reservation, says "not known"."""
    archive, prom = _bills_once("mig", tmp_path_factory)
    rows = {r.project: r for r in prom.rows if r.kind == "owner"}
    for project, slices in (("fraud-detection", 3), ("recsys", 2), ("nlp", 7)):
        assert rows[project].allocated_gpu_hours == pytest.approx(
            HOURS * slices / 7, rel=0.002), rows[project]
    assert prom.allocation_known
    assert not archive.allocation_known


def test_mig_slices_are_the_same_in_the_interval_trail(tmp_path: Path) -> None:
    """The 300 s interval records (schema 3) bill the mig scenario's slices exactly as
    the per-cycle records (schema 2) do: the weight is applied in close_cycle, which
    both use."""
    end = START + timedelta(hours=2)
    bills = []
    for name, interval in (("cycle", float(STEP)), ("interval", 300.0)):
        archive = tmp_path / name
        simulate_archive("mig", START, end, archive, tmp_path / f"{name}.yaml", step=STEP,
                         audit_interval=interval)
        req = Request(start=START, end=end, source="archive", config=None,
                      prometheus_url=None, rates=None, directory=None, idle_policy="none",
                      out=str(tmp_path / "out"), include_simulated=True)
        bills.append(build_bill(read_archive(req, archive), load_rates(EXAMPLES / "rates.yaml"),
                                load_directory(EXAMPLES / "directory.yaml"), "none"))
    per_cycle, per_interval = bills
    for x, y in zip(per_cycle.rows, per_interval.rows, strict=True):
        assert (x.kind, x.project) == (y.kind, y.project)
        for f in ("used_gpu_hours", "charged_gpu_hours"):
            assert _close(getattr(x, f), getattr(y, f)), (x.project, f)
    fd = next(r for r in per_interval.rows if r.project == "fraud-detection")
    assert fd.charged_gpu_hours == pytest.approx(2 * 3 / 7, rel=0.002)
