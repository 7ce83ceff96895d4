"""The engine's exclusive directories: a shipper holds its spool's cursors and ledgers,
its dead-letter directory and every archive directory, from construction until stop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_audit.errors import LockHeld
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.engine import Shipper
from shipper.sinks.archive.config import ArchiveSinkConfig
from tests.shipper.memsinks import MemorySink


def _spool(tmp_path: Path, name: str) -> SpoolConfig:
    return SpoolConfig(directory=tmp_path / name, min_free_bytes=0)


def test_a_second_shipper_on_the_same_spool_is_refused_until_the_first_stops(
    fast_config: ShipperConfig, tmp_path: Path,
) -> None:
    """Same cursors: LockHeld naming this process's pid and the spool; after stop() (even
    of a shipper that never started) the next one gets the lock."""
    spool = _spool(tmp_path, "spool")
    first = Shipper(fast_config, spool, sinks=[MemorySink("a")])
    with pytest.raises(LockHeld, match=rf"spool {spool.directory}.*pid {os.getpid()}"):
        Shipper(fast_config, spool, sinks=[MemorySink("a")])
    first.stop()
    Shipper(fast_config, spool, sinks=[MemorySink("a")]).stop()


def test_shippers_of_two_spools_sharing_a_dead_letter_directory_are_refused(
    fast_config: ShipperConfig, tmp_path: Path,
) -> None:
    """A dead-letter directory has one shipper; the refused one creates no dead-letter
    file, ledger or cursor."""
    cfg = fast_config.model_copy(update={"deadletter_dir": tmp_path / "dead"})
    first = Shipper(cfg, _spool(tmp_path, "a"), sinks=[MemorySink("x")])
    try:
        with pytest.raises(LockHeld, match=f"dead-letter directory {tmp_path / 'dead'}"):
            Shipper(cfg, _spool(tmp_path, "b"), sinks=[MemorySink("x")])
        assert not (tmp_path / "b" / "shipper" / "x.ledger.json").exists()
        assert not list((tmp_path / "b").glob("cursors/*"))
    finally:
        first.stop()


def test_shippers_of_two_spools_sharing_an_archive_directory_are_refused(
    fast_config: ShipperConfig, tmp_path: Path,
) -> None:
    """Two archive sinks writing one directory would interleave its files: refused."""
    archive = tmp_path / "archive"
    cfg = fast_config.model_copy(
        update={"sinks": [ArchiveSinkConfig(type="archive", directory=archive)]})
    first = Shipper(cfg, _spool(tmp_path, "a"))
    try:
        with pytest.raises(LockHeld, match=f"archive directory {archive}"):
            Shipper(cfg, _spool(tmp_path, "b"))
    finally:
        first.stop()
    Shipper(cfg, _spool(tmp_path, "b")).stop()
