"""`gpu-audit launcher ...`: the daemon's wiring (`main.py`: configuration, `serve`, the
socket clients' commands and their rendering) and `launcher replay` (`replay.py`). The
queue itself (engine, scheduler, store, daemon loop) lives in the launcher component;
nothing here schedules, and no component imports this package."""
