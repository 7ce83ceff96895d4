"""One real Slurm cluster per test session (tests/slurm/cluster.py), and one gpu-audit
exporter per node playing that node's simulated GPUs with the host's real processes on
them (exporter/sim/hostprocs.py).

Every test here runs against the real daemons: there is no fake sbatch, scontrol or
sacct. They need root (munge, mknod, useradd, daemons as root) and the Slurm, munge and
MariaDB packages (`scripts/setup --test` installs them); without them they skip with the
reason.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.netutil import bound_port, http_get
from tests.polling import wait_for
from tests.promstack import Prometheus, prometheus
from tests.slurm.cluster import (
    GPUS_PER_NODE,
    NODES,
    REPO,
    ClusterError,
    SlurmCluster,
    gpu_uuid,
    missing_binaries,
)
from tests.slurm.jobenv import JobEnv, make_jobenv

# the exporters' audit interval (schema-3 usage records): a record dated at an interval's
# end holds the seconds before it
TRAIL_INTERVAL_S = 5
# the exporters' sampling interval
SAMPLE_INTERVAL_S = 1


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """The cluster: munge, MariaDB + slurmdbd, slurmctld, slurmd n1 and n2."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests need root (munge key, mknod, useradd, daemons)")
    missing = missing_binaries()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/setup --test installs "
                    "slurmd slurmctld slurm-client munge slurmdbd mariadb-server)")
    root = Path(tempfile.mkdtemp(prefix="gpu-audit-slurm-", dir="/tmp"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except PermissionError as exc:
        shutil.rmtree(root, ignore_errors=True)
        if exc.errno == errno.EPERM:
            pytest.skip(f"cannot create the simulated GPUs' device nodes here: {exc}")
        raise
    except ClusterError:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
        if os.environ.get("GPU_AUDIT_KEEP_SLURM") == "1":
            print(f"kept the test cluster's files in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def jobenv(slurm: SlurmCluster) -> JobEnv:
    return make_jobenv(slurm)


@dataclass
class NodeExporter:
    """`gpu-audit run --backend sim` for one node: its GPUs, its job-mapping directory,
    its spool and archive, its live events file."""

    name: str
    url: str
    spool: Path
    archive: Path
    events: Path
    config: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def metrics(self) -> str:
        status, body = http_get(f"{self.url}/metrics")
        assert status == 200, (status, body[:300])
        return body.decode()

    def inject(self, **event: object) -> None:
        with self.events.open("a") as fh:
            fh.write(json.dumps(event) + "\n")

    @property
    def target(self) -> str:
        return self.url.removeprefix("http://")

    def stop(self) -> None:
        (self.config.parent / "exporter.url").unlink(missing_ok=True)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _start_node(cluster: SlurmCluster, node: str) -> NodeExporter:
    base = cluster.root / "nodes" / node
    base.mkdir(parents=True)
    events = base / "events.jsonl"
    events.touch()
    scenario = {
        "name": f"slurm-{node}",
        "description": f"test cluster node {node}: its jobs' real processes on 2 simulated GPUs",
        "gpus": [{"count": GPUS_PER_NODE, "model": "NVIDIA A100-SXM4-80GB",
                  "memory_total": "80GiB",
                  "uuids": [gpu_uuid(node, i) for i in range(GPUS_PER_NODE)]}],
        "host": {"devices": [str(cluster.device(node, i)) for i in range(GPUS_PER_NODE)],
                 "memory": "4GiB", "util": 0.6, "events_file": str(events)},
    }
    (base / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    config = {
        "host": node,
        "exporter": {"listen": "127.0.0.1:0", "backend": "sim",
                     "scenario": str(base / "scenario.yaml"),
                     "interval_seconds": SAMPLE_INTERVAL_S,
                     "log_summary_interval_seconds": 0},
        "attribution": {"jobmap_dir": str(cluster.jobmap_dir(node))},
        # the interval trail (schema 3) as a site runs it, at a short interval so the
        # epilog's wait for the run's last interval stays short
        "audit": {"interval_seconds": TRAIL_INTERVAL_S},
        "spool": {"directory": str(base / "spool")},
    }
    (base / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    log = base / "exporter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "run", "--config", str(base / "config.yaml"),
             "--log-level", "info"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    port = bound_port(log, proc, timeout=60)
    node_exp = NodeExporter(node, f"http://127.0.0.1:{port}", base / "spool", base / "archive",
                            events, base / "config.yaml", proc, log)
    wait_for(lambda: http_get(f"{node_exp.url}/readyz")[0] == 200, 60, f"exporter {node} ready")
    # for the node's health check (tests/slurm/config.py hooks)
    (base / "exporter.url").write_text(node_exp.url)
    return node_exp


@pytest.fixture(scope="session")
def nodes(slurm: SlurmCluster) -> Iterator[dict[str, NodeExporter]]:
    started: dict[str, NodeExporter] = {}
    try:
        for node in NODES:
            started[node] = _start_node(slurm, node)
        yield started
    finally:
        for n in started.values():
            n.stop()


@pytest.fixture(scope="session")
def prom(slurm: SlurmCluster, nodes: dict[str, NodeExporter]) -> Iterator[Prometheus]:
    """A real Prometheus scraping both nodes' exporters every second, with the alerting and
    recording rules rendered from alerts/params/fast.yaml (simulated series included)."""
    rules = slurm.root / "rules"
    done = subprocess.run([sys.executable, "-m", "gpu_audit_app", "rules", "render", "--params",
                           str(REPO / "alerts" / "params" / "fast.yaml"), "--out", str(rules)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    with prometheus(slurm.root, [n.target for n in nodes.values()],
                    rule_files=sorted(rules.glob("*.yaml"))) as p:
        wait_for(lambda: len(p.query('up{job="gpu-audit"} == 1')) == len(nodes), 60,
                 "Prometheus scraping both exporters")
        yield p
