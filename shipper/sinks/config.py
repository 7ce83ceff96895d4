"""Configuration of the sinks: one pydantic model per sink kind, chosen by `type`.

Secrets are never written in the YAML: each secret is named by an environment variable
(`*_env`) or a file (`*_file`) and resolved only when the sink is built, into a pydantic
SecretStr so that it never shows in a repr, a log line or a validation error. This module
must never read a secret at validation time (check-config runs where secrets are absent)
and never put a secret's value into an error message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, model_validator

from gpu_audit.config_section import Section
from gpu_audit.errors import ConfigError
from gpu_audit.logredact import register_secret

_NAME = r"^[A-Za-z0-9_.-]+$"


def resolve_secret(what: str, env: str | None, file: Path | None) -> SecretStr | None:
    """Read a secret from the named environment variable or file (one of them, or none).

    Raises ConfigError naming the variable or file (never the value) when it is missing.
    A trailing newline in a file is removed, as every secret file written by `echo` has one.
    """
    if env is not None:
        value = os.environ.get(env)
        if value is None or value == "":
            raise ConfigError(what, [f"environment variable {env} is not set or empty"])
        register_secret(value)  # masked in every log line from now on
        return SecretStr(value)
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(what, [f"cannot read secret file {file}: {exc.strerror}"]) from None
        text = text.rstrip("\r\n")
        if not text:
            raise ConfigError(what, [f"secret file {file} is empty"])
        register_secret(text)
        return SecretStr(text)
    return None


def _one_of(pairs: list[tuple[str, object, object]]) -> None:
    for label, env, file in pairs:
        if env is not None and file is not None:
            raise ValueError(f"set only one of {label}_env and {label}_file")


class TlsConfig(Section):
    """TLS towards the backend. Off means plain TCP / http."""

    enabled: bool = Field(default=False, description="Use TLS (https:// URLs enable it too).")
    ca_file: Path | None = Field(default=None, description="CA bundle to verify the server with.")
    verify: bool = Field(default=True, description="Verify the server certificate and host name.")
    client_cert: Path | None = Field(default=None, description="Client certificate (PEM).")
    client_key: Path | None = Field(default=None, description="Client private key (PEM).")

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together")
        return self


class _SearchSinkBase(Section):
    name: str = Field(default="", pattern=r"^$|" + _NAME, description="Sink name (cursor name).")
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
        default="daily", description="daily: an index per UTC day of record time; data_stream.",
    )
    index_prefix: str = Field(default="gpu-audit", pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    date_format: str = Field(default="%Y.%m.%d", description="strftime format of the daily suffix.")
    # not matching the daily pattern `<index_prefix>-*`, so both templates can coexist
    data_stream: str = Field(default="gpu-audit.records", pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    install_template: bool = Field(
        default=True, description="Install the index template in start()."
    )
    template_name: str = Field(default="gpu-audit", pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    number_of_shards: int = Field(default=1, ge=1)
    number_of_replicas: int = Field(default=1, ge=0)
    timeout_s: float = Field(default=30.0, gt=0, description="Per-request timeout.")
    gzip: bool = Field(default=False, description="Compress request bodies.")

    @model_validator(mode="after")
    def _secrets(self) -> _SearchSinkBase:
        _one_of(
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


class ElasticsearchSinkConfig(_SearchSinkBase):
    type: Literal["elasticsearch"]
    cloud_id: str | None = Field(
        default=None, description="Elastic Cloud deployment id (replaces hosts)."
    )


class OpenSearchSinkConfig(_SearchSinkBase):
    type: Literal["opensearch"]


class _InfluxBase(Section):
    name: str = Field(default="", pattern=r"^$|" + _NAME)
    url: str = Field(default="http://localhost:8086", pattern=r"^https?://")
    tls: TlsConfig = TlsConfig()
    gzip: bool = Field(default=False, description="Send bodies with Content-Encoding: gzip.")
    timeout_s: float = Field(default=30.0, gt=0)
    measurement_prefix: str = Field(default="gpu_audit", pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    identity_tags: bool = Field(
        default=True,
        description="Tag points with user/project/job (a few hundred values per cluster; "
        "switch off where job ids would make series cardinality too high).",
    )


class InfluxV1SinkConfig(_InfluxBase):
    type: Literal["influxdb_v1"]
    database: str = Field(..., min_length=1)
    retention_policy: str | None = None
    username: str | None = None
    password_env: str | None = None
    password_file: Path | None = None
    auth: Literal["basic", "query"] = Field(
        default="basic", description="basic: Authorization header; query: u=/p= URL parameters."
    )

    @model_validator(mode="after")
    def _secrets(self) -> InfluxV1SinkConfig:
        _one_of([("password", self.password_env, self.password_file)])
        if (self.password_env or self.password_file) and self.username is None:
            raise ValueError("a password needs a username")
        return self


class InfluxV2SinkConfig(_InfluxBase):
    type: Literal["influxdb_v2"]
    org: str = Field(default="", description="Organisation (InfluxDB 2); may be empty for v3 / VM.")
    bucket: str = Field(..., min_length=1)
    token_env: str | None = None
    token_file: Path | None = None
    flavour: Literal["influxdb", "victoriametrics"] = Field(
        default="influxdb",
        description="victoriametrics keeps no string fields, so read_back is unsupported there.",
    )

    @model_validator(mode="after")
    def _secrets(self) -> InfluxV2SinkConfig:
        _one_of([("token", self.token_env, self.token_file)])
        return self


class FluentdSinkConfig(Section):
    type: Literal["fluentd"]
    name: str = Field(default="", pattern=r"^$|" + _NAME)
    host: str = "localhost"
    port: int = Field(default=24224, ge=1, le=65535)
    tag_prefix: str = Field(default="gpu_audit", description="Tag = <tag_prefix>.<record kind>.")
    timeout_s: float = Field(default=10.0, gt=0, description="Connect/send timeout.")
    ack_timeout_s: float = Field(
        default=30.0, gt=0, description="Wait this long for the chunk ack."
    )
    tls: TlsConfig = TlsConfig()
    shared_key_env: str | None = Field(
        default=None, description="Env var with the forward shared_key."
    )
    shared_key_file: Path | None = None
    self_hostname: str = Field(
        default="gpu-audit", description="Our name in the shared_key handshake."
    )
    username: str | None = Field(default=None, description="Forward user auth (with password_*).")
    password_env: str | None = None
    password_file: Path | None = None

    @model_validator(mode="after")
    def _secrets(self) -> FluentdSinkConfig:
        _one_of(
            [
                ("shared_key", self.shared_key_env, self.shared_key_file),
                ("password", self.password_env, self.password_file),
            ]
        )
        has_key = self.shared_key_env is not None or self.shared_key_file is not None
        has_password = self.password_env is not None or self.password_file is not None
        if (self.username is not None or has_password) and not has_key:
            raise ValueError(
                "user authentication is part of the shared_key handshake: "
                "set shared_key_env or shared_key_file too"
            )
        if (self.username is None) != (not has_password):
            raise ValueError("username and password_env/password_file go together")
        return self


class ArchiveSinkConfig(Section):
    type: Literal["archive"]
    name: str = Field(default="", pattern=r"^$|" + _NAME)
    directory: Path | None = Field(
        default=None, description="Archive directory; default 'archive' beside the spool dir."
    )
    prefix: str = Field(default="gpu-audit", pattern=_NAME)
    max_file_bytes: int = Field(
        default=256 * 1024 * 1024, ge=4096, description="Rotate above this."
    )
    compress: bool = Field(default=True, description="gzip closed files to .jsonl.gz.")
    fsync: bool = Field(default=True, description="fsync lines and state before acknowledging.")


SinkConfig = Annotated[
    ElasticsearchSinkConfig
    | OpenSearchSinkConfig
    | InfluxV1SinkConfig
    | InfluxV2SinkConfig
    | FluentdSinkConfig
    | ArchiveSinkConfig,
    Field(discriminator="type"),
]


def sink_name(cfg: SinkConfig) -> str:
    """The configured name, or the kind when no name was given."""
    return cfg.name or cfg.type
