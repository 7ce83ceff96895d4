"""Exposition: a snapshot in, Prometheus text out (our families, the dcgm-exporter profile,
the text-format primitives) and the generated metric catalogue, docs/METRICS.md."""
