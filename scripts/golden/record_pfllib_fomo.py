"""A golden trace of PFLlib's (github.com/TsingZ0/PFLlib) FedFomo: clientFomo and serverFomo.

    /work/ref-venv/bin/python scripts/golden/record_pfllib_fomo.py --pfllib /work/ref/PFLlib

The setup of scripts/golden/record_pfllib_mix.py (whose helpers, in _pfllib.py, this imports): PFLlib's own client
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

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pfllib import (  # noqa: E402
    STEPS,
    build_clients,
    draw,
    header,
    main,
    params,
    per_client,
    pfllib_args,
    rows,
    seed_rounds,
    select,
    stand_in,
)
from record_pfllib import Passes, model  # noqa: E402

ROUNDS, JOIN, M, VAL = 4, 3, 2, 2


def record(pfllib: str, data: dict, init: dict) -> dict:
    from flcore.clients.clientfomo import clientFomo
    from flcore.servers.serverfomo import FedFomo

    xs, ys = rows(data)
    C = len(xs)
    args = pfllib_args(model(init), "fedfomo", num_clients=C, M=M)
    clients = build_clients(clientFomo, args, data, ys)
    server = stand_in(FedFomo, ("send_models", "receive_models"), clients, JOIN, num_join_clients=JOIN, uploaded_ids=[],
                      M=min(M, JOIN), P=torch.diag(torch.ones(C)),
                      client_models=[copy.deepcopy(args.model) for _ in range(C)])
    rng = seed_rounds()
    trace = []
    for r in range(ROUNDS):
        selected = select(server, JOIN)
        server.send_models()
        batches, received = {}, {}
        for i in selected:
            c = clients[i]
            mine, val = draw(rng, len(ys[i])), draw(rng, len(ys[i]), VAL)
            batches[str(i)] = {"train": mine, "val": val}
            received[str(i)] = list(c.received_ids)
            c.load_train_data = lambda batch_size=None, i=i, mine=mine, val=val: (
                Passes([[(xs[i][b], ys[i][b]) for b in mine]]), [(xs[i][b], ys[i][b]) for b in val])
            c.train()
        server.receive_models()
        trace.append({"selected": selected, "batches": batches, "received": received,
                      "clients": per_client(clients, lambda c: params(c.model)),
                      "old": per_client(clients, lambda c: params(c.old_model)),
                      "affinity": server.P.tolist()})
    return {**header(pfllib, "fedfomo", "clientfomo.clientFomo", "serverfomo.FedFomo", JOIN, dict(M=M, val_batches=VAL),
                     rounds=ROUNDS),
            "phases": [["val", 1], ["train", STEPS]], "init": init, "iterations": trace}


if __name__ == "__main__":
    main(__doc__, record, "fedfomo")
