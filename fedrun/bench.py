"""Seconds per round, after warm-up, for the vectorized and the loop engine in the same process.

Default setting (issue 2): synthetic data, 100 clients, MLP 60-20-10, 10 clients per round, tau=20,
batch 20, evaluation of all 100 clients every round; FedAvg and Per-FedAvg (fo, hf).
    python -m fedrun.bench            (or fedrun-bench)  [--rounds N] [--device cpu|cuda]
pFedMe setting (issue 4; pFedMe's Table 1, official protocol): the same data and model, ALL 100
clients train every round (R=tau=20 local rounds of K=5 inner steps, batch 20), 10 aggregated
(sample-weighted), PM = local models, every client evaluated every round:
    python -m fedrun.bench --algos pfedme
"""
from __future__ import annotations

import argparse
import time

import torch

from .algorithms import FedAvg, PerFedAvg, PFedMe
from .data import synthetic
from .functional import ENGINES, params_of
from .models import MLP
from .simulate import Schedule, simulate

ALGOS = {
    "fedavg": lambda: FedAvg(beta=0.02, alpha=0.02),
    "perfedavg-fo": lambda: PerFedAvg(alpha=0.02, beta=0.02, variant="fo"),
    "perfedavg-hf": lambda: PerFedAvg(alpha=0.02, beta=0.02, variant="hf"),
    "perfedavg-exact": lambda: PerFedAvg(alpha=0.02, beta=0.02, variant="exact"),
    "pfedme": lambda: PFedMe(lam=30, eta=0.01, personal_lr=0.01, K=5, beta=2.0, mu=0.001, personalized="local",
                             train_all=True),
}
AGGREGATE = {"pfedme": "samples"}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_rounds(algo, engine_name, data, sched, device, warmup: int, seed: int = 0) -> float:
    torch.manual_seed(seed)
    model = MLP(data.in_features, data.num_classes, hidden=[20]).to(device)
    engine = ENGINES[engine_name](model)
    warm = Schedule(**{**sched.__dict__, "rounds": warmup})
    simulate(algo, engine, data, params_of(model), warm, seed)
    _sync(device)
    t0 = time.perf_counter()
    simulate(algo, engine, data, params_of(model), sched, seed)
    _sync(device)
    return (time.perf_counter() - t0) / sched.rounds


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--loop-rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--algos", default="fedavg,perfedavg-fo,perfedavg-hf,perfedavg-exact")
    ap.add_argument("--tau", type=int, default=20)
    ap.add_argument("--personalize-batch", type=int, default=None,
                    help="test-time adaptation on a minibatch of this size (default: all training rows)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data = synthetic(cache_dir=".cache/fedrun").to(device)
    print(f"device={device} threads={torch.get_num_threads()} clients={data.num_clients} "
          f"train_rows={int(data.train.sizes.sum())} test_rows={int(data.test.sizes.sum())}; "
          f"10 clients/round, tau={args.tau}, batch 20, MLP 60-20-10, all {data.num_clients} clients evaluated every round, "
          f"personalization on {'all training rows' if args.personalize_batch is None else f'{args.personalize_batch}-row minibatches'}")
    print(f"{'algorithm':<18}{'vmap s/round':>14}{'loop s/round':>14}{'loop/vmap':>11}")
    for name in args.algos.split(","):
        res = {}
        for eng, rounds in (("vmap", args.rounds), ("loop", args.loop_rounds)):
            sched = Schedule(rounds=rounds, tau=args.tau, clients_per_round=10, batch_size=20, eval_every=1,
                             personalize_batch=args.personalize_batch, aggregate=AGGREGATE.get(name, "uniform"))
            res[eng] = time_rounds(ALGOS[name](), eng, data, sched, device, args.warmup)
        print(f"{name:<18}{res['vmap']:>14.4f}{res['loop']:>14.4f}{res['loop'] / res['vmap']:>11.1f}", flush=True)


if __name__ == "__main__":
    main()
