"""Replaying a manifest reproduces the bill byte for byte, through the real pipeline:
three days of the chargeback test month backfilled into a real Prometheus (promtool),
billed by `run_chargeback`, then `gpu-audit chargeback replay manifest.json`."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from chargeback.model import Request
from chargeback.replay import replay
from chargeback.run import run_chargeback
from chargeback.values import CSV_NAME, HTML_NAME, JSON_NAME, MANIFEST_NAME
from gpu_audit_app.chargeback.main import readers
from tests.chargeback.month import Month, scenario
from tests.chargeback.promfill import Backfilled, backfilled_prometheus

ROOT = Path(__file__).resolve().parents[2]
DAYS = 3


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Backfilled, Month]]:
    month = scenario(step=300)
    month = Month(month.gpus, start=month.start, days=DAYS, step=month.step)
    with backfilled_prometheus(tmp_path_factory.mktemp("replay-prom"), month) as prom:
        yield prom, month


def _request(prom: Backfilled, month: Month, out: Path, rates: Path) -> Request:
    return Request(start=month.start, end=month.start + timedelta(days=DAYS),
                   source="prometheus", config=None, prometheus_url=prom.url,
                   rates=str(rates), directory=str(ROOT / "chargeback/examples/directory.yaml"),
                   idle_policy="proportional", out=str(out))


@pytest.mark.timeout(600)
def test_replay_of_a_prometheus_bill_is_byte_identical(
        prometheus: tuple[Backfilled, Month], tmp_path: Path) -> None:
    prom, month = prometheus
    rates = tmp_path / "rates.yaml"
    rates.write_bytes((ROOT / "chargeback/examples/rates.yaml").read_bytes())
    result = run_chargeback(_request(prom, month, tmp_path / "bill", rates),
                            readers=readers())
    assert result.bill.reconciliation.fleet_gpu_hours > 0
    manifest = tmp_path / "bill" / MANIFEST_NAME
    doc = json.loads(manifest.read_text())
    assert doc["source"]["queries"], "every query is in the manifest"
    assert doc["source"]["inputs"]["prometheus_url"] == prom.url

    rates.unlink()  # the rates file is gone: replay uses the manifest's copy
    say = io.StringIO()
    assert replay(manifest, tmp_path / "again", readers=readers(), say=say) == 0, say.getvalue()
    for name in (CSV_NAME, JSON_NAME, HTML_NAME):
        assert (tmp_path / "again" / name).read_bytes() == \
            (tmp_path / "bill" / name).read_bytes(), name

    # an export whose CSV does not match what the source gives now is named
    doc["outputs"][CSV_NAME] = "0" * 64
    manifest.write_text(json.dumps(doc))
    say = io.StringIO()
    assert replay(manifest, readers=readers(), say=say) == 1
    assert f"{CSV_NAME}: sha256" in say.getvalue()
    assert JSON_NAME not in say.getvalue()
