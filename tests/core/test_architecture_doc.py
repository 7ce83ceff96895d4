"""docs/ARCHITECTURE.md matches the tree: every path its "Where the code lives" table
names exists, every package of the tree has a row, every module of the packages is
mapped there, and the `tests/` row names every test folder there is and none that is
not."""

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


PACKAGES = ("gpu_audit", "exporter", "shipper", "launcher", "chargeback", "alerts",
            "dashboards", "gpu_audit_app", "gpu_audit_ckpt")
_TOKEN = re.compile(r"`([\w./-]+)`")


def _mapped(table: str) -> set[Path]:
    """Every file and folder the table names. In a row, a name is taken from the root
    when it starts with a top-level folder, else in the row's folder (its first column's
    first path) or in any folder the row names before it (`chargeback/slurm/`, `sim/`)."""
    named: set[Path] = set()
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        first = Path(_TOKEN.findall(row.split("|")[1])[0])
        bases = [ROOT / (first.parent if first.suffix else first)]
        named.add(bases[0])  # a row of a folder's files maps its package too
        for token in _TOKEN.findall(row):
            top = token.split("/")[0]
            tries = [ROOT / token] if top in PACKAGES else [b / token for b in bases]
            found = [t for t in tries if t.exists()]
            named.update(found)
            bases += [t for t in found if t.is_dir()]
    return named


def test_every_module_is_mapped() -> None:
    """A newcomer finds every module of the packages in the map, with what it is for: each
    .py file is named in the "Where the code lives" table (a package's `__init__.py` and
    `__main__.py` by its folder's row)."""
    text = DOC.read_text()
    named = _mapped(text.split("## Where the code lives", 1)[1].split("\n## ", 1)[0])
    unmapped = []
    for top in PACKAGES:
        for module in sorted((ROOT / top).rglob("*.py")):
            if "_podresources" in module.parts or module in named:
                continue
            if module.name in ("__init__.py", "__main__.py") and module.parent in named:
                continue
            unmapped.append(str(module.relative_to(ROOT)))
    assert unmapped == [], f"modules docs/ARCHITECTURE.md does not map: {unmapped}"
