"""TLS towards a sink's backend: moved to core (gpu_audit/tls.py) so that chargeback's
search source shares it; re-exported here for the sinks."""

from gpu_audit.tls import TlsConfig, elastic_transport_kwargs, ssl_context, uses_tls

__all__ = ["TlsConfig", "elastic_transport_kwargs", "ssl_context", "uses_tls"]
