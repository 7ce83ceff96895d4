"""The sinks: one folder per backend with the same files (config.py, encode.py, sink.py,
client.py and response.py where relevant), and the pieces they share here (base.py,
errors.py, httputil.py, build.py, config.py, registry.py); TLS and secrets come from
core (gpu_audit.tls, gpu_audit.credentials). docs/SHIPPER.md "Sinks: one shape" has the
table; registry.py is where a sink type is added."""
