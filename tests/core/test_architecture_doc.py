"""docs/ARCHITECTURE.md matches the tree: every path its "Where the code lives" table
names exists, every package of the tree has a row, and the `tests/` row names every
test folder there is and none that is not."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _first_column_paths() -> list[Path]:
    """The backticked paths of the table's first column; a bare name after a path
    (`exporter/exposition/render.py`, `compat.py`) is in the same folder as the first."""
    text = DOC.read_text()
    table = text.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    paths: list[Path] = []
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", row.split("|")[1])
        base = Path(names[0])
        paths.append(ROOT / base)
        folder = base.parent if base.suffix else base
        paths += [ROOT / folder / name for name in names[1:]]
    return paths


def test_every_path_in_the_table_exists() -> None:
    """A moved or renamed module fails here until the table says where it went."""
    paths = _first_column_paths()
    assert len(paths) > 20
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_package_has_a_row() -> None:
    """Each top-level package and each package of core and the components is named."""
    named = {p.relative_to(ROOT) for p in _first_column_paths()}
    named_dirs = {p if (ROOT / p).is_dir() else p.parent for p in named}
    packages = [
        init.parent.relative_to(ROOT)
        for top in ("gpu_audit", "gpu_audit_app", "exporter", "shipper")
        for init in (ROOT / top).rglob("__init__.py")
        if "_podresources" not in init.parts and init.parent != ROOT / top
    ]
    packages += [Path("gpu_audit_app"), Path("shipper")]
    unnamed = [str(p) for p in packages
               if not any(p == d or d in p.parents for d in named_dirs)]
    assert not unnamed, f"packages without a row in docs/ARCHITECTURE.md: {unnamed}"


def test_the_tests_row_names_every_test_folder() -> None:
    """The tests' layout as the doc tells it: each folder under tests/ (two levels down)
    is named in the `tests/` row, and each `tests/...` folder the row names exists."""
    text = DOC.read_text()
    table = text.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    row = next(r for r in table.splitlines() if r.startswith("| `tests/` |"))
    named = {n.rstrip("/") for n in re.findall(r"`(tests/[^`<]*)`", row)}
    tests = ROOT / "tests"
    folders = {str(d.relative_to(ROOT)) for d in [*tests.glob("*/"), *tests.glob("*/*/")]
               if d.is_dir() and (d / "__init__.py").exists()}
    assert folders - named == set(), f"test folders the doc does not name: {folders - named}"
    gone = {n for n in named if not (ROOT / n).exists()}
    assert not gone, f"docs/ARCHITECTURE.md names test paths that do not exist: {gone}"
