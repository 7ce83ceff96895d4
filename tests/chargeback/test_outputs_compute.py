"""Outputs of a bill that compute.build_bill made (not a hand-made Bill): the CSV adds up
to the reconciliation, and the JSON and report carry the policy note and the unmapped."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from chargeback.compute import build_bill
from chargeback.directory import load_directory
from chargeback.outputs import write_outputs
from chargeback.rates import load_rates
from chargeback.values import CSV_NAME, HTML_NAME, JSON_NAME
from tests.chargeback.fixtures import sample_files, sample_month_data, sample_request


@pytest.mark.parametrize("policy", ["none", "proportional", "even"])
def test_a_computed_bill_exports_consistently(tmp_path: Path, policy: str) -> None:
    data = sample_month_data(days=7, hostile=True)
    rates_path, directory_path = sample_files(tmp_path)
    bill = build_bill(data, load_rates(rates_path), load_directory(directory_path), policy)
    req = sample_request(tmp_path, bill)
    out = tmp_path / "out"
    write_outputs(bill, req, data, out)

    rows = list(csv.DictReader(io.StringIO((out / CSV_NAME).read_text(), newline="")))
    rec = bill.reconciliation
    charged = sum(float(r["charged_gpu_hours"]) for r in rows)
    assert charged == pytest.approx(rec.fleet_gpu_hours, rel=1e-9)
    total = sum(float(r["total_cost"]) for r in rows)
    gpu_and_energy = sum(float(r["gpu_cost"]) + float(r["energy_cost"]) for r in rows)
    assert total == pytest.approx(gpu_and_energy, rel=1e-9)  # idle share moves cost only
    idle = next(r for r in rows if r["kind"] == "idle")
    assert (float(idle["total_cost"]) > 0) == (policy == "none")

    doc = json.loads((out / JSON_NAME).read_text())
    assert doc["idle_policy"] == policy and doc["idle_policy_note"] == bill.idle_policy_note
    assert doc["unmapped"] == bill.unmapped and bill.unmapped
    html = (out / HTML_NAME).read_text()
    assert bill.idle_policy_note.split(":")[0] in html
    assert "<script" not in html
