"""No import cycles: the import graph of every package of the project (grimp, the graph
import-linter uses) has no strongly connected component of more than one module, and no
module imports itself. Imports made only under `if TYPE_CHECKING:` are left out: they
never run. Imports inside functions count: they still tie the two modules together.

A cycle means two modules cannot be read, tested or changed one without the other; the
fix is to move what both need into a third module below them (chargeback/replay.py
above run.py, shipper/sinks/registry.py building what each sink's config.py describes)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import grimp
import pytest

PACKAGES = ("gpu_audit", "gpu_audit_app", "exporter", "shipper", "alerts", "dashboards",
            "chargeback", "launcher", "gpu_audit_ckpt")


def import_cycles(*packages: str) -> list[list[str]]:
    """Each set of modules that import each other, directly or through others (Tarjan's
    strongly connected components, iteratively), sorted; TYPE_CHECKING imports left out."""
    graph = grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=True)
    edges: Mapping[str, Set[str]] = {
        m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_the_project_has_no_import_cycle() -> None:
    """Every module of every package can be imported, read and tested without a module
    that imports it back."""
    cycles = import_cycles(*PACKAGES)
    assert not cycles, "import cycles (each list imports itself round):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


@pytest.fixture
def toy_package(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An empty package with a unique name on sys.path (removed afterwards)."""
    name = f"cycletoy_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, tmp_path / name
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_a_cycle_is_found_even_through_a_lazy_import(toy_package: tuple[str, Path]) -> None:
    """a -> b -> c -> a, the last import inside a function (as replay's was in
    chargeback): reported as one cycle of the three modules; d, which only imports a,
    is not in it."""
    name, root = toy_package
    (root / "a.py").write_text(f"from {name} import b\n")
    (root / "b.py").write_text(f"import {name}.c\n")
    (root / "c.py").write_text(f"def f():\n    from {name} import a\n    return a\n")
    (root / "d.py").write_text(f"from {name}.a import b\n")
    assert import_cycles(name) == [[f"{name}.a", f"{name}.b", f"{name}.c"]]


def test_type_checking_imports_make_no_cycle(toy_package: tuple[str, Path]) -> None:
    """An import back under `if TYPE_CHECKING:` (for an annotation) never runs: no cycle."""
    name, root = toy_package
    (root / "a.py").write_text(f"from {name} import b\n")
    (root / "b.py").write_text("from typing import TYPE_CHECKING\n"
                               f"if TYPE_CHECKING:\n    from {name} import a\n")
    assert import_cycles(name) == []
