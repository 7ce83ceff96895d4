"""The `_bulk` sink Elasticsearch and OpenSearch share: `create` with `_id` = record id,
whole-request outcomes, and read-back for `audit verify`.

Each kind's `sink.py` (here ElasticsearchSink, shipper/sinks/opensearch/sink.py
OpenSearchSink) is this sink with its own client; the client turns every answer into a
body or an HttpFailure / ConnFailure (response.py), so the bulk logic and the
classification are one code path for both. This module imports no client library: the
OpenSearch sink uses it without the `elasticsearch` library installed.

Whole-request outcomes: 401/403 and 404 (missing index, auto-create off) hold; 429, 5xx,
timeouts and connection errors retry (with Retry-After); 413 splits the batch in halves;
another 4xx on a multi-record batch is bisected so the one record that causes it ends
as a dead letter alone. Per-item outcomes: see response.py.

This module must never log a password or API key (the clients hold them) and never give
a record no outcome.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord
from shipper.sinks.elasticsearch import encode
from shipper.sinks.elasticsearch.config import SearchSinkConfigBase
from shipper.sinks.elasticsearch.response import (
    ConnFailure,
    HttpFailure,
    classify_response,
    error_reason,
)
from shipper.sinks.httputil import header, parse_retry_after

_PAGE = 5000


class SearchClient(Protocol):
    def bulk(self, body: bytes) -> Mapping[str, Any]: ...
    def put_template(self, name: str, body: dict[str, Any]) -> None: ...
    def search(self, index: str, body: dict[str, Any]) -> Mapping[str, Any]: ...
    def refresh(self, index: str) -> None: ...
    def close(self) -> None: ...


class SearchSink:
    """The sink for both Elasticsearch and OpenSearch (kind says which)."""

    def __init__(
        self,
        cfg: SearchSinkConfigBase,
        name: str,
        client: SearchClient,
    ) -> None:
        self.name = name
        self.kind: str = cfg.type
        self._cfg = cfg
        self._client = client

    def _raise_whole(self, exc: HttpFailure | ConnFailure, what: str) -> None:
        if isinstance(exc, ConnFailure):
            raise SinkError(Outcome.RETRY, f"{what}: {exc}")
        reason = f"{what}: HTTP {exc.status} {error_reason(exc.body)}"
        retry_after = parse_retry_after(header(exc.headers, "Retry-After"))
        if exc.status in (401, 403):
            raise SinkError(Outcome.HOLD, f"not authorised: {reason}")
        if exc.status == 404:
            raise SinkError(Outcome.HOLD, f"index missing: {reason}")
        raise SinkError(Outcome.RETRY, reason, retry_after)

    def start(self) -> None:
        """Install (or update) the composable index template."""
        if not self._cfg.install_template:
            return
        try:
            self._client.put_template(self._cfg.template_name, encode.template_body(self._cfg))
        except (HttpFailure, ConnFailure) as exc:
            self._raise_whole(exc, "installing the index template")

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        results: list[ItemResult | None] = [None] * len(batch)
        self._send(batch, list(range(len(batch))), results)
        out: list[ItemResult] = []
        for r in results:
            assert r is not None, "search sink left a record without an outcome"
            out.append(r)
        return out

    def _send(
        self, batch: Sequence[SinkRecord], positions: list[int], results: list[ItemResult | None]
    ) -> None:
        sub_results: list[ItemResult | None] = [None] * len(positions)
        body, sent = encode.build_body([batch[p] for p in positions], self._cfg, sub_results)
        for k, r in enumerate(sub_results):
            if r is not None:
                results[positions[k]] = r
        if not sent:
            return
        carried = [positions[k] for k in sent]
        try:
            response = self._client.bulk(body)
        except HttpFailure as exc:
            if exc.status == 413 or (400 <= exc.status < 500 and exc.status not in
                                     (401, 403, 404, 408, 429)):
                if len(carried) == 1:
                    results[carried[0]] = ItemResult(
                        Outcome.DEAD_LETTER, f"HTTP {exc.status} {error_reason(exc.body)}")
                    return
                half = len(carried) // 2
                self._send(batch, carried[:half], results)
                self._send(batch, carried[half:], results)
                return
            self._raise_whole(exc, "bulk request")
            return
        except ConnFailure as exc:
            self._raise_whole(exc, "bulk request")
            return
        for pos, item in zip(carried, classify_response(response, len(carried)),
                             strict=True):
            results[pos] = item

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        """Records with time_ns in [start_ns, end_ns), sorted by (stream, seq, id),
        paged with search_after so result size is unbounded."""
        pattern = encode.index_pattern(self._cfg)
        try:
            self._client.refresh(pattern)
        except (HttpFailure, ConnFailure) as exc:
            self._raise_whole(exc, "refresh before read-back")
        after: list[Any] | None = None
        while True:
            try:
                page = self._client.search(
                    pattern, encode.search_body(start_ns, end_ns, _PAGE, after))
            except (HttpFailure, ConnFailure) as exc:
                self._raise_whole(exc, "read-back search")
                return
            hits = page.get("hits", {}).get("hits", [])
            for hit in hits:
                yield encode.strip_added(dict(hit["_source"]), self._cfg)
            if len(hits) < _PAGE:
                return
            after = list(hits[-1]["sort"])

    def close(self) -> None:
        self._client.close()
