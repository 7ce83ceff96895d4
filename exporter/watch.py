"""What the exporter says in its log while it runs: each change of state once, and a
one-line summary every few minutes, so an operator can watch the process from its log.

- `GpuWatch`, a snapshot listener: a GPU that stops answering logs one WARNING with its
  error kind (also when it is already down at the first cycle), its return one INFO; each
  XID event one WARNING. Nothing is logged for a cycle in which nothing changed.
- `SummaryLog`, a snapshot listener: every `interval_seconds` of wall time one INFO line
  built by the app layer (cycles, records, spool, per-sink lag); 0 switches it off.

Both run on the sampler thread after a cycle and only compare small dicts; they never
touch the backend, the spool or the network themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpu_audit.model.snapshot import Snapshot

log = logging.getLogger("gpu_audit.watch")


class GpuWatch:
    """Logs GPUs lost and recovered, and XID events, once each."""

    def __init__(self) -> None:
        self._down: dict[str, str] = {}  # uuid -> error kind, for GPUs down now
        self._seen: set[str] = set()

    def __call__(self, snap: Snapshot) -> None:
        for gpu in snap.gpus:
            uuid = gpu.uuid
            where = f"GPU {gpu.info.index} ({uuid})"
            if not gpu.up:
                error = gpu.error or "unknown error"
                if self._down.get(uuid) != error:
                    was = self._down.get(uuid)
                    log.warning("%s is not answering: %s%s; its series report gpu_up 0 and "
                                "the other GPUs carry on", where, error,
                                f" (was {was})" if was else "")
                    self._down[uuid] = error
            elif uuid in self._down:
                log.info("%s is answering again (it was down: %s)", where,
                         self._down.pop(uuid))
            for event in gpu.new_xids:
                log.warning("%s: XID %d", where, event.xid)
            self._seen.add(uuid)
        # A GPU that vanished from the snapshot altogether is also a change of state.
        present = {g.uuid for g in snap.gpus}
        for uuid in sorted(self._seen - present):
            log.warning("GPU %s is no longer listed by the backend", uuid)
            self._seen.discard(uuid)
            self._down.pop(uuid, None)


class SummaryLog:
    """Every `interval_seconds`, one INFO line from `describe()`."""

    def __init__(self, interval_seconds: float, describe: Callable[[], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_seconds
        self._describe = describe
        self._clock = clock
        self._next = clock() + interval_seconds

    def __call__(self, _snap: Snapshot) -> None:
        if self._interval <= 0:
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        log.info("%s", self._describe())
