"""Configuration of the OpenSearch sink: Elasticsearch's, less the Elastic-only keys.

OpenSearch speaks Elasticsearch's `_bulk` API, so the sink, its encoding and its outcome
rules are shipper/sinks/elasticsearch's; what differs is the client (`client.py`, the
`opensearch-py` library). `build` never imports the `elasticsearch` library.
"""

from __future__ import annotations

from typing import Literal

from shipper.sinks.base import Sink
from shipper.sinks.build import BuildContext, Sdk, SinkType
from shipper.sinks.elasticsearch.config import SearchSinkConfigBase


class OpenSearchSinkConfig(SearchSinkConfigBase):
    type: Literal["opensearch"]

    def build(self, ctx: BuildContext) -> Sink:
        password = ctx.secret("password", self.password_env, self.password_file)
        if self.api_key_env or self.api_key_file:
            ctx.problems.append(
                "api_key: OpenSearch has no Elasticsearch-style API keys; use username + "
                "password_env/password_file")
        ctx.check()
        from shipper.sinks.opensearch.sink import OpenSearchSink  # noqa: PLC0415 - the SDK

        return OpenSearchSink(self, ctx.name, password=password)


SINK_TYPE = SinkType("opensearch", OpenSearchSinkConfig, Sdk(("opensearchpy",), "opensearch"))
