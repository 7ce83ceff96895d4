"""TLS towards a backend: the one place a `tls:` section becomes an ssl.SSLContext.

In core so that the shipper's sinks and chargeback's search source (which reads the
same sink configuration) share it.

Every sink that can speak TLS takes its settings from here, so a CA bundle, `verify:
false` and a client certificate mean the same thing for all of them: the InfluxDB
sinks' urllib3 pool (shipper/sinks/httputil.py `make_pool`), the OpenSearch client and
the Fluentd forward connection (shipper/sinks/fluentd/client.py) take `ssl_context()`;
the Elasticsearch client takes `elastic_transport_kwargs()`, the same settings in the
form its transport library needs (see there why not a context). The context is built
when the sink is built, so an unreadable or malformed file is a configuration error
naming the file at start, not a connection failure retried for ever.

This module must never weaken what is configured: verification is off only with
`verify: false`, and then hostname checking goes with it (a certificate that is not
verified proves no name).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, model_validator

from gpu_audit.config_section import Section
from gpu_audit.errors import ConfigError


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


def uses_tls(tls: TlsConfig, urls: Iterable[str] = ()) -> bool:
    """TLS is on when asked for, or when any backend URL is https://."""
    return tls.enabled or any(url.lower().startswith("https://") for url in urls)


def ssl_context(tls: TlsConfig, what: str = "tls") -> ssl.SSLContext:
    """The context for `tls`: system CAs (or `ca_file`), verification and hostname check
    unless `verify: false`, the client certificate when one is configured.

    Raises ConfigError naming `what` and the file when a file cannot be read or parsed.
    """
    try:
        ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(what, [f"ca_file {tls.ca_file}: {_why(exc)}"]) from None
    if not tls.verify:
        # in this order: an SSLContext refuses CERT_NONE while it still checks host names
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.client_cert is not None:
        try:
            ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                what, [f"client_cert {tls.client_cert} / client_key {tls.client_key}: "
                       f"{_why(exc)}"]) from None
    return ctx


def elastic_transport_kwargs(
    tls: TlsConfig, urls: Iterable[str], what: str = "tls"
) -> dict[str, object]:
    """`tls` as elastic-transport's TLS arguments, for the Elasticsearch client.

    Verifying, not a context: next to an ssl_context elastic-transport still passes
    urllib3 its own CA bundle (certifi), so a configured `ca_file` would stop being the
    only CA trusted; with `ca_certs` the transport builds the context from exactly the
    configured files, as `ssl_context()` does. Not verifying, a context: without one
    elastic-transport drops the client certificate when `verify_certs` is off, and a
    server that demands one would refuse us. (A context on http:// nodes is refused by
    the transport, so plain-HTTP nodes get no TLS arguments beyond `verify_certs`.)
    """
    kwargs: dict[str, object] = {}
    if not tls.verify:
        kwargs["verify_certs"] = False
        kwargs["ssl_show_warn"] = False
        if uses_tls(TlsConfig(), urls):
            kwargs["ssl_context"] = ssl_context(tls, what)
        return kwargs
    if tls.ca_file is not None:
        kwargs["ca_certs"] = str(tls.ca_file)
    if tls.client_cert is not None:
        kwargs["client_cert"] = str(tls.client_cert)
        kwargs["client_key"] = str(tls.client_key)
    return kwargs


def _why(exc: OSError) -> str:  # ssl.SSLError is an OSError
    return exc.strerror or str(exc)
