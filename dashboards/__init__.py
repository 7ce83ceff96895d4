"""Grafana dashboards (built in code), their provisioning files, Kibana saved objects for
the audit index, and `gpu-audit dashboards push`."""
