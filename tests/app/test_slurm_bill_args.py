"""`gpu-audit chargeback bill --group-by slurm`: wrong combinations of options are refused with
every problem named, exit 2, before anything is read."""

from __future__ import annotations

import pytest

from gpu_audit_app.cli import main


@pytest.mark.parametrize(("args", "messages"), [
    (["--group-by", "slurm", "--compare-with", "archive,slurm", "--source", "prometheus"],
     ["compares with `slurm` (sacct) only", "--rates FILE is needed",
      "not --source prometheus"]),
    (["--trail", "/tmp", "--compare-with", "slurm", "--rates", "x.yaml"],
     ["--trail goes with --group-by slurm", "--compare-with slurm goes with --group-by slurm"]),
])
def test_bad_slurm_bill_options_are_all_named(
    args: list[str], messages: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """One error listing each problem, exit 2."""
    assert main(["chargeback", "bill", "--month", "2026-11", *args]) == 2
    err = capsys.readouterr().err
    for m in messages:
        assert m in err, err
