"""Golden traces of PFLlib's (github.com/TsingZ0/PFLlib) model-mixing methods: FedAMP and FedPHP.

    /work/ref-venv/bin/python scripts/golden/record_pfllib_mix.py --pfllib /work/ref/PFLlib [--algorithms fedamp]

The setup of scripts/golden/record_pfllib.py (whose helpers this imports): PFLlib's own client
classes and its server's methods (on a stand-in server holding only the attributes they read), the
tiny problem of the pFedMe traces (4 clients, 12 features, 4 classes), the DNN 12-8(ReLU)-4 as
BaseHeadSplit, its fixed initial weights, lr 0.1, 3 rounds of 2 of 4 clients (numpy seeded), each
selected client's pass over its loader replaced by a recorded list of 3 minibatches of 4 rows.
Writes pfllib_<algo>.json, which tests/test_golden_pfllib_mix.py replays through fedrun.

FedAMP (clientAMP, serverAMP): per round the server's own send_models (the attention-weighted cloud
models u_i from the previous round's uploaded models, written into each selected client's client_u),
each selected client's train(), receive_models (serverbase); recorded: every client's model and
client_u after the round. alphaK 1, lamda 1, sigma 10 (PFLlib's default sigma 1 makes every weight
exp(-||w_i - w_j||^2) vanish on this problem, and the trace would not see the attention).
FedPHP (clientPHP, serverPHP): send_models(R) (the global model to EVERY client, R = 0, 1, 2),
each selected client's train() (its loss (1 - lamda) CE + lamda MMD(features of model, of model_p);
then model_p <- (1 - mu R / T) model + (mu R / T) model_p), receive_models, aggregate_parameters;
recorded: the server model, every client's model and model_p. mu 0.9, lamda 0.5, T (global_rounds) 3.
"""
from __future__ import annotations

import copy
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pfllib import (  # noqa: E402
    STEPS,
    build_clients,
    classes,
    header,
    main,
    params,
    per_client,
    pfllib_args,
    rows,
    seed_rounds,
    select,
    stand_in,
    train_passes,
)
from record_pfllib import JOIN, ROUNDS, model  # noqa: E402

# algo -> (client module, class, server module, class, PFLlib arguments, server methods used)
RUNS = {
    "fedamp": ("clientamp", "clientAMP", "serveramp", "FedAMP", dict(alphaK=1.0, lamda=1.0, sigma=10.0),
               ("send_models", "receive_models", "e")),
    "fedphp": ("clientphp", "clientPHP", "serverphp", "FedPHP", dict(mu=0.9, lamda=0.5, global_rounds=ROUNDS),
               ("send_models", "receive_models", "aggregate_parameters", "add_parameters")),
    "fedala": ("clientala", "clientALA", "serverala", "FedALA", dict(eta=1.0, rand_percent=100, layer_idx=2),
               ("send_models", "receive_models", "aggregate_parameters", "add_parameters")),
}
JOINS = {"fedala": 4}  # FedALA: every client every round (PFLlib's send_models runs the ALA on all clients)


class CountingLoader:
    """torch's DataLoader, counting the passes made over it into `passes[client]` (FedALA's ALA epochs)."""

    passes: dict = {}

    def __init__(self, loader, cid):
        self.loader, self.cid = loader, cid

    def __iter__(self):
        CountingLoader.passes[self.cid] = CountingLoader.passes.get(self.cid, 0) + 1
        return iter(self.loader)


def record(pfllib: str, algo: str, data: dict, init: dict) -> dict:
    cmod, ccls, smod, scls, extra, methods = RUNS[algo]
    join = JOINS.get(algo, JOIN)
    xs, ys = rows(data)
    if algo == "fedala":  # its ALA reads the client's rows itself: the trace's rows, as (x, y) pairs in order
        clientala, ala = importlib.import_module("flcore.clients.clientala"), importlib.import_module("utils.ALA")
        clientala.read_client_data = lambda dataset, idx, is_train=True, few_shot=0: list(zip(xs[idx], ys[idx]))
        real = ala.DataLoader
        ala.DataLoader = lambda data, *a, **k: CountingLoader(real(data, *a, **k), next(
            i for i in range(len(xs))
            if len(data) == len(ys[i]) and torch.equal(torch.stack([d[0] for d in data]), xs[i])))
    Client, _, Server = classes(cmod, ccls, smod, scls)
    args = pfllib_args(model(init), algo, **extra)
    clients = build_clients(Client, args, data, ys)
    if algo == "fedala":  # its start phase: exactly num_pre_loss + 1 = 11 passes (the loss spread test always met)
        for c in clients:
            c.ALA.threshold = float("inf")
    server = stand_in(Server, methods, clients, join, num_join_clients=join, uploaded_ids=[], uploaded_models=[],
                      global_model=copy.deepcopy(args.model), **extra)
    rng = seed_rounds()
    trace = []
    for r in range(ROUNDS):
        selected = select(server, join)
        CountingLoader.passes = {}
        if algo == "fedphp":
            server.send_models(r)
        else:
            server.send_models()
        batches = train_passes(clients, selected, xs, ys, rng)
        server.receive_models()
        if algo in ("fedphp", "fedala"):
            server.aggregate_parameters()
        it = {"selected": selected, "batches": batches, "clients": per_client(clients, lambda c: params(c.model))}
        if algo == "fedamp":
            it["cloud"] = per_client(clients, lambda c: params(c.client_u))
        if algo == "fedala":  # the ALA weights of the higher layers, and how many ALA passes each client made
            names = [n for n, _ in clients[0].model.named_parameters()][-extra["layer_idx"]:]
            it["weights"] = {str(i): {n: w.tolist() for n, w in zip(names, c.ALA.weights)}
                             for i, c in enumerate(clients) if c.ALA.weights is not None}
            it["ala_passes"] = {str(i): CountingLoader.passes.get(i, 0) for i in range(len(clients))}
        if algo in ("fedphp", "fedala"):
            it["server"] = params(server.global_model)
        if algo == "fedphp":
            it["historical"] = per_client(clients, lambda c: params(c.model_p))
        trace.append(it)
    return {**header(pfllib, algo, f"{cmod}.{ccls}", f"{smod}.{scls}", join, extra),
            "phases": [["train", STEPS]], "init": init, "iterations": trace}


if __name__ == "__main__":
    main(__doc__, record, RUNS)
