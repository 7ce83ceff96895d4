"""How the Elasticsearch and OpenSearch sinks read an answer: the failures their clients
raise (HttpFailure with status, headers and body; ConnFailure for no answer at all) and
the per-item outcome of a `_bulk` response.

Per item: 2xx delivered; 409 on `create` delivered (the id is already stored); 429, 5xx
and a `cluster_block_exception` (flood stage; 429 since ES 7.x, 403 before) retried for
that item only; 404 `index_not_found_exception` (auto-create off) held; any other 4xx
dead-lettered with the item's error type and reason. An item missing from the response
is retried (the server did not say it stored it). Pure; no I/O, no client library.

This module must never decide to drop a record: every record gets an outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_audit.errors import GpuAuditError
from shipper.sinks.base import ItemResult, Outcome
from shipper.sinks.httputil import redact

_RETRY_TYPES = frozenset(
    {"cluster_block_exception", "es_rejected_execution_exception",
     "circuit_breaking_exception", "unavailable_shards_exception"}
)


class HttpFailure(GpuAuditError):
    """A non-2xx answer, with what classification needs."""

    def __init__(self, status: int, headers: Mapping[str, str], body: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = dict(headers)
        self.body = body


class ConnFailure(GpuAuditError):
    """No answer: refused, reset, timed out, TLS failure."""


def error_reason(body: Any) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            return f"{error.get('type', '')}: {error.get('reason', '')}"
        if error is not None:
            return str(error)
    return redact(str(body))[:500]


_DELIVERED = ItemResult(Outcome.DELIVERED)


def classify_item(item: Mapping[str, Any]) -> ItemResult:
    """One `items[]` entry of a bulk response."""
    body = next(iter(item.values()), None) if item else None
    if type(body) is dict:
        # the common case first: 2xx, or 409 "already stored" on a replay
        code = body.get("status")
        if type(code) is int and (200 <= code < 300 or code == 409):
            return _DELIVERED
    if not isinstance(body, Mapping):
        return ItemResult(Outcome.RETRY, "malformed bulk item in response")
    status = int(body.get("status", 0))
    error = body.get("error")
    etype, ereason = "", ""
    if isinstance(error, Mapping):
        etype = str(error.get("type", ""))
        ereason = str(error.get("reason", ""))
    elif error is not None:
        ereason = str(error)
    reason = f"{status} {etype}: {ereason}".strip()
    if 200 <= status < 300 or status == 409:
        return ItemResult(Outcome.DELIVERED)
    if status == 429 or status >= 500 or etype in _RETRY_TYPES:
        return ItemResult(Outcome.RETRY, reason)
    if status == 404 and etype == "index_not_found_exception":
        return ItemResult(Outcome.HOLD, f"index missing and not auto-created: {reason}")
    if status in (401, 403):
        return ItemResult(Outcome.HOLD, f"not authorised: {reason}")
    return ItemResult(Outcome.DEAD_LETTER, reason)


def classify_response(body: Mapping[str, Any], count: int) -> list[ItemResult]:
    items = body.get("items")
    if not isinstance(items, list):
        return [ItemResult(Outcome.RETRY, "bulk response without items")] * count
    out = [classify_item(item) for item in items[:count]]
    out += [ItemResult(Outcome.RETRY, "no result for this item in the bulk response")] * (
        count - len(out)
    )
    return out
