"""Every series made from simulated data says so: under the simulator each per-GPU,
per-process, unattributed, allocation and dcgm-compat sample carries simulated="true"
(the README, the start-up log and the no-GPU hint promise it; before, only gpu_info
did: 908 of 912 samples of a busy scenario did not). gpu-audit's own metrics
(gpu_audit_*) describe gpu-audit, not the GPUs, and carry no such label. Real data
carries no `simulated` label except gpu_info's simulated="false", so
`{simulated!="true"}` selects exactly the real series."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition.render import RenderOptions, render_snapshot
from gpu_audit.model.samples import BackendInfo
from tests.exporter.exposition.snapshots import small_snapshot

OPTS = [RenderOptions(), RenderOptions(dcgm_compat=True), RenderOptions(pid_label=True)]


def _samples(body: bytes) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, dict(s.labels)) for f in text_string_to_metric_families(body.decode())
            for s in f.samples]


@pytest.mark.parametrize("opts", OPTS)
def test_every_simulated_series_carries_simulated_true(opts: RenderOptions) -> None:
    """Simulated snapshot: every sample except the gpu_audit_* self-metrics has
    simulated="true"; the self-metrics have no simulated label."""
    snap = small_snapshot()
    assert snap.backend.simulated
    samples = _samples(render_snapshot(snap, opts, now=0.0).body)
    data = [(n, lb) for n, lb in samples if not n.startswith("gpu_audit_")]
    assert len(data) > 50
    missing = sorted({n for n, lb in data if lb.get("simulated") != "true"})
    assert missing == []
    assert all("simulated" not in lb for n, lb in samples if n.startswith("gpu_audit_"))


@pytest.mark.parametrize("opts", OPTS)
def test_real_series_carry_no_simulated_label_but_gpu_info(opts: RenderOptions) -> None:
    """Real backend: the exposition is unchanged (no simulated label), except gpu_info
    which always says simulated="false"; so {simulated!="true"} keeps every real series."""
    snap = dataclasses.replace(small_snapshot(), backend=BackendInfo(name="nvml"))
    samples = _samples(render_snapshot(snap, opts, now=0.0).body)
    labelled = {(n, lb["simulated"]) for n, lb in samples if "simulated" in lb}
    assert labelled == {("gpu_info", "false")}
