"""`gpu-audit audit ...`: the command-line side of the audit trail tools. The checks
are core's (gpu_audit.audit.verify, gpu_audit.archive.verify); nothing here decides
whether a trail is sound, and no component imports this package."""
