"""Golden traces of the authors' pFedMe code (github.com/CharlieDinh/pFedMe) for FedAvg, Per-FedAvg, pFedMe.

    python scripts/golden/record_pfedme.py --authors /path/to/pFedMe/checkout [--out tests/fixtures/golden]
    python scripts/golden/record_pfedme.py --authors <a checkout of c0722e7> --commit c0722e7... \
        --algorithms PerAvg --suffix _2020      # their June 2020 Per-FedAvg (protocol=official_2020)

Runs the authors' own classes (FLAlgorithms.servers / users / trainmodel, imported from the checkout,
nothing copied into fedrun) on a tiny fixed problem and writes what they computed as JSON fixtures
that tests/test_golden_pfedme.py replays through fedrun (`protocol=official`):

  pfedme_data.json             the problem: 4 clients, 12 features, 4 classes, 8-20 training and 4-12
                               test rows each (values k/8, exact in float32), generated here
  pfedme_<algo>_<model>.json   one run of the authors' server.train(): FedAvg (mclr, dnn), PerAvg
                               (mclr, dnn), pFedMe (mclr, dnn); 3 rounds, 3 local steps, batch 4,
                               2 of 4 clients aggregated per round, fixed initial weights (stored)

Each fixture holds, per round ("iteration" i = 0..2 of their loop, plus i = 3: the evaluation the
loop's next round would begin with): the clients their `select_users` picked (numpy seeded, not
patched), the row indices of every minibatch each client's loaders yielded (train and test), the
server model after aggregation (all entries), their evaluations (pooled accuracy and train loss,
per-client numbers of correct test rows) and a summary (sum, L2 norm, first entries) of every
client's personalized model.

Patches, all at run time and none to the math:
  * data: none to their reader; the problem is written in their JSON layout
    (data/<dataset>/data/{train,test}/*.json) into a temporary folder that becomes the working
    directory (their read_data reads relative paths; save_results/save_model write their .h5 and
    .pt files there too, and they are thrown away).
  * initial weights: their model class is built (as main.py does), then its parameters are
    overwritten by fixed values (torch.manual_seed(0) init rounded to multiples of 1/64) before the
    server deep-copies it.
  * observation only: User.get_next_train_batch / get_next_test_batch are wrapped to note the row
    indices of the batch their DataLoader yielded (by matching the rows); the server's
    send_parameters, evaluate, evaluate_one_step, evaluate_personalized_model, test,
    test_persionalized_model and (persionalized_)aggregate_parameters are wrapped to snapshot state
    after they ran. Their return values and side effects are untouched. Their prints are silenced.
  * device: cpu. torch 2.x: MySGD's `p.data.add_(-beta, d_p)` overload is deprecated but still
    computes p - beta * d_p (a UserWarning, silenced); no patch.

What the authors' code does that the traces pin down (fedrun `protocol=official` reproduces each,
tests/test_golden_pfedme.py checks it):
  * aggregation weighted by the sampled clients' numbers of training rows (aggregate=samples);
  * pFedMe: every client trains every round, only the sampled are aggregated (algo.train_all);
    the inner steps add mu*theta with mu = 0.001 (pFedMeOptimizer's default; algo.mu);
    `persionalized_model_bar` is the list of the model's own parameters (the optimizer returns its
    param group), which train() resets to the local model at its end, so the "personalized" model
    evaluated is the local model w_i (algo.personalized=local);
  * Per-FedAvg (first order): its personalized accuracy comes from train_one_step: one SGD step of
    learning_rate then one of beta, on the client's next two TEST minibatches (algo.test_time).
    Their June 2020 version (c0722e7): the training step's outer update starts from the adapted
    model (algo.outer_step_from=w_tilde), and
    train_one_step uses a TEST then a TRAINING minibatch (algo.test_time=test_then_train); the
    training batches it draws are recorded as `eval_train_batches`.
Differences the traces do not cover (fedrun deliberately does not reproduce them):
  * minibatches: their DataLoaders are unshuffled and restart when exhausted, so a client cycles
    through its rows in file order, and a last short batch when B does not divide its size;
    fedrun draws B rows uniformly with replacement. The traces feed fedrun the authors' batches
    (sizes here are multiples of B, so every batch has B rows).
  * evaluation time: their loop evaluates the global model at the START of a round (round 0 is the
    initial model; the last trained model is never evaluated) and pFedMe's personalized model
    after local training, before aggregation; fedrun evaluates after the round's server update.
    Same numbers, shifted by one round (the test maps them); the MAX over rounds is unaffected.
  * Per-FedAvg's personalized "train loss" is of the adapted models; fedrun logs the global
    model's (recorded, not compared).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch

NUM_CLIENTS, DIM, CLASSES, HIDDEN = 4, 12, 4, 8
TRAIN_SIZES, TEST_SIZES = (12, 16, 20, 8), (8, 8, 12, 4)
BATCH, ROUNDS, LOCAL_EPOCHS, USERS_PER_ROUND, SELECT_SEED = 4, 3, 3, 2, 1

# algorithm -> the authors' main.py arguments (learning_rate, beta, lamda, K, personal_learning_rate)
RUNS = {
    "FedAvg": dict(learning_rate=0.1, beta=1.0, lamda=15, K=5, personal_learning_rate=0.01),
    "PerAvg": dict(learning_rate=0.1, beta=0.05, lamda=15, K=5, personal_learning_rate=0.01),
    "pFedMe": dict(learning_rate=0.05, beta=2.0, lamda=15, K=3, personal_learning_rate=0.05),
}
MODELS = ("mclr", "dnn")
DATASET = "GoldenTiny"


def make_data(seed: int = 0) -> dict:
    """Each client labels Gaussian inputs (k/8 grid) by its own random linear map (heterogeneous)."""
    rng = np.random.RandomState(seed)
    shared = rng.normal(size=(DIM, CLASSES))
    clients = []
    for c in range(NUM_CLIENTS):
        w = shared + 1.5 * rng.normal(size=(DIM, CLASSES))
        n = TRAIN_SIZES[c] + TEST_SIZES[c]
        x = np.round(rng.normal(loc=0.3 * rng.normal(size=DIM), size=(n, DIM)) * 8) / 8
        y = np.argmax(x @ w + rng.normal(scale=0.5, size=(n, CLASSES)), axis=1)
        assert len({r.tobytes() for r in x}) == n, "rows must be distinct (batches are matched by rows)"
        t = TRAIN_SIZES[c]
        clients.append({"train": {"x": x[:t].tolist(), "y": y[:t].tolist()},
                        "test": {"x": x[t:].tolist(), "y": y[t:].tolist()}})
    return {"num_classes": CLASSES, "dim": DIM, "clients": clients}


def write_authors_layout(data: dict, root: str) -> None:
    ids = [f"f_{c:05d}" for c in range(NUM_CLIENTS)]
    for split in ("train", "test"):
        folder = os.path.join(root, "data", DATASET, "data", split)
        os.makedirs(folder, exist_ok=True)
        blob = {"users": ids, "user_data": {i: data["clients"][c][split] for c, i in enumerate(ids)},
                "num_samples": [len(data["clients"][c][split]["y"]) for c in range(NUM_CLIENTS)]}
        with open(os.path.join(folder, f"{split}.json"), "w") as f:
            json.dump(blob, f)
    os.makedirs(os.path.join(root, "results"), exist_ok=True)


def fixed_init(model: torch.nn.Module) -> dict:
    torch.manual_seed(0)
    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            torch.nn.init.uniform_(p, -0.5, 0.5)
            p.copy_(torch.round(p * 64) / 64)
            out[name] = p.tolist()
    return out


def summary(params) -> dict:
    """Per tensor: sum, L2 norm and the first 3 entries (float64 of the float32 values)."""
    return {n: {"sum": float(p.detach().double().sum()), "norm": float(p.detach().double().norm()),
                "head": p.detach().flatten()[:3].double().tolist()} for n, p in params}


def record(authors: str, algorithm: str, model_name: str, data: dict) -> dict:
    from FLAlgorithms.servers.serveravg import FedAvg
    from FLAlgorithms.servers.serverperavg import PerAvg
    from FLAlgorithms.servers.serverpFedMe import pFedMe
    from FLAlgorithms.trainmodel.models import DNN, Mclr_Logistic
    from FLAlgorithms.users.userbase import User

    args = RUNS[algorithm]
    device = torch.device("cpu")
    net = Mclr_Logistic(DIM, CLASSES) if model_name == "mclr" else DNN(DIM, HIDDEN, CLASSES)
    init = fixed_init(net)
    common = (DATASET, algorithm, (net, model_name), BATCH, args["learning_rate"], args["beta"],
              args["lamda"], ROUNDS, LOCAL_EPOCHS, "SGD", USERS_PER_ROUND)
    if "device" in inspect.signature(FedAvg.__init__).parameters:  # added in Dec 2020 (commit 7e52b22)
        common = (device, *common)
    with contextlib.redirect_stdout(io.StringIO()):
        if algorithm == "FedAvg":
            server = FedAvg(*common, 0)
        elif algorithm == "PerAvg":
            server = PerAvg(*common, 0)
        else:
            server = pFedMe(*common, args["K"], args["personal_learning_rate"], 0)
    order = [u.id for u in server.users]
    rows = {}  # user id -> {split: {row bytes: index}}
    for c, u in enumerate(server.users):
        rows[u.id] = {s: {np.asarray(r, dtype=np.float32).tobytes(): i
                          for i, r in enumerate(data["clients"][c][s]["x"])}
                      for s in ("train", "test")}

    trace: list[dict] = []

    def current() -> dict:
        return trace[-1]

    evaluating = [False]  # inside Per-FedAvg's evaluate_one_step

    def batch_recorder(original, split):
        def wrapped(user):
            X, y = original(user)
            idx = [rows[user.id][split][r.numpy().astype(np.float32).tobytes()] for r in X]
            # training batches its test-time step drew (their code before Nov 2020) are kept apart
            key = "eval_train_batches" if evaluating[0] and split == "train" else f"{split}_batches"
            current().setdefault(key, {}).setdefault(str(order.index(user.id)), []).append(idx)
            return X, y
        return wrapped

    def after(name, fn):
        original = getattr(server, name)

        def wrapped(*a, **k):
            out = original(*a, **k)
            fn(out)
            return out
        setattr(server, name, wrapped)

    def new_iteration(_):
        trace.append({"train_batches": {}, "test_batches": {}})

    def snap_global(_):
        it = current()
        it["global"] = {"acc": float(server.rs_glob_acc[-1]), "train_loss": float(server.rs_train_loss[-1]),
                        "correct": it.pop("_test_correct"), "params": summary(server.model.named_parameters())}

    def snap_pers(_):
        it = current()
        it["pers"] = {"acc": float(server.rs_glob_acc_per[-1]), "train_loss": float(server.rs_train_loss_per[-1]),
                      "correct": it.pop("_test_correct"), "clients": it.pop("_pers_params")}

    names = [n for n, _ in net.named_parameters()]

    def snap_test(out):
        # server.test(): the users' current models on their test rows (global, or adapted in evaluate_one_step)
        current()["_test_correct"] = [int(v) for v in out[2]]
        current()["_pers_params"] = [summary(u.model.named_parameters()) for u in server.users]

    def snap_test_pers(out):
        # test_persionalized_model(): what it loaded into the model and tested, persionalized_model_bar
        current()["_test_correct"] = [int(v) for v in out[2]]
        current()["_pers_params"] = [summary(zip(names, u.persionalized_model_bar)) for u in server.users]

    def snap_aggregate(_):
        it = current()
        it["selected"] = sorted(order.index(u.id) for u in server.selected_users)
        it["aggregated"] = {n: p.detach().tolist() for n, p in server.model.named_parameters()}

    after("send_parameters", new_iteration)
    after("test", snap_test)
    after("test_persionalized_model", snap_test_pers)
    if algorithm == "PerAvg":
        after("evaluate_one_step", snap_pers)
        after("aggregate_parameters", snap_aggregate)
        one_step = server.evaluate_one_step

        def flagged(*a, **k):
            evaluating[0] = True
            try:
                return one_step(*a, **k)
            finally:
                evaluating[0] = False
        server.evaluate_one_step = flagged
    else:
        after("evaluate", snap_global)
        if algorithm == "pFedMe":
            after("evaluate_personalized_model", snap_pers)
            after("persionalized_aggregate_parameters", snap_aggregate)
        else:
            after("aggregate_parameters", snap_aggregate)

    saved = User.get_next_train_batch, User.get_next_test_batch
    User.get_next_train_batch = batch_recorder(saved[0], "train")
    User.get_next_test_batch = batch_recorder(saved[1], "test")
    try:
        np.random.seed(SELECT_SEED)  # their select_users draws from numpy's global stream
        with contextlib.redirect_stdout(io.StringIO()):
            server.train()
            # the start of the loop's next round: the last trained model's evaluation
            server.send_parameters()
            (server.evaluate_one_step if algorithm == "PerAvg" else server.evaluate)()
    finally:
        User.get_next_train_batch, User.get_next_test_batch = saved
    for it in trace:
        for k in [k for k in it if k.startswith("_")]:
            del it[k]
    return {
        "authors": {"repo": "CharlieDinh/pFedMe", "commit": _commit(authors),
                    "recorder": "scripts/golden/record_pfedme.py",
                    "torch": torch.__version__},
        "algorithm": algorithm, "model": model_name, "hidden": HIDDEN if model_name == "dnn" else None,
        "args": {**args, "batch_size": BATCH, "num_global_iters": ROUNDS, "local_epochs": LOCAL_EPOCHS,
                 "numusers": USERS_PER_ROUND},
        "select_seed": SELECT_SEED,
        "init": init,
        "iterations": trace,
    }


def _commit(path: str) -> str | None:
    stamp = os.path.join(path, ".commit")
    if os.path.exists(stamp):
        return open(stamp).read().strip()
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, help="a work tree of github.com/CharlieDinh/pFedMe")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "golden"))
    ap.add_argument("--commit", default=None, help="the checkout's commit, when it is not a git work tree")
    ap.add_argument("--algorithms", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--suffix", default="", help="appended to the fixture names, e.g. _2020 for an older checkout")
    opts = ap.parse_args()
    authors = os.path.abspath(opts.authors)
    out = os.path.abspath(opts.out)
    sys.path.insert(0, authors)
    warnings.filterwarnings("ignore", message=".*overload of add_ is deprecated.*")
    torch.set_num_threads(1)
    os.makedirs(out, exist_ok=True)
    data = make_data()
    _dump(os.path.join(out, "pfedme_data.json"), data)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        write_authors_layout(data, tmp)
        os.chdir(tmp)
        try:
            for algorithm in opts.algorithms.split(","):
                for model_name in MODELS:
                    trace = record(authors, algorithm, model_name, data)
                    if opts.commit:
                        trace["authors"]["commit"] = opts.commit
                    path = os.path.join(out, f"pfedme_{algorithm.lower()}_{model_name}{opts.suffix}.json")
                    _dump(path, trace)
                    print(f"wrote {os.path.relpath(path, cwd)}")
        finally:
            os.chdir(cwd)


def _short(obj):
    """Floats to 9 significant digits: every float32 value survives the round trip exactly."""
    if isinstance(obj, float):
        return float(f"{obj:.9g}")
    if isinstance(obj, dict):
        return {k: _short(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_short(v) for v in obj]
    return obj


def _dump(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(_short(obj), f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
