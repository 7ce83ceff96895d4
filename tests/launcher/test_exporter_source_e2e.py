"""ExporterStatusSource against a real exporter process (the simulator backend behind the
real HTTP endpoint): the launcher reads what the exporter publishes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.app import ExporterApp
from gpu_audit_app.config import Config
from gpu_audit_app.run import exporter_app
from launcher.gpustate import ExporterStatusSource
from tests.polling import wait_for


@pytest.fixture
def app(tmp_path: Path) -> Iterator[ExporterApp]:
    config = Config.model_validate({
        "exporter": {"backend": "sim", "scenario": "busy", "interval_seconds": 0.05,
                     "listen": "127.0.0.1:0", "process_pid_label": True},
        "spool": {"directory": str(tmp_path / "spool"), "min_free_bytes": 0},
    })
    running = exporter_app(config, with_shipper=False)
    running.start()
    yield running
    running.stop()


@pytest.mark.timeout(60)
def test_reads_gpus_memory_and_processes_from_a_running_exporter(app: ExporterApp) -> None:
    assert app.server is not None
    source = ExporterStatusSource(f"http://127.0.0.1:{app.server.port}")

    def measured() -> bool:
        gpus = source.read(0.0)
        return bool(gpus) and all(g.memory_total_bytes > 0 for g in gpus)

    wait_for(measured, 30, "the exporter to publish GPU memory")
    gpus = source.read(0.0)
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert all(g.uuid.startswith("GPU-") and g.up and g.pci_bus_id for g in gpus)
    assert all(0 <= g.memory_used_bytes <= g.memory_total_bytes for g in gpus)
    assert all(g.temperature_c is not None for g in gpus)
    assert any(g.processes for g in gpus)  # per-pid series with process_pid_label
    for g in gpus:
        assert all(pid > 0 and used >= 0 for pid, used in g.processes)
