"""The authors' pFedMe code (CharlieDinh/pFedMe) run at full size on fedrun's data, or on their own files.

    python scripts/golden/run_pfedme_authors.py --authors /path/to/pFedMe/checkout \
        --dataset Synthetic --algorithm PerAvg --model dnn [--rounds 600] [--seed 0]
    python scripts/golden/run_pfedme_authors.py --authors ... --dataset Mnist --data-root DIR ...
    python scripts/golden/run_pfedme_authors.py --authors ... --dataset Mnist --files DIR ...

A diagnostic beside the golden traces: where fedrun's `protocol=official` misses a number of the
pFedMe paper's Table 1, this runs THEIR server (servers/users/models imported from the checkout)
with the fine-tuned arguments of their README and prints the accuracy their code reports: the max
over rounds of rs_glob_acc_per (Per-FedAvg, pFedMe PM) or rs_glob_acc (FedAvg, pFedMe GM). If
their own code misses the paper's number too, the gap is not fedrun's.

Data: fedrun's, in their dict layout: Synthetic(0.5, 0.5) (`fedrun.data.synthetic`: their
generator's draws) or, for Mnist, `fedrun.data.mnist_pfedme_authors` (their 2020
MNIST generator) on the MNIST under --data-root. With --files DIR, their own `read_data` instead
reads DIR/data/<dataset>/data/{train,test}/*.json as their generator wrote them.

Run-time patches (none to the math): `read_data` returns the data above; every user's full-size
train and test DataLoaders are replaced by the one batch they yield, collated once (their
evaluation re-collates every row every round, which made 600 rounds take hours); save_results /
save_model do nothing; prints are silenced. torch.manual_seed(0) before the model as their main.py;
`--seed` seeds numpy's global stream, which their client selection draws from (their main.py leaves
it unseeded).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import sys
import time
import warnings

import numpy as np
import torch

# Their README's fine-tuned commands (pFedMe paper Table 1): batch 20, 20 local epochs; Synthetic:
# 600 rounds, 10 users per round; Mnist: 800 rounds, 5 users per round; and per (algorithm, model):
SETTING = {"Synthetic": dict(rounds=600, users=10, features=60, hidden=20),
           "Mnist": dict(rounds=800, users=5, features=784, hidden=100)}
README_ARGS = {
    ("Synthetic", "pFedMe", "mclr"): dict(learning_rate=0.01, personal_learning_rate=0.01, beta=2.0, lamda=20),
    ("Synthetic", "FedAvg", "mclr"): dict(learning_rate=0.02),
    ("Synthetic", "PerAvg", "mclr"): dict(learning_rate=0.02, beta=0.002),
    ("Synthetic", "pFedMe", "dnn"): dict(learning_rate=0.01, personal_learning_rate=0.01, beta=2.0, lamda=30),
    ("Synthetic", "FedAvg", "dnn"): dict(learning_rate=0.03),
    ("Synthetic", "PerAvg", "dnn"): dict(learning_rate=0.01, beta=0.001),
    ("Mnist", "pFedMe", "mclr"): dict(learning_rate=0.01, personal_learning_rate=0.1, beta=2.0, lamda=15),
    ("Mnist", "FedAvg", "mclr"): dict(learning_rate=0.02),
    ("Mnist", "PerAvg", "mclr"): dict(learning_rate=0.03, beta=0.003),
    ("Mnist", "pFedMe", "dnn"): dict(learning_rate=0.01, personal_learning_rate=0.05, beta=2.0, lamda=30),
    ("Mnist", "FedAvg", "dnn"): dict(learning_rate=0.02),
    ("Mnist", "PerAvg", "dnn"): dict(learning_rate=0.02, beta=0.001),
}
# The paper's Table 1 (pFedMe: GM, PM).
PAPER = {
    ("Synthetic", "FedAvg", "mclr"): 77.62, ("Synthetic", "PerAvg", "mclr"): 81.49,
    ("Synthetic", "pFedMe", "mclr"): (78.65, 83.20), ("Synthetic", "FedAvg", "dnn"): 83.64,
    ("Synthetic", "PerAvg", "dnn"): 85.01, ("Synthetic", "pFedMe", "dnn"): (84.17, 86.36),
    ("Mnist", "FedAvg", "mclr"): 93.96, ("Mnist", "PerAvg", "mclr"): 94.37, ("Mnist", "pFedMe", "mclr"): (94.18, 95.62),
    ("Mnist", "FedAvg", "dnn"): 98.79, ("Mnist", "PerAvg", "dnn"): 98.90, ("Mnist", "pFedMe", "dnn"): (99.16, 99.46),
}

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True)
    ap.add_argument("--dataset", choices=list(SETTING), default="Synthetic")
    ap.add_argument("--algorithm", choices=["FedAvg", "PerAvg", "pFedMe"], required=True)
    ap.add_argument("--model", choices=["mclr", "dnn"], required=True)
    ap.add_argument("--rounds", type=int, help="default: 600 (Synthetic), 800 (Mnist)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-root", default="data", help="fedrun's MNIST root (MNIST/raw), for --dataset Mnist")
    ap.add_argument("--files", help="read their own json files under DIR/data/<dataset>/data instead of fedrun's data")
    ap.add_argument("--cache-dir", default=".cache/fedrun")
    o = ap.parse_args()
    setting = SETTING[o.dataset]
    rounds = o.rounds or setting["rounds"]
    sys.path.insert(0, os.path.abspath(o.authors))
    warnings.filterwarnings("ignore", message=".*overload of add_ is deprecated.*")
    torch.set_num_threads(1)

    import FLAlgorithms.servers.serveravg as serveravg
    import FLAlgorithms.servers.serverperavg as serverperavg
    import FLAlgorithms.servers.serverpFedMe as serverpfedme
    from FLAlgorithms.servers.serverbase import Server
    from FLAlgorithms.trainmodel.models import DNN, Mclr_Logistic

    if o.files:
        os.chdir(o.files)  # their read_data reads data/<dataset>/data/{train,test} under the working folder
    else:
        from fedrun.data import mnist_pfedme_authors, synthetic

        if o.dataset == "Synthetic":
            d = synthetic(cache_dir=o.cache_dir)
        else:
            d = mnist_pfedme_authors(root=o.data_root, download=False, cache_dir=o.cache_dir)
        ids = [f"f_{c:05d}" for c in range(d.num_clients)]

        def users(split):
            return {i: {"x": split.x[split.client_rows(c)].flatten(1).numpy(),
                        "y": split.y[split.client_rows(c)].numpy()}
                    for c, i in enumerate(ids)}

        blob = (ids, [], users(d.train), users(d.test))
        for module in (serveravg, serverperavg, serverpfedme):
            module.read_data = lambda dataset: blob
    Server.save_results = lambda self: None
    Server.save_model = lambda self: None

    key = (o.dataset, o.algorithm, o.model)
    a = {"beta": 1.0, "lamda": 15, "K": 5, "personal_learning_rate": 0.09, **README_ARGS[key]}
    torch.manual_seed(0)
    f = setting["features"]
    net = DNN(f, setting["hidden"], 10) if o.model == "dnn" else Mclr_Logistic(f, 10)
    common = (o.dataset, o.algorithm, (net, o.model), 20, a["learning_rate"], a["beta"],
              a["lamda"], rounds, 20, "SGD", setting["users"])
    if "device" in inspect.signature(Server.__init__).parameters:  # added in Dec 2020 (commit 7e52b22)
        common = (torch.device("cpu"), *common)
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
            print(f"{o.dataset} {o.algorithm} {o.model} {name}: best {acc.max():.2f} (round {acc.argmax()}), "
                  f"last {acc[-1]:.2f}; paper {PAPER[key]}; {rounds} rounds in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
