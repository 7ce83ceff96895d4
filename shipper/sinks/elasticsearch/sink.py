"""The Elasticsearch sink: the shared `_bulk` sink (bulk.py) with the official
`elasticsearch` client (client.py, the `gpu-audit[elasticsearch]` extra).

The registry (shipper/sinks/registry.py) imports this module only after the sink's
configuration, secrets and client library were checked, so a missing library is a
ConfigError naming the extra, never an ImportError. It never logs the secrets it is
given (the client holds them).
"""

from __future__ import annotations

from pydantic import SecretStr

from shipper.sinks.elasticsearch.bulk import SearchClient, SearchSink
from shipper.sinks.elasticsearch.client import ElasticClient
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig


class ElasticsearchSink(SearchSink):
    def __init__(
        self,
        cfg: ElasticsearchSinkConfig,
        name: str,
        *,
        password: SecretStr | None = None,
        api_key: SecretStr | None = None,
        client: SearchClient | None = None,
    ) -> None:
        super().__init__(cfg, name,
                         client or ElasticClient(cfg, password=password, api_key=api_key))
