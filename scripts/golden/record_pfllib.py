"""Golden traces of PFLlib's (github.com/TsingZ0/PFLlib) FedProx, Ditto, FedPer, FedRep, LG-FedAvg, FedBABU, APFL
and FedBN; and of FedAvg, Ditto and FedRep with a BatchNorm model.

    python -m venv --system-site-packages /work/ref-venv && /work/ref-venv/bin/pip install scikit-learn
    git clone https://github.com/TsingZ0/PFLlib /work/ref/PFLlib     # traces: commit d832e76
    /work/ref-venv/bin/python scripts/golden/record_pfllib.py --pfllib /work/ref/PFLlib [--out tests/fixtures/golden]

Runs PFLlib's own client classes (flcore.clients.client*, imported from the checkout; nothing copied
into fedrun) and its servers' send_models / receive_models / aggregate_parameters (called on a
stand-in server object holding only the attributes they read), on the tiny fixed problem of the
pFedMe traces (tests/fixtures/golden/pfedme_data.json: 4 clients, 12 features, 4 classes) and
writes pfllib_<algo>.json, which tests/test_golden_pfllib.py replays through fedrun.

Setup: 3 rounds, 2 of 4 clients per round (numpy seeded, as their select_clients draws), the DNN
12-8(ReLU)-4 as PFLlib's personalized algorithms take it (BaseHeadSplit: base = fc1 + ReLU, head =
the output layer; no log_softmax, so the loss is fedrun's plain cross-entropy), fixed initial
weights (the pFedMe DNN traces'), learning rate 0.1, CPU.

Patches, at run time, none to the math:
  * data: each client's `load_train_data` returns a fixed iterable of minibatches (B = 4 rows drawn
    by a seeded numpy generator) instead of their shuffled DataLoader over .npz files: every pass
    over it (`for x, y in trainloader`, one per epoch / phase) yields the next recorded list, so
    PFLlib and fedrun see the same rows. Their epochs (a pass over all of a client's rows, drop_last)
    become fixed numbers of steps: local_epochs = plocal_epochs = 1 pass of the given list.
  * the server: their `train()` loops also evaluate, save .h5 files and time clients; the recorder
    runs only the per-round part: select (recorded), send_models, each selected client's
    ptrain()/train() in their order, receive_models (client_drop_rate 0), aggregate_parameters.
FedBN takes a model with BatchNorm instead: fc1 12-8, bn1 BatchNorm1d(8), ReLU, fc2 8-4 (PFLlib's
clientBN keeps local every parameter whose NAME contains "bn"; its running statistics, buffers, are
never sent at all), fc1/fc2 initialized as the DNN, bn1 as PyTorch does (weight 1, bias 0, running
mean 0, variance 1); its clients' BatchNorm buffers and the server's are recorded too. FedBN runs in
float64 (data: the float32 rows, widened): BatchNorm over 4 rows amplifies rounding, so that in
float32 PFLlib itself moved by 7e-6 between one thread and several, and fedrun's vmap engine
(another summation order) by 1.6e-6, beyond the float32 traces' tolerance; in float64 that is ~1e-15.
What is recorded: per round the selected clients, every minibatch's row indices per client and
phase, the server model after aggregation (all entries) and every client's model(s) after the
round (all entries: PFLlib's model, and Ditto's and APFL's model_per; APFL's alpha).

`fedavg_bn`, `ditto_bn`, `fedrep_bn` (pfllib_<algo>_bn.json, "model": "bn"; tests/test_golden_pfllib_bn.py)
record FedAvg (clientAVG, serveravg), Ditto and FedRep with FedBN's model, float64, as FedBN; FedRep's
as PFLlib's main.py builds its models, a BaseHeadSplit (base = fc1, bn1, ReLU; head = fc2). PFLlib moves
parameters only (clientbase.py set_parameters, serverbase.py add_parameters: `model.parameters()`), so
each client's running statistics stay in its own model (Ditto's model and model_per each keep theirs)
and the server's model, a copy of the first uploaded model (serverbase.py aggregate_parameters), carries
that client's: per round the order receive_models took the clients' models (`uploaded`: random.sample's,
seeded) is recorded, and every model with its buffers.

`--epochs` records FedRep, Ditto and FedBABU with their local work in EPOCHS instead, at PFLlib's
defaults (local_epochs 1, plocal_epochs 1, fine_tuning_epochs 10), as pfllib_<algo>_epochs.json:
every pass over a client's loader (`for x, y in trainloader`) is a fresh seeded permutation of ALL
its rows cut into floor(n / 4) minibatches (a shuffling DataLoader with drop_last; the clients have
12, 16, 20 and 8 rows, so 3, 4, 5 and 2 steps a pass), recorded per client in the order PFLlib's
client walks them (FedRep: its head passes, then its body passes; Ditto: ptrain's, then train's).
FedBABU: after the last round the server's send_models gives every client the final global body
(PFLlib's own loop fine-tunes each client's model as it last stood: the selected clients' own
bodies), then each client's fine_tune() runs (its whole model, fine_tuning_epochs passes, lr 0.1);
the fine-tuned models and their passes are recorded.
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
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "tests", "fixtures", "golden")
ROUNDS, JOIN, BATCH, LR, SELECT_SEED, BATCH_SEED = 3, 2, 4, 0.1, 1, 2
# algo -> (client module, class, server module, class, extra args, passes per round as (phase, steps))
RUNS = {
    "fedprox": ("clientprox", "clientProx", "serverprox", "FedProx", dict(mu=0.5), [("train", 3)]),
    "ditto": ("clientditto", "clientDitto", "serverditto", "Ditto", dict(mu=0.5, plocal_epochs=1),
              [("personal", 3), ("train", 3)]),
    "fedper": ("clientper", "clientPer", "serverper", "FedPer", {}, [("train", 3)]),
    "fedrep": ("clientrep", "clientRep", "serverrep", "FedRep", dict(plocal_epochs=1), [("head", 2), ("body", 1)]),
    "lgfedavg": ("clientlg", "clientLG", "serverlg", "LG_FedAvg", {}, [("train", 3)]),
    "fedbabu": ("clientbabu", "clientBABU", "serverbabu", "FedBABU", dict(fine_tuning_epochs=1), [("train", 3)]),
    "apfl": ("clientapfl", "clientAPFL", "serverapfl", "APFL", dict(alpha=0.5), [("train", 3)]),
    "fedbn": ("clientbn", "clientBN", "serverbn", "FedBN", {}, [("train", 3)]),
    # FedAvg, Ditto and FedRep with FedBN's BatchNorm model (pfllib_<algo>.json, "model": "bn")
    "fedavg_bn": ("clientavg", "clientAVG", "serveravg", "FedAvg", {}, [("train", 3)]),
    "ditto_bn": ("clientditto", "clientDitto", "serverditto", "Ditto", dict(mu=0.5, plocal_epochs=1),
                 [("personal", 3), ("train", 3)]),
    "fedrep_bn": ("clientrep", "clientRep", "serverrep", "FedRep", dict(plocal_epochs=1), [("head", 2), ("body", 1)]),
}

# algo -> (client module, class, server module, class, extra args, phases as (name, epochs)): --epochs
EPOCH_RUNS = {
    "fedrep": ("clientrep", "clientRep", "serverrep", "FedRep", dict(plocal_epochs=1), [("head", 1), ("body", 1)]),
    "ditto": ("clientditto", "clientDitto", "serverditto", "Ditto", dict(mu=0.5, plocal_epochs=1),
              [("personal", 1), ("train", 1)]),
    "fedbabu": ("clientbabu", "clientBABU", "serverbabu", "FedBABU", dict(fine_tuning_epochs=10), [("train", 1)]),
}


class Shuffling:
    """A stand-in shuffling DataLoader(drop_last=True): each `for ... in` over it is a fresh permutation
    of the client's rows (from the recorder's generator) cut into floor(n / BATCH) minibatches; the
    pass's row indices are appended to `log`."""

    def __init__(self, x, y, rng, log):
        self.x, self.y, self.rng, self.log = x, y, rng, log

    def __iter__(self):
        n = len(self.y)
        rows = self.rng.permutation(n)[: n // BATCH * BATCH].reshape(-1, BATCH)
        self.log.append(rows.tolist())
        return iter([(self.x[b], self.y[b]) for b in rows])


class Passes:
    """A stand-in DataLoader: each `for ... in` over it yields the next recorded list of batches."""

    def __init__(self, lists):
        self.lists = list(lists)

    def __iter__(self):
        return iter(self.lists.pop(0))


def model(init: dict):
    from flcore.trainmodel.models import BaseHeadSplit

    m = BaseHeadSplit(nn.Sequential(nn.Linear(12, 8), nn.ReLU()), nn.Linear(8, 4))
    names = {"base.0.weight": "fc1.weight", "base.0.bias": "fc1.bias", "head.weight": "fc2.weight",
             "head.bias": "fc2.bias"}
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(torch.tensor(init[names[n]]))
    return m


class BNNet(nn.Module):
    """FedBN's model: the DNN with a BatchNorm layer after its hidden layer (named bn1, as PFLlib's
    FedBN needs: it finds BatchNorm parameters by the substring "bn" in their names)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn1, self.fc2 = nn.Linear(12, 8), nn.BatchNorm1d(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn1(self.fc1(x))))


def bn_model(init: dict) -> BNNet:
    m = BNNet()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.startswith("fc"):
                p.copy_(torch.tensor(init[n]))
    return m


def bn_split_model(init: dict):
    """FedRep's BatchNorm model: FedBN's, as PFLlib's main.py gives FedRep its models, a BaseHeadSplit
    (base = fc1, bn1, ReLU; head = fc2), float64."""
    from flcore.trainmodel.models import BaseHeadSplit

    m = bn_model(init).double()
    return BaseHeadSplit(nn.Sequential(m.fc1, m.bn1, nn.ReLU()), m.fc2)


def uploaded(server, clients) -> list[int]:
    """The clients whose models the server's receive_models took, in its order (random.sample's: the
    first is the one whose copy aggregate_parameters makes the server's model, buffers included)."""
    return [next(i for i, c in enumerate(clients) if m is c.model or m is getattr(c.model, "base", None))
            for m in server.uploaded_models]


def state(m: nn.Module) -> dict:
    return {n: p.detach().tolist() for n, p in [*m.named_parameters(), *m.named_buffers()]}


def record(pfllib: str, algo: str, data: dict, init: dict, epochs: bool = False) -> dict:
    import importlib

    cmod, ccls, smod, scls, extra, phases = (EPOCH_RUNS if epochs else RUNS)[algo]
    Client = getattr(importlib.import_module(f"flcore.clients.{cmod}"), ccls)
    Server = getattr(importlib.import_module(f"flcore.servers.{smod}"), scls)
    bn, base = algo == "fedbn" or algo.endswith("_bn"), algo.removesuffix("_bn")  # (FedBN's BatchNorm model)
    dtype = torch.float64 if bn else torch.float32
    if bn:
        init = state(bn_model(init).double())
    net = (bn_split_model(init) if base == "fedrep" else bn_model(init).double()) if bn else model(init)
    args = types.SimpleNamespace(model=net, algorithm=base,
                                 dataset="golden", device="cpu", save_folder_name="x",
                                 num_classes=4, batch_size=BATCH, local_learning_rate=LR, local_epochs=1, few_shot=0,
                                 learning_rate_decay_gamma=1.0, learning_rate_decay=False, **extra)
    xs = [torch.tensor(c["train"]["x"], dtype=torch.float32).to(dtype) for c in data["clients"]]
    ys = [torch.tensor(c["train"]["y"]) for c in data["clients"]]
    with contextlib.redirect_stdout(io.StringIO()):
        clients = [Client(args, id=i, train_samples=len(ys[i]), test_samples=len(c["test"]["y"]), train_slow=False,
                          send_slow=False) for i, c in enumerate(data["clients"])]
    server = types.SimpleNamespace(clients=clients, client_drop_rate=0.0, current_num_join_clients=JOIN,
                                   time_threthold=float("inf"), global_model=__import__("copy").deepcopy(
                                       args.model.head if algo == "lgfedavg" else args.model))
    for name in ("send_models", "receive_models", "aggregate_parameters", "add_parameters"):
        setattr(server, name, getattr(Server, name).__get__(server))
    rng = np.random.RandomState(BATCH_SEED)
    np.random.seed(SELECT_SEED)
    import random
    random.seed(0)
    trace = []
    for r in range(ROUNDS):
        selected = sorted(np.random.choice(len(clients), JOIN, replace=False).tolist())
        server.selected_clients = [clients[i] for i in selected]
        server.send_models()
        batches = {}
        for i in selected:
            c = clients[i]
            if epochs:  # every pass: a fresh shuffle of all the client's rows, recorded as walked
                batches[str(i)] = log = []
                c.load_train_data = lambda batch_size=None, i=i, log=log: Shuffling(xs[i], ys[i], rng, log)
                if base == "ditto":
                    c.ptrain()
                c.train()
                continue
            mine = {ph: [rng.randint(0, len(ys[i]), size=BATCH).tolist() for _ in range(n)] for ph, n in phases}
            batches[str(i)] = mine
            lists = [[(xs[i][b], ys[i][b]) for b in mine[ph]] for ph, _ in phases]
            c.load_train_data = (lambda batch_size=None, lists=lists:
                                 Passes([lists.pop(0)] if base != "fedrep" else lists))
            if base == "ditto":
                c.ptrain()
            c.train()
        server.receive_models()
        server.aggregate_parameters()
        it = {"selected": selected, "batches": batches,
              "server": {n: p.detach().tolist() for n, p in server.global_model.named_parameters()},
              "clients": {str(i): {n: p.detach().tolist() for n, p in c.model.named_parameters()}
                          for i, c in enumerate(clients)}}
        if bn:  # with the BatchNorm buffers
            it["server"] = state(server.global_model)
            it["clients"] = {str(i): state(c.model) for i, c in enumerate(clients)}
            if base != "fedbn":
                it["uploaded"] = uploaded(server, clients)
        if algo == "apfl":
            it["alpha"] = {str(i): float(c.alpha) for i, c in enumerate(clients)}
        if base in ("ditto", "apfl"):
            it["personal"] = {str(i): state(c.model_per) if bn else
                              {n: p.detach().tolist() for n, p in c.model_per.named_parameters()}
                              for i, c in enumerate(clients)}
        trace.append(it)
    out = {}
    if epochs and algo == "fedbabu":  # the final global body to every client, then PFLlib's fine-tuning
        server.send_models()
        out["finetune"] = {"passes": {}, "clients": {}}
        for i, c in enumerate(clients):
            out["finetune"]["passes"][str(i)] = log = []
            c.load_train_data = lambda batch_size=None, i=i, log=log: Shuffling(xs[i], ys[i], rng, log)
            c.fine_tune()
            out["finetune"]["clients"][str(i)] = {n: p.detach().tolist() for n, p in c.model.named_parameters()}
    commit = subprocess.run(["git", "-C", pfllib, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"reference": {"repo": "TsingZ0/PFLlib", "commit": commit, "client": f"{cmod}.{ccls}",
                          "server": f"{smod}.{scls}"},
            "algorithm": base, "dtype": str(dtype).removeprefix("torch."),
            "args": {"lr": LR, "batch_size": BATCH, "rounds": ROUNDS, "join": JOIN, **extra},
            "phases": phases, **({"unit": "epochs"} if epochs else {}), "init": init, "iterations": trace, **out,
            **({"model": "bn"} if algo.endswith("_bn") else {})}


def load_problem(pfllib: str) -> tuple[dict, dict]:
    """Every recorder's start: PFLlib's system/ importable, one torch thread, and the traced problem's
    rows and initial model from the pFedMe fixtures (their `data` and `init`)."""
    sys.path.insert(0, os.path.join(os.path.abspath(pfllib), "system"))
    with open(os.path.join(FIXTURES, "pfedme_data.json")) as f:
        data = json.load(f)
    with open(os.path.join(FIXTURES, "pfedme_fedavg_dnn.json")) as f:
        init = json.load(f)["init"]
    torch.set_num_threads(1)
    return data, init


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pfllib", required=True, help="a checkout of TsingZ0/PFLlib")
    ap.add_argument("--out", default=FIXTURES)
    ap.add_argument("--algorithms", default=None, help="default: all of RUNS (with --epochs: of EPOCH_RUNS)")
    ap.add_argument("--epochs", action="store_true",
                    help="local work in epochs (EPOCH_RUNS): pfllib_<algo>_epochs.json")
    a = ap.parse_args()
    data, init = load_problem(a.pfllib)
    for algo in (a.algorithms or ",".join(EPOCH_RUNS if a.epochs else RUNS)).split(","):
        out = record(a.pfllib, algo, data, init, a.epochs)
        path = os.path.join(a.out, f"pfllib_{algo}{'_epochs' if a.epochs else ''}.json")
        with open(path, "w") as f:
            json.dump(out, f)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
