"""`gpu-audit capacity`: its options (`args.py`, all the parser loads), the command
(`main.py`: chargeback's readers per bin, launcher stores and sacct for waits) and its
what-if through the launcher's replay engine (`replay.py`). The figures are computed in
chargeback/capacity/; nothing here computes them, and no component imports this
package."""
