"""The layers hold: import-linter's contracts in pyproject.toml pass on this tree, and they
do catch the imports they forbid (core importing a component, a component importing
another, a component importing the app layer, a production start-up module importing
the simulator)."""

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


# The toy tree's modules: the top-level packages the layer contracts name, and the
# exporter's modules the simulator contract names (launcher's come from this tree).
TOY_MODULES = ("gpu_audit", "gpu_audit_app", "exporter", "shipper", "exporter.app",
               "exporter.sampler", "exporter.backends", "exporter.backends.nvml",
               "exporter.backends.dcgm", "exporter.sim")


def _toy_tree(tmp: Path, imports: dict[str, str]) -> dict[str, str]:
    """Empty modules with this project's names and pyproject's contracts; `imports` maps
    a module to the module it imports."""
    for module in TOY_MODULES:
        package = tmp.joinpath(*module.split("."))
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(
            f"import {imports[module]}\n" if module in imports else "")
    (tmp / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return {**os.environ, "PYTHONPATH": str(tmp)}


@pytest.mark.parametrize(("importer", "imported", "contract"), [
    ("gpu_audit", "exporter", "The app layer above the components"),
    ("gpu_audit", "gpu_audit_app", "The app layer above the components"),
    ("exporter", "gpu_audit_app", "The app layer above the components"),
    ("shipper", "exporter", "Components never import each other"),
    ("exporter", "shipper", "Components never import each other"),
    ("exporter.app", "exporter.sim", "The simulator stays out of the production start-up"),
    ("exporter.sampler", "exporter.sim", "The simulator stays out of the production start-up"),
    ("exporter.backends.nvml", "launcher.sim",
     "The simulator stays out of the production start-up"),
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


def test_the_simulator_is_kept_out_through_other_modules_too(tmp_path: Path) -> None:
    """exporter.app importing a module that imports the simulator (as exporter.backends
    once did, to build the `sim` backend) breaks the simulator contract."""
    env = _toy_tree(tmp_path, {"exporter.app": "exporter.backends",
                               "exporter.backends": "exporter.sim"})
    res = _lint(tmp_path, env)
    assert res.returncode != 0, res.stdout
    assert "The simulator stays out of the production start-up" in res.stdout, res.stdout
    assert "exporter.app -> exporter.backends" in res.stdout, res.stdout


def test_the_simulator_may_import_the_exporter_and_the_app_the_simulator(
        tmp_path: Path) -> None:
    """The simulator's wiring imports production modules, and the app layer imports the
    simulator (it chooses it by name): kept."""
    env = _toy_tree(tmp_path, {"exporter.sim": "exporter.app",
                               "gpu_audit_app": "exporter.sim"})
    res = _lint(tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
