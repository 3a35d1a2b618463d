"""Golden trace of PFLlib's FedCP (clientcp.clientCP, servercp.FedCP).

    /work/ref-venv/bin/python scripts/golden/record_pfllib_fedcp.py --pfllib /work/ref/PFLlib \
[--out tests/fixtures/golden]

The setting of scripts/golden/record_pfllib_module.py (the tiny problem, the DNN 12-8(ReLU)-4 as
BaseHeadSplit with the pFedMe traces' initial weights, lr 0.1, batches of 4, 3 rounds of 2 of the 4
clients, every pass a recorded seeded shuffle), -lam 1, 1 local epoch. The CPN is built as servercp's
__init__ builds it (torch seeded 0), each client's initial condition is its __init__'s torch.rand.
PFLlib's gate draws its Gumbel noise from torch's global random state inside F.gumbel_softmax: the
recorder replaces F.gumbel_softmax by the same computation (softmax((logits + G) / tau)) with G drawn
from its own seeded generator, and records every draw (per round, client and step) for the replay.
Per round, as servercp.train: every selected client's train_cs_model and generate_upload_head, then
receive_models, aggregate_parameters, send_models, global_head, global_cs. Recorded per round: the
selected clients, their passes and noise, the server's body, global head and CPN, and every client's
model (body, personalized head), global head, CPN and condition.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pfllib import build_clients, header, main, params, per_client, pfllib_args, rows, select, shuffled, stand_in  # noqa: E402
from record_pfllib import BATCH_SEED, JOIN, ROUNDS, SELECT_SEED, model  # noqa: E402

EXTRA = dict(lamda=1.0, local_epochs=1)
SERVER_METHODS = ("receive_models", "aggregate_parameters", "add_parameters", "send_models", "global_head", "add_head",
                  "global_cs", "add_cs")
NOISE_SEED = 3


def record(pfllib: str, data: dict, init: dict) -> dict:
    from flcore.clients.clientcp import clientCP
    from flcore.servers import servercp

    xs, ys = rows(data)
    torch.manual_seed(0)
    cs = servercp.ConditionalSelection(8, 8)
    clients = build_clients(clientCP, pfllib_args(model(init), "fedcp", **EXTRA), data, ys, ConditionalSelection=cs)
    modules = {"cs": params(cs), "contexts": [c.context.view(-1).tolist() for c in clients]}
    rng = np.random.RandomState(BATCH_SEED)
    gen = torch.Generator().manual_seed(NOISE_SEED)
    noise: list = []  # the current client's draws

    def gumbel_softmax(logits, tau=1, hard=False, eps=1e-10, dim=-1):  # F.gumbel_softmax's soft form, logged noise
        assert not hard
        g = -torch.empty(logits.shape, dtype=logits.dtype).exponential_(generator=gen).log()
        noise.append(g.tolist())
        return ((logits + g) / tau).softmax(dim)

    server = stand_in(servercp.FedCP, SERVER_METHODS, clients)
    saved = F.gumbel_softmax
    F.gumbel_softmax = gumbel_softmax
    np.random.seed(SELECT_SEED)
    trace = []
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for r in range(ROUNDS):
                selected = select(server)
                passes, draws = {}, {}
                for i in selected:
                    c = clients[i]
                    c.load_train_data = shuffled(xs[i], ys[i], rng, passes.setdefault(i, []))
                    noise.clear()
                    c.train_cs_model()
                    draws[i] = list(noise)
                    c.generate_upload_head()
                server.receive_models()
                server.aggregate_parameters()
                server.send_models()
                server.global_head()
                server.global_cs()
                trace.append({
                    "selected": selected,
                    "batches": {str(i): {"train": passes[i]} for i in selected},
                    "noise": {str(i): draws[i] for i in selected},
                    "server": params(server.global_modules), "head_g": params(server.head), "cs": params(server.cs),
                    "clients": per_client(clients, lambda c: params(c.model.model)),
                    "client_head_g": per_client(clients, lambda c: params(c.model.head_g)),
                    "client_cs": per_client(clients, lambda c: params(c.model.gate.cs)),
                    "contexts": per_client(clients, lambda c: c.context.view(-1).tolist())})
    finally:
        F.gumbel_softmax = saved
    return {**header(pfllib, "fedcp", "clientcp.clientCP", "servercp.FedCP", JOIN, EXTRA, unit="epochs"),
            "init": init, "modules": modules, "iterations": trace}


if __name__ == "__main__":
    main(__doc__, record, "fedcp")
