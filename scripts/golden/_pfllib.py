"""What the PFLlib recorders beside record_pfllib.py (record_pfllib_feat, _mix, _apple, _fomo, _module,
_fedcp) share: the problem's rows, PFLlib's argument namespace, its clients built quietly, the stand-in
server (PFLlib's own server methods bound to a namespace holding only what they read), the seeds, the
selection and minibatch draws, the state dumps, the trace's header and the command line
(--pfllib, --out and, for recorders of several methods, --algorithms). What each method does in its
round stays in its recorder.
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
from record_pfllib import BATCH, BATCH_SEED, FIXTURES, JOIN, LR, ROUNDS, SELECT_SEED, Passes, Shuffling, load_problem  # noqa: E402

STEPS = 3  # minibatches of one recorded train() pass


def params(m) -> dict:
    return {n: p.detach().tolist() for n, p in m.named_parameters()}


def per_client(clients, f) -> dict:
    """{"0": f(client 0), ...} over EVERY client (the traces' per-client dumps)."""
    return {str(i): f(c) for i, c in enumerate(clients)}


def rows(data: dict):
    """Every client's training rows: float32 features, labels."""
    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    return xs, ys


def pfllib_args(model, algo: str, **extra) -> types.SimpleNamespace:
    """PFLlib's argument namespace as its clients read it (CPU, B = 4, lr 0.1, 1 local epoch, no decay);
    `extra` adds the method's own arguments (or overrides these)."""
    base = dict(model=model, algorithm=algo, dataset="golden", device="cpu", save_folder_name="x", num_classes=4,
                batch_size=BATCH, local_learning_rate=LR, local_epochs=1, few_shot=0, learning_rate_decay_gamma=1.0,
                learning_rate_decay=False)
    return types.SimpleNamespace(**{**base, **extra})


def classes(cmod: str, ccls: str, smod: str, scls: str):
    """PFLlib's client class flcore.clients.<cmod>.<ccls>, its server module flcore.servers.<smod> and the
    server class <scls> in it."""
    Client = getattr(importlib.import_module(f"flcore.clients.{cmod}"), ccls)
    smodule = importlib.import_module(f"flcore.servers.{smod}")
    return Client, smodule, getattr(smodule, scls)


def build_clients(Client, args, data: dict, ys, **kw) -> list:
    """PFLlib's client objects, one a client of the problem, their prints swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        return [Client(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                       send_slow=False, **kw) for i, c in enumerate(data["clients"])]


def stand_in(Server, methods, clients, join: int = JOIN, **attrs) -> types.SimpleNamespace:
    """A namespace holding the clients (no drops, no time limit, `join` a round) and `attrs`, with PFLlib's
    own `Server.<method>` bound to it for each of `methods`."""
    server = types.SimpleNamespace(clients=clients, client_drop_rate=0.0, current_num_join_clients=join,
                                   time_threthold=float("inf"), **attrs)
    for name in methods:
        setattr(server, name, getattr(Server, name).__get__(server))
    return server


def seed_rounds() -> np.random.RandomState:
    """The selection's seeds (numpy's global state, as PFLlib's select_clients draws; Python's `random`
    at 0) and the generator of the minibatch draws."""
    rng = np.random.RandomState(BATCH_SEED)
    np.random.seed(SELECT_SEED)
    random.seed(0)
    return rng


def select(server, join: int = JOIN) -> list:
    """The round's clients (join of them, by numpy's global state, sorted), set as the server's selection."""
    selected = sorted(np.random.choice(len(server.clients), join, replace=False).tolist())
    server.selected_clients = [server.clients[i] for i in selected]
    return selected


def draw(rng, n: int, steps: int = STEPS) -> list:
    """`steps` minibatches of BATCH row indices of n rows, drawn with replacement."""
    return [rng.randint(0, n, size=BATCH).tolist() for _ in range(steps)]


def one_pass(x, y, batches):
    """A load_train_data whose loader makes one pass over the given minibatches (row indices)."""
    return lambda batch_size=None: Passes([[(x[b], y[b]) for b in batches]])


def train_passes(clients, ids, xs, ys, rng, train=lambda c: c.train()) -> dict:
    """Each client of `ids` in turn: a recorded pass of STEPS minibatches drawn as its loader, then
    `train(client)`; returns the draws as the traces record them, {"<id>": {"train": rows}}."""
    batches = {}
    for i in ids:
        batches[str(i)] = {"train": (mine := draw(rng, len(ys[i])))}
        clients[i].load_train_data = one_pass(xs[i], ys[i], mine)
        train(clients[i])
    return batches


def shuffled(x, y, rng, log):
    """A load_train_data whose every pass is a fresh shuffle of all rows, logged (record_pfllib.Shuffling)."""
    return lambda batch_size=None: Shuffling(x, y, rng, log)


def header(pfllib: str, algo: str, client: str, server: str, join: int, extra: dict, rounds: int = ROUNDS,
           unit: str | None = None) -> dict:
    """A trace's opening keys: the reference (PFLlib's commit, the client and server classes), the
    method, float32, the unit of local work where it is epochs, and the arguments."""
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": client, "server": server},
            "algorithm": algo, "dtype": "float32", **({"unit": unit} if unit else {}),
            "args": {"lr": LR, "batch_size": BATCH, "rounds": rounds, "join": join, **extra}}


def main(doc: str, record, algorithms=None) -> None:
    """The recorders' command line. With `algorithms` (names): --algorithms (default all of them), and
    record(pfllib, algo, data, init) writes pfllib_<algo>.json for each; with a single name as a string,
    record(pfllib, data, init) writes pfllib_<name>.json."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--pfllib", required=True, help="a checkout of TsingZ0/PFLlib")
    ap.add_argument("--out", default=FIXTURES)
    if not isinstance(algorithms, str):
        ap.add_argument("--algorithms", default=",".join(algorithms))
    a = ap.parse_args()
    data, init = load_problem(a.pfllib)
    for algo in [algorithms] if isinstance(algorithms, str) else a.algorithms.split(","):
        out = record(a.pfllib, data, init) if isinstance(algorithms, str) else record(a.pfllib, algo, data, init)
        path = os.path.join(a.out, f"pfllib_{algo}.json")
        with open(path, "w") as f:
            json.dump(out, f)
        print(f"wrote {path}")
