"""Golden traces of PFLlib's (github.com/TsingZ0/PFLlib) representation methods: MOON, FedRoD, FedProto, FedDBE.

    /work/ref-venv/bin/python scripts/golden/record_pfllib_feat.py --pfllib /work/ref/PFLlib [--algorithms moon,fedrod]

The same problem, model, initial weights, selection and minibatch draws as record_pfllib.py (whose
helpers this imports): 3 rounds, 2 of 4 clients a round, the DNN 12-8(ReLU)-4 as PFLlib's
BaseHeadSplit, lr 0.1, B = 4 rows drawn with replacement by a seeded numpy generator, one pass of 3
minibatches per client's train(), CPU, float32. PFLlib's own client classes (flcore.clients.client*)
train; its servers' own methods (send_models, receive_models, aggregate_parameters; FedProto's
receive_protos, send_protos and module-level proto_aggregation) are called on a stand-in server
holding only what they read, in the order its train() calls them (FedProto sends nothing before the
first aggregation and no model at all). Patched, none of it math: `load_train_data` (the recorded
minibatches; while a client is built, FedRoD counts its classes over one batch of ALL its rows, not
over a shuffled drop_last loader's subset) and nothing else.

Recorded per round, besides the selection and minibatches: the server model (MOON, FedRoD), every
client's model, and MOON's previous models (`old_model`), FedRoD's personal heads (`head`), FedProto's
global prototypes (label -> vector), FedDBE's representation biases (`client_mean`). Extra arguments:
MOON mu 1, tau 0.5 (PFLlib's defaults mu 0, tau 1 would make it FedAvg); FedProto lamda 1 (its
default); FedDBE momentum 0.1, kl_weight 1 (its default 0 would leave the mean regularizer out).

FedDBE's server computes its global mean in its constructor, which also reads the dataset files: the
recorder restates those lines (every client's train() with no global mean yet, on 3 recorded
minibatches drawn before the rounds' draws; the running means weighted by training rows; the mean
given to every client) around PFLlib's own client.train(), and records the init batches and the mean.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import random
import subprocess
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_pfllib import BATCH, BATCH_SEED, FIXTURES, JOIN, LR, ROUNDS, SELECT_SEED, Passes, model  # noqa: E402

# algo -> (client module, class, server module, class, extra args)
RUNS = {
    "moon": ("clientmoon", "clientMOON", "servermoon", "MOON", dict(mu=1.0, tau=0.5)),
    "fedrod": ("clientrod", "clientROD", "serverrod", "FedROD", {}),
    "fedproto": ("clientproto", "clientProto", "serverproto", "FedProto", dict(lamda=1.0)),
    "feddbe": ("clientdbe", "clientDBE", "serverdbe", "FedDBE", dict(momentum=0.1, kl_weight=1.0)),
}
STEPS = 3  # minibatches of one train() pass


def params(m) -> dict:
    return {n: p.detach().tolist() for n, p in m.named_parameters()}


def record(pfllib: str, algo: str, data: dict, init: dict) -> dict:
    cmod, ccls, smod, scls, extra = RUNS[algo]
    Client = getattr(importlib.import_module(f"flcore.clients.{cmod}"), ccls)
    smodule = importlib.import_module(f"flcore.servers.{smod}")
    Server = getattr(smodule, scls)
    args = types.SimpleNamespace(model=model(init), algorithm=algo, dataset="golden", device="cpu", save_folder_name="x",
                                 num_classes=4, batch_size=BATCH, local_learning_rate=LR, local_epochs=1, few_shot=0,
                                 learning_rate_decay_gamma=1.0, learning_rate_decay=False, **extra)
    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    base_loader = Client.load_train_data
    Client.load_train_data = lambda self, batch_size=None: [(xs[self.id], ys[self.id])]  # while building: all rows
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            clients = [Client(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                              send_slow=False) for i, c in enumerate(data["clients"])]
    finally:
        Client.load_train_data = base_loader
    server = types.SimpleNamespace(clients=clients, client_drop_rate=0.0, current_num_join_clients=JOIN,
                                   time_threthold=float("inf"), global_model=__import__("copy").deepcopy(args.model))
    for name in ("send_models", "receive_models", "aggregate_parameters", "add_parameters", "receive_protos", "send_protos"):
        if hasattr(Server, name):
            setattr(server, name, getattr(Server, name).__get__(server))
    rng = np.random.RandomState(BATCH_SEED)
    np.random.seed(SELECT_SEED)
    random.seed(0)
    trace, out = [], {}
    if algo == "feddbe":  # its server's constructor: every client trains once (no bias yet), then the global mean
        out["init_period"] = {"batches": {}}
        for i, c in enumerate(clients):
            rows = [rng.randint(0, len(ys[i]), size=BATCH).tolist() for _ in range(STEPS)]
            out["init_period"]["batches"][str(i)] = rows
            c.load_train_data = lambda batch_size=None, i=i, rows=rows: Passes([[(xs[i][b], ys[i][b]) for b in rows]])
            c.train()
        total = sum(c.train_samples for c in clients)  # (FedDBE.__init__'s weighting, restated: it runs in the constructor)
        global_mean = sum(c.running_mean * (c.train_samples / total) for c in clients)
        for c in clients:
            c.global_mean = global_mean.data.clone()
        out["init_period"]["global_mean"] = global_mean.tolist()
    for r in range(ROUNDS):
        selected = sorted(np.random.choice(len(clients), JOIN, replace=False).tolist())
        server.selected_clients = [clients[i] for i in selected]
        if algo != "fedproto":
            server.send_models()
        batches = {}
        for i in selected:
            rows = [rng.randint(0, len(ys[i]), size=BATCH).tolist() for _ in range(STEPS)]
            batches[str(i)] = {"train": rows}
            clients[i].load_train_data = lambda batch_size=None, i=i, rows=rows: Passes([[(xs[i][b], ys[i][b]) for b in rows]])
            clients[i].train()
        it = {"selected": selected, "batches": batches}
        if algo == "fedproto":
            server.receive_protos()
            server.global_protos = smodule.proto_aggregation(server.uploaded_protos)
            server.send_protos()
            it["protos"] = {str(k): v.tolist() for k, v in server.global_protos.items() if not isinstance(v, list)}
        else:
            server.receive_models()
            server.aggregate_parameters()
            it["server"] = params(server.global_model)
        it["clients"] = {str(i): params(c.model) for i, c in enumerate(clients)}
        if algo == "moon":
            it["prev"] = {str(i): params(c.old_model) for i, c in enumerate(clients)}
        if algo == "fedrod":
            it["heads"] = {str(i): params(c.head) for i, c in enumerate(clients)}
        if algo == "feddbe":
            it["bias"] = {str(i): c.client_mean.detach().tolist() for i, c in enumerate(clients)}
        trace.append(it)
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": f"{cmod}.{ccls}", "server": f"{smod}.{scls}"},
            "algorithm": algo, "dtype": "float32", "args": {"lr": LR, "batch_size": BATCH, "rounds": ROUNDS, "join": JOIN, **extra},
            "phases": [["train", STEPS]], "init": init, "iterations": trace, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pfllib", required=True, help="a checkout of TsingZ0/PFLlib")
    ap.add_argument("--out", default=FIXTURES)
    ap.add_argument("--algorithms", default=",".join(RUNS))
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(a.pfllib), "system"))
    with open(os.path.join(FIXTURES, "pfedme_data.json")) as f:
        data = json.load(f)
    with open(os.path.join(FIXTURES, "pfedme_fedavg_dnn.json")) as f:
        init = json.load(f)["init"]
    torch.set_num_threads(1)
    for algo in a.algorithms.split(","):
        path = os.path.join(a.out, f"pfllib_{algo}.json")
        with open(path, "w") as f:
            json.dump(record(a.pfllib, algo, data, init), f)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
