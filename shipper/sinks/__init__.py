"""The sinks: one folder per backend with the same files (config.py, encode.py, sink.py,
client.py and response.py where relevant), and the pieces they share here (base.py,
errors.py, credentials.py, tls.py, httputil.py, build.py, config.py, registry.py).
docs/SHIPPER.md "Sinks: one shape" has the table."""
