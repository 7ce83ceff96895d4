"""A real Prometheus scrapes four simulators in dcgm-exporter compatibility mode (xid, hot,
mig, busy) and evaluates alert-style PromQL written against dcgm-exporter's names: the
series each expression returns are the ones a site's alerts would fire for.

Scenario time runs 60-600 times faster than wall time, so each story (an XID 79 and a
lost GPU at t=1800 s, a GPU climbing past 87 C) plays within seconds; every wait has a
deadline and waits on a condition, never on a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.sim.scenario import load_scenario
from tests.netutil import free_port, http_get
from tests.polling import wait_for

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v prometheus"], capture_output=True,
                   check=False).returncode != 0,
    reason="prometheus binary not installed (scripts/setup --test installs it)",
)

# scenario -> time scale: xid loses GPU 1 at t=1800 (3 s), hot's GPU 2 passes 87 C at
# about t=2100 (3.5 s); mig and busy only need their steady state.
SCENARIOS = {"xid": 600.0, "hot": 600.0, "mig": 60.0, "busy": 60.0}


def _exporter(tmp: Path, name: str, scale: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        f"exporter:\n  backend: sim\n  scenario: {name}\n  time_scale: {scale}\n"
        "  interval_seconds: 0.5\n  slow_interval_seconds: 1\n"
        "  compat: {dcgm_exporter: true}\n"
        f"spool:\n  directory: {tmp / ('spool-' + name)}\n  min_free_bytes: 0\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_audit_app.cli", "exporter", "--config", str(cfg),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp / f"{name}.log").open("wb"),
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return proc, f"127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus scraping one compat-mode simulator per scenario, job = scenario name."""
    tmp = tmp_path_factory.mktemp("compat")
    exporters = {name: _exporter(tmp, name, scale) for name, scale in SCENARIOS.items()}
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        for name, (_, target) in exporters.items():
            wait_for(lambda t=target: http_get(f"http://{t}/readyz")[0] == 200, 60,
                     f"{name} exporter /readyz")
        jobs = "".join(f"  - job_name: {name}\n    static_configs: [{{targets: ['{target}']}}]\n"
                       for name, (_, target) in exporters.items())
        cfg = tmp / "prometheus.yml"
        cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                       f"scrape_configs:\n{jobs}")
        port = free_port()
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, 60, "prometheus ready")
        wait_for(lambda: len(query(url, "up == 1")) == len(SCENARIOS), 60, "all targets up")
        yield url
    finally:
        if prometheus is not None:
            _stop(prometheus)
        for proc, _ in exporters.values():
            _stop(proc)


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{prom}/api/v1/query?query={urllib.parse.quote(expr)}")
    assert status == 200, body
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


def _value(result: list[dict[str, Any]]) -> float:
    """The value of a one-series result; 0 while it is empty."""
    return float(result[0]["value"][1]) if result else 0.0


def gpus(result: list[dict[str, Any]]) -> set[str]:
    return {r["metric"]["gpu"] for r in result}


def test_xid_79_of_the_lost_gpu_stays_and_fires(prom: str) -> None:
    """xid: after GPU 1 gets XID 79 and falls off the bus, `DCGM_FI_DEV_XID_ERRORS == 79`
    returns exactly GPU 1, with its UUID and model, while gpu_up says 0; `> 0` returns
    the three GPUs that had XIDs (13->79, 48, 31), never the clean GPU 0."""
    expr = 'DCGM_FI_DEV_XID_ERRORS{job="xid"} == 79'
    wait_for(lambda: bool(query(prom, 'gpu_up{job="xid"} == 0')), 60, "GPU 1 lost")
    wait_for(lambda: bool(query(prom, expr)), 30, "XID 79 visible")
    uuid1 = load_scenario("xid").gpus[1].info.uuid
    # Scraped again and again while the GPU is down: still there, still 79.
    wait_for(lambda: _value(query(prom, f"count_over_time(({expr})[5s:1s])")) >= 4, 30,
             "XID 79 kept over several scrapes")
    (fired,) = query(prom, expr)
    labels = fired["metric"]
    assert (labels["gpu"], labels["UUID"], labels["device"]) == ("1", uuid1, "nvidia1")
    assert labels["modelName"] == "NVIDIA A100-SXM4-80GB" and labels["Hostname"]
    assert gpus(query(prom, 'gpu_up{job="xid"} == 0')) == {"1"}
    assert gpus(query(prom, 'DCGM_FI_DEV_XID_ERRORS{job="xid"} > 0')) == {"1", "2", "3"}


def test_remap_pending_fires_for_the_gpu_with_the_double_bit_error(prom: str) -> None:
    """xid: GPU 2's XID 48 leaves a row remap pending: the pending alert returns GPU 2
    only, and the uncorrectable remapped rows went up on GPU 2 only."""
    expr = 'DCGM_FI_DEV_ROW_REMAP_PENDING{job="xid"} == 1'
    wait_for(lambda: bool(query(prom, expr)), 60, "remap pending")
    assert gpus(query(prom, expr)) == {"2"}
    assert gpus(query(prom, 'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{job="xid"} > 0')) == {"2"}
    assert gpus(query(prom, 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job="xid"} > 0')) == {"2"}


def test_thermal_violation_increasing_on_the_hot_gpu_only(prom: str) -> None:
    """hot: `increase(DCGM_FI_DEV_THERMAL_VIOLATION[5s]) > 0` returns GPU 2, the one
    that throttles, and no other; all four GPUs report the field."""
    expr = 'increase(DCGM_FI_DEV_THERMAL_VIOLATION{job="hot"}[5s]) > 0'
    wait_for(lambda: bool(query(prom, expr)), 60, "thermal violation increasing")
    assert gpus(query(prom, expr)) == {"2"}
    assert gpus(query(prom, 'DCGM_FI_DEV_THERMAL_VIOLATION{job="hot"}')) == {"0", "1", "2", "3"}
    reasons = query(prom, 'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{job="hot"} % 128 >= 32')
    assert gpus(reasons) == {"2"}  # the sw_thermal_slowdown bit (0x20)


def test_memory_used_over_total_per_gpu_and_per_mig_instance(prom: str) -> None:
    """busy and mig: `DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_TOTAL > 0.75` returns busy's
    four training GPUs and, on the MIG GPU, only instance 2 (30 GiB of its ~39 GiB),
    labelled GPU_I_ID/GPU_I_PROFILE and with the pod the simulated kubelet reports."""
    pod = 'DCGM_FI_DEV_FB_USED{job="mig",GPU_I_ID="2",pod!=""}'
    wait_for(lambda: bool(query(prom, pod)), 60, "MIG instance with its pod")
    wait_for(lambda: len(query(prom, 'DCGM_FI_DEV_FB_TOTAL{job="busy"}')) == 4, 60, "busy")
    result = query(prom, 'DCGM_FI_DEV_FB_USED{job=~"busy|mig"}'
                         ' / DCGM_FI_DEV_FB_TOTAL{job=~"busy|mig"} > 0.75')
    got = {(r["metric"]["job"], r["metric"]["gpu"], r["metric"].get("GPU_I_ID"),
            r["metric"].get("GPU_I_PROFILE"), r["metric"].get("pod")) for r in result}
    assert got == {("busy", "0", None, None, None), ("busy", "1", None, None, None),
                   ("busy", "2", None, None, "triton-search-0"),
                   ("busy", "3", None, None, None),
                   ("mig", "0", "2", "3g.40gb", "train-fd-12-0")}
    instances = query(prom, 'DCGM_FI_DEV_FB_USED{job="mig",gpu="0"}')
    assert {r["metric"]["GPU_I_ID"] for r in instances} == {"2", "3", "4"}


def test_busy_dashboards_group_by_model_and_see_profiling_and_pods(prom: str) -> None:
    """busy: a by-modelName aggregation sees the four H100s, the DCGM profiling fields
    have data, and the Kubernetes inference pod's GPU carries pod/namespace/container."""
    expr = 'count by (modelName) (DCGM_FI_DEV_GPU_TEMP{job="busy"})'
    wait_for(lambda: bool(query(prom, expr)), 60, "busy temperatures")
    (row,) = query(prom, expr)
    assert row["metric"] == {"modelName": "NVIDIA H100 80GB HBM3"} and row["value"][1] == "4"
    assert gpus(query(prom, 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{job="busy"} > 0.3')) == {
        "0", "1", "2", "3"}
    pods = query(prom, 'DCGM_FI_DEV_GPU_UTIL{job="busy",pod!=""}')
    assert [(r["metric"]["gpu"], r["metric"]["namespace"], r["metric"]["pod"],
             r["metric"]["container"]) for r in pods] == [
        ("2", "serving", "triton-search-0", "tritonserver")]


# NVIDIA's DCGM dashboard (12239): each panel's query as it reads the compat names (its
# $Hostname/$gpu filters replaced by the scrape job). Titles as compat lists them.
NVIDIA_PANEL_QUERIES = {
    "GPU Temperature": 'max(DCGM_FI_DEV_GPU_TEMP{{job="{job}"}}) by (Hostname, gpu, UUID)',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{{job="{job}"}})',
    "GPU Power Usage": 'max(DCGM_FI_DEV_POWER_USAGE{{job="{job}"}}) by (Hostname, gpu, UUID)',
    "GPU Power Total": 'sum(max(DCGM_FI_DEV_POWER_USAGE{{job="{job}"}}) by (gpu))',
    "GPU SM Clocks": 'max(DCGM_FI_DEV_SM_CLOCK{{job="{job}"}} * 1000000) by (Hostname, UUID, gpu)',
    "GPU Utilization": 'max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{job="{job}"}})'
                       ' by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
    "Tensor Core Utilization": 'max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{job="{job}"}})'
                               ' by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
    "GPU Framebuffer Mem Used": 'max(DCGM_FI_DEV_FB_USED{{job="{job}"}})'
                                ' by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
}


def test_nvidia_dashboard_on_mig_has_every_panel_and_without_dcgm_only_profiling_is_empty(
        prom: str) -> None:
    """mig (simulated DCGM): all eight panels of NVIDIA's dashboard have data, its
    utilisation and tensor panels one line per GPU instance of the MIG GPU plus the whole
    GPU 1. hot (no DCGM): exactly the panels docs/METRICS.md lists as needing DCGM
    profiling are empty; nothing stands in for the missing measurements."""
    from exporter.exposition.compat import NVIDIA_DASHBOARD_PANELS, needs_profiling

    assert list(NVIDIA_PANEL_QUERIES) == [title for title, _ in NVIDIA_DASHBOARD_PANELS]
    profiling = {title for title, name in NVIDIA_DASHBOARD_PANELS if needs_profiling(name)}
    assert profiling == {"GPU Utilization", "Tensor Core Utilization"}
    engine = NVIDIA_PANEL_QUERIES["GPU Utilization"].format(job="mig")
    wait_for(lambda: len(query(prom, engine)) == 4, 60, "per-instance engine activity")
    for title, expr in NVIDIA_PANEL_QUERIES.items():
        assert query(prom, expr.format(job="mig")), title
    for title in profiling:
        rows = query(prom, NVIDIA_PANEL_QUERIES[title].format(job="mig"))
        assert {(r["metric"]["gpu"], r["metric"].get("GPU_I_ID")) for r in rows} == {
            ("0", "2"), ("0", "3"), ("0", "4"), ("1", None)}, title
    wait_for(lambda: bool(query(prom, NVIDIA_PANEL_QUERIES["GPU Temperature"].format(
        job="hot"))), 60, "hot scraped")
    empty = {title for title, expr in NVIDIA_PANEL_QUERIES.items()
             if not query(prom, expr.format(job="hot"))}
    assert empty == profiling
    metrics_md = (Path(__file__).resolve().parents[2] / "docs" / "METRICS.md").read_text()
    for title in profiling:
        assert f"| {title} | " in metrics_md and "| yes |" in metrics_md
