#!/usr/bin/env python
"""fedrun beside PFLlib (github.com/TsingZ0/PFLlib): the same partition, model and local work, both columns.

    python scripts/pfllib_side_by_side.py --pfllib /work/ref/PFLlib --dataset.root /work/shared/data --out DIR
    python scripts/pfllib_side_by_side.py --replot DIR[,DIR2...]   # the table again from DIRs' results (into DIR)
    python scripts/pfllib_side_by_side.py --setting mnist_dir01 --algos fedavg,fedrep --rounds 3 --eval-every 1 \
        --batch-size 10 --fedrun-masked --out DIR   # uneven clients, rounds in local epochs (issue 44)
    ... --rounds 4 --rounds-pair 1,4 ...            # also s/round with the fixed costs out of both sides

1. Builds fedrun's data for --setting (default: baselines.py's `mnist_shards2`, real MNIST, 2
   label-sorted shards per client, 20 clients, every client's rows split 75 / 25) and writes every
   client's training and test rows, already normalized, into PFLlib's dataset layout:
   DIR/pfllib/dataset/<name>/{train,test}/<client>.npz, each holding {'data': {'x', 'y'}} as
   PFLlib's generators write them (its read_client_data loads them; this script never reads them).
   `--setting cifar100_dir01_resnet18`: baselines.py's CIFAR-100, Dirichlet 0.1, 100 clients, 10 a round
   on both sides, the rows as images; fedrun trains the table's ResNet-18 (CIFAR stem, GroupNorm), PFLlib
   its own (main.py's ResNet18: torchvision's, BatchNorm), so that setting compares time per round, not
   one network's accuracy; tau is the mean client's epoch (sizes differ under Dirichlet).
2. fedrun: `fedrun -m algo=<a> ... seed=<seeds> hydra/launcher=basic` (seeds one after another, so
   each job's own wall time is one run's), `sampling=epochs` (a shuffled pass through the client's
   rows, as PFLlib's DataLoader) with tau = floor(n / B) steps = one epoch when every client holds
   n training rows (the shards setting: 2,625 each); `aggregate=samples` (PFLlib's weights; equal
   here), all clients every round.
3. PFLlib: its own server class (flcore.servers.*) and `train()` loop (select, send, evaluate every
   --eval-every rounds, each client's train() one after another, receive, aggregate), run by
   /work/ref-venv/bin/python on that folder, the model an MLP of fedrun's shape 784-100(ReLU)-10
   built as PFLlib's BaseHeadSplit (base = flatten + fc1 + ReLU, head = the output layer; PFLlib's
   own `DNN` would put a log_softmax between body and head once split). Options are PFLlib
   main.py's defaults (read from its argparse calls), then: cpu, lr, batch, 1 local epoch (FedRep: 1
   head epoch + 1 body epoch), mu / lambda. Nothing of PFLlib is copied here.

--setting mnist_dir01 (uneven clients, issue 44): baselines.py's `mnist_dir01` (real MNIST, Dirichlet
alpha 0.1 over 20 clients, the same MLP): fedrun's rounds are in local epochs as PFLlib's
(`algo.local_epochs=1`, FedRep also `algo.head_epochs=1`; each client floor(n_c / B) steps per epoch,
computed sorted by work, fedrun/simulate.py `_epochs_by_work`) instead of tau steps; fedavg and fedrep.
--fedrun-masked runs fedrun's side once more with the epochs phases computed masked (every client
stepped for the largest client's count, the finished ones frozen: the computation before sorting by
work, the same numbers) for the ratio of what sorting saves.

Accuracy in both is pooled over all clients' test rows (correct / rows). PFLlib evaluates at the
start of round i the models trained i rounds, so its i-th evaluation is fedrun's round i. Speed: wall
seconds per round with the same evaluation schedule, same machine, one after the other per
algorithm, one torch thread each (fedrun: the job's wall time / rounds, setup included; PFLlib: the
mean of its per-round `Budget`, set-up of clients excluded), plus PFLlib's rounds without evaluation.
Those two measures differ (fedrun's holds its set-up, PFLlib's not); `--rounds-pair R1,R2` measures both sides
the same way: each side also run at R1 and R2 rounds (same seeds; the run at --rounds reused), its whole
processes' CPU and wall seconds taken by this script, and (X(R2) - X(R1)) / (R2 - R1) per run is the round's
cost with imports, data and client set-up and the end of the run out (PFLlib's loop trains one round more than
it is given in both runs: that round falls in the fixed part too). Each run's load average (1 minute) at its
start and end is kept in the json.
Writes DIR/side_by_side.{json,md}.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LR, MU, LAM = 0.05, 0.01, 0.1
# name -> (fedrun options (tau in epochs: "E"), metric column, PFLlib server module, class, extra PFLlib args)
ALGOS = {
    "fedavg": (["algo=fedavg", f"algo.beta={LR}", "algo.alpha=null"], "global_acc", "serveravg", "FedAvg", {}),
    "fedprox": (["algo=fedprox", f"algo.beta={LR}", f"algo.mu={MU}", "algo.alpha=null"], "global_acc",
                "serverprox", "FedProx", {"mu": MU}),
    "ditto": (["algo=ditto", f"algo.lr={LR}", f"algo.personal_lr={LR}", f"algo.lam={LAM}"], "pers_acc",
              "serverditto", "Ditto", {"mu": LAM, "plocal_epochs": 1}),
    "fedper": (["algo=fedper", f"algo.lr={LR}"], "pers_acc", "serverper", "FedPer", {}),
    "fedrep": (["algo=fedrep", f"algo.lr={LR}", "algo.head_steps=E"], "pers_acc", "serverrep", "FedRep",
               {"plocal_epochs": 1}),
    # the representation methods (issue 36), at the papers' weights (PFLlib's defaults mu 0 / tau 1 make MOON FedAvg)
    "moon": (["algo=moon", f"algo.lr={LR}", "algo.mu=1.0", "algo.temperature=0.5"], "global_acc", "servermoon", "MOON",
             {"mu": 1.0, "tau": 0.5}),
    "fedrod": (["algo=fedrod", f"algo.lr={LR}"], "pers_acc", "serverrod", "FedROD", {}),
    "fedproto": (["algo=fedproto", f"algo.lr={LR}", "algo.lam=1.0", "algo.follow=pfllib"], "pers_acc", "serverproto",
                 "FedProto", {"lamda": 1.0}),
    "feddbe": (["algo=feddbe", f"algo.lr={LR}", "algo.momentum=0.1", "algo.kappa=1.0"], "pers_acc", "serverdbe",
               "FedDBE", {"momentum": 0.1, "kl_weight": 1.0}),
    "fedpac": (["algo=fedpac", f"algo.lr={LR}", "algo.lam=1.0", "algo.head_epochs=1", "algo.local_epochs=1",
                "algo.follow=pfllib"], "pers_acc",
               "serverpac", "FedPAC", {"lamda": 1.0}),  # (its passes over each client's rows: tau unused)
    "gpfl": (["algo=gpfl", f"algo.lr={LR}", "algo.lam=1.0", "algo.mu=0.0", "algo.local_epochs=1",
              "algo.follow=pfllib"], "pers_acc", "servergpfl", "GPFL", {"lamda": 1.0, "mu": 0.0}),
    # FedCP: PFLlib's accuracy draws gate noise at test time, fedrun's does not
    "fedcp": (["algo=fedcp", f"algo.lr={LR}", "algo.lam=1.0", "algo.local_epochs=1", "algo.follow=pfllib"], "pers_acc",
              "servercp", "FedCP", {"lamda": 1.0}),
}
# issue 36, the model-mixing methods (fedrun follows PFLlib's code where it differs from the paper: FedAMP's
# regularizer without gradient, follow=pfllib; FedPHP serves each client's last personalized model, serve=local;
# FedALA's ALA differs in its rows and start phase, docs/baselines.md)
ALGOS.update({
    "fedamp": (["algo=fedamp", f"algo.lr={LR}", "algo.lam=1.0", "algo.alpha_k=1.0", "algo.sigma=1.0",
                "algo.follow=pfllib"],
               "pers_acc", "serveramp", "FedAMP", {"alphaK": 1.0, "lamda": 1.0, "sigma": 1.0}),
    "fedphp": (["algo=fedphp", f"algo.lr={LR}", "algo.mu=0.9", "algo.lam=0.5", "algo.serve=local"], "pers_acc",
               "serverphp", "FedPHP", {"mu": 0.9, "lamda": 0.5}),
    # FedALA: PFLlib scores the models its ALA just mixed, fedrun the clients' trained ones (docs/baselines.md)
    "fedala": (["algo=fedala", f"algo.lr={LR}", "algo.ala_steps=null"], "pers_acc", "serverala", "FedALA",
               {"eta": 1.0, "rand_percent": 80, "layer_idx": 2}),
})
# APPLE: every client trains every round in both; PFLlib's clients, trained one after another in one
# process, mix the cores that the clients before them trained that round (fedrun: the round's start), docs/baselines.md
ALGOS["apple"] = (["algo=apple", f"algo.lr={LR}", "algo.dr_lr=0.01", "algo.mu=0.01", "algo.decay=1.0",
                   "algo.follow=pfllib"],
                  "pers_acc", "serverapple", "APPLE", {"dr_learning_rate": 0.01, "mu": 0.01, "L": 1.0})
# FedFomo: PFLlib weighs on the last 20 % of a client's rows and trains on the rest; fedrun draws its
# validation minibatches from all of them (2,625 rows: 525 in minibatches of the default --batch-size 50, 11 of
# them, the last partial in PFLlib) and trains on all (docs/baselines.md, "FedFomo"); follow=pfllib: w_n
# measured from the model before its last training
ALGOS["fedfomo"] = (["algo=fedfomo", f"algo.lr={LR}", "algo.M=5", "algo.val_batches=11", "algo.follow=pfllib"],
                    "pers_acc", "serverfomo", "FedFomo", {"M": 5})
# PFLlib's servers that evaluate AFTER the round's local training (before aggregation): their i-th
# evaluation scores the models of fedrun's round i + 1
EVAL_AFTER_TRAINING = {"fedphp"}
EPOCHS_PER_ROUND = {"fedrep": 2}  # fedrun's tau in epochs: FedRep's head epoch then its body epoch
SETTING = "mnist_shards2"  # the default --setting
# --setting (baselines.py's, its data and fedrun model as the table defines them) -> PFLlib's side: the dataset
# folder's name ("MNIST" in the name: PFLlib's helpers read it so), classes, clients trained a round, the model
# PFLlib trains
SETTINGS = {
    SETTING: dict(dataset="MNIST_fedrun_shards2", classes=10, per_round=20, model="mlp"),
    "mnist_dir01": dict(dataset="MNIST_fedrun_dir01", classes=10, per_round=20, model="mlp"),
    # PFLlib's own ResNet-18 (its main.py's ResNet18: torchvision's, ImageNet stem, BatchNorm) beside fedrun's
    # (CIFAR stem, GroupNorm): the same data, partition and local work, not the same network
    "cifar100_dir01_resnet18": dict(dataset="Cifar100_fedrun_dir01", classes=100, per_round=10, model="resnet18"),
}
# the settings whose fedrun rounds are in local epochs (uneven clients): algorithm -> fedrun's options there
LOCAL_EPOCHS = {"mnist_dir01": {
    "fedavg": ["algo=fedavg", f"algo.beta={LR}", "algo.alpha=null", "algo.local_epochs=1"],
    "fedrep": ["algo=fedrep", f"algo.lr={LR}", "algo.local_epochs=1", "algo.head_epochs=1"],
}}
# fedrun's side with the epochs phases masked (--fedrun-masked): simulate._epochs_by_work replaced by every
# client stepping the largest client's count, the finished ones kept as they were (the same numbers)
MASKED = """import sys
import fedrun.simulate as s

def masked(algo, engine, local, data, d, rnd, fn, epochs):
    for t in range(d.idx.shape[1]):
        local = s.one_step(algo, engine, local, data, d.idx[:, t].contiguous(), rnd,
                           None if d.aug is None else tuple(a[:, t].contiguous() for a in d.aug), fn,
                           d.live[:, t].contiguous())
    return local

s._epochs_by_work = masked
sys.argv[0] = 'fedrun'
from fedrun.cli import main
main()
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pfllib", default="/work/ref/PFLlib", help="PFLlib checkout (its system/ folder is imported)")
    ap.add_argument("--pfllib-python", default="/work/ref-venv/bin/python",
                    help="a Python with PFLlib's needs (h5py, scikit-learn)")
    ap.add_argument("--dataset.root", "--dataset.root", dest="data_root", default=os.environ.get("FEDRUN_DATA", "data"),
                    metavar="DIR",
                    help="folder holding MNIST/raw, fedrun's dataset.root (default: $FEDRUN_DATA or ./data)")
    ap.add_argument("--setting", default=SETTING, metavar="NAME",
                    help=f"one of {', '.join(SETTINGS)} (default: {SETTING})")
    ap.add_argument("--algos", default=None, help=f"comma-separated, from {', '.join(ALGOS)} (mnist_dir01: "
                    f"{', '.join(LOCAL_EPOCHS['mnist_dir01'])}); default: all of the setting's")
    ap.add_argument("--fedrun-masked", action="store_true",
                    help="--setting mnist_dir01: fedrun's side once more, its epochs computed masked (before sorting "
                         "by work)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--rounds-pair", default=None, metavar="R1,R2",
                    help="also run each side at R1 and at R2 rounds (R1 < R2, multiples of --eval-every; the same "
                         "seeds; a count equal to --rounds reuses that run) for CPU and wall seconds per round with "
                         "the fixed costs out of both sides: (X(R2) - X(R1)) / (R2 - R1), X each side's whole "
                         "processes as measured by this script")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--seeds", default="0,1,2", help="fedrun's run seeds")
    ap.add_argument("--pfllib-seeds", default="0", help="PFLlib's runs: torch/numpy/random seeded with each")
    ap.add_argument("--device", default="cpu", help="both sides' device: cpu, cuda, cuda:N (default cpu)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once (each run: one seed of one side, one torch thread); above 1 the s/round "
                         "columns are taken under that contention and the table says so")
    ap.add_argument("--out", default=None,
                    help="output folder (default outputs/papers/pfllib_side_by_side/<date_time>)")
    ap.add_argument("--replot", metavar="DIR", default=None,
                    help="run nothing: the table from DIR's results (comma-separated DIRs: runs of other algorithms "
                         "with the same settings merged in, written into the first)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one PFLlib run (JSON job)
    args = ap.parse_args(argv)
    if args.worker:
        return pfllib_worker(json.loads(args.worker))
    if args.setting not in SETTINGS:
        print(f"error: --setting {args.setting} is not allowed; choose from {', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    allowed = LOCAL_EPOCHS.get(args.setting, ALGOS)
    algos = [a for a in (args.algos or ",".join(allowed)).split(",") if a]
    bad = [a for a in algos if a not in allowed]
    if bad or not algos:
        print(f"error: --algos {','.join(bad) or '(empty)'} is not allowed with --setting {args.setting}; choose "
              f"from {', '.join(allowed)}", file=sys.stderr)
        return 2
    if args.fedrun_masked and args.setting not in LOCAL_EPOCHS:
        print(f"error: --fedrun-masked is not allowed with --setting {args.setting}; it needs rounds in local "
              f"epochs: --setting {', '.join(LOCAL_EPOCHS)}", file=sys.stderr)
        return 2
    if args.fedrun_masked and args.jobs != 1:
        print(f"error: --fedrun-masked is not allowed with --jobs {args.jobs}; it times runs one after the other: "
              f"--jobs 1", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        pseeds = [int(s) for s in args.pfllib_seeds.split(",") if s]
    except ValueError:
        print("error: --seeds and --pfllib-seeds take comma-separated integers", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"error: --jobs {args.jobs} is not allowed; give a count of 1 or more", file=sys.stderr)
        return 2
    pair = parse_rounds_pair(args.rounds_pair, args.eval_every) if args.rounds_pair is not None else None
    if isinstance(pair, str):
        print(f"error: --rounds-pair {args.rounds_pair} is not allowed; {pair}", file=sys.stderr)
        return 2
    if pair and args.jobs != 1:
        print(f"error: --rounds-pair is not allowed with --jobs {args.jobs}; it reads each run's CPU seconds as the "
              f"runs end one after the other: --jobs 1", file=sys.stderr)
        return 2
    if args.device != "cpu" and not args.device.startswith("cuda"):
        print(f"error: --device {args.device} is not allowed; choose cpu, cuda or cuda:N", file=sys.stderr)
        return 2
    if args.replot:
        dirs = [os.path.abspath(d) for d in args.replot.split(",") if d]
        results = json.load(open(os.path.join(dirs[0], "side_by_side.json")))
        for d in dirs[1:]:
            more = json.load(open(os.path.join(d, "side_by_side.json")))
            same = ("setting", "data", "rounds", "eval_every", "batch_size", "tau_epoch", "lr", "pfllib_commit",
                    "rounds_pair")
            for m in (more["meta"], results["meta"]):
                m.setdefault("rounds_pair", None)  # (results written before --rounds-pair existed)
            more["meta"].setdefault("jobs", 1)
            more["meta"].setdefault("setting", SETTING)  # (results written before --jobs and --device existed)
            results["meta"].setdefault("jobs", 1)
            # (the same files elsewhere)
            where = lambda m: {**m, "data": [o for o in m["data"] if not o.startswith("dataset.root=")]}
            if any(where(more["meta"])[k] != where(results["meta"])[k] for k in same):
                print(f"error: --replot {d} ran other settings than {dirs[0]}", file=sys.stderr)
                return 2
            results.update({k: v for k, v in more.items() if k != "meta"})
        write_table(dirs[0], results)
        return 0
    out = os.path.abspath(args.out or os.path.join(
        "outputs", "papers", "pfllib_side_by_side", time.strftime("%Y-%m-%d_%H-%M-%S")))
    res_path = os.path.join(out, "side_by_side.json")
    if not os.path.isdir(os.path.join(args.pfllib, "system", "flcore")):
        print(f"error: --pfllib {args.pfllib} holds no system/flcore (a PFLlib checkout)", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    print(f"outputs: {out}")
    side = SETTINGS[args.setting]
    data_opts = setting_options(args.data_root, args.setting)
    n_train = export(data_opts, os.path.join(out, "pfllib", "dataset", side["dataset"]), flat=side["model"] == "mlp")
    local = args.setting in LOCAL_EPOCHS  # fedrun's rounds in local epochs: tau unused, each client floor(n_c / B)
    equal = len(set(n_train)) == 1
    # one epoch: floor(n / B) steps when every client holds n rows; in local epochs (tau unused) the smallest
    # client's, as printed; else the clients' mean epoch
    tau = max(1, min(n_train) // args.batch_size if equal or local
              else round(sum(n_train) / len(n_train) / args.batch_size))
    print(f"clients: {len(n_train)}, training rows per client: min {min(n_train)}, max {max(n_train)}; "
          f"one epoch at B={args.batch_size}: {tau} steps" + ("" if equal else
          (" for the smallest client, floor(n_c / B) each in both (local epochs)" if local else
           " for a client of the mean size (fedrun: every client tau steps; PFLlib: floor(n_c / B) each)")))
    results = json.load(open(res_path)) if os.path.exists(res_path) else {}
    results.update(meta={"setting": args.setting, "data": data_opts, "rounds": args.rounds,
                         "eval_every": args.eval_every, "batch_size": args.batch_size, "tau_epoch": tau,
                         "n_train": n_train, "lr": LR,
                         "pfllib_commit": git_commit(args.pfllib), "device": args.device, "jobs": args.jobs,
                         "rounds_pair": pair})
    if args.jobs == 1:
        for a in algos:
            r = results.setdefault(a, {})
            r["fedrun"] = run_fedrun(args, out, a, data_opts, tau, seeds)
            r["pfllib"] = [run_pfllib(args, out, a, s) for s in pseeds]
            if args.fedrun_masked:
                r["fedrun_masked"] = run_fedrun(args, out, a, data_opts, tau, seeds, masked=True)
            write_atomic_json(res_path, results)
            if pair:  # each side at R1 and R2 rounds (the run above where a count is --rounds)
                r["pair"] = {side: {} for side in ("fedrun", "pfllib") + (("fedrun_masked",) if args.fedrun_masked
                                                                         else ())}
                for n in pair:
                    again = n != args.rounds
                    for side, p in r["pair"].items():
                        if side == "pfllib":
                            ps = [run_pfllib(args, out, a, s, n) for s in pseeds] if again else r["pfllib"]
                            p[str(n)] = {"cpu": sum(x["proc_cpu"] for x in ps), "wall": sum(x["wall"] for x in ps),
                                         "runs": len(ps), "load": [x["load"] for x in ps]}
                        else:
                            f = run_fedrun(args, out, a, data_opts, tau, seeds, side == "fedrun_masked",
                                           n) if again else r[side]
                            p[str(n)] = {"cpu": f["cpu"], "wall": f["wall"], "runs": len(f["runs"]), "load": f["load"]}
                    write_atomic_json(res_path, results)
    else:  # every (algorithm, side, seed) one run, --jobs of them at once; results saved as each algorithm completes
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        with ThreadPoolExecutor(args.jobs) as pool:
            futs = {a: ([pool.submit(run_fedrun, args, out, a, data_opts, tau, [s]) for s in seeds],
                        [pool.submit(run_pfllib, args, out, a, s) for s in pseeds]) for a in algos}
            failed = []
            while futs:
                running = [f for fr, pr in futs.values() for f in fr + pr if not f.done()]
                if running:
                    wait(running, return_when=FIRST_COMPLETED)
                done = [a for a, (fr, pr) in futs.items() if all(f.done() for f in fr + pr)]
                for a in done:
                    fr, pr = futs.pop(a)
                    if any(f.exception() for f in fr + pr):  # (its error printed by the run) the others go on
                        failed.append(a)
                        continue
                    runs = [f.result() for f in fr]
                    results[a] = {"fedrun": {"command": [r["command"] for r in runs], "metric": runs[0]["metric"],
                                             "runs": [x for r in runs for x in r["runs"]],
                                             "wall": [r["wall"] for r in runs]},
                                  "pfllib": [f.result() for f in pr]}
                    write_atomic_json(res_path, results)
        if failed:
            write_table(out, results)
            print(f"error: {', '.join(failed)} failed (their output above); the table holds the others",
                  file=sys.stderr)
            return 1
    write_table(out, results)
    return 0


def setting_options(root: str, setting: str = SETTING) -> list[str]:
    sys.path.insert(0, HERE)
    import baselines  # the table's setting, as it defines it

    s = baselines.SETTINGS[setting]
    return s["data"] + [f"dataset.root={os.path.abspath(root)}", "dataset.download=false"]


def export(data_opts: list[str], folder: str, flat: bool = True) -> list[int]:
    """fedrun's partition of the setting into PFLlib's per-client .npz files (`flat`: each row a vector, for the MLP;
    else as fedrun holds it, images C x H x W); returns the training rows per client."""
    import numpy as np
    from hydra import compose, initialize_config_dir

    from fedrun.config import CONF_DIR, instantiate_checked

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=list(data_opts))  # dataset= selects data=composed itself
    data = instantiate_checked(cfg.data)
    sizes = []
    for part, split in (("train", data.train), ("test", data.test)):
        os.makedirs(os.path.join(folder, part), exist_ok=True)
        for c in range(split.num_clients):
            rows = split.client_rows(c)
            x = split.x[rows]
            x = (x.reshape(rows.stop - rows.start, -1) if flat else x).numpy().astype(np.float32)
            y = split.y[rows].numpy().astype(np.int64)
            if part == "train":
                sizes.append(len(y))
            path = os.path.join(folder, part, f"{c}.npz")
            with open(path + ".tmp", "wb") as f:
                np.savez_compressed(f, data={"x": x, "y": y})
            os.replace(path + ".tmp", path)
    return sizes


def parse_rounds_pair(text: str, eval_every: int) -> list[int] | str:
    """--rounds-pair's R1,R2 as [R1, R2], or what is wrong with it (both sides then evaluate (R2 - R1) / eval_every
    times more in the longer run: fedrun after rounds eval_every, 2 eval_every, ..., PFLlib before them)."""
    try:
        pair = [int(x) for x in text.split(",")]
    except ValueError:
        pair = []
    if len(pair) != 2 or not 1 <= pair[0] < pair[1]:
        return "give two round counts R1,R2 with 1 <= R1 < R2"
    if any(n % eval_every for n in pair):
        return f"give round counts that are multiples of --eval-every {eval_every}"
    return pair


def per_round(pair: dict, key: str = "cpu") -> tuple[float, float] | None:
    """Seconds per round and per run with the fixed costs out, from one side's totals at two round counts:
    `pair` maps each count R (a string, as JSON keys are) to {"cpu", "wall": the seconds of all its runs, "runs":
    how many}. Returns ((X(R2) - X(R1)) / (R2 - R1), the fixed part X(R1) - R1 x that), X = `key`'s seconds per
    run; None without both counts."""
    if len(pair) != 2:
        return None
    (r1, a), (r2, b) = sorted((int(k), v) for k, v in pair.items())
    slope = (b[key] / b["runs"] - a[key] / a["runs"]) / (r2 - r1)
    return slope, a[key] / a["runs"] - r1 * slope


def run_fedrun(args, out: str, algo: str, data_opts: list[str], tau_epoch: int, seeds: list[int],
               masked: bool = False, rounds: int | None = None) -> dict:
    import pandas as pd

    rounds = args.rounds if rounds is None else rounds

    opts, col = ALGOS[algo][0], ALGOS[algo][1]
    if args.setting in LOCAL_EPOCHS:  # rounds in local epochs (tau unused)
        opts, tau = LOCAL_EPOCHS[args.setting][algo], tau_epoch
    else:
        opts = [o.replace("=E", f"={tau_epoch}") for o in opts]
        tau = tau_epoch * EPOCHS_PER_ROUND.get(algo, 1)
    sweep = os.path.join(out, ("fedrun_masked" if masked else "fedrun")
                         + ("" if rounds == args.rounds else f"_rounds{rounds}"), algo) + (
        "" if args.jobs == 1 else f"_seed{seeds[0]}")
    cmd = [sys.executable, *(["-c", MASKED] if masked else ["-m", "fedrun.cli"]), "-m", *opts, *data_opts, f"tau={tau}",
           f"batch_size={args.batch_size}", "sampling=epochs", "aggregate=samples",
           f"clients_per_round={SETTINGS[args.setting]['per_round']}", f"rounds={rounds}",
           f"eval_every={args.eval_every}", f"seed={','.join(map(str, seeds))}", f"device={args.device}",
           "threads=1", "progress=false",
           "plot=false", "hydra/launcher=basic", "~hydra.callbacks.sweep_report", f"hydra.sweep.dir={sweep}",
           "hydra.sweep.subdir=seed${seed}"]
    print(f"run: fedrun{' (masked)' if masked else ''} " + " ".join(cmd[4:]), flush=True)
    t0, c0, l0 = time.time(), _children_cpu(), os.getloadavg()[0]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall, cpu, load = time.time() - t0, _children_cpu() - c0, [l0, os.getloadavg()[0]]
    if r.returncode:
        print(r.stdout[-3000:])
        sys.exit(f"error: fedrun exited with {r.returncode}")
    runs = []
    for d in sorted(os.listdir(sweep)):
        p = os.path.join(sweep, d)
        if not os.path.exists(os.path.join(p, "summary.json")):
            continue
        m = pd.read_csv(os.path.join(p, "metrics.csv"))
        s = json.load(open(os.path.join(p, "summary.json")))
        runs.append({"seed": s["seed"], "rounds": m["round"].tolist(), "acc": m[col].tolist(), "seconds": s["seconds"]})
    print(f"fedrun{' (masked)' if masked else ''} {algo}, {rounds} rounds: {len(runs)} runs in {wall:.0f}s, "
          f"{cpu:.1f} CPU-s, load average (1 min) {load[0]:.2f} -> {load[1]:.2f}", flush=True)
    # cpu: the fedrun process's CPU seconds (user + system), all its seeds, imports and setup included
    return {"command": ("fedrun (masked) " if masked else "fedrun ") + " ".join(cmd[4:]), "metric": col, "runs": runs,
            "wall": wall, "cpu": cpu, "load": load}


def _children_cpu() -> float:
    import resource

    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def run_pfllib(args, out: str, algo: str, seed: int, rounds: int | None = None) -> dict:
    rounds = args.rounds if rounds is None else rounds
    work = os.path.join(out, "pfllib")
    job = {"pfllib": os.path.abspath(args.pfllib), "work": work, "algo": algo, "seed": seed, "rounds": rounds,
           "device": args.device, "setting": args.setting,
           "eval_every": args.eval_every, "batch_size": args.batch_size,
           "log": os.path.join(work, f"{algo}_seed{seed}" + ("" if rounds == args.rounds else f"_rounds{rounds}")
                               + ".log")}
    cmd = [args.pfllib_python, os.path.abspath(__file__), "--worker", json.dumps(job)]
    t0, c0, l0 = time.time(), _children_cpu(), os.getloadavg()[0]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall, cpu, load = time.time() - t0, _children_cpu() - c0, [l0, os.getloadavg()[0]]
    if r.returncode:
        print(r.stdout[-3000:])
        sys.exit(f"error: the PFLlib run exited with {r.returncode} (log: {job['log']})")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["wall"], res["load"] = wall, load
    if args.jobs == 1:  # the PFLlib process's CPU seconds (user + system), imports and client set-up included
        res["proc_cpu"] = cpu
    print(f"PFLlib {algo} seed {seed}, {rounds} rounds: {wall:.0f}s, {cpu:.1f} CPU-s, load average (1 min) "
          f"{load[0]:.2f} -> {load[1]:.2f}", flush=True)
    return res


# ------------------------------------------------------------------------------------------------
# the PFLlib side (runs under --pfllib-python; imports neither fedrun nor pandas)
# ------------------------------------------------------------------------------------------------

def main_py_defaults(pfllib: str) -> dict:
    """The defaults of PFLlib's system/main.py options, read from its parser.add_argument calls."""
    tree = ast.parse(open(os.path.join(pfllib, "system", "main.py")).read())
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            longs = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
            dflt = next((k.value for k in node.keywords if k.arg == "default"), None)
            if longs:
                out[longs[0][2:]] = ast.literal_eval(dflt) if dflt is not None else None
    return out


def pfllib_worker(job: dict) -> int:
    import random
    import types

    import numpy as np
    import torch
    from torch import nn

    system = os.path.join(job["pfllib"], "system")
    sys.path.insert(0, system)
    os.makedirs(os.path.join(job["work"], "system"), exist_ok=True)
    os.chdir(os.path.join(job["work"], "system"))  # PFLlib reads ../dataset/<name>, writes ../results
    from flcore.trainmodel.models import BaseHeadSplit

    _, _, module, cls, extra = ALGOS[job["algo"]]
    server_cls = getattr(__import__(f"flcore.servers.{module}", fromlist=[cls]), cls)
    a = types.SimpleNamespace(**main_py_defaults(job["pfllib"]))
    side = SETTINGS[job.get("setting", SETTING)]
    clients = len(os.listdir(os.path.join(job["work"], "dataset", side["dataset"], "train")))
    a.device, a.dataset, a.num_classes, a.num_clients = job["device"], side["dataset"], side["classes"], clients
    a.join_ratio = side["per_round"] / clients
    a.local_learning_rate, a.batch_size, a.local_epochs = LR, job["batch_size"], 1
    a.global_rounds, a.eval_gap, a.times, a.algorithm = job["rounds"], job["eval_every"], 1, cls
    a.model_str = "fedrun_mlp" if side["model"] == "mlp" else "ResNet18"
    for k, v in extra.items():
        setattr(a, k, v)
    torch.set_num_threads(1)  # as fedrun's side (threads=1): one core each, the same for both
    torch.manual_seed(job["seed"])
    np.random.seed(job["seed"])
    random.seed(job["seed"])
    if side["model"] == "mlp":
        head = nn.Linear(100, 10)
        a.model = BaseHeadSplit(nn.Sequential(nn.Flatten(), nn.Linear(784, 100), nn.ReLU()), head)
    else:  # PFLlib main.py's ResNet18, split into base and head as its main.py splits every model
        import torchvision

        base = torchvision.models.resnet18(weights=None, num_classes=side["classes"])
        head, base.fc = base.fc, nn.Identity()
        a.model = BaseHeadSplit(base, head)
    a.head = head
    with open(job["log"], "w", buffering=1) as log, contextlib.redirect_stdout(log):
        t0 = time.time()
        server = server_cls(a, 0)
        setup = time.time() - t0
        c0 = time.process_time()
        server.train()
        cpu = time.process_time() - c0  # the process's CPU seconds of train(): its rounds, evaluations and end
    acc = list(server.rs_test_acc)
    if job["algo"] == "ditto":  # each evaluation appends the global models' accuracy, then the personal ones'
        acc = acc[1::2]
    evals = list(range(0, job["rounds"] + 1, job["eval_every"]))
    if job["algo"] in EVAL_AFTER_TRAINING:
        evals = [e + 1 for e in evals]
    budget = list(server.Budget)
    plain = [b for i, b in enumerate(budget) if i % job["eval_every"]]
    print(json.dumps({"seed": job["seed"], "rounds": evals[: len(acc)], "acc": acc, "budget": budget,
                      "setup": setup, "cpu_per_round": cpu / len(budget) if budget else None,
                      "per_round": sum(budget) / len(budget) if budget else None,
                      "per_round_no_eval": sum(plain) / len(plain) if plain else None}))
    return 0


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------

def _ms(v: list[float]) -> str:
    m = sum(v) / len(v)
    if len(v) < 2:
        return f"{m:.2f}"
    return f"{m:.2f} ± {math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)):.2f}"


def write_table(out: str, results: dict) -> None:
    meta = results["meta"]
    lines = [f"fedrun vs PFLlib (commit {meta['pfllib_commit']}), {meta['setting']}: personalized test accuracy % "
             f"(pooled over clients' test rows) at round {meta['rounds']} (last) and at the best of the rounds "
             f"evaluated every {meta['eval_every']}; mean ± std over runs (seeds in brackets). "
             f"Seconds per round: wall time with that evaluation schedule, same machine "
             f"(device {meta.get('device', 'cpu')}), "
             + ("one after the other." if meta.get("jobs", 1) == 1 else
                f"{meta['jobs']} runs at once (the s/round columns were taken under that contention)."), "",
             "| algo | scored | fedrun last | fedrun best | PFLlib last | PFLlib best | last gap (fedrun - PFLlib) "
             "| fedrun s/round | PFLlib s/round | PFLlib s/round, rounds without evaluation | PFLlib / fedrun |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in ALGOS:
        if a not in results:
            continue
        f, p = results[a]["fedrun"], results[a]["pfllib"]
        fl = [100 * r["acc"][-1] for r in f["runs"]]
        fb = [100 * max(r["acc"]) for r in f["runs"]]
        pl = [100 * r["acc"][-1] for r in p]
        pb = [100 * max(r["acc"][1:]) for r in p]  # round 0 (the initial model) left out, as fedrun has none
        fs = sum(r["seconds"] for r in f["runs"]) / len(f["runs"]) / meta["rounds"]
        pr = [r["per_round"] for r in p if r["per_round"] is not None]  # (PFLlib's FedPHP keeps no Budget)
        ps = sum(pr) / len(pr) if pr else None
        pn = [r["per_round_no_eval"] for r in p if r["per_round_no_eval"] is not None]
        pn = f"{sum(pn) / len(pn):.2f}" if pn else "n/a"
        gap = sum(fl) / len(fl) - sum(pl) / len(pl)
        lines.append(f"| {a} | {f['metric'].split('_')[0]} | {_ms(fl)} ({len(fl)}) | {_ms(fb)} | "
                     f"{_ms(pl)} ({len(pl)}) | "
                     f"{_ms(pb)} | {gap:+.2f} | {fs:.2f} | {'n/a' if ps is None else f'{ps:.2f}'} | {pn} | "
                     f"{'n/a' if ps is None else f'{ps / fs:.1f}x'} |")
    masked = [a for a in ALGOS if "fedrun_masked" in results.get(a, {})]
    if masked:  # fedrun's epochs computed masked, as before sorting by work (the same numbers)
        lines += ["", "fedrun's epochs phases computed masked (every client stepped for the largest client's count, "
                  "the finished ones frozen; before simulate._epochs_by_work), the same sitting:", "",
                  "| algo | fedrun s/round | fedrun masked s/round | masked / fedrun | masked last | PFLlib / masked |",
                  "|---|---|---|---|---|---|"]
        for a in masked:
            f, fm, p = results[a]["fedrun"], results[a]["fedrun_masked"], results[a]["pfllib"]
            fs = sum(r["seconds"] for r in f["runs"]) / len(f["runs"]) / meta["rounds"]
            ms = sum(r["seconds"] for r in fm["runs"]) / len(fm["runs"]) / meta["rounds"]
            pr = [r["per_round"] for r in p if r["per_round"] is not None]
            pm = f"{sum(pr) / len(pr) / ms:.1f}x" if pr else "n/a"
            lines.append(f"| {a} | {fs:.2f} | {ms:.2f} | {ms / fs:.2f}x | "
                         f"{_ms([100 * r['acc'][-1] for r in fm['runs']])} | {pm} |")
    timed = [a for a in ALGOS if "cpu" in results.get(a, {}).get("fedrun", {})]
    if timed:  # CPU seconds: what each side computed, less moved by other processes on the cores than wall time
        lines += ["", "CPU seconds (user + system) per round, the same runs: fedrun's whole process (imports and setup "
                  "included) / (seeds x rounds); PFLlib's train() (its rounds, evaluations and end) / its rounds:", "",
                  "| algo | fedrun CPU s/round | PFLlib CPU s/round | PFLlib / fedrun | fedrun masked CPU s/round "
                  "| masked / fedrun |", "|---|---|---|---|---|---|"]
        for a in timed:
            f, p = results[a]["fedrun"], results[a]["pfllib"]
            fc = f["cpu"] / len(f["runs"]) / meta["rounds"]
            pc = [r["cpu_per_round"] for r in p if r.get("cpu_per_round") is not None]
            pc = sum(pc) / len(pc) if pc else None
            fm = results[a].get("fedrun_masked")
            mc = fm["cpu"] / len(fm["runs"]) / meta["rounds"] if fm and "cpu" in fm else None
            lines.append(f"| {a} | {fc:.2f} | {'n/a' if pc is None else f'{pc:.2f}'} | "
                         f"{'n/a' if pc is None else f'{pc / fc:.1f}x'} | {'n/a' if mc is None else f'{mc:.2f}'} | "
                         f"{'n/a' if mc is None else f'{mc / fc:.2f}x'} |")
    paired = [a for a in ALGOS if "pair" in results.get(a, {})]
    if paired:  # the fixed costs (imports, data and client set-up, the end) out of both sides the same way
        r1, r2 = meta["rounds_pair"]
        lines += ["", f"Seconds per round with the fixed costs out, the same way on both sides: each side run at "
                  f"R1 = {r1} and R2 = {r2} rounds (the same seeds, evaluation every {meta['eval_every']}), X = its "
                  f"whole processes' seconds per run as this script measures them (CPU: user + system, imports, data "
                  f"and client set-up included), (X(R2) - X(R1)) / (R2 - R1); fixed: X(R1) - R1 x that. PFLlib's "
                  f"loop trains one round more than it is given in both runs, so its extra round is in the fixed "
                  f"part:", "",
                  "| algo | fedrun CPU s/round | PFLlib CPU s/round | **PFLlib / fedrun (CPU)** | fedrun fixed CPU s "
                  "| PFLlib fixed CPU s | fedrun wall s/round | PFLlib wall s/round | PFLlib / fedrun (wall) "
                  "| fedrun masked CPU s/round | masked / fedrun (CPU) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        na = "n/a"
        for a in paired:
            pr = results[a]["pair"]
            (fc, ff), (pc, pf) = per_round(pr["fedrun"]), per_round(pr["pfllib"])
            fw, pw = per_round(pr["fedrun"], "wall")[0], per_round(pr["pfllib"], "wall")[0]
            mc = per_round(pr["fedrun_masked"])[0] if "fedrun_masked" in pr else None
            lines.append(f"| {a} | {fc:.2f} | {pc:.2f} | **{pc / fc:.1f}x** | {ff:.2f} | {pf:.2f} | {fw:.2f} | "
                         f"{pw:.2f} | {pw / fw:.1f}x | {na if mc is None else f'{mc:.2f}'} | "
                         f"{na if mc is None else f'{mc / fc:.2f}x'} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "side_by_side.md.tmp"), "w") as fh:
        fh.write(text)
    os.replace(os.path.join(out, "side_by_side.md.tmp"), os.path.join(out, "side_by_side.md"))
    print(text)


def write_atomic_json(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def git_commit(repo: str) -> str:
    r = subprocess.run(["git", "-C", repo, "rev-parse", "--show-toplevel", "--short", "HEAD"],
                       capture_output=True, text=True)
    top, _, commit = r.stdout.strip().partition("\n")
    if r.returncode == 0 and os.path.realpath(top) == os.path.realpath(repo):  # its own repository, not one around it
        return commit
    note = os.path.join(repo, "COMMIT")  # a copy of system/ without its .git (e.g. carried to another machine)
    return open(note).read().strip() if os.path.exists(note) else "unknown"


if __name__ == "__main__":
    sys.exit(main())
