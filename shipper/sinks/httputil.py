"""Small HTTP helpers shared by the sinks that speak HTTP through urllib3.

What it is for: one place that builds a urllib3 pool with no retries of its own (the
shipper engine owns retries) and its TLS from gpu_audit/tls.py, parses Retry-After,
and turns exceptions into reasons that can be logged. It must never put a secret into a
reason: URLs may carry `p=` / `token=` parameters, so every reason passes through
`redact`.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

import urllib3

from gpu_audit import logredact
from gpu_audit.tls import TlsConfig, ssl_context


def redact(text: str) -> str:
    """Replace secrets and secret-bearing URL parameters in a message by `***`.

    The same rules the logging set-up applies to every record (gpu_audit.logredact); a
    reason is redacted here too because it also goes into dead-letter files and metrics.
    """
    return logredact.redact(text)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if headers is None:
        return None
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def make_pool(tls: TlsConfig, timeout_s: float, *, https: bool) -> urllib3.PoolManager:
    """A pool with urllib3's own retries off and the configured TLS settings."""
    kwargs: dict[str, object] = {
        "num_pools": 4,
        "maxsize": 2,
        "retries": False,
        "timeout": urllib3.Timeout(connect=timeout_s, read=timeout_s),
    }
    if https or tls.enabled:
        kwargs["ssl_context"] = ssl_context(tls)
    return urllib3.PoolManager(**kwargs)  # type: ignore[arg-type]


def exception_reason(exc: BaseException) -> str:
    """A loggable one-line reason for a transport exception."""
    return redact(f"{type(exc).__name__}: {exc}")[:500]
