"""Configuration of an HTTP endpoint, shared by every component that serves one (the
exporter's /metrics, the standalone shipper's metrics): the listen address and the
connection limits. TLS and basic auth come from a web-config file (webconfig.py)."""

from __future__ import annotations

from pydantic import Field

from gpu_audit.config_section import Section


def parse_listen(value: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 as [::1]:PORT). Raises ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {value!r} is not HOST:PORT")
    port_no = int(port)
    if not 0 <= port_no <= 65535:
        raise ValueError(f"port {port_no} is out of range 0..65535")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104
    return host, port_no


class HttpLimitsConfig(Section):
    """Bounds on the HTTP endpoint's connections (see gpu_audit/http/connections.py)."""

    max_connections: int = Field(
        64, ge=1, le=10000,
        description="Connections served at once (one thread each). When full, the "
        "connection idle the longest is closed to make room; when every one is busy, new "
        "ones wait up to header_timeout_seconds, then get 503.",
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, le=300,
        description="A request head (TLS handshake included, for the first request of a "
        "connection) must be complete this long after it started; slow clients are cut.",
    )
    idle_timeout_seconds: float = Field(
        60.0, gt=0, le=3600,
        description="A kept-alive connection with no new request for this long is closed.",
    )
    max_header_bytes: int = Field(
        16384, ge=1024, le=1048576,
        description="Largest request head (request line + headers); larger ones get 431.",
    )
