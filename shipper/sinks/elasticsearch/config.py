"""Configuration of the Elasticsearch sink, and the part it shares with OpenSearch (the
same `_bulk` API, index layout and template).

Secrets are named, never written (gpu_audit/credentials.py): `secrets()` says where each
one is, and the registry reads them before it imports the sink, whose client module
imports the `elasticsearch` library. Pure data: this module imports no sink.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gpu_audit.credentials import only_one_of
from gpu_audit.tls import TlsConfig
from shipper.sinks.build import OPTIONAL_NAME_PATTERN, SecretRef, SinkSection


class SearchSinkConfigBase(SinkSection):
    """What Elasticsearch and OpenSearch sinks share."""

    type: str  # each sink type's own model narrows it to its Literal
    name: str = Field(default="", pattern=OPTIONAL_NAME_PATTERN,
                      description="Sink name (cursor name).")
    hosts: list[str] = Field(
        default=["http://localhost:9200"], min_length=1, description="Node URLs."
    )
    username: str | None = Field(default=None, description="Basic auth user.")
    password_env: str | None = Field(
        default=None, description="Env var holding the basic auth password."
    )
    password_file: Path | None = Field(
        default=None, description="File holding the basic auth password."
    )
    api_key_env: str | None = Field(
        default=None, description="Env var holding an API key (base64 id:key)."
    )
    api_key_file: Path | None = Field(default=None, description="File holding an API key.")
    tls: TlsConfig = TlsConfig()
    index_mode: Literal["daily", "data_stream"] = Field(
        default="daily",
        description="daily: an index per UTC day of record time (`index_prefix`); "
        "data_stream: append to the data stream named by `data_stream`.",
    )
    index_prefix: str = Field(
        default="gpu-audit", pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description="daily: records go to `<index_prefix>-<date>`.",
    )
    date_format: str = Field(default="%Y.%m.%d", description="strftime format of the daily suffix.")
    # not matching the daily pattern `<index_prefix>-*`, so both templates can coexist
    data_stream: str = Field(
        default="gpu-audit.records", pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description="data_stream: the data stream records go to.",
    )
    install_template: bool = Field(
        default=True, description="Install the index template in start()."
    )
    template_name: str = Field(
        default="gpu-audit", pattern=r"^[a-z0-9][a-z0-9_.-]*$",
        description="Name of the index template installed for the indices or data stream.",
    )
    number_of_shards: int = Field(
        default=1, ge=1, description="Primary shards of each new index (in the template)."
    )
    number_of_replicas: int = Field(
        default=1, ge=0, description="Replicas of each new index (in the template)."
    )
    timeout_s: float = Field(default=30.0, gt=0, description="Per-request timeout.")
    gzip: bool = Field(default=False, description="Compress request bodies.")

    @model_validator(mode="after")
    def _secrets(self) -> SearchSinkConfigBase:
        only_one_of(
            [
                ("password", self.password_env, self.password_file),
                ("api_key", self.api_key_env, self.api_key_file),
            ]
        )
        has_password = self.password_env is not None or self.password_file is not None
        if has_password and self.username is None:
            raise ValueError("a password needs a username")
        if self.username is not None and not has_password:
            raise ValueError("username needs password_env or password_file")
        return self

    def secrets(self) -> dict[str, SecretRef]:
        return {"password": (self.password_env, self.password_file),
                "api_key": (self.api_key_env, self.api_key_file)}


class ElasticsearchSinkConfig(SearchSinkConfigBase):
    type: Literal["elasticsearch"]
    cloud_id: str | None = Field(
        default=None, description="Elastic Cloud deployment id (replaces hosts)."
    )
