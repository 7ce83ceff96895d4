"""What the daemon's socket loop counts: connections open, bytes held, requests answered,
refusals, drops and accept errors, served as the `gpu_audit_launcher_*` self-metrics
declared in gpu_audit/selfmetrics.py (docs/METRICS.md).

The loop updates a `LoopStats`; scrapes read it from the metrics server's thread (a lock
between them). Families are built fresh on every collect. This module must never do I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpu_audit import selfmetrics as sm


class LoopStats(Collector):
    """Counters and gauges of launcher.connections, and their Prometheus families."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.connections = 0
        self.buffered = 0
        self.read_pauses = 0
        self._requests: dict[tuple[str, str], int] = {}
        self._refused: dict[str, int] = {}
        self._dropped: dict[str, int] = {}
        self._accept_errors: dict[str, int] = {}

    def gauges(self, connections: int, buffered: int) -> None:
        with self._lock:
            self.connections, self.buffered = connections, buffered

    def request(self, op: str, outcome: str) -> None:
        with self._lock:
            key = (op, outcome)
            self._requests[key] = self._requests.get(key, 0) + 1

    def refused(self, reason: str) -> None:
        with self._lock:
            self._refused[reason] = self._refused.get(reason, 0) + 1

    def dropped(self, reason: str) -> None:
        with self._lock:
            self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def accept_error(self, name: str) -> None:
        with self._lock:
            self._accept_errors[name] = self._accept_errors.get(name, 0) + 1

    def paused(self) -> None:
        with self._lock:
            self.read_pauses += 1

    def count(self, kind: str, key: str) -> int:
        """One counter's value (tests, bench): kind refused, dropped or accept_errors."""
        with self._lock:
            table = {"refused": self._refused, "dropped": self._dropped,
                     "accept_errors": self._accept_errors}[kind]
            return table.get(key, 0)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield sm.LAUNCHER_CONNECTIONS.gauge(value=self.connections)
            yield sm.LAUNCHER_BUFFERED.gauge(value=self.buffered)
            requests = sm.LAUNCHER_REQUESTS.counter()
            for (op, outcome), n in sorted(self._requests.items()):
                requests.add_metric([op, outcome], n)
            yield requests
            for metric, table in ((sm.LAUNCHER_REFUSED, self._refused),
                                  (sm.LAUNCHER_DROPPED, self._dropped),
                                  (sm.LAUNCHER_ACCEPT_ERRORS, self._accept_errors)):
                family = metric.counter()
                for key, n in sorted(table.items()):
                    family.add_metric([key], n)
                yield family
            yield sm.LAUNCHER_READ_PAUSES.counter(value=self.read_pauses)
