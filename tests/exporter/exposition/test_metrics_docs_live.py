"""docs/METRICS.md lists every metric a live `gpu-audit run` serves, and nothing that is
not declared in code.

A real `gpu-audit run --backend sim` (exporter, audit producer, spool and shipper with an
archive sink, in one process) is scraped until the shipper's per-sink series appear;
every family it serves must be in docs/METRICS.md, every self-metric it serves must have
the type and HELP of its declaration in gpu_audit/selfmetrics.py (the collectors take
them from there), and every name in docs/METRICS.md must be declared in a catalogue.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition.compat import COMPAT_NAMES
from exporter.exposition.families import FAMILIES
from gpu_audit.model.fields import CATALOGUE
from gpu_audit.selfmetrics import SELF_METRICS
from tests.netutil import bound_port, http_get
from tests.polling import wait_for

DOC = Path(__file__).resolve().parents[3] / "docs" / "METRICS.md"
_DOC_NAME = re.compile(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)` \|", re.MULTILINE)


_DCGM_NAME = re.compile(r"`(DCGM_[A-Z0-9_]+)` \((?:x|/)")  # "`NAME` (x100)"


def _documented() -> set[str]:
    """The first column of every metric table, and the dcgm-exporter names."""
    text = DOC.read_text(encoding="utf-8")
    return set(_DOC_NAME.findall(text)) | set(_DCGM_NAME.findall(text))


def _declared() -> set[str]:
    return ({m.name for m in CATALOGUE} | set(COMPAT_NAMES)
            | {f.name for f in FAMILIES} | {m.name for m in SELF_METRICS})


def _families(body: str) -> dict[str, tuple[str, str]]:
    """name -> (type, help) of every family in an exposition."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, re.MULTILINE))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", body, re.MULTILINE))
    return {name: (t, helps.get(name, "")) for name, t in types.items()}


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One /metrics body of a live `gpu-audit run --backend sim` with an archive sink."""
    tmp = tmp_path_factory.mktemp("live")
    cfg = tmp / "gpu-audit.yaml"
    cfg.write_text(
        "exporter:\n  backend: sim\n  scenario: busy\n  time_scale: 60\n"
        "  interval_seconds: 0.2\n"
        f"spool:\n  directory: {tmp / 'spool'}\n  min_free_bytes: 0\n"
        "shipper:\n  batch_max_wait_s: 0.1\n"
        f"  sinks:\n    - type: archive\n      directory: {tmp / 'archive'}\n"
    )
    log = tmp / "run.log"
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "run", "--config", str(cfg),
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=err,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    port = bound_port(log, proc)
    url = f"http://127.0.0.1:{port}/metrics"
    body = b""

    def shipped() -> bool:
        nonlocal body
        status, body = http_get(url)
        # the archive sink has delivered, and the audit producer has written
        return (status == 200 and b'gpu_audit_shipper_records_delivered_total{sink="archive"}'
                in body and b"gpu_audit_records_written_total" in body
                and b"gpu_process_memory_used_bytes" in body)

    try:
        wait_for(shipped, 60, "the shipper's metrics on a live gpu-audit run")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return body.decode()


@pytest.fixture(scope="module")
def served(scrape: str) -> dict[str, tuple[str, str]]:
    return _families(scrape)


def test_every_served_family_is_documented(served: dict[str, tuple[str, str]]) -> None:
    """No family served by a live `gpu-audit run` is missing from docs/METRICS.md (v1
    of the docs missed all 27 self-metrics of sampler, producer, spool and shipper)."""
    missing = sorted(set(served) - _documented())
    assert missing == [], f"served but not in docs/METRICS.md: {missing}"
    assert sum(1 for n in served if n.startswith("gpu_audit_")) >= 30


def test_served_self_metrics_match_their_declaration(
        served: dict[str, tuple[str, str]]) -> None:
    """Every gpu_audit_* family served is declared in gpu_audit/selfmetrics.py with the
    type and HELP it is served with: the collectors take them from the catalogue."""
    declared = {m.name: m for m in SELF_METRICS}
    for name, (type_, help_) in served.items():
        if not name.startswith("gpu_audit_"):
            continue
        assert name in declared, f"{name} is served but not declared"
        m = declared[name]
        assert (type_, help_) == (m.type, m.full_help.replace("\\", "\\\\")), name


def test_every_documented_name_is_declared() -> None:
    """docs/METRICS.md names no metric that is not declared in a catalogue (the per-GPU
    catalogue, the fixed families, their dcgm-exporter names, the self-metrics)."""
    assert sorted(_documented() - _declared()) == []
    assert sorted(_declared() - _documented()) == []


def test_live_simulated_series_all_say_simulated(scrape: str) -> None:
    """On a live simulator run every sample except gpu-audit's own carries
    simulated="true" (before: 4 of 912 did, the gpu_info ones)."""
    data = [(s.name, s.labels) for f in text_string_to_metric_families(scrape)
            for s in f.samples if not s.name.startswith("gpu_audit_")]
    assert len(data) > 100
    assert sorted({n for n, lb in data if lb.get("simulated") != "true"}) == []
