"""Chargeback for Slurm clusters: per-job GPU reports from the audit trail, usage grouped
by Slurm account and partition, and the reconciliation with Slurm's own accounting
(sacct's GPU TRES-hours). docs/SLURM.md."""
