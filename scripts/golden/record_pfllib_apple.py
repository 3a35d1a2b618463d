"""Golden trace of PFLlib's APPLE (clientAPPLE, serverAPPLE):

    /work/ref-venv/bin/python scripts/golden/record_pfllib_apple.py --pfllib /work/ref/PFLlib

The setup of scripts/golden/record_pfllib_mix.py (whose helpers this imports): PFLlib's own client
class, the tiny problem of the pFedMe traces (4 clients, 12 features, 4 classes), the DNN
12-8(ReLU)-4, its fixed initial weights, lr 0.1, 3 rounds, each client's pass over its loader
replaced by a recorded list of 3 minibatches of 4 rows. APPLE's server trains EVERY client every
round: all 4 here. Per round: serverAPPLE's own send_models (the list of every client's model_c),
then each client's train(R) in order; recorded: every client's core model_c, its personalized model
and its p vector (ps) after the round. dr_learning_rate 1, mu 0.5, L 1 (of global_rounds 3: the
proximal weight 1, 1, 0.75 in rounds 0, 1, 2).

Two things the stand-in server does itself: p0 (the clients' shares of training rows), as
serverAPPLE's __init__ computes it; and each client gets its OWN copy of the downloaded models.
PFLlib's send_models hands every client the same list of the same model objects, and a client's
core step writes into its entry in place, so a client trained later in PFLlib's sequential loop
mixes the trained cores of the clients before it, and its "recover" line restores nothing (the two
models it names are one object). With copies, every client mixes the cores of the round's start, as
separate machines would, and fedrun's round (all clients at once) can replay it (docs/baselines.md,
"APPLE").
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import io
import json
import os
import subprocess
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from record_pfllib import BATCH, BATCH_SEED, FIXTURES, LR, ROUNDS, Passes, model  # noqa: E402
from record_pfllib_mix import STEPS, params  # noqa: E402

EXTRA = dict(dr_learning_rate=1.0, mu=0.5, L=1.0, global_rounds=ROUNDS)


def record(pfllib: str, data: dict, init: dict) -> dict:
    Client = importlib.import_module("flcore.clients.clientapple").clientAPPLE
    Server = importlib.import_module("flcore.servers.serverapple").APPLE
    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    C = len(xs)
    args = types.SimpleNamespace(model=model(init), algorithm="apple", dataset="golden", device="cpu", save_folder_name="x",
                                 num_classes=4, batch_size=BATCH, local_learning_rate=LR, local_epochs=1, few_shot=0,
                                 learning_rate_decay_gamma=1.0, learning_rate_decay=False, num_clients=C, **EXTRA)
    with contextlib.redirect_stdout(io.StringIO()):
        clients = [Client(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                          send_slow=False) for i, c in enumerate(data["clients"])]
    total = sum(c.train_samples for c in clients)  # serverAPPLE.__init__'s p0
    for c in clients:
        c.p0 = [k.train_samples / total for k in clients]
    server = types.SimpleNamespace(clients=clients)
    server.send_models = Server.send_models.__get__(server)
    rng = np.random.RandomState(BATCH_SEED)
    trace = []
    for r in range(ROUNDS):
        server.send_models()
        for c in clients:  # each client's own copy of the downloads (see the docstring)
            c.set_models(copy.deepcopy(c.model_cs))
        batches = {}
        for i, c in enumerate(clients):
            mine = [rng.randint(0, len(ys[i]), size=BATCH).tolist() for _ in range(STEPS)]
            batches[str(i)] = {"train": mine}
            c.load_train_data = lambda batch_size=None, i=i, mine=mine: Passes([[(xs[i][b], ys[i][b]) for b in mine]])
            c.train(r)
        trace.append({"selected": list(range(C)), "batches": batches,
                      "core": {str(i): params(c.model_c) for i, c in enumerate(clients)},
                      "clients": {str(i): params(c.model) for i, c in enumerate(clients)},
                      "p": {str(i): [float(v) for v in c.ps] for i, c in enumerate(clients)},
                      "lamda": [c.lamda for c in clients]})
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": "clientapple.clientAPPLE",
                          "server": "serverapple.APPLE"},
            "algorithm": "apple", "dtype": "float32",
            "args": {"lr": LR, "batch_size": BATCH, "rounds": ROUNDS, "join": C, **EXTRA},
            "phases": [["train", STEPS]], "init": init, "iterations": trace}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pfllib", required=True, help="a checkout of TsingZ0/PFLlib")
    ap.add_argument("--out", default=FIXTURES)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(a.pfllib), "system"))
    with open(os.path.join(FIXTURES, "pfedme_data.json")) as f:
        data = json.load(f)
    with open(os.path.join(FIXTURES, "pfedme_fedavg_dnn.json")) as f:
        init = json.load(f)["init"]
    torch.set_num_threads(1)
    path = os.path.join(a.out, "pfllib_apple.json")
    with open(path, "w") as f:
        json.dump(record(a.pfllib, data, init), f)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
