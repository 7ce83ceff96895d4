"""OpenSearch's client for the search sink (shipper/sinks/elasticsearch/bulk.py).

`opensearch-py` is the `gpu-audit[opensearch]` extra, imported only here, so an
Elasticsearch-only install never imports it (and the other way round). The official
`elasticsearch` client refuses OpenSearch servers (its product check), hence this one.
Like ElasticClient it has its own retries off, maps every failure to HttpFailure or
ConnFailure and takes its TLS from gpu_audit/tls.py. It never logs the password it
is given.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import opensearchpy
from opensearchpy.connection import Urllib3HttpConnection
from pydantic import SecretStr
from typing_extensions import override

from gpu_audit.tls import ssl_context, uses_tls
from shipper.sinks.elasticsearch.response import ConnFailure, HttpFailure
from shipper.sinks.httputil import exception_reason
from shipper.sinks.opensearch.config import OpenSearchSinkConfig


class _StatusConnection(Urllib3HttpConnection):
    """opensearch-py drops response headers on errors; keep them (Retry-After)."""

    @override
    def perform_request(
        self,
        method: str,
        url: str,
        params: Mapping[str, Any] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
        ignore: Collection[int] = (),
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Mapping[str, str], str]:
        status, resp_headers, data = super().perform_request(
            method, url, params, body, timeout, tuple(range(300, 600)), headers
        )
        if not 200 <= status < 300:
            try:
                parsed: Any = json.loads(data)
            except ValueError:
                parsed = data
            raise HttpFailure(status, dict(resp_headers), parsed)
        return status, resp_headers, data


class OpenSearchClient:
    """opensearch-py with retries off and errors mapped like ElasticClient's."""

    def __init__(self, cfg: OpenSearchSinkConfig, *, password: SecretStr | None = None) -> None:
        kwargs: dict[str, Any] = {
            "hosts": list(cfg.hosts),
            "timeout": cfg.timeout_s,
            "max_retries": 0,
            "retry_on_timeout": False,
            "http_compress": cfg.gzip,
            "connection_class": _StatusConnection,
        }
        if cfg.username is not None and password is not None:
            kwargs["http_auth"] = (cfg.username, password.get_secret_value())
        if uses_tls(cfg.tls, cfg.hosts):
            # with a context opensearch-py takes every TLS setting from it (and warns
            # about any other TLS argument, so none is given)
            kwargs["use_ssl"] = True
            kwargs["ssl_context"] = ssl_context(cfg.tls, f"sink {cfg.name or cfg.type}: tls")
        self._os = opensearchpy.OpenSearch(**kwargs)

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Mapping[str, Any]:
        try:
            body = fn(*args, **kw)
        except HttpFailure:
            raise
        except opensearchpy.exceptions.TransportError as exc:
            raise ConnFailure(exception_reason(exc)) from None
        return body if isinstance(body, Mapping) else {}

    def bulk(self, body: bytes) -> Mapping[str, Any]:
        return self._call(self._os.bulk, body=body)

    def put_template(self, name: str, body: dict[str, Any]) -> None:
        self._call(self._os.indices.put_index_template, name=name, body=body)

    def search(self, index: str, body: dict[str, Any]) -> Mapping[str, Any]:
        return self._call(self._os.search, index=index, body=body,
                          params={"ignore_unavailable": "true", "allow_no_indices": "true"})

    def refresh(self, index: str) -> None:
        self._call(self._os.indices.refresh, index=index,
                   params={"ignore_unavailable": "true", "allow_no_indices": "true"})

    def close(self) -> None:
        self._os.close()
