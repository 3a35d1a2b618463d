"""Peak memory against the number of clients (synthetic data; MLR and the MLP 60-20-10).

For each setting a fresh process loads the (pre-generated, cached) data and runs a few rounds with
10% of the clients per round, tau=20, batch 20 and full evaluation of every client each round.
Printed per setting: the process's resident memory right after importing torch (base), the data's
own size (rows, chunk layout), the process's peak resident memory (CPU) or peak CUDA memory (GPU),
and the peak minus base and data: what loading and the engine add.

    python -m fedrun.bench.memory [--clients 100,1000,10000] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time


def _status_mb(field: str) -> float:
    """VmHWM (peak) or VmRSS (current) of this process in MB; unlike ru_maxrss, VmHWM starts afresh
    at exec instead of inheriting the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(n: int, model_name: str, device: str, cache: str, rounds: int) -> dict:
    import torch

    from ..algorithms.perfedavg import PerFedAvg
    from ..data import synthetic
    from ..engine import VmapEngine, params_of
    from ..models import MLP, MLR
    from ..simulate import Schedule, simulate

    rss0 = _status_mb("VmRSS")
    data = synthetic(num_clients=n, cache_dir=cache).to(device)
    data_bytes = sum(t.numel() * t.element_size() for split in (data.train, data.test)
                     for t in (split.x, split.y, split.chunk_idx, split.chunk_mask))
    torch.manual_seed(0)
    model = (MLR(60, 10) if model_name == "mlr" else MLP(60, 10, hidden=[20])).to(device)
    sched = Schedule(rounds=rounds, tau=20, clients_per_round=max(1, n // 10), batch_size=20)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    simulate(PerFedAvg(variant="fo"), VmapEngine(model), data, params_of(model), sched, 0)
    if device == "cuda":
        torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / rounds
    out = {"clients": n, "model": model_name, "rows": int(data.train.sizes.sum() + data.test.sizes.sum()),
           "data_MB": data_bytes / 2**20, "s_per_round": sec,
           "peak_rss_MB": _status_mb("VmHWM"), "rss_after_import_MB": rss0}
    if device == "cuda":
        out["peak_cuda_MB"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="100,1000,10000")
    ap.add_argument("--models", default="mlr,dnn")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache", default=None, help="data cache folder (default: a temporary one)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        n, model_name = args.child.split(":")
        print(json.dumps(child(int(n), model_name, args.device, args.cache, args.rounds)))
        return
    cache = args.cache or tempfile.mkdtemp(prefix="fedrun-membench-")
    print(f"device={args.device}; Per-FedAvg fo, 10% of clients per round, tau=20, batch 20, all clients evaluated")
    head = (f"{'clients':>8} {'model':>5} {'rows':>11} {'base MB':>8} {'data MB':>9} {'peak MB':>9} "
            f"{'peak-base-data MB':>18} {'s/round':>8}")
    print(head)
    for n in [int(c) for c in args.clients.split(",")]:
        # generate once, in its own process, outside the measured ones
        subprocess.run([sys.executable, "-c",
                        f"from fedrun.data import synthetic; synthetic(num_clients={n}, cache_dir={cache!r})"],
                       check=True)
        for model_name in args.models.split(","):
            r = subprocess.run([sys.executable, "-m", "fedrun.bench.memory", "--child", f"{n}:{model_name}",
                                "--device", args.device, "--cache", cache, "--rounds", str(args.rounds)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{n:>8} {model_name:>5} failed: {r.stderr.strip().splitlines()[-1]}")
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            base = 0.0 if "peak_cuda_MB" in res else res["rss_after_import_MB"]
            peak = res.get("peak_cuda_MB", res["peak_rss_MB"])
            print(f"{n:>8} {model_name:>5} {res['rows']:>11,} {base:>8.1f} {res['data_MB']:>9.1f} {peak:>9.1f} "
                  f"{peak - base - res['data_MB']:>18.1f} {res['s_per_round']:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
