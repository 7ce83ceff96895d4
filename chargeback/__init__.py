"""Monthly chargeback: GPU-hours, energy and cost per user, project and department.

A component beside exporter/ and shipper/: it imports core (gpu_audit) only. Sources
(Prometheus through the recording rules, the local archive, Elasticsearch/OpenSearch)
produce one `SourceData`; `compute.build_bill` turns it into a `Bill` with rates, a
department directory and an idle-share policy; `outputs` writes CSV, JSON, HTML and the
audit manifest that `--replay` reproduces byte for byte.
"""
