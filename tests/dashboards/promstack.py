"""A real Prometheus scraping several `gpu-audit` simulators on loopback, with recording
rules loaded: the stack the dashboard end-to-end test queries (Prometheus itself is
started by tests.promstack, shared with the alerts' end-to-end test).

Each scenario runs in its own exporter process on its own port, so each is a node
(`instance`) of one fleet. Scrape config uses `honor_labels: true` so the exporter's own
`job` label (the GPU job) is kept instead of being renamed `exported_job` by the scrape
job's; `up` still carries the scrape job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.netutil import free_port, http_get
from tests.polling import wait_for
from tests.promstack import prometheus, stop


@dataclass
class Stack:
    prometheus: str
    nodes: dict[str, str]  # node (the scenario's name, or "<scenario>-exporter") -> instance

    def api(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        status, body = http_get(f"{self.prometheus}/api/v1/{path}?{query}", timeout=30)
        payload = json.loads(body) if body else {"status": "error", "error": f"HTTP {status}"}
        if payload.get("status") != "success":
            raise PromError(payload.get("errorType", ""), payload.get("error", str(status)))
        return payload["data"]


class PromError(Exception):
    pass


def _exporter(tmp: Path, scenario: str, command: str, spool_bytes: int | None,
              node: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    root = tmp / (node or scenario)
    root.mkdir()
    cfg = root / "gpu-audit.yaml"
    limit = (f"  max_bytes: {spool_bytes}\n  segment_bytes: {spool_bytes // 4}\n"
             if spool_bytes else "")
    cfg.write_text(
        f"exporter:\n  backend: sim\n  scenario: {scenario}\n  time_scale: 60\n"
        f"  interval_seconds: 1.0\n  listen: 127.0.0.1:{port}\n"
        f"spool:\n  directory: {root / 'spool'}\n  min_free_bytes: 0\n{limit}"
        f"shipper:\n  sinks:\n    - type: archive\n      directory: {root / 'archive'}\n"
    )
    proc = subprocess.Popen([sys.executable, "-m", "gpu_audit_app", command, "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=(root / "log.txt").open("wb"),
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return proc, f"127.0.0.1:{port}"


@contextmanager
def prometheus_stack(tmp: Path, scenarios: Sequence[str], rule_files: Sequence[Path],
                     run_scenario: str | None = None, full_spool: str | None = None, *,
                     exporter_only: Sequence[str] = ()) -> Iterator[Stack]:
    """Exporters for `scenarios` (`run_scenario` as `gpu-audit run`, so the shipper's
    metrics are served too; `full_spool` with a spool small enough to fill within
    seconds, so refused records are counted), one more `gpu-audit exporter` node per
    scenario of `exporter_only` (named "<scenario>-exporter"), and one Prometheus
    scraping them every second."""
    with ExitStack() as stack:
        nodes: dict[str, str] = {}
        plan = [(s, s, "run" if s == run_scenario else "exporter") for s in scenarios]
        plan += [(f"{s}-exporter", s, "exporter") for s in exporter_only]
        for node, scenario, command in plan:
            proc, target = _exporter(tmp, scenario, command,
                                     64 * 1024 if node == full_spool else None, node)
            stack.callback(stop, proc)
            nodes[node] = target
        for target in nodes.values():
            wait_for(lambda t=target: http_get(f"http://{t}/readyz")[0] == 200, 60,  # type: ignore[misc]
                     f"exporter {target} ready")
        prom = stack.enter_context(prometheus(tmp, list(nodes.values()), rule_files))
        yield Stack(prom.url, nodes)
