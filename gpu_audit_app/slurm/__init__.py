"""`gpu-audit slurm ...` and `gpu-audit chargeback bill --group-by slurm`: the command-line
side of gpu-audit on a Slurm cluster (arguments, files, exit codes). The Slurm domain
(reports, usage, idle policy, the bill) lives in chargeback/slurm/; nothing here
computes what those modules compute, and no component imports this package."""
