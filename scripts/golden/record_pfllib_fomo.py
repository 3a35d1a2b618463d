"""A golden trace of PFLlib's (github.com/TsingZ0/PFLlib) FedFomo: clientFomo and serverFomo.

    /work/ref-venv/bin/python scripts/golden/record_pfllib_fomo.py --pfllib /work/ref/PFLlib

The setup of scripts/golden/record_pfllib_mix.py (whose helpers this imports): PFLlib's own client
class and its server's send_models / receive_models on a stand-in server holding only the
attributes they read (its affinity matrix P started at the identity, its stored client models at the
initial model), the tiny problem of the pFedMe traces (4 clients, 12 features, 4 classes), the DNN
12-8(ReLU)-4, its fixed initial weights, lr 0.1. ROUNDS rounds of JOIN of 4 clients (numpy seeded),
M 2. clientFomo.load_train_data returns (train loader, validation loader): here the train loader is
a recorded list of STEPS minibatches of 4 rows, the validation loader a recorded list of VAL
minibatches of 4 rows (both drawn from the client's rows; PFLlib's own split is the last 20 % of
them in order, which fedrun does not withhold: docs/baselines.md, "FedFomo").
Recorded after every round: every client's model, its old_model (its model after the round's mixture,
before training) and the server's P. Writes tests/fixtures/golden/pfllib_fedfomo.json, which
tests/test_golden_pfllib_fomo.py replays through fedrun.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import random
import subprocess
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from record_pfllib import BATCH, BATCH_SEED, FIXTURES, LR, SELECT_SEED, Passes, model  # noqa: E402
from record_pfllib_mix import STEPS, params  # noqa: E402

ROUNDS, JOIN, M, VAL = 4, 3, 2, 2


def record(pfllib: str, data: dict, init: dict) -> dict:
    from flcore.clients.clientfomo import clientFomo
    from flcore.servers.serverfomo import FedFomo

    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    C = len(xs)
    args = types.SimpleNamespace(model=model(init), algorithm="fedfomo", dataset="golden", device="cpu", save_folder_name="x",
                                 num_classes=4, batch_size=BATCH, local_learning_rate=LR, local_epochs=1, few_shot=0,
                                 learning_rate_decay_gamma=1.0, learning_rate_decay=False, num_clients=C, M=M)
    with contextlib.redirect_stdout(io.StringIO()):
        clients = [clientFomo(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                              send_slow=False) for i, c in enumerate(data["clients"])]
    server = types.SimpleNamespace(clients=clients, client_drop_rate=0.0, current_num_join_clients=JOIN, num_join_clients=JOIN,
                                   time_threthold=float("inf"), uploaded_ids=[], M=min(M, JOIN),
                                   P=torch.diag(torch.ones(C)), client_models=[copy.deepcopy(args.model) for _ in range(C)])
    for name in ("send_models", "receive_models"):
        setattr(server, name, getattr(FedFomo, name).__get__(server))
    rng = np.random.RandomState(BATCH_SEED)
    np.random.seed(SELECT_SEED)
    random.seed(0)
    trace = []
    for r in range(ROUNDS):
        selected = sorted(np.random.choice(C, JOIN, replace=False).tolist())
        server.selected_clients = [clients[i] for i in selected]
        server.send_models()
        batches, received = {}, {}
        for i in selected:
            c = clients[i]
            mine = [rng.randint(0, len(ys[i]), size=BATCH).tolist() for _ in range(STEPS)]
            val = [rng.randint(0, len(ys[i]), size=BATCH).tolist() for _ in range(VAL)]
            batches[str(i)] = {"train": mine, "val": val}
            received[str(i)] = list(c.received_ids)
            c.load_train_data = lambda batch_size=None, i=i, mine=mine, val=val: (
                Passes([[(xs[i][b], ys[i][b]) for b in mine]]), [(xs[i][b], ys[i][b]) for b in val])
            c.train()
        server.receive_models()
        trace.append({"selected": selected, "batches": batches, "received": received,
                      "clients": {str(i): params(c.model) for i, c in enumerate(clients)},
                      "old": {str(i): params(c.old_model) for i, c in enumerate(clients)},
                      "affinity": server.P.tolist()})
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": "clientfomo.clientFomo",
                          "server": "serverfomo.FedFomo"},
            "algorithm": "fedfomo", "dtype": "float32",
            "args": {"lr": LR, "batch_size": BATCH, "rounds": ROUNDS, "join": JOIN, "M": M, "val_batches": VAL},
            "phases": [["val", 1], ["train", STEPS]], "init": init, "iterations": trace}


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
    path = os.path.join(a.out, "pfllib_fedfomo.json")
    with open(path, "w") as f:
        json.dump(record(a.pfllib, data, init), f)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
