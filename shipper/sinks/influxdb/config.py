"""Configuration of the InfluxDB sinks: `influxdb_v1` (the 1.x `/write` API) and
`influxdb_v2` (`/api/v2/write`: InfluxDB 2 / 3 and VictoriaMetrics).

Both versions share this folder: the same line protocol (`encode.py`), the same answers
to classify (`response.py`) and the same sink (`sink.py`); only the write request (path,
auth) and what a 400 means differ. They need no optional library (urllib3 only).
Pure data: this module imports no sink.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gpu_audit.credentials import only_one_of
from gpu_audit.tls import TlsConfig
from shipper.sinks.build import OPTIONAL_NAME_PATTERN, SecretRef, SinkSection


class InfluxConfigBase(SinkSection):
    name: str = Field(default="", pattern=OPTIONAL_NAME_PATTERN,
                      description="Sink name (cursor name).")
    url: str = Field(default="http://localhost:8086", pattern=r"^https?://",
                     description="Base URL of the server.")
    tls: TlsConfig = TlsConfig()
    gzip: bool = Field(default=False, description="Send bodies with Content-Encoding: gzip.")
    timeout_s: float = Field(default=30.0, gt=0, description="Per-request timeout.")
    measurement_prefix: str = Field(
        default="gpu_audit", pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
        description="Measurement = <measurement_prefix>_<record kind>.",
    )
    identity_tags: bool = Field(
        default=True,
        description="Tag points with user/project/job (a few hundred values per cluster; "
        "switch off where job ids would make series cardinality too high).",
    )


class InfluxV1SinkConfig(InfluxConfigBase):
    type: Literal["influxdb_v1"]
    database: str = Field(..., min_length=1, description="Database written to (`db=`).")
    retention_policy: str | None = Field(
        default=None, description="Retention policy (`rp=`); default: the database's."
    )
    username: str | None = Field(default=None, description="User (with password_*).")
    password_env: str | None = Field(default=None, description="Env var holding the password.")
    password_file: Path | None = Field(default=None, description="File holding the password.")
    auth: Literal["basic", "query"] = Field(
        default="basic", description="basic: Authorization header; query: u=/p= URL parameters."
    )

    @model_validator(mode="after")
    def _secrets(self) -> InfluxV1SinkConfig:
        only_one_of([("password", self.password_env, self.password_file)])
        if (self.password_env or self.password_file) and self.username is None:
            raise ValueError("a password needs a username")
        return self

    def secrets(self) -> dict[str, SecretRef]:
        return {"password": (self.password_env, self.password_file)}


class InfluxV2SinkConfig(InfluxConfigBase):
    type: Literal["influxdb_v2"]
    org: str = Field(default="", description="Organisation (InfluxDB 2); may be empty for v3 / VM.")
    bucket: str = Field(..., min_length=1, description="Bucket (or database) written to.")
    token_env: str | None = Field(default=None, description="Env var holding the API token.")
    token_file: Path | None = Field(default=None, description="File holding the API token.")
    flavour: Literal["influxdb", "victoriametrics"] = Field(
        default="influxdb",
        description="victoriametrics keeps no string fields, so read_back is unsupported there.",
    )

    @model_validator(mode="after")
    def _secrets(self) -> InfluxV2SinkConfig:
        only_one_of([("token", self.token_env, self.token_file)])
        return self

    def secrets(self) -> dict[str, SecretRef]:
        return {"token": (self.token_env, self.token_file)}
