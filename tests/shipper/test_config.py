"""Shipper configuration: validation lists every problem; check-config names secrets'
variables and files but never their values."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_audit.errors import ConfigError
from gpu_audit.spool.config import SpoolConfig
from gpu_audit_app.config import load_config
from shipper.config import ShipperConfig
from shipper.config_check import check_shipper_config
from shipper.sinks.archive.config import ArchiveSinkConfig


def test_default_is_one_archive_sink() -> None:
    """With no configuration the shipper delivers to the local archive only."""
    cfg = ShipperConfig()
    assert len(cfg.sinks) == 1
    assert isinstance(cfg.sinks[0], ArchiveSinkConfig)
    assert cfg.sink_names() == ["archive"]


def test_yaml_problems_are_all_listed_with_lines(tmp_path: Path) -> None:
    """Duplicate names, an unknown sink type and a bad engine value are reported together,
    each with its line."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "shipper:\n"
        "  batch_max_records: 0\n"
        "  sinks:\n"
        "    - type: archive\n"
        "    - type: archive\n"
        "spool:\n"
        "  segment_bytes: 1\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = info.value.render()
    assert f"{path}:2: shipper.batch_max_records" in text
    assert "both named 'archive'" in text
    assert "spool.segment_bytes" in text
    assert len(info.value.problems) == 3

    path.write_text("shipper:\n  sinks:\n    - type: kafka\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:3: shipper.sinks.0" in info.value.render()
    assert "kafka" in info.value.render()


def test_check_names_missing_secrets_and_bad_urls_never_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every machine-level problem is listed at once; a present secret's value never
    appears in any problem."""
    monkeypatch.setenv("PRESENT_TOKEN", "s3cr3t-value")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.delenv("MISSING_PASSWORD", raising=False)
    cfg = ShipperConfig.model_validate(
        {
            "sinks": [
                {"type": "influxdb_v2", "name": "vm", "url": "http://127.0.0.1:8428",
                 "bucket": "b", "token_env": "PRESENT_TOKEN"},
                {"type": "elasticsearch", "name": "es", "hosts": ["http://:9200", "es:9200"],
                 "username": "u", "password_env": "MISSING_PASSWORD"},
                {"type": "influxdb_v1", "name": "i1", "url": "http://127.0.0.1:99999",
                 "database": "d", "username": "u", "password_file": str(tmp_path / "nope")},
                {"type": "archive", "name": "arch", "directory": str(blocker / "archive")},
            ]
        }
    )
    spool = SpoolConfig(directory=tmp_path / "spool")
    findings = check_shipper_config(cfg, spool)
    problems = [f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in findings]
    text = "\n".join(problems)
    assert "MISSING_PASSWORD is not set" in text
    assert str(tmp_path / "nope") in text
    assert "'http://:9200'" in text and "'es:9200'" in text
    assert "http://127.0.0.1:99999" in text
    assert str(blocker / "archive") in text
    assert "s3cr3t-value" not in text
    assert not any(p.startswith("shipper.sinks.0") for p in problems)
    assert "shipper.sinks.1.password_env: environment variable MISSING_PASSWORD" in text
    assert "shipper.sinks.1.hosts.0: 'http://:9200'" in text
    assert "shipper.sinks.2.password_file: cannot read secret file" in text
    assert "shipper.sinks.3.directory: cannot create" in text
    assert len(problems) == 6


def test_check_passes_for_the_default(tmp_path: Path) -> None:
    """The default configuration has nothing to report on a writable machine."""
    assert check_shipper_config(ShipperConfig(),
                                SpoolConfig(directory=tmp_path / "spool")) == []
