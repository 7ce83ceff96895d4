"""The audit manifest: it records the request, the queries, the inputs and the rates and
directory files (content embedded), and replay re-runs it and compares every output.

Replay's call into the pipeline (`chargeback.replay.run_request`) is replaced here by a
small pipeline that reads the rates file from the request, as the real one does, and
writes through the real `write_outputs`: these tests are about the manifest, not about
the sources (tests/chargeback/test_replay_*.py replays a real archive export)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from chargeback import replay as replay_mod
from chargeback.manifest import MANIFEST_FORMAT, load_manifest
from chargeback.model import Bill, Request, SourceData
from chargeback.outputs import write_outputs
from chargeback.replay import replay
from chargeback.run import Reader
from chargeback.values import CSV_NAME, HTML_NAME, JSON_NAME, MANIFEST_NAME, OUTPUT_NAMES
from gpu_audit import __version__
from gpu_audit.errors import ConfigError
from tests.chargeback.fixtures import sample_bill, sample_request, sample_source_data

# run_request is replaced below, so replay reads no source
NO_READERS: dict[str, Reader] = {}


def _export(tmp_path: Path, days: int = 3) -> tuple[Path, Request, dict[str, str]]:
    bill = sample_bill(days=days)
    req = sample_request(tmp_path, bill)
    hashes = write_outputs(bill, req, sample_source_data(bill), Path(req.out))
    return Path(req.out) / MANIFEST_NAME, req, hashes


class Pipeline:
    """Stands in for chargeback.run.run_chargeback: the bill depends on the rates file
    the request names (its price line), so replay must hand over the right content."""

    def __init__(self, days: int = 3) -> None:
        self.days = days
        self.requests: list[Request] = []
        self.source_drift: dict[str, str] = {}

    def __call__(self, req: Request, readers: Mapping[str, Reader]
                 ) -> tuple[Bill, SourceData, dict[str, str]]:
        self.requests.append(req)
        bill = sample_bill(days=self.days)
        assert req.rates is not None
        price = float(Path(req.rates).read_text().split("default: ")[1].split()[0])
        for row in bill.rows:
            row.gpu_cost = row.charged_gpu_hours * price
        data = sample_source_data(bill)
        data.inputs.update(self.source_drift)
        return bill, data, write_outputs(bill, req, data, Path(req.out))


def test_manifest_records_what_the_bill_was_made_from(tmp_path: Path) -> None:
    path, req, hashes = _export(tmp_path)
    doc = json.loads(path.read_text())
    assert doc["format"] == MANIFEST_FORMAT
    assert doc["software"] == f"gpu-audit {__version__}"
    assert doc["request"]["start"] == "2026-11-01T00:00:00Z"
    assert doc["request"]["end"] == "2026-11-04T00:00:00Z"
    assert doc["request"]["idle_policy"] == "proportional"
    assert doc["request"]["include_simulated"] is False
    assert doc["outputs"] == hashes and set(hashes) == set(OUTPUT_NAMES)
    assert doc["source"]["queries"] == [f"archive part 2026-11-0{d}.jsonl.gz"
                                        for d in (1, 2, 3)]
    assert len(doc["source"]["inputs"]) == 3
    assert doc["source"]["simulated_excluded"] == 1234
    assert req.rates is not None
    rates = Path(req.rates).read_bytes()
    assert doc["files"]["rates"]["content"] == rates.decode()
    assert doc["files"]["directory"]["content"].startswith("users:\n")
    assert doc["files"]["rates"]["sha256"] == hashlib.sha256(rates).hexdigest()
    assert doc["files"]["config"] is None


def test_config_is_hashed_not_embedded(tmp_path: Path) -> None:
    """The config file may hold sink passwords: the manifest keeps its hash only."""
    bill = sample_bill(days=2)
    config = tmp_path / "gpu-audit.yaml"
    config.write_text("shipper:\n  sinks:\n  - type: elasticsearch\n    password: hunter2\n")
    req = sample_request(tmp_path, bill)
    req = Request(**{**{f: getattr(req, f) for f in req.__dataclass_fields__},
                     "config": str(config)})
    write_outputs(bill, req, sample_source_data(bill), tmp_path / "out")
    text = (tmp_path / "out" / MANIFEST_NAME).read_text()
    assert "hunter2" not in text
    assert json.loads(text)["files"]["config"]["path"] == str(config)


def test_replay_reproduces_every_output(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path, _req, hashes = _export(tmp_path)
    pipeline = Pipeline()
    monkeypatch.setattr(replay_mod, "run_request", pipeline)
    out = io.StringIO()
    again = tmp_path / "again"
    assert replay(path, again, readers=NO_READERS, say=out) == 0, out.getvalue()
    assert "4 outputs byte-identical" in out.getvalue()
    assert (again / CSV_NAME).read_bytes() == (path.parent / CSV_NAME).read_bytes()
    replayed = pipeline.requests[0]
    assert replayed.out == str(again)
    assert replayed.start.isoformat() == "2026-11-01T00:00:00+00:00"
    assert replayed.rates != _req.rates  # the manifest's copy, not the original path
    assert hashes[CSV_NAME] == json.loads(path.read_text())["outputs"][CSV_NAME]


def test_replay_uses_the_embedded_rates_after_the_file_changed_or_went(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing or deleting the rates file after the export does not change the replay:
    the bill is re-derived from the manifest's copy, and the change is reported."""
    path, req, _ = _export(tmp_path)
    monkeypatch.setattr(replay_mod, "run_request", Pipeline())
    assert req.rates is not None
    rates = Path(req.rates)
    rates.write_text(rates.read_text().replace("default: 2.5", "default: 9.0"))
    out = io.StringIO()
    assert replay(path, readers=NO_READERS, say=out) == 0, out.getvalue()
    assert "changed since the export" in out.getvalue()
    rates.unlink()
    out = io.StringIO()
    assert replay(path, readers=NO_READERS, say=out) == 0, out.getvalue()
    assert "is gone; using the copy in the manifest" in out.getvalue()


def test_replay_names_each_output_that_differs(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A source whose data changed since the export gives another bill: exit 1, with the
    files named and the changed input reported beside."""
    path, _, _ = _export(tmp_path)
    pipeline = Pipeline(days=3)
    pipeline.source_drift = {"2026-11-02.jsonl.gz": "f" * 64}

    def drifted(req: Request, readers: Mapping[str, Reader]
                ) -> tuple[Bill, SourceData, dict[str, str]]:
        bill, data, _ = pipeline(req, readers)
        bill.rows[0].total_cost += 1.0
        return bill, data, write_outputs(bill, req, data, Path(req.out))

    monkeypatch.setattr(replay_mod, "run_request", drifted)
    out = io.StringIO()
    assert replay(path, readers=NO_READERS, say=out) == 1
    text = out.getvalue()
    assert f"{CSV_NAME}: sha256" in text and f"{JSON_NAME}: sha256" in text
    assert "input 2026-11-02.jsonl.gz" in text


def test_an_altered_manifest_is_refused(tmp_path: Path) -> None:
    """Editing the embedded rates (to change what a replay would bill) without fixing
    their sha256 is caught; so are missing parts, all reported at once."""
    path, _, _ = _export(tmp_path)
    doc = json.loads(path.read_text())
    doc["files"]["rates"]["content"] = doc["files"]["rates"]["content"].replace("2.5", "0.1")
    del doc["outputs"][HTML_NAME]
    doc["request"]["start"] = "yesterday"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        load_manifest(path)
    problems = "\n".join(err.value.problems)
    assert "files.rates: embedded content does not match its sha256" in problems
    assert f"outputs.{HTML_NAME}: missing sha256" in problems
    assert "request.start" in problems


def test_not_a_manifest_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "chargeback.json"
    bogus.write_text('{"format": "gpu-audit-chargeback/1"}')
    with pytest.raises(ConfigError, match="not a chargeback manifest"):
        load_manifest(bogus)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_manifest(garbage)


def test_replay_never_writes_over_the_export_it_checks(tmp_path: Path) -> None:
    path, _, _ = _export(tmp_path)
    with pytest.raises(ConfigError, match="holds the export being checked"):
        replay(path, path.parent, readers=NO_READERS)
