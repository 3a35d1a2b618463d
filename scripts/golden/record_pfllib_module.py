"""Golden traces of PFLlib's methods with parts beside the model or feature alignment: FedPAC (so far).

    /work/ref-venv/bin/pip install cvxpy      # PFLlib's serverpac imports it (its QP solver)
    /work/ref-venv/bin/python scripts/golden/record_pfllib_module.py --pfllib /work/ref/PFLlib \
[--out tests/fixtures/golden]

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

import contextlib
import copy
import io
import os
import random
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pfllib import (  # noqa: E402
    build_clients,
    classes,
    header,
    main,
    params,
    per_client,
    pfllib_args,
    rows,
    select,
    shuffled,
    stand_in,
)
from record_pfllib import BATCH_SEED, JOIN, ROUNDS, SELECT_SEED, Shuffling, model  # noqa: E402

RUNS = {"fedpac": ("clientpac", "clientPAC", "serverpac", "FedPAC", dict(lamda=1.0, local_epochs=1)),
        "gpfl": ("clientgpfl", "clientGPFL", "servergpfl", "GPFL", dict(lamda=0.5, mu=0.1, local_epochs=1))}
SERVER_METHODS = {"fedpac": ("send_models", "receive_models", "aggregate_parameters", "add_parameters",
                             "receive_protos", "send_protos", "aggregate_and_send_heads", "add_heads"),
                  "gpfl": ("send_models", "receive_models", "aggregate_parameters", "add_parameters", "global_GCE",
                           "add_GCE", "global_CoV", "add_CoV")}


def record(pfllib: str, algo: str, data: dict, init: dict) -> dict:
    if algo == "gpfl":
        return record_gpfl(pfllib, data, init)
    cmod, ccls, smod, scls, extra = RUNS[algo]
    Client, server_module, Server = classes(cmod, ccls, smod, scls)
    args = pfllib_args(model(init), algo, **extra)
    xs, ys = rows(data)
    clients = build_clients(Client, args, data, ys)
    server = stand_in(Server, SERVER_METHODS[algo], clients, global_model=copy.deepcopy(args.model), num_classes=4)
    rng = np.random.RandomState(BATCH_SEED)
    np.random.seed(SELECT_SEED)
    logs: dict = {}

    def loaders(phase: str) -> None:  # every client's passes from now on are logged under `phase`
        for i, c in enumerate(clients):
            c.load_train_data = shuffled(xs[i], ys[i], rng, logs.setdefault(i, {}).setdefault(phase, []))

    trace = []
    in_order = lambda population, k: list(population)[:k]  # receive_models: the selection's order
    with mock_sample(in_order), contextlib.redirect_stdout(io.StringIO()):
        for r in range(ROUNDS):
            logs.clear()
            selected = select(server)
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
                "clients": per_client(clients, lambda c: params(c.model)),
                "protos": {str(k): v.tolist() for k, v in server.global_protos.items()},
                "V": [float(v) for v in server.Vars], "h": [h.tolist() for h in server.Hs]})
    return {**header(pfllib, algo, f"{cmod}.{ccls}", f"{smod}.{scls}", JOIN, extra, unit="epochs"),
            "init": init, "iterations": trace}


def record_gpfl(pfllib: str, data: dict, init: dict) -> dict:
    """GPFL: the server's round (clients' train(), receive_models, aggregate_parameters, send_models,
    global_GCE, global_CoV), its GCE and CoV built as its __init__ builds them (torch seeded 0)."""
    from flcore.clients.clientgpfl import clientGPFL
    from flcore.servers import servergpfl

    cmod, ccls, smod, scls, extra = RUNS["gpfl"]
    xs, ys = rows(data)
    torch.manual_seed(0)
    gce, cov = servergpfl.GCE(in_features=8, num_classes=4, dev="cpu"), servergpfl.CoV(8)
    modules = {"gce": params(gce), "cov": params(cov)}
    args = pfllib_args(model(init), "gpfl", GCE=gce, CoV=cov, **extra)
    rng = np.random.RandomState(BATCH_SEED)
    logs: dict = {}
    saved = clientGPFL.load_train_data
    # every pass is logged under the client's current phase ("init": __init__'s class count)
    clientGPFL.load_train_data = lambda self, batch_size=None: Shuffling(
        xs[self.id], ys[self.id], rng, logs.setdefault(self.id, {}).setdefault(logs.get("phase"), []))
    try:
        logs["phase"] = "init"
        clients = build_clients(clientGPFL, args, data, ys)
        server = stand_in(servergpfl.GPFL, SERVER_METHODS["gpfl"], clients, global_model=copy.deepcopy(args.model.base))
        np.random.seed(SELECT_SEED)
        trace = []
        for r in range(ROUNDS):
            logs.clear()
            logs["phase"] = "train"
            selected = select(server)
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
                "clients": per_client(clients, lambda c: params(c.model)),
                "conditions": per_client(clients, lambda c: [c.generic_conditional_input.tolist(),
                                                            c.personalized_conditional_input.tolist()])})
    finally:
        clientGPFL.load_train_data = saved
    return {**header(pfllib, "gpfl", f"{cmod}.{ccls}", f"{smod}.{scls}", JOIN, extra, unit="epochs"),
            "init": init, "modules": modules, "iterations": trace}


@contextlib.contextmanager
def mock_sample(fn):
    saved = random.sample
    random.sample = fn
    try:
        yield
    finally:
        random.sample = saved


if __name__ == "__main__":
    main(__doc__, record, RUNS)
