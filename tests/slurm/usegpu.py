"""What a CUDA program does first, for the simulated GPUs of the test cluster: open the
device files of the GPUs Slurm gave this job (SLURM_JOB_GPUS on node SLURMD_NODENAME,
under $GPU_AUDIT_TEST_DEVDIR/<node>/nvidia<i>), then run the given script in this same
process (so only it holds the devices, as only the process with a CUDA context does), or
just hold them for --sleep seconds.

    python usegpu.py --sleep 30
    python usegpu.py examples/train_numpy.py --steps 400 ...

Standard library only: it runs in the job user's interpreter.
"""

from __future__ import annotations

import os
import runpy
import sys
import time


def open_gpus() -> list[int]:
    node = os.environ["SLURMD_NODENAME"]
    base = os.environ["GPU_AUDIT_TEST_DEVDIR"]
    gpus = [g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g.strip()]
    return [os.open(os.path.join(base, node, f"nvidia{int(g)}"), os.O_RDWR) for g in gpus]


def main() -> None:
    held = open_gpus()
    print(f"usegpu: holding {len(held)} GPU(s) on {os.environ['SLURMD_NODENAME']}", flush=True)
    if sys.argv[1:2] == ["--sleep"]:
        time.sleep(float(sys.argv[2]))
        return
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
