"""The authors' pFedMe code (CharlieDinh/pFedMe) run at full size on fedrun's synthetic data.

    python scripts/golden/run_pfedme_authors_synthetic.py --authors /path/to/pFedMe/checkout \
        --algorithm PerAvg --model dnn [--rounds 600] [--seed 0]

A diagnostic beside the golden traces: where fedrun's `protocol=official` misses a number of the
pFedMe paper's Table 1 (synthetic column), this runs THEIR server (servers/users/models imported
from the checkout) with the fine-tuned arguments of their README on fedrun's Synthetic(0.5, 0.5)
(`fedrun.data.synthetic`, the default data config: their generator's draws, SPEC section 2), and
prints the accuracy their code reports: the max over rounds of rs_glob_acc_per (Per-FedAvg, pFedMe
PM) or rs_glob_acc (FedAvg, pFedMe GM). If their own code misses the paper's number too, the gap is
not fedrun's.

Run-time patches (none to the math): `read_data` returns fedrun's data in their dict layout
(instead of reading data/Synthetic/*.json); every user's full-size train and test DataLoaders are
replaced by the one batch they yield, collated once (their evaluation re-collates every row every
round, which made 600 rounds take hours); save_results / save_model do nothing; prints are
silenced. torch.manual_seed(0) before the model as their main.py; `--seed` seeds numpy's global
stream, which their client selection draws from (their main.py leaves it unseeded).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import warnings

import numpy as np
import torch

# Their README's fine-tuned Synthetic commands (pFedMe paper Table 1): batch 20, 20 local epochs,
# 600 rounds, 10 users per round, and per (algorithm, model):
README_ARGS = {
    ("pFedMe", "mclr"): dict(learning_rate=0.01, personal_learning_rate=0.01, beta=2.0, lamda=20),
    ("FedAvg", "mclr"): dict(learning_rate=0.02),
    ("PerAvg", "mclr"): dict(learning_rate=0.02, beta=0.002),
    ("pFedMe", "dnn"): dict(learning_rate=0.01, personal_learning_rate=0.01, beta=2.0, lamda=30),
    ("FedAvg", "dnn"): dict(learning_rate=0.03),
    ("PerAvg", "dnn"): dict(learning_rate=0.01, beta=0.001),
}
PAPER = {("FedAvg", "mclr"): 77.62, ("PerAvg", "mclr"): 81.49, ("pFedMe", "mclr"): (78.65, 83.20),
         ("FedAvg", "dnn"): 83.64, ("PerAvg", "dnn"): 85.01, ("pFedMe", "dnn"): (84.17, 86.36)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True)
    ap.add_argument("--algorithm", choices=["FedAvg", "PerAvg", "pFedMe"], required=True)
    ap.add_argument("--model", choices=["mclr", "dnn"], required=True)
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=".cache/fedrun")
    o = ap.parse_args()
    sys.path.insert(0, o.authors)
    warnings.filterwarnings("ignore", message=".*overload of add_ is deprecated.*")
    torch.set_num_threads(1)

    from fedrun.data import synthetic

    import FLAlgorithms.servers.serveravg as serveravg
    import FLAlgorithms.servers.serverperavg as serverperavg
    import FLAlgorithms.servers.serverpFedMe as serverpfedme
    from FLAlgorithms.servers.serverbase import Server
    from FLAlgorithms.trainmodel.models import DNN, Mclr_Logistic

    d = synthetic(cache_dir=o.cache_dir)
    ids = [f"f_{c:05d}" for c in range(d.num_clients)]

    def users(split):
        return {i: {"x": split.x[split.client_rows(c)].numpy(), "y": split.y[split.client_rows(c)].numpy()}
                for c, i in enumerate(ids)}

    blob = (ids, [], users(d.train), users(d.test))
    for module in (serveravg, serverperavg, serverpfedme):
        module.read_data = lambda dataset: blob
    Server.save_results = lambda self: None
    Server.save_model = lambda self: None

    a = {"beta": 1.0, "lamda": 15, "K": 5, "personal_learning_rate": 0.09, **README_ARGS[(o.algorithm, o.model)]}
    torch.manual_seed(0)
    net = DNN(60, 20, 10) if o.model == "dnn" else Mclr_Logistic(60, 10)
    common = (torch.device("cpu"), "Synthetic", o.algorithm, (net, o.model), 20, a["learning_rate"], a["beta"],
              a["lamda"], o.rounds, 20, "SGD", 10)
    with contextlib.redirect_stdout(io.StringIO()):
        if o.algorithm == "FedAvg":
            server = serveravg.FedAvg(*common, 0)
        elif o.algorithm == "PerAvg":
            server = serverperavg.PerAvg(*common, 0)
        else:
            server = serverpfedme.pFedMe(*common, a["K"], a["personal_learning_rate"], 0)
        for u in server.users:  # the single full batch their full-size loaders yield, collated once
            u.trainloaderfull = [next(iter(u.trainloaderfull))]
            u.testloaderfull = [next(iter(u.testloaderfull))]
        np.random.seed(o.seed)
        t0 = time.time()
        server.train()
    curves = {"GM": server.rs_glob_acc, "PM": server.rs_glob_acc_per}
    for name, acc in curves.items():
        if len(acc):
            acc = np.asarray(acc) * 100
            print(f"{o.algorithm} {o.model} {name}: best {acc.max():.2f} (round {acc.argmax()}), last {acc[-1]:.2f}; "
                  f"paper {PAPER[(o.algorithm, o.model)]}; {o.rounds} rounds in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
