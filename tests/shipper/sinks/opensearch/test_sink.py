"""The OpenSearch sink: Elasticsearch's bulk sink with the OpenSearch client and its own
configuration. (The bulk protocol itself is tested for both kinds in
tests/shipper/sinks/elasticsearch/test_sink.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_audit.errors import ConfigError
from shipper.sinks.opensearch.client import OpenSearchClient
from shipper.sinks.opensearch.sink import OpenSearchSink
from shipper.sinks.registry import create_sink
from tests.shipper.sinks.test_registry import parse


def test_the_registry_builds_the_bulk_sink_with_the_opensearch_client(tmp_path: Path) -> None:
    """`type: opensearch` builds an OpenSearchSink of kind opensearch that talks through
    opensearch-py (the elasticsearch library refuses OpenSearch servers)."""
    sink = create_sink(parse({"type": "opensearch", "hosts": ["http://127.0.0.1:9"]}),
                       spool_dir=tmp_path)
    assert isinstance(sink, OpenSearchSink)
    assert sink.kind == "opensearch" and sink.name == "opensearch"
    assert isinstance(sink._client, OpenSearchClient)


def test_opensearch_api_key_is_refused_loudly(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenSearch has no ES API keys: configuring one is a ConfigError, not ignored."""
    monkeypatch.setenv("K", "abc")
    with pytest.raises(ConfigError, match="API keys"):
        create_sink(parse({"type": "opensearch", "api_key_env": "K"}), spool_dir=tmp_path)
