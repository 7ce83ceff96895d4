"""The one shape every sink has: send a batch, get an outcome per record.

A sink never decides to drop data. It classifies each record of a batch:
- DELIVERED: the backend holds it (a 409 "already exists" on an idempotent create counts);
- RETRY: transient (429, 5xx, timeout, connection reset): send this record again later;
- DEAD_LETTER: the backend rejected this record for good (e.g. a mapping error): it goes
  to the sink's dead-letter file with the reason;
- HOLD: a configuration or auth problem (401, 403, missing index/bucket): keep the data,
  raise the alert metric, try again later; never dropped.
The shipper engine owns batching, backoff, cursors and counting; sinks own the wire.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_audit.errors import GpuAuditError


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class SinkRecord:
    """One audit record as read from the spool."""

    offset: int  # spool offset: unique and increasing within the spool
    record_id: str  # deterministic id from the record itself
    doc: Mapping[str, Any]  # the decoded record (the audit schema)
    raw: bytes  # the exact bytes stored in the spool (JSON)


@dataclass(frozen=True, slots=True)
class ItemResult:
    outcome: Outcome
    reason: str = ""
    retry_after: float | None = None  # seconds the server asked us to wait, if it did
    # How many times this one send() call put the record on the wire: more than 1 when the
    # sink had to send it again itself (a bisected partial write, a split 413), 0 when it
    # never left (an encoding error). The worker counts every extra send as redelivered.
    sends: int = 1


class SinkError(GpuAuditError):
    """A whole-batch failure, classified like an item outcome."""

    def __init__(self, outcome: Outcome, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason
        self.retry_after = retry_after


class Sink(Protocol):
    name: str  # unique per configured sink; also the cursor name
    kind: str  # "elasticsearch", "opensearch", "influxdb_v1", "influxdb_v2", "fluentd", "archive"

    def start(self) -> None:
        """Prepare the backend (index template, ...). Raises SinkError (RETRY or HOLD)."""
        ...

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        """Deliver a batch. Returns one result per record, in order.

        May raise SinkError for a whole-batch failure (connection refused, 503, 401).
        Sending the same record twice must not store it twice (idempotent by record_id).
        """
        ...

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        """The records the backend holds with time in [start_ns, end_ns), for verify."""
        ...

    def close(self) -> None: ...
