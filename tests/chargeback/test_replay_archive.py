"""`gpu-audit chargeback replay` over the audit archive, through the command line: the
test month's records, hash-chained and archived by the real archive sink, billed with
`--source archive --config FILE`, replayed byte for byte; an archive tampered with after
the export is refused on replay (exit 1), and the report of an export made with
--allow-unverified carries the warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from chargeback.values import CSV_NAME, HTML_NAME, MANIFEST_NAME
from gpu_audit_app.cli import main
from tests.chargeback.archives import ArchiveWriter, rewrite_part
from tests.chargeback.month import audit_records, scenario
from tests.chargeback.test_archive_month import _chained

pytestmark = pytest.mark.timeout(300)

EXAMPLES = Path(__file__).resolve().parents[2] / "chargeback" / "examples"


@pytest.fixture
def archived(tmp_path: Path) -> Path:
    """A config file whose archive sink holds the test month (hourly records)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    writer = ArchiveWriter(archive)
    writer.write(_chained(audit_records(scenario(step=3600))))
    writer.close()
    config = tmp_path / "gpu-audit.yaml"
    config.write_text(f"spool:\n  directory: {tmp_path / 'spool'}\n"
                      f"shipper:\n  sinks:\n  - type: archive\n    directory: {archive}\n")
    return config


def _bill(config: Path, out: Path, *extra: str) -> int:
    return main(["chargeback", "bill", "--month", "2026-11", "--source", "archive",
                 "--config", str(config), "--rates", str(EXAMPLES / "rates.yaml"),
                 "--directory", str(EXAMPLES / "directory.yaml"), "--out", str(out), *extra])


def _tamper(archive: Path) -> None:
    part = sorted(archive.glob("gpu-audit_*_2026-11-1*.jsonl*"))[0]

    def edit(lines: list[bytes]) -> list[bytes]:
        for i, line in enumerate(lines):
            if b'"kind":"process"' in line and b'"gpu_seconds":3600.0' in line:
                lines[i] = line.replace(b'"gpu_seconds":3600.0', b'"gpu_seconds":7200.0', 1)
                return lines
        raise AssertionError(f"no process record to tamper with in {part.name}")

    rewrite_part(part, edit)


def test_archive_bill_replays_byte_identical_and_refuses_a_tampered_trail(
        archived: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bill = tmp_path / "bill"
    assert _bill(archived, bill) == 0
    capsys.readouterr()
    assert main(["chargeback", "replay", str(bill / MANIFEST_NAME)]) == 0
    assert "4 outputs byte-identical" in capsys.readouterr().out

    _tamper(tmp_path / "archive")
    assert main(["chargeback", "replay", str(bill / MANIFEST_NAME)]) == 1
    err = capsys.readouterr().err
    assert "hash chain does not verify" in err

    # billed anyway with --allow-unverified: the report says so at the top
    unverified = tmp_path / "unverified"
    assert _bill(archived, unverified, "--allow-unverified") == 0
    html = (unverified / HTML_NAME).read_text()
    assert 'id="unverified"' in html and ": modified:" in html
    assert (unverified / CSV_NAME).read_bytes() != (bill / CSV_NAME).read_bytes()
