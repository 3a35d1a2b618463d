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

import copy
import os
import sys

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

# algo -> (client module, class, server module, class, extra args)
RUNS = {
    "moon": ("clientmoon", "clientMOON", "servermoon", "MOON", dict(mu=1.0, tau=0.5)),
    "fedrod": ("clientrod", "clientROD", "serverrod", "FedROD", {}),
    "fedproto": ("clientproto", "clientProto", "serverproto", "FedProto", dict(lamda=1.0)),
    "feddbe": ("clientdbe", "clientDBE", "serverdbe", "FedDBE", dict(momentum=0.1, kl_weight=1.0)),
}
SERVER_METHODS = ("send_models", "receive_models", "aggregate_parameters", "add_parameters", "receive_protos",
                  "send_protos")


def record(pfllib: str, algo: str, data: dict, init: dict) -> dict:
    cmod, ccls, smod, scls, extra = RUNS[algo]
    Client, smodule, Server = classes(cmod, ccls, smod, scls)
    args = pfllib_args(model(init), algo, **extra)
    xs, ys = rows(data)
    base_loader = Client.load_train_data
    Client.load_train_data = lambda self, batch_size=None: [(xs[self.id], ys[self.id])]  # while building: all rows
    try:
        clients = build_clients(Client, args, data, ys)
    finally:
        Client.load_train_data = base_loader
    server = stand_in(Server, [n for n in SERVER_METHODS if hasattr(Server, n)], clients,
                      global_model=copy.deepcopy(args.model))
    rng = seed_rounds()
    trace, out = [], {}
    if algo == "feddbe":  # its server's constructor: every client trains once (no bias yet), then the global mean
        first = train_passes(clients, range(len(clients)), xs, ys, rng)
        out["init_period"] = {"batches": {i: b["train"] for i, b in first.items()}}
        total = sum(c.train_samples for c in clients)  # (FedDBE.__init__'s weighting, restated: in its constructor)
        global_mean = sum(c.running_mean * (c.train_samples / total) for c in clients)
        for c in clients:
            c.global_mean = global_mean.data.clone()
        out["init_period"]["global_mean"] = global_mean.tolist()
    for r in range(ROUNDS):
        selected = select(server)
        if algo != "fedproto":
            server.send_models()
        it = {"selected": selected, "batches": train_passes(clients, selected, xs, ys, rng)}
        if algo == "fedproto":
            server.receive_protos()
            server.global_protos = smodule.proto_aggregation(server.uploaded_protos)
            server.send_protos()
            it["protos"] = {str(k): v.tolist() for k, v in server.global_protos.items() if not isinstance(v, list)}
        else:
            server.receive_models()
            server.aggregate_parameters()
            it["server"] = params(server.global_model)
        it["clients"] = per_client(clients, lambda c: params(c.model))
        if algo == "moon":
            it["prev"] = per_client(clients, lambda c: params(c.old_model))
        if algo == "fedrod":
            it["heads"] = per_client(clients, lambda c: params(c.head))
        if algo == "feddbe":
            it["bias"] = per_client(clients, lambda c: c.client_mean.detach().tolist())
        trace.append(it)
    return {**header(pfllib, algo, f"{cmod}.{ccls}", f"{smod}.{scls}", JOIN, extra),
            "phases": [["train", STEPS]], "init": init, "iterations": trace, **out}


if __name__ == "__main__":
    main(__doc__, record, RUNS)
