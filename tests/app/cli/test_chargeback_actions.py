"""`gpu-audit chargeback bill|simulate|replay`, and the flag form from before the actions
(`chargeback --month ...`, `--simulate SCENARIO`, `--replay MANIFEST`) kept for one
release: each old form runs the same action and prints the same, after one deprecation
line on stderr naming the command to type instead; the new forms print no such line.

Each pair runs in its own directory with the same relative paths, so that what is
printed (which names the output files) can be compared byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chargeback.values import CSV_NAME, MANIFEST_NAME
from gpu_audit_app.chargeback.legacy import modern_argv
from gpu_audit_app.cli import main

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[3] / "chargeback" / "examples"
PERIOD = ["--from", "2026-11-01T00:00:00Z", "--to", "2026-11-01T03:00:00Z"]
RATES = ["--rates", str(EXAMPLES / "rates.yaml")]


def _run(where: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    where.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(where)
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _deprecation(err: str) -> list[str]:
    return [line for line in err.splitlines() if "deprecated" in line]


def test_old_and_new_forms_of_each_action_print_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """simulate, bill (of the simulated archive) and replay, each in both forms: the same
    exit code, the same stdout, the same bill; the old form alone says it is deprecated
    and which command replaces it."""
    new, old = tmp_path / "new", tmp_path / "old"
    pairs = [
        (["chargeback", "simulate", "busy", *PERIOD, *RATES, "--out", "sim"],
         ["chargeback", *PERIOD, "--simulate", "busy", *RATES, "--out", "sim"],
         "gpu-audit chargeback simulate busy --from"),
        (["chargeback", "bill", *PERIOD, "--source", "archive", "--config",
          "sim/gpu-audit-sim.yaml", "--include-simulated", *RATES, "--out", "bill"],
         ["chargeback", *PERIOD, "--source", "archive", "--config",
          "sim/gpu-audit-sim.yaml", "--include-simulated", *RATES, "--out", "bill"],
         "gpu-audit chargeback bill --from"),
        (["chargeback", "replay", f"bill/{MANIFEST_NAME}"],
         ["chargeback", f"--replay=bill/{MANIFEST_NAME}"],
         f"gpu-audit chargeback replay bill/{MANIFEST_NAME}`"),
    ]
    for new_argv, old_argv, instead in pairs:
        code_new, out_new, err_new = _run(new, new_argv, monkeypatch, capsys)
        code_old, out_old, err_old = _run(old, old_argv, monkeypatch, capsys)
        assert code_new == 0, err_new
        assert (code_old, out_old) == (code_new, out_new)
        assert _deprecation(err_new) == []
        [line] = _deprecation(err_old)
        assert line.startswith("gpu-audit chargeback: the flag form is deprecated")
        assert instead in line
    assert "4 outputs byte-identical" in out_new  # the replay compared, in both forms
    for bill in ("sim", "bill"):
        assert (new / bill / CSV_NAME).read_bytes() == (old / bill / CSV_NAME).read_bytes()


@pytest.mark.parametrize(("argv", "expected"), [
    (["chargeback", "--month", "2026-11"], ["chargeback", "bill", "--month", "2026-11"]),
    (["chargeback", "--out", "o", "--replay", "m.json"],
     ["chargeback", "replay", "m.json", "--out", "o"]),
    (["chargeback", "--simulate=idle", "--month", "2026-11"],
     ["chargeback", "simulate", "idle", "--month", "2026-11"]),
])
def test_the_flag_form_is_rewritten_to_its_action(argv: list[str],
                                                 expected: list[str]) -> None:
    """The old mode flag becomes the action and its value the positional argument; every
    other word is kept in order (an option the action lacks is then a usage error)."""
    words, note = modern_argv(argv)
    assert words == expected
    assert note is not None


@pytest.mark.parametrize("argv", [
    ["chargeback", "bill", "--month", "2026-11"], ["chargeback", "replay", "m.json"],
    ["chargeback"], ["chargeback", "--help"], ["run", "--replay", "x"],
])
def test_the_new_forms_and_other_commands_are_left_alone(argv: list[str]) -> None:
    assert modern_argv(argv) == (argv, None)

