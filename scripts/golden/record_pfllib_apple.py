"""Golden trace of PFLlib's APPLE (clientAPPLE, serverAPPLE):

    /work/ref-venv/bin/python scripts/golden/record_pfllib_apple.py --pfllib /work/ref/PFLlib

The setup of scripts/golden/record_pfllib_mix.py (whose helpers, in _pfllib.py, this imports): PFLlib's own client
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

import copy
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pfllib import STEPS, build_clients, header, main, params, per_client, pfllib_args, rows, stand_in, train_passes  # noqa: E402
from record_pfllib import BATCH_SEED, ROUNDS, model  # noqa: E402

EXTRA = dict(dr_learning_rate=1.0, mu=0.5, L=1.0, global_rounds=ROUNDS)


def record(pfllib: str, data: dict, init: dict) -> dict:
    Client = importlib.import_module("flcore.clients.clientapple").clientAPPLE
    Server = importlib.import_module("flcore.servers.serverapple").APPLE
    xs, ys = rows(data)
    C = len(xs)
    clients = build_clients(Client, pfllib_args(model(init), "apple", num_clients=C, **EXTRA), data, ys)
    total = sum(c.train_samples for c in clients)  # serverAPPLE.__init__'s p0
    for c in clients:
        c.p0 = [k.train_samples / total for k in clients]
    server = stand_in(Server, ("send_models",), clients, C)
    rng = np.random.RandomState(BATCH_SEED)
    trace = []
    for r in range(ROUNDS):
        server.send_models()
        for c in clients:  # each client's own copy of the downloads (see the docstring)
            c.set_models(copy.deepcopy(c.model_cs))
        batches = train_passes(clients, range(C), xs, ys, rng, lambda c: c.train(r))
        trace.append({"selected": list(range(C)), "batches": batches,
                      "core": per_client(clients, lambda c: params(c.model_c)),
                      "clients": per_client(clients, lambda c: params(c.model)),
                      "p": per_client(clients, lambda c: [float(v) for v in c.ps]),
                      "lamda": [c.lamda for c in clients]})
    return {**header(pfllib, "apple", "clientapple.clientAPPLE", "serverapple.APPLE", C, EXTRA),
            "phases": [["train", STEPS]], "init": init, "iterations": trace}


if __name__ == "__main__":
    main(__doc__, record, "apple")
