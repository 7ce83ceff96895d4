"""The shipper's exposition passes `promtool check metrics`, and the dead-letter file
holds each rejected record exactly once, even across a torn write."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_audit.spool import SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.deadletter import DeadLetter, DeadLetterFile
from shipper.engine import Shipper
from tests.polling import wait_for
from tests.shipper.conftest import produce
from tests.shipper.memsinks import MemorySink


def test_exposition_passes_promtool(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """Every shipper metric family is valid for Prometheus (names, units, types, HELP)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    produce(writer, 0, 20)
    sink = MemorySink("a")
    shipper = Shipper(fast_config, spool_config, writer=writer, sinks=[sink])
    shipper.start()
    try:
        wait_for(lambda: sink.count() == 20, what="delivered")
        reg = CollectorRegistry()
        reg.register(shipper.collector())
        text = generate_latest(reg)
    finally:
        shipper.stop(5)
    for name in (b"gpu_audit_shipper_records_delivered_total", b"gpu_audit_spool_full",
                 b"gpu_audit_shipper_batch_duration_seconds_bucket",
                 b"gpu_audit_shipper_conservation_ok", b"gpu_audit_records_produced_total"):
        assert name in text
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                         check=False)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()


def test_dead_letter_file_dedupes_by_offset_and_survives_a_torn_line(tmp_path: Path) -> None:
    """A replayed dead letter is not written twice, and a torn last line left by a crash
    is terminated so later entries stay parseable."""
    dl = DeadLetterFile(tmp_path, "es")
    letter = DeadLetter(offset=5, record_id="r5", reason="400", raw=b'{"id":"r5"}',
                        doc={"id": "r5"})
    assert dl.write([letter], 1) == 1
    assert dl.write([letter], 2) == 0
    with dl.path.open("ab") as fh:
        fh.write(b'{"sink":"es","offset":6,"rea')  # a crash in the middle of a line
    again = DeadLetterFile(tmp_path, "es")
    assert again.count == 1
    assert again.write([DeadLetter(6, "r6", "400", b"x", None)], 3) == 1
    lines = dl.path.read_bytes().splitlines()
    parsed = []
    for line in lines:
        try:
            parsed.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    assert [e["offset"] for e in parsed] == [5, 6]
    assert parsed[1]["raw_b64"] == "eA=="
