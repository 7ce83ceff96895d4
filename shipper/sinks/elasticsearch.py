"""Elasticsearch and OpenSearch sinks: `_bulk` `create` with `_id` = record id.

The official `elasticsearch` client refuses servers that are not Elastic's (its product
check), so OpenSearch goes through `opensearch-py`. Both sit behind a small adapter that
turns every answer into (status, headers, body) or a connection failure, so the bulk
logic (shipper/sinks/bulk.py) and the classification below are one code path. Both
clients have their own retries switched off: the shipper engine owns retries.
Each client library is an optional extra (`gpu-audit[elasticsearch]`, `[opensearch]`):
this module imports `elasticsearch` only inside ElasticClient, and the OpenSearch client
lives in shipper/sinks/opensearch.py, so either works without the other installed.

Whole-request outcomes: 401/403 and 404 (missing index, auto-create off) hold; 429, 5xx,
timeouts and connection errors retry (with Retry-After); 413 splits the batch in halves;
another 4xx on a multi-record batch is bisected so the one record that causes it ends
as a dead letter alone. Per-item outcomes: see bulk.py.

This module must never log a password or API key (the clients get them as SecretStr
values resolved by the factory) and never give a record no outcome.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from pydantic import SecretStr

from shipper.sinks import bulk
from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord
from shipper.sinks.config import ElasticsearchSinkConfig, OpenSearchSinkConfig
from shipper.sinks.httputil import exception_reason, header, parse_retry_after, redact

_PAGE = 5000


class HttpFailure(Exception):
    """A non-2xx answer, with what classification needs."""

    def __init__(self, status: int, headers: Mapping[str, str], body: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = dict(headers)
        self.body = body


class ConnFailure(Exception):
    """No answer: refused, reset, timed out, TLS failure."""


class SearchClient(Protocol):
    def bulk(self, body: bytes) -> Mapping[str, Any]: ...
    def put_template(self, name: str, body: dict[str, Any]) -> None: ...
    def search(self, index: str, body: dict[str, Any]) -> Mapping[str, Any]: ...
    def refresh(self, index: str) -> None: ...
    def close(self) -> None: ...


def _error_reason(body: Any) -> str:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            return f"{error.get('type', '')}: {error.get('reason', '')}"
        if error is not None:
            return str(error)
    return redact(str(body))[:500]


class ElasticClient:
    """The official client, retries off, every failure mapped to HttpFailure/ConnFailure."""

    def __init__(
        self,
        cfg: ElasticsearchSinkConfig,
        *,
        password: SecretStr | None = None,
        api_key: SecretStr | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {
            "request_timeout": cfg.timeout_s,
            "max_retries": 0,
            "retry_on_timeout": False,
            "retry_on_status": (),
            "http_compress": cfg.gzip,
        }
        if cfg.cloud_id:
            kwargs["cloud_id"] = cfg.cloud_id
        else:
            kwargs["hosts"] = list(cfg.hosts)
        if cfg.username is not None and password is not None:
            kwargs["basic_auth"] = (cfg.username, password.get_secret_value())
        if api_key is not None:
            kwargs["api_key"] = api_key.get_secret_value()
        tls = cfg.tls
        if tls.ca_file is not None:
            kwargs["ca_certs"] = str(tls.ca_file)
        if not tls.verify:
            kwargs["verify_certs"] = False
            kwargs["ssl_show_warn"] = False
        if tls.client_cert is not None:
            kwargs["client_cert"] = str(tls.client_cert)
            kwargs["client_key"] = str(tls.client_key)
        import elasticsearch  # the [elasticsearch] extra (the factory checks it is there)

        self._es = elasticsearch.Elasticsearch(**kwargs)

    def _call(self, fn: Any, **kw: Any) -> Mapping[str, Any]:
        import elastic_transport
        import elasticsearch

        try:
            resp = fn(**kw)
        except elasticsearch.UnsupportedProductError as exc:
            raise HttpFailure(
                401, {}, {"error": "the server is not Elasticsearch (for OpenSearch use "
                          f"`type: opensearch`): {exc.message}"}
            ) from None
        except elasticsearch.ApiError as exc:
            raise HttpFailure(exc.meta.status, dict(exc.meta.headers), exc.body) from None
        except elastic_transport.TransportError as exc:
            raise ConnFailure(exception_reason(exc)) from None
        body = resp.body
        return body if isinstance(body, Mapping) else {}

    def bulk(self, body: bytes) -> Mapping[str, Any]:
        return self._call(self._es.bulk, operations=body)

    def put_template(self, name: str, body: dict[str, Any]) -> None:
        self._call(self._es.indices.put_index_template, name=name, **body)

    def search(self, index: str, body: dict[str, Any]) -> Mapping[str, Any]:
        return self._call(self._es.search, index=index, ignore_unavailable=True,
                          allow_no_indices=True, **body)

    def refresh(self, index: str) -> None:
        self._call(self._es.indices.refresh, index=index, ignore_unavailable=True,
                   allow_no_indices=True)

    def close(self) -> None:
        self._es.close()


class SearchSink:
    """The sink for both Elasticsearch and OpenSearch (kind says which)."""

    def __init__(
        self,
        cfg: ElasticsearchSinkConfig | OpenSearchSinkConfig,
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
        reason = f"{what}: HTTP {exc.status} {_error_reason(exc.body)}"
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
            self._client.put_template(self._cfg.template_name, bulk.template_body(self._cfg))
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
        body, sent = bulk.build_body([batch[p] for p in positions], self._cfg, sub_results)
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
                        Outcome.DEAD_LETTER, f"HTTP {exc.status} {_error_reason(exc.body)}")
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
        for pos, item in zip(carried, bulk.classify_response(response, len(carried)),
                             strict=True):
            results[pos] = item

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        """Records with time_ns in [start_ns, end_ns), sorted by (stream, seq, id),
        paged with search_after so result size is unbounded."""
        pattern = bulk.index_pattern(self._cfg)
        try:
            self._client.refresh(pattern)
        except (HttpFailure, ConnFailure) as exc:
            self._raise_whole(exc, "refresh before read-back")
        after: list[Any] | None = None
        while True:
            try:
                page = self._client.search(
                    pattern, bulk.search_body(start_ns, end_ns, _PAGE, after))
            except (HttpFailure, ConnFailure) as exc:
                self._raise_whole(exc, "read-back search")
                return
            hits = page.get("hits", {}).get("hits", [])
            for hit in hits:
                yield bulk.strip_added(dict(hit["_source"]), self._cfg)
            if len(hits) < _PAGE:
                return
            after = list(hits[-1]["sort"])

    def close(self) -> None:
        self._client.close()
