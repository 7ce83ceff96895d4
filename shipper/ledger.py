"""The per-sink delivery ledger: how the records below a sink's cursor ended, persisted.

`<spool>/shipper/<sink>.ledger.json` holds `{"cursor", "delivered", "dead_lettered",
"dropped": {reason: n}}`: every record below `cursor` ended in exactly one of those
counts. It is written (atomically: temp file, fsync, rename, directory fsync) just
BEFORE the sink's cursor is committed in the spool's CursorStore, so after any crash the
ledger's cursor is at or ahead of the committed one. Records between the two are re-sent
on restart (idempotent sinks absorb them) but are not counted a second time.

This is what makes the conservation check (produced = delivered + dead-lettered +
dropped + pending) a statement about persisted facts that survives restarts. A ledger
behind the committed cursor (lost or edited file) makes the check fail; it is never
"repaired" by guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson

from gpu_audit import atomicfile


@dataclass
class LedgerState:
    cursor: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def accounted(self) -> int:
        """Records with a final outcome: delivered + dead-lettered + dropped."""
        return self.delivered + self.dead_lettered + sum(self.dropped.values())


class Ledger:
    def __init__(self, directory: Path, sink: str) -> None:
        self.path = directory / f"{sink}.ledger.json"
        directory.mkdir(parents=True, exist_ok=True)

    def load(self) -> LedgerState | None:
        """The persisted state, or None when there is none (or it is unreadable)."""
        try:
            data = orjson.loads(self.path.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None
        try:
            return LedgerState(
                cursor=int(data["cursor"]),
                delivered=int(data["delivered"]),
                dead_lettered=int(data["dead_lettered"]),
                dropped={str(k): int(v) for k, v in dict(data["dropped"]).items()},
            )
        except (KeyError, TypeError, ValueError):
            return None

    def save(self, state: LedgerState) -> None:
        payload = orjson.dumps(
            {
                "cursor": state.cursor,
                "delivered": state.delivered,
                "dead_lettered": state.dead_lettered,
                "dropped": state.dropped,
            }
        )
        atomicfile.replace_file(self.path, payload)
