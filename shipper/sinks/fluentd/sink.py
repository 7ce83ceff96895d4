"""Fluentd / Fluent Bit sink: the forward protocol with `chunk` / `ack` (at-least-once)
and nanosecond EventTime, over our own connection (client.py says why not fluent-logger).

- Forward mode, one chunk per tag in the batch (encode.py), each sent and acknowledged
  before the next.
- No ack within `ack_timeout_s`, or a broken connection: the chunk and every later chunk
  of the batch are RETRY (earlier, acknowledged chunks are DELIVERED); the connection is
  closed so the resend starts clean, and the resend carries the same chunk id.
- A record without a usable `time_ns` is a dead letter (it cannot have an EventTime).
The acknowledgement means the receiver has the chunk in its buffer, not that it reached
the final store; that is the forward protocol's guarantee. Fluentd is a router, so
read_back is not possible: it raises ReadBackUnsupported.

This module must never log the shared key or password, and never drop a record without
an outcome.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgpack
from pydantic import SecretStr

from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord
from shipper.sinks.errors import ReadBackUnsupported
from shipper.sinks.fluentd.client import ForwardConnection, HandshakeError
from shipper.sinks.fluentd.config import FluentdSinkConfig
from shipper.sinks.fluentd.encode import chunk_id, forward_chunk, tag_for, valid_time_ns


class FluentdSink:
    kind = "fluentd"

    def __init__(
        self,
        cfg: FluentdSinkConfig,
        name: str,
        *,
        shared_key: SecretStr | None = None,
        password: SecretStr | None = None,
    ) -> None:
        self.name = name
        self._cfg = cfg
        self._conn = ForwardConnection(cfg, shared_key, password)

    def start(self) -> None:
        """Connect (and authenticate) once, so a wrong key shows at start."""
        try:
            self._conn.connect()
        except HandshakeError as exc:
            raise SinkError(Outcome.HOLD, f"forward handshake: {exc}") from None
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            raise SinkError(Outcome.RETRY, f"forward connect: {type(exc).__name__}: {exc}") \
                from None

    def tag_for(self, doc: Mapping[str, Any]) -> str:
        return tag_for(self._cfg.tag_prefix, doc)

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        results: list[ItemResult | None] = [None] * len(batch)
        chunks: dict[str, list[int]] = {}
        for i, rec in enumerate(batch):
            if not valid_time_ns(rec.doc):
                results[i] = ItemResult(Outcome.DEAD_LETTER, "record has no valid time_ns")
                continue
            chunks.setdefault(self.tag_for(rec.doc), []).append(i)
        failed: str | None = None
        for tag, positions in chunks.items():
            if failed is None:
                failed = self._send_chunk(tag, [batch[p] for p in positions])
            outcome = ItemResult(Outcome.DELIVERED) if failed is None else \
                ItemResult(Outcome.RETRY, failed)
            for p in positions:
                results[p] = outcome
        out: list[ItemResult] = []
        for r in results:
            assert r is not None, "fluentd sink left a record without an outcome"
            out.append(r)
        return out

    def _send_chunk(self, tag: str, records: Sequence[SinkRecord]) -> str | None:
        """Send one chunk and wait for its ack; None on success, else the reason."""
        cid = chunk_id([r.record_id for r in records])
        packet = forward_chunk(tag, records, cid)
        try:
            self._conn.send_chunk(packet, cid)
        except HandshakeError as exc:
            self._conn.close()
            return f"forward handshake: {exc}"
        except (OSError, TimeoutError, ValueError, msgpack.UnpackException) as exc:
            self._conn.close()
            return f"no ack for chunk {cid}: {type(exc).__name__}: {exc}"
        return None

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        raise ReadBackUnsupported(
            f"sink {self.name}: Fluentd/Fluent Bit forward is a router and keeps nothing to "
            "read back; verify against the store it forwards to, or the archive"
        )

    def close(self) -> None:
        self._conn.close()
