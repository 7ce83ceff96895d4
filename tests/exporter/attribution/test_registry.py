"""The name -> builder table of attribution sources (exporter/attribution/registry.py):
every name the configuration accepts has a builder, and the sources are built from the
table, by name, in the configured order."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from exporter.attribution import registry
from exporter.attribution.registry import SOURCES, SourceContext, build_sources
from exporter.attribution.resolver import Resolver
from exporter.attribution.sources.base import Query
from gpu_audit.model.attribution import ALL_SOURCES
from tests.exporter.attribution.helpers import GPU0, USERS, config, gpu, make_tree, only, proc


def test_every_configurable_source_name_has_a_builder() -> None:
    """The names `attribution.sources` accepts (ALL_SOURCES, which records and labels
    carry) and the table's names are the same set: a source added to one and not the
    other fails here."""
    assert set(SOURCES) == set(ALL_SOURCES)


class Recorder:
    """A stand-in source that answers one job for every process."""

    name = "jobmap"
    proc_needs: frozenset[str] = frozenset()

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    def begin_cycle(self) -> int:
        return 0

    def resolve(self, query: Query) -> Mapping[str, str]:
        return {"job": "from-the-table"}

    def stats(self) -> Mapping[str, int]:
        return {}

    def close(self) -> None:
        return None


def test_sources_are_built_from_the_table_by_name(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Replacing the table's `jobmap` builder changes what the resolver asks for that
    name, in the configured place, with the configuration and clocks handed over; a
    builder that returns None (the kubelet while disabled) leaves its name out."""
    monkeypatch.setitem(registry.SOURCES, "jobmap", Recorder)
    p = proc(60, uid=1001)
    make_tree(tmp_path / "proc", p)
    cfg = config(tmp_path, sources=("owner", "kubelet", "jobmap"))
    built = build_sources(cfg, user_lookup=USERS.get, wall_clock=lambda: 42.0)
    assert [s.name for s in built] == ["owner", "jobmap"]
    recorder = built[1]
    assert isinstance(recorder, Recorder)
    assert recorder.ctx.config is cfg and recorder.ctx.wall_clock() == 42.0
    a = only(Resolver(cfg, sources=built).attribute([gpu(GPU0, p)]))
    assert (a.job, a.user) == ("from-the-table", "bob")
    assert a.sources == {"job": "jobmap", "user": "owner"}
