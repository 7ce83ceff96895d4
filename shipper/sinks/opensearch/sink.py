"""The OpenSearch sink: the `_bulk` sink it shares with Elasticsearch
(shipper/sinks/elasticsearch/bulk.py) with the OpenSearch client, since OpenSearch speaks
the same `_bulk` API.

What this folder holds is what differs from Elasticsearch: the configuration (no API
keys, no cloud id) and the client (`opensearch-py`). It never imports the
`elasticsearch` library.
"""

from __future__ import annotations

from pydantic import SecretStr

from shipper.sinks.elasticsearch.bulk import SearchClient, SearchSink
from shipper.sinks.opensearch.client import OpenSearchClient
from shipper.sinks.opensearch.config import OpenSearchSinkConfig


class OpenSearchSink(SearchSink):
    def __init__(
        self,
        cfg: OpenSearchSinkConfig,
        name: str,
        *,
        password: SecretStr | None = None,
        client: SearchClient | None = None,
    ) -> None:
        super().__init__(cfg, name, client or OpenSearchClient(cfg, password=password))
