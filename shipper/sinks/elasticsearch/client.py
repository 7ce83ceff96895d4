"""The Elasticsearch client of the search sink: the official `elasticsearch` library
(the `gpu-audit[elasticsearch]` extra), imported only here, so an OpenSearch-only install
never needs it.

Its own retries are off (the shipper engine owns retries) and every failure is mapped to
HttpFailure or ConnFailure (response.py). TLS comes from gpu_audit/tls.py like every
sink's (as keyword arguments: see `elastic_transport_kwargs` there for why). It never
logs the password or API key it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import elastic_transport
import elasticsearch
from pydantic import SecretStr

from gpu_audit.tls import elastic_transport_kwargs
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.elasticsearch.response import ConnFailure, HttpFailure
from shipper.sinks.httputil import exception_reason


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
        kwargs.update(elastic_transport_kwargs(
            cfg.tls, ["https://"] if cfg.cloud_id else cfg.hosts,
            f"sink {cfg.name or cfg.type}: tls"))
        self._es = elasticsearch.Elasticsearch(**kwargs)

    def _call(self, fn: Any, **kw: Any) -> Mapping[str, Any]:
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
