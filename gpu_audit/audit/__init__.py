"""The audit trail: records built from snapshots, hash-chained, spooled and verified.

- builder: Snapshot -> record dicts (pure), through the record kinds usage and events
  and the parts cache (parts); interval: the interval trail's records (holders: the
  bill's per-sample rules); accounting: GPU-seconds and energy;
- canonical: the bytes, ids and hash chain; schema: the published JSON Schema;
- producer: AuditProducer (chain + group commit to the spool); metrics: AuditCollector;
- verify: `audit verify` over JSON Lines, spool directories and sink read-backs.

The format is documented in docs/AUDIT.md.
"""

from typing import TYPE_CHECKING, Any

from gpu_audit.audit.builder import PartsCache, build_records, exporter_event
from gpu_audit.audit.canonical import SCHEMA_ID, ZERO_HASH, load_hmac_key
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.metrics import AuditCollector
from gpu_audit.audit.producer import AuditProducer

if TYPE_CHECKING:
    from gpu_audit.audit.verify import (
        Problem,
        VerifyReport,
        verify_jsonl,
        verify_readback,
        verify_records,
        verify_spool,
        verify_spool_dir,
    )

# verify (and the archive reader it needs) loads on first use: the exporter, which
# imports this package for the producer, never verifies (RSS it would keep).
_VERIFY = frozenset({"Problem", "VerifyReport", "verify_jsonl", "verify_readback",
                     "verify_records", "verify_spool", "verify_spool_dir"})


def __getattr__(name: str) -> Any:
    if name in _VERIFY:
        from gpu_audit.audit import verify  # noqa: PLC0415

        return getattr(verify, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMA_ID",
    "ZERO_HASH",
    "AuditCollector",
    "AuditConfig",
    "AuditProducer",
    "PartsCache",
    "Problem",
    "VerifyReport",
    "build_records",
    "exporter_event",
    "load_hmac_key",
    "verify_jsonl",
    "verify_readback",
    "verify_records",
    "verify_spool",
    "verify_spool_dir",
]
