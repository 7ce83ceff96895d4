"""`gpu-audit chargeback bill|simulate|replay`: the command-line side of chargeback
(arguments, the source readers that need the gpu-audit configuration, the simulator run,
what is printed). The bill itself is the chargeback component's; nothing here prices or
reconciles, and no component imports this package."""
