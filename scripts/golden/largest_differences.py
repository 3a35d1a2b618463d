"""Replay every golden trace of the pFedMe authors' code and of PFLlib as the tests do, and print the
largest |fedrun - reference| over all compared numbers of each (the tests check only the tolerance).

    python scripts/golden/largest_differences.py            # both engines, every trace
    python scripts/golden/largest_differences.py --engine vmap

Run from the repository root; it imports tests/test_golden_pfedme.py, tests/test_golden_pfllib.py and
tests/test_golden_pfllib_feat.py.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

import test_golden_pfedme as pfedme  # noqa: E402
import test_golden_pfllib as pfllib  # noqa: E402
import test_golden_pfllib_feat as feat  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["vmap", "loop", "both"], default="both")
    args = ap.parse_args(argv)
    engines = ["vmap", "loop"] if args.engine == "both" else [args.engine]
    print("| trace | dtype | tolerance | " + " | ".join(f"largest difference ({e})" for e in engines) + " |")
    print("| --- | --- | --- | " + " | ".join("---:" for _ in engines) + " |")
    for algorithm, model in pfedme.RUNS:
        name = f"pfedme_{algorithm}_{model}.json"
        trace, got = pfedme.load(name), []
        for e in engines:
            worst = pfedme.compare(trace, pfedme.replay(trace, [f"engine={e}"]))
            got.append(f"{pfedme.compare.max_abs:.2g}" + (" (MISMATCH)" if pfedme.mismatched(worst) else ""))
        print(f"| {name} | float32 | {pfedme.ATOL:g} + {pfedme.RTOL:g} ref | " + " | ".join(got) + " |")
    for algo in [*pfllib.ALGOS, *(f"{a}_epochs" for a in pfllib.EPOCH_OPTIONS)]:
        trace, got = pfllib.load(algo), []
        f32 = trace.get("dtype", "float32") == "float32"
        rtol, atol = (pfllib.RTOL, pfllib.ATOL) if f32 else pfllib.TOL64
        for e in engines:
            worst = pfllib.compare(trace, pfllib.replay(trace, engine=e))
            got.append(f"{pfllib.compare.max_abs:.2g}" + ("" if all(v <= 0 for v in worst.values()) else " (MISMATCH)"))
        print(f"| pfllib_{algo}.json | {'float32' if f32 else 'float64'} | {atol:g} + {rtol:g} ref | "
              + " | ".join(got) + " |")
    for algo in feat.ALGOS:  # the representation methods (record_pfllib_feat.py)
        trace, got = pfllib.load(algo), []
        for e in engines:
            worst = feat.compare(trace, feat.replay(trace, engine=e))
            got.append(f"{feat.compare.max_abs:.2g}" + ("" if all(v <= 0 for v in worst.values()) else " (MISMATCH)"))
        print(f"| pfllib_{algo}.json | float32 | {pfllib.ATOL:g} + {pfllib.RTOL:g} ref | " + " | ".join(got) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
