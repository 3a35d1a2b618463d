"""Golden traces of PFLlib's methods with parts beside the model or feature alignment: FedPAC (so far).

    /work/ref-venv/bin/pip install cvxpy      # PFLlib's serverpac imports it (its QP solver)
    /work/ref-venv/bin/python scripts/golden/record_pfllib_module.py --pfllib /work/ref/PFLlib [--out tests/fixtures/golden]

The setting of scripts/golden/record_pfllib.py (whose helpers this imports): PFLlib's own client
class and its server's methods (on a stand-in server object holding only the attributes they read),
the tiny problem of the pFedMe traces (4 clients, 12 features, 4 classes), the DNN 12-8(ReLU)-4 as
BaseHeadSplit with the pFedMe traces' initial weights, lr 0.1, batches of 4, 3 rounds of 2 of the 4
clients (numpy seeded), CPU, one thread. Every pass over a client's loader (`for x, y in loader`) is
a fresh seeded permutation of ALL its rows cut into minibatches of 4 (a shuffling DataLoader with
drop_last; the clients' 12, 16, 20 and 8 rows divide evenly), recorded in the order PFLlib walks them.

FedPAC (clientPAC, serverpac.FedPAC, -lam 1, 1 local epoch): per round the server's send_models
(every client's statistics_extraction: 3 passes, a probe of the feature size, the features, the
label counts), the selected clients' train() (a head pass, local_epochs body passes, then
collect_protos' pass), receive_protos, proto_aggregation, send_protos, receive_models,
aggregate_parameters, aggregate_and_send_heads (its QP solved by cvxpy). One patch: `random.sample`
(receive_models' order of the clients it receives) keeps the selection order. PFLlib pairs the
statistics, gathered in selection order, with the heads in received order: when the two differ a
client's head is built with another client's weights (docs/baselines.md, FedPAC); the recorder keeps
the orders equal so that the trace checks the method. Recorded per round: the selected clients, every
pass's rows per client (send_models' and train()'s), the server's body, every client's model, the
global prototypes and the clients' statistics (V, h) of the round.
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
from record_pfllib import BATCH, BATCH_SEED, FIXTURES, JOIN, LR, ROUNDS, SELECT_SEED, Shuffling, model  # noqa: E402

RUNS = {"fedpac": ("clientpac", "clientPAC", "serverpac", "FedPAC", dict(lamda=1.0, local_epochs=1)),
        "gpfl": ("clientgpfl", "clientGPFL", "servergpfl", "GPFL", dict(lamda=0.5, mu=0.1, local_epochs=1))}
SERVER_METHODS = {"fedpac": ("send_models", "receive_models", "aggregate_parameters", "add_parameters",
                             "receive_protos", "send_protos", "aggregate_and_send_heads", "add_heads"),
                  "gpfl": ("send_models", "receive_models", "aggregate_parameters", "add_parameters", "global_GCE",
                           "add_GCE", "global_CoV", "add_CoV")}


def params(m) -> dict:
    return {n: p.detach().tolist() for n, p in m.named_parameters()}


def record(pfllib: str, algo: str, data: dict, init: dict) -> dict:
    if algo == "gpfl":
        return record_gpfl(pfllib, data, init)
    import importlib

    cmod, ccls, smod, scls, extra = RUNS[algo]
    Client = getattr(importlib.import_module(f"flcore.clients.{cmod}"), ccls)
    server_module = importlib.import_module(f"flcore.servers.{smod}")
    Server = getattr(server_module, scls)
    args = types.SimpleNamespace(model=model(init), algorithm=algo, dataset="golden", device="cpu", save_folder_name="x",
                                 num_classes=4, batch_size=BATCH, local_learning_rate=LR, few_shot=0,
                                 learning_rate_decay_gamma=1.0, learning_rate_decay=False, **extra)
    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    with contextlib.redirect_stdout(io.StringIO()):
        clients = [Client(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                          send_slow=False) for i, c in enumerate(data["clients"])]
    server = types.SimpleNamespace(clients=clients, client_drop_rate=0.0, current_num_join_clients=JOIN,
                                   time_threthold=float("inf"), global_model=copy.deepcopy(args.model), num_classes=4)
    for name in SERVER_METHODS[algo]:
        setattr(server, name, getattr(Server, name).__get__(server))
    rng = np.random.RandomState(BATCH_SEED)
    np.random.seed(SELECT_SEED)
    logs: dict = {}

    def loaders(phase: str) -> None:  # every client's passes from now on are logged under `phase`
        for i, c in enumerate(clients):
            log = logs.setdefault(i, {}).setdefault(phase, [])
            c.load_train_data = lambda batch_size=None, i=i, log=log: Shuffling(xs[i], ys[i], rng, log)

    trace = []
    in_order = lambda population, k: list(population)[:k]  # receive_models: the selection's order
    with mock_sample(in_order), contextlib.redirect_stdout(io.StringIO()):
        for r in range(ROUNDS):
            logs.clear()
            selected = sorted(np.random.choice(len(clients), JOIN, replace=False).tolist())
            server.selected_clients = [clients[i] for i in selected]
            loaders("stats")
            server.send_models()
            server.Vars = [c.V for c in server.selected_clients]
            server.Hs = [c.h for c in server.selected_clients]
            loaders("train")
            for c in server.selected_clients:
                c.train()
            server.receive_protos()
            server.global_protos = server_module.proto_aggregation(server.uploaded_protos)
            server.send_protos()
            server.receive_models()
            server.aggregate_parameters()
            server.aggregate_and_send_heads()
            trace.append({
                "selected": selected,
                "batches": {str(i): {"stats": logs[i]["stats"], "train": logs[i]["train"]} for i in selected},
                "server": params(server.global_model),
                "clients": {str(i): params(c.model) for i, c in enumerate(clients)},
                "protos": {str(k): v.tolist() for k, v in server.global_protos.items()},
                "V": [float(v) for v in server.Vars], "h": [h.tolist() for h in server.Hs]})
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": f"{cmod}.{ccls}", "server": f"{smod}.{scls}"},
            "algorithm": algo, "dtype": "float32", "unit": "epochs",
            "args": {"lr": LR, "batch_size": BATCH, "rounds": ROUNDS, "join": JOIN, **extra},
            "init": init, "iterations": trace}


def record_gpfl(pfllib: str, data: dict, init: dict) -> dict:
    """GPFL: the server's round (clients' train(), receive_models, aggregate_parameters, send_models,
    global_GCE, global_CoV), its GCE and CoV built as its __init__ builds them (torch seeded 0)."""
    from flcore.clients.clientgpfl import clientGPFL
    from flcore.servers import servergpfl

    cmod, ccls, smod, scls, extra = RUNS["gpfl"]
    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    torch.manual_seed(0)
    gce, cov = servergpfl.GCE(in_features=8, num_classes=4, dev="cpu"), servergpfl.CoV(8)
    modules = {"gce": params(gce), "cov": params(cov)}
    args = types.SimpleNamespace(model=model(init), algorithm="gpfl", dataset="golden", device="cpu", save_folder_name="x",
                                 num_classes=4, batch_size=BATCH, local_learning_rate=LR, few_shot=0, GCE=gce, CoV=cov,
                                 learning_rate_decay_gamma=1.0, learning_rate_decay=False, **extra)
    rng = np.random.RandomState(BATCH_SEED)
    logs: dict = {}
    saved = clientGPFL.load_train_data
    # every pass is logged under the client's current phase ("init": __init__'s class count)
    clientGPFL.load_train_data = lambda self, batch_size=None: Shuffling(
        xs[self.id], ys[self.id], rng, logs.setdefault(self.id, {}).setdefault(logs.get("phase"), []))
    try:
        logs["phase"] = "init"
        with contextlib.redirect_stdout(io.StringIO()):
            clients = [clientGPFL(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                                  send_slow=False) for i, c in enumerate(data["clients"])]
        server = types.SimpleNamespace(clients=clients, client_drop_rate=0.0, current_num_join_clients=JOIN,
                                       time_threthold=float("inf"), global_model=copy.deepcopy(args.model.base))
        for name in SERVER_METHODS["gpfl"]:
            setattr(server, name, getattr(servergpfl.GPFL, name).__get__(server))
        np.random.seed(SELECT_SEED)
        trace = []
        for r in range(ROUNDS):
            logs.clear()
            logs["phase"] = "train"
            selected = sorted(np.random.choice(len(clients), JOIN, replace=False).tolist())
            server.selected_clients = [clients[i] for i in selected]
            for c in server.selected_clients:
                c.train()
            server.receive_models()
            server.aggregate_parameters()
            server.send_models()
            server.global_GCE()
            server.global_CoV()
            trace.append({
                "selected": selected, "batches": {str(i): {"train": logs[i]["train"]} for i in selected},
                "server": params(server.global_model), "gce": params(server.GCE), "cov": params(server.CoV),
                "clients": {str(i): params(c.model) for i, c in enumerate(clients)},
                "conditions": {str(i): [c.generic_conditional_input.tolist(), c.personalized_conditional_input.tolist()]
                               for i, c in enumerate(clients)}})
    finally:
        clientGPFL.load_train_data = saved
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": f"{cmod}.{ccls}", "server": f"{smod}.{scls}"},
            "algorithm": "gpfl", "dtype": "float32", "unit": "epochs",
            "args": {"lr": LR, "batch_size": BATCH, "rounds": ROUNDS, "join": JOIN, **extra},
            "init": init, "modules": modules, "iterations": trace}


@contextlib.contextmanager
def mock_sample(fn):
    saved = random.sample
    random.sample = fn
    try:
        yield
    finally:
        random.sample = saved


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
        out = record(a.pfllib, algo, data, init)
        path = os.path.join(a.out, f"pfllib_{algo}.json")
        with open(path, "w") as f:
            json.dump(out, f)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
