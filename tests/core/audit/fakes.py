"""An in-memory spool with the SpoolWriter / SpoolReader methods, that can be told to fail."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class FakeReadResult:
    entries: list[tuple[int, bytes]]
    next_offset: int
    skipped_to: int | None = None


@dataclass
class MemorySpool:
    """Offsets are record indexes. `fail_with` is raised by commit while set."""

    payloads: list[bytes] = field(default_factory=list)
    fail_with: BaseException | None = None
    commits: int = 0

    def commit(self, payloads: Sequence[bytes]) -> int:
        if self.fail_with is not None:
            raise self.fail_with
        self.commits += 1
        first = len(self.payloads)
        self.payloads.extend(payloads)
        return first

    def last_payload(self) -> bytes | None:
        return self.payloads[-1] if self.payloads else None

    def close(self) -> None:
        pass

    def read(
        self, offset: int, max_records: int, max_bytes: int, limit_offset: int | None = None
    ) -> FakeReadResult:
        end = len(self.payloads) if limit_offset is None else min(limit_offset, len(self.payloads))
        chunk = list(enumerate(self.payloads))[offset : min(end, offset + max_records)]
        return FakeReadResult(chunk, offset + len(chunk))
