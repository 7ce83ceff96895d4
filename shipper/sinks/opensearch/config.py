"""Configuration of the OpenSearch sink: Elasticsearch's, less the Elastic-only keys.

OpenSearch speaks Elasticsearch's `_bulk` API, so the sink, its encoding and its outcome
rules are shipper/sinks/elasticsearch's; what differs is the client (`client.py`, the
`opensearch-py` library). Pure data: this module imports no sink and no client library.
"""

from __future__ import annotations

from typing import Literal

from shipper.sinks.build import SecretRef
from shipper.sinks.elasticsearch.config import SearchSinkConfigBase


class OpenSearchSinkConfig(SearchSinkConfigBase):
    type: Literal["opensearch"]

    def secrets(self) -> dict[str, SecretRef]:
        return {"password": (self.password_env, self.password_file)}

    def refusals(self) -> list[str]:
        if self.api_key_env or self.api_key_file:
            return ["api_key: OpenSearch has no Elasticsearch-style API keys; use username + "
                    "password_env/password_file"]
        return []
