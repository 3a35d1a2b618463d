"""Golden trace of PFLlib's FedCP (clientcp.clientCP, servercp.FedCP).

    /work/ref-venv/bin/python scripts/golden/record_pfllib_fedcp.py --pfllib /work/ref/PFLlib [--out tests/fixtures/golden]

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

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from record_pfllib import BATCH, BATCH_SEED, FIXTURES, JOIN, LR, ROUNDS, SELECT_SEED, Shuffling, model  # noqa: E402
from record_pfllib_module import params  # noqa: E402

EXTRA = dict(lamda=1.0, local_epochs=1)
SERVER_METHODS = ("receive_models", "aggregate_parameters", "add_parameters", "send_models", "global_head", "add_head",
                  "global_cs", "add_cs")
NOISE_SEED = 3


def record(pfllib: str, data: dict, init: dict) -> dict:
    from flcore.clients.clientcp import clientCP
    from flcore.servers import servercp

    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    torch.manual_seed(0)
    cs = servercp.ConditionalSelection(8, 8)
    args = types.SimpleNamespace(model=model(init), algorithm="fedcp", dataset="golden", device="cpu", save_folder_name="x",
                                 num_classes=4, batch_size=BATCH, local_learning_rate=LR, few_shot=0,
                                 learning_rate_decay_gamma=1.0, learning_rate_decay=False, **EXTRA)
    with contextlib.redirect_stdout(io.StringIO()):
        clients = [clientCP(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                            send_slow=False, ConditionalSelection=cs) for i, c in enumerate(data["clients"])]
    modules = {"cs": params(cs), "contexts": [c.context.view(-1).tolist() for c in clients]}
    rng = np.random.RandomState(BATCH_SEED)
    gen = torch.Generator().manual_seed(NOISE_SEED)
    noise: list = []  # the current client's draws

    def gumbel_softmax(logits, tau=1, hard=False, eps=1e-10, dim=-1):  # F.gumbel_softmax's soft form, logged noise
        assert not hard
        g = -torch.empty(logits.shape, dtype=logits.dtype).exponential_(generator=gen).log()
        noise.append(g.tolist())
        return ((logits + g) / tau).softmax(dim)

    server = types.SimpleNamespace(clients=clients, client_drop_rate=0.0, current_num_join_clients=JOIN,
                                   time_threthold=float("inf"))
    for name in SERVER_METHODS:
        setattr(server, name, getattr(servercp.FedCP, name).__get__(server))
    saved = F.gumbel_softmax
    F.gumbel_softmax = gumbel_softmax
    np.random.seed(SELECT_SEED)
    trace = []
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for r in range(ROUNDS):
                selected = sorted(np.random.choice(len(clients), JOIN, replace=False).tolist())
                server.selected_clients = [clients[i] for i in selected]
                passes, draws = {}, {}
                for i in selected:
                    c = clients[i]
                    log = passes.setdefault(i, [])
                    c.load_train_data = lambda batch_size=None, i=i, log=log: Shuffling(xs[i], ys[i], rng, log)
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
                    "clients": {str(i): params(c.model.model) for i, c in enumerate(clients)},
                    "client_head_g": {str(i): params(c.model.head_g) for i, c in enumerate(clients)},
                    "client_cs": {str(i): params(c.model.gate.cs) for i, c in enumerate(clients)},
                    "contexts": {str(i): c.context.view(-1).tolist() for i, c in enumerate(clients)}})
    finally:
        F.gumbel_softmax = saved
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": "clientcp.clientCP", "server": "servercp.FedCP"},
            "algorithm": "fedcp", "dtype": "float32", "unit": "epochs",
            "args": {"lr": LR, "batch_size": BATCH, "rounds": ROUNDS, "join": JOIN, **EXTRA},
            "init": init, "modules": modules, "iterations": trace}


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
    out = record(a.pfllib, data, init)
    path = os.path.join(a.out, "pfllib_fedcp.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
