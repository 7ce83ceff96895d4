"""Configuration of the Fluentd / Fluent Bit sink (the forward protocol).

The shared key and the user password are named, never written (gpu_audit/credentials.py).
The sink needs `msgpack` (the `gpu-audit[fluentd]` extra). Pure data: this module imports
no sink.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gpu_audit.credentials import only_one_of
from gpu_audit.tls import TlsConfig
from shipper.sinks.build import OPTIONAL_NAME_PATTERN, SecretRef, SinkSection


class FluentdSinkConfig(SinkSection):
    type: Literal["fluentd"]
    name: str = Field(default="", pattern=OPTIONAL_NAME_PATTERN,
                      description="Sink name (cursor name).")
    host: str = Field(default="localhost", description="Fluentd / Fluent Bit forward input.")
    port: int = Field(default=24224, ge=1, le=65535, description="Its forward port.")
    tag_prefix: str = Field(default="gpu_audit", description="Tag = <tag_prefix>.<record kind>.")
    timeout_s: float = Field(default=10.0, gt=0, description="Connect/send timeout.")
    ack_timeout_s: float = Field(
        default=30.0, gt=0, description="Wait this long for the chunk ack."
    )
    tls: TlsConfig = TlsConfig()
    shared_key_env: str | None = Field(
        default=None, description="Env var with the forward shared_key."
    )
    shared_key_file: Path | None = Field(
        default=None, description="File holding the forward shared_key."
    )
    self_hostname: str = Field(
        default="gpu-audit", description="Our name in the shared_key handshake."
    )
    username: str | None = Field(default=None, description="Forward user auth (with password_*).")
    password_env: str | None = Field(default=None, description="Env var holding the password.")
    password_file: Path | None = Field(default=None, description="File holding the password.")

    @model_validator(mode="after")
    def _secrets(self) -> FluentdSinkConfig:
        only_one_of(
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

    def secrets(self) -> dict[str, SecretRef]:
        return {"shared_key": (self.shared_key_env, self.shared_key_file),
                "password": (self.password_env, self.password_file)}
