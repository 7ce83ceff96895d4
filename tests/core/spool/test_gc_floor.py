"""Spool garbage collection's floor and the places derived from the spool directory: core
knowledge, so the exporter (split mode), the shipper and check-config share one answer."""

from __future__ import annotations

from pathlib import Path

from gpu_audit.spool import CursorStore, gc_floor
from gpu_audit.spool.config import SpoolConfig, default_archive_dir, default_deadletter_dir
from shipper.config_check import check_engine
from shipper.sinks.config import ArchiveSinkConfig
from shipper.sinks.registry import create_sink


def test_gc_floor_is_the_lowest_cursor_of_the_configured_sinks_only(tmp_path: Path) -> None:
    """Segments may go below the slowest configured sink; a removed sink's cursor pins
    nothing, and with no sink configured nothing may be deleted."""
    store = CursorStore(tmp_path)
    store.commit("fast", 90)
    store.commit("slow", 40)
    store.commit("removed", 3)
    assert gc_floor(store, ["fast", "slow"]) == 40
    assert gc_floor(store, ["fast"]) == 90
    assert gc_floor(store, ["fast", "never-committed"]) == 0
    assert gc_floor(store, []) == 0


def test_default_directories_are_derived_from_the_spool_directory() -> None:
    """Dead letters go inside the spool, the default archive beside it."""
    assert default_deadletter_dir(Path("/var/lib/g/spool")) == Path("/var/lib/g/spool/deadletter")
    assert default_archive_dir(Path("/var/lib/g/spool")) == Path("/var/lib/g/archive")


def test_sink_factory_and_check_config_use_the_same_default_directories(tmp_path: Path) -> None:
    """The archive sink built with no directory writes where check-config looks, and
    check-config checks the dead-letter directory the engine uses."""
    spool = tmp_path / "spool"
    sink = create_sink(ArchiveSinkConfig(type="archive"), spool_dir=spool)
    assert sink._dir == default_archive_dir(spool)  # type: ignore[attr-defined]
    (spool / "deadletter").parent.mkdir(parents=True)
    default_deadletter_dir(spool).write_text("a file where a directory must be")
    findings = check_engine(None, SpoolConfig(directory=spool))
    assert any(str(default_deadletter_dir(spool)) in str(f) for f in findings), findings
