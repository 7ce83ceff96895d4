"""run_chargeback's source dispatch, refusals and no-data rule, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from chargeback import run
from chargeback.model import Request, SourceData
from gpu_audit.errors import ConfigError
from gpu_audit_app.chargeback.main import readers
from gpu_audit_app.cli import main

EXAMPLES = Path(__file__).parents[2] / "chargeback" / "examples"


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return ["chargeback", "bill", "--month", "2026-11", "--source", "archive",
            "--rates", str(EXAMPLES / "rates.yaml"), "--out", str(tmp_path / "o"), *extra]


def test_a_registered_reader_failing_is_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    def broken(req: Request, progress: bool) -> SourceData:
        raise run.SourceError("archive /x: the chain breaks at part 3")

    monkeypatch.setattr("gpu_audit_app.chargeback.main._archive", broken)
    assert main(_args(tmp_path)) == 1
    assert "the chain breaks at part 3" in capsys.readouterr().err


def test_an_empty_source_is_no_data_not_an_empty_bill(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def empty(req: Request, progress: bool) -> SourceData:
        return SourceData("archive", req.start, req.end)

    monkeypatch.setattr("gpu_audit_app.chargeback.main._archive", empty)
    assert main(_args(tmp_path)) == 1
    assert "no data for 2026-11-01T00:00:00+00:00" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_request_problems_are_listed_together(tmp_path: Path) -> None:
    from datetime import UTC, datetime
    t = datetime(2026, 11, 1, tzinfo=UTC)
    req = Request(t, t, "prometheus", None, None, None, None, "fair", str(tmp_path))
    with pytest.raises(ConfigError) as exc:
        run.run_chargeback(req, readers=readers())
    text = str(exc.value)
    for what in ("period is empty", "--idle-policy 'fair'", "--prometheus-url URL"):
        assert what in text
