"""The spool as the audit producer and verifier see it: two small protocols.

gpu_audit.spool implements them; tests may pass an in-memory fake. Nothing here does
I/O, and nothing here may import the spool implementation (the audit package must stay
usable against any writer with these methods).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class SpoolWriterPort(Protocol):
    """Append-only, group-committed record log."""

    def commit(self, payloads: Sequence[bytes]) -> int:
        """Append all payloads durably (after one fsync); return the first one's offset.

        Raises gpu_audit.spool.SpoolFull / SpoolWriteError (with `.reason`) or OSError;
        on any error none of the payloads counts as written.
        """
        ...

    def last_payload(self) -> bytes | None:
        """The most recently committed payload, or None for an empty spool."""
        ...

    def close(self) -> None: ...


class ReadResultPort(Protocol):
    @property
    def entries(self) -> list[tuple[int, bytes]]: ...

    @property
    def next_offset(self) -> int: ...


class SpoolReaderPort(Protocol):
    def read(
        self,
        offset: int,
        max_records: int,
        max_bytes: int,
        limit_offset: int | None = None,
    ) -> ReadResultPort: ...
