"""How long idle OpenMP threads spin before they sleep; imported by fedrun's entry points (`fedrun`,
`fedrun-bench`) before anything loads torch, since the OpenMP runtime reads its settings once, when
it is loaded.

torch's CPU operators run on an OpenMP thread team (GNU libgomp in the Linux wheels). Between two
parallel operators libgomp's waiting threads spin for GOMP_SPINCOUNT iterations (300,000 by default)
before sleeping. That is right on an idle machine and ruinous on a busy one: when another process
holds one of the cores, every operator waits for a thread that is spinning on, or descheduled from,
a shared core. A fedrun round is thousands of small operators, so on the 2-core machine here, with
one other single-threaded process running (a Python busy loop), `fedrun rounds=50 threads=default
progress=false plot=false` took 25.6-84.8 s (three runs) against 1.8 s idle (2026-11-25). With
GOMP_SPINCOUNT=10000 the same run took 7.0-9.7 s beside that process (six runs) and 1.8-1.9 s idle
(six runs, against 1.8 s for six with the default), and
`fedrun-bench --algos pfedme,perfedavg-fo --loop-rounds 0 --threads 2 --rounds 10 --repeats 3`
idle gave the same s/round within noise (pFedMe 0.088-0.091 both ways). Lower counts cost idle
speed (1,000: 3.2 s; OMP_WAIT_POLICY=PASSIVE: 4.5 s, slower than one thread's 2.9 s); one thread
per process (`threads=1`) stays fastest where processes share cores (2.9-3.1 s beside it).

A user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY is left as it is. Other OpenMP runtimes ignore the
variable. Child processes (launchers, paper scripts) inherit it.
"""
from __future__ import annotations

import os
import sys

SPINCOUNT = "10000"
# whether torch was loaded before this module ran (then the setting came too late); a test checks it is not
TORCH_LOADED_FIRST = "torch" in sys.modules

if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = SPINCOUNT
