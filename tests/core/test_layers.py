"""The layers hold: import-linter's contracts in pyproject.toml pass on this tree, and they
do catch the imports they forbid (core importing a component, a component importing
another, a component importing the app layer)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists() and not shutil.which("lint-imports"),
                                reason="import-linter is not installed (the test extra)")


def _lint(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    program = str(LINT_IMPORTS) if LINT_IMPORTS.exists() else "lint-imports"
    return subprocess.run([program, "--no-logo", "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_tree_keeps_every_contract() -> None:
    """`lint-imports` on the repository: every contract kept."""
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def _toy_tree(tmp: Path, imports: dict[str, str]) -> dict[str, str]:
    """Empty packages with this project's top-level names and pyproject's contracts;
    `imports` maps a package to the module it imports."""
    for package in ("gpu_audit", "gpu_audit_app", "exporter", "shipper"):
        (tmp / package).mkdir()
        (tmp / package / "__init__.py").write_text(
            f"import {imports[package]}\n" if package in imports else "")
    (tmp / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return {**os.environ, "PYTHONPATH": str(tmp)}


@pytest.mark.parametrize(("importer", "imported", "contract"), [
    ("gpu_audit", "exporter", "The app layer above the components"),
    ("gpu_audit", "gpu_audit_app", "The app layer above the components"),
    ("exporter", "gpu_audit_app", "The app layer above the components"),
    ("shipper", "exporter", "Components never import each other"),
    ("exporter", "shipper", "Components never import each other"),
])
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, importer: str, imported: str, contract: str,
) -> None:
    """Each direction the layers forbid is reported, naming the broken contract."""
    env = _toy_tree(tmp_path, {importer: imported})
    res = _lint(tmp_path, env)
    assert res.returncode != 0, res.stdout
    assert f"{contract}" in res.stdout and "BROKEN" in res.stdout, res.stdout


def test_the_allowed_directions_pass(tmp_path: Path) -> None:
    """The app imports components, components import core: kept."""
    env = _toy_tree(tmp_path, {"gpu_audit_app": "exporter", "exporter": "gpu_audit",
                               "shipper": "gpu_audit"})
    res = _lint(tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
