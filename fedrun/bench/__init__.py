"""The measuring tools (fedrun-bench and its parts): round timings of both engines (cli.py, with the
shared settings in common.py), batched seeds (seeds.py), memory per client count (memory.py),
compile/precision modes (compile.py), the GPU check (gpu_check.py), the engine-agreement cases the
tests and the GPU check share (agreement.py), partition times at scale (partitions.py) and the
vmapped LSTM against per-client loops (lstm.py).

Nothing is imported here: `fedrun-bench` (cli.py) must load fedrun.openmp before torch."""
