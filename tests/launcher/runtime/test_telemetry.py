"""The launcher's Prometheus families: job telemetry with identity, preemption latencies."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from launcher.telemetry import FAMILIES, Telemetry


def _exposition() -> bytes:
    t = Telemetry()
    t.job_started(3, "train", "alice", "vision", 2)
    t.job_event(3, {"event": "metrics", "step": 40, "loss": 0.25, "acc": 0.9, "bad name": 1,
                    "note": "text"})
    t.job_event(3, {"event": "checkpoint_committed", "step": 40, "time": 1.0})
    t.job_event(3, {"event": "anomaly", "step": 41})
    t.set_states({"running": 1, "queued": 2})
    t.decision("start")
    t.preemption("checkpointed", 0.3, 0.05, 12.5)
    reg = CollectorRegistry()
    reg.register(t)
    return generate_latest(reg)


def test_job_metrics_carry_identity_and_values() -> None:
    """step, loss and user metrics are labelled with job, name, user, project, attempt;
    names that are not metric names and non-numbers are dropped."""
    fams = {f.name: f for f in text_string_to_metric_families(_exposition().decode())}
    labels = {"job": "3", "name": "train", "user": "alice", "project": "vision",
              "attempt": "2"}
    (step,) = fams["gpu_audit_launcher_job_step"].samples
    assert step.labels == labels and step.value == 40
    (loss,) = fams["gpu_audit_launcher_job_loss"].samples
    assert loss.value == 0.25
    metrics = {s.labels["metric"]: s.value for s in fams["gpu_audit_launcher_job_metric"].samples}
    assert metrics == {"acc": 0.9}
    lost = fams["gpu_audit_launcher_lost_gpu_seconds"].samples[0]
    assert lost.value == 12.5
    s2c = {s.labels.get("le"): s.value
           for s in fams["gpu_audit_launcher_preempt_signal_to_commit_seconds"].samples
           if s.name.endswith("_bucket")}
    assert (s2c["0.25"], s2c["0.5"], s2c["+Inf"]) == (0, 1, 1)
    served = {f.name for f in text_string_to_metric_families(_exposition().decode())}
    declared = {n.removesuffix("_total") for n in FAMILIES}
    assert served == declared, "a served family is missing from the catalogue or vice versa"


def test_job_series_go_when_the_attempt_ends() -> None:
    t = Telemetry()
    t.job_started(1, "a", "u", "p", 1)
    t.job_event(1, {"event": "metrics", "step": 1, "loss": 2.0})
    t.job_ended(1)
    reg = CollectorRegistry()
    reg.register(t)
    assert b"gpu_audit_launcher_job_step{" not in generate_latest(reg)


def test_promtool_accepts_the_exposition() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/setup --test installs it)")
    r = subprocess.run([promtool, "check", "metrics"], input=_exposition(),
                       capture_output=True, timeout=30, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_metrics_endpoint_is_the_projects_server_with_basic_auth(tmp_path: Path) -> None:
    """metrics_listen serves through gpu_audit.http (limits, TLS, basic auth): with a
    web-config file, a scrape without credentials is refused and one with them served."""
    import base64
    import urllib.request

    import bcrypt
    import yaml

    from gpu_audit_app.launcher.main import LauncherConfig, _build
    from tests.netutil import free_port, http_get

    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {
        "prom": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()}}))
    port = free_port()
    _build(LauncherConfig(state_dir=tmp_path / "state", gpus="sim:1", jobmap_dir=None,
                          metrics_listen=f"127.0.0.1:{port}", web_config_file=web))
    url = f"http://127.0.0.1:{port}/metrics"
    assert http_get(url)[0] == 401
    req = urllib.request.Request(url, headers={
        "Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
        assert b"gpu_audit_launcher_" in resp.read()
