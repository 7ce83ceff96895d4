"""Where `gpu-audit dashboards push` puts the Grafana dashboards unless told otherwise.

Shared by the command line (cli_args.py, which must import neither grafana-client nor
the builders) and push.py, so neither imports the other for them.
"""

DEFAULT_FOLDER = "GPU"
DEFAULT_FOLDER_UID = "gpu-audit"
