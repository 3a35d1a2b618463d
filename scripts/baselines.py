#!/usr/bin/env python
"""The personalized-FL baseline table: every baseline fedrun has, one setting, several seeds.

Runs each entry below through `fedrun -m` (seeds batched), then writes one table and one figure:
personalized test accuracy (pooled over all clients' test rows: total correct / total rows),
mean ± sample std over seeds, at the LAST round and at the BEST round, and the lowest-decile
client (the 10th percentile of the per-client accuracies at the last round, mean over seeds).
Entries that serve no personalized model (FedAvg) are scored with their global model. With held-out
clients (--data-overrides "partition.holdout=0.2") those columns are over the training clients, and
`new_*` columns give the same over the held-out (unseen) clients, each decile among its own clients.

Settings (`--setting NAME`; a name not listed stops with one line, exit 2):
  mnist_dir01      real MNIST, Dirichlet alpha=0.1 over 20 clients, all 20 per round, the MLP 784-100-10 (CPU)
  mnist_shards2    real MNIST, pathological: 2 label-sorted shards per client, 20 clients, the MLP (CPU)
  cifar10_dir01    real CIFAR-10, Dirichlet alpha=0.1, 20 clients, the CNN, batch 50 (GPU-sized)
  cifar10_shards2  real CIFAR-10, 2 shards per client, 20 clients, the CNN, batch 50 (GPU-sized)
  mnist_pfedme     pFedMe's MNIST split (20 clients, 2 labels each), 5 per round, the MLP 784-100-10
  cifar10_acid     paper 004's CIFAR-10 ACID (100 devices, 5 classes each), 10 per round, the CNN
  synthetic        pFedMe's Synthetic(0.5, 0.5), 100 clients, 10 per round, the DNN 60-20-10 (--quick's)
  cifar100_dir01_resnet18   real CIFAR-100, Dirichlet alpha=0.1, 100 clients, 10 per round, ResNet-18 (GroupNorm),
                            batch 50 (GPU)
  shakespeare_natural_lstm  LEAF's Shakespeare, one client per role, 10 per round, LEAF's LSTM, batch 10 (GPU)
  agnews_dir_textcnn        AG News, Dirichlet alpha=0.1, 20 clients, all per round, TextCNN, batch 50 (GPU)
The real-data settings are fedrun's `dataset=` x `partition=` groups (docs/data.md; every
client's rows split 75 / 25 train / test); --dataset.root is the folder holding MNIST/raw or
cifar-10-batches-py. --data-overrides adds fedrun options (e.g. "partition.num_clients=50"); a model=,
dataset=, partition= or data= there replaces the setting's, whose options of that group stay only where
the new choice takes them (docs/baselines.md "Another model, dataset or partition").

    python scripts/baselines.py --setting mnist_dir01 --dataset.root /work/shared/data --eval-every 5
    python scripts/baselines.py --setting mnist_shards2 --dataset.root /work/shared/data --seeds 0,1,2
    python scripts/baselines.py --quick              # 2 rounds of 2 steps, 6 small synthetic clients, seed 0
    python scripts/baselines.py --setting mnist_dir01 --dataset.root /work/shared/data --quick \
        --data-overrides "model=fedavg_cnn"      # another model (or dataset=, partition=) for the setting's
    python scripts/baselines.py --replot outputs/papers/baselines/<run>   # table and figure only
    python scripts/baselines.py --setting cifar100_dir01_resnet18 --dataset.root <root> --eval-every 10 \
        --device cuda --plan         # each entry's s/round, timed here, and the table's projected time; no training

--plan times every entry (one warm-up round, then --plan-rounds rounds, each evaluated, one seed) in this
process on the setting's data and --device, set up as fedrun's round loop sets it up, and prints per entry
its s/round, s/evaluation and rounds x seeds x s/round + evaluations x seeds x s/evaluation, then the sum
with the device's name. A run without --quick prints the same plan before it trains (--no-plan: not);
entries fedrun refuses are listed with their one line and left out of the training.

Writes baselines.csv, baselines.md and baselines.png into the output folder it prints.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paper  # noqa: E402

from fedrun.config import FIGURE_FORMATS  # noqa: E402

NAME = "baselines"
LR = 0.05  # one local lr for every entry (no per-method tuning: see docs/baselines.md)
# entry -> (algo, its options, metric prefix scored). algo.lr is every algorithm's local lr (FedAvg's
# beta, pFedMe's eta, ...).
ENTRIES = {
    "Local": ("local", [f"algo.lr={LR}"], "pers"),
    "FedAvg": ("fedavg", [f"algo.lr={LR}", "algo.alpha=null"], "global"),
    "FedAvg+FT": ("fedavg", [f"algo.lr={LR}", f"algo.alpha={LR}", "algo.finetune_steps=5"], "pers"),
    "FedProx+FT": ("fedprox", [f"algo.lr={LR}", "algo.mu=0.01", f"algo.alpha={LR}", "algo.finetune_steps=5"], "pers"),
    "Per-FedAvg": ("perfedavg", [f"algo.alpha={LR}", f"algo.lr={LR}"], "pers"),
    "pFedMe": ("pfedme", ["algo.lam=15", f"algo.lr={LR}", f"algo.personal_lr={LR}"], "pers"),
    "Ditto": ("ditto", [f"algo.lr={LR}", f"algo.personal_lr={LR}", "algo.lam=0.1"], "pers"),
    "APFL": ("apfl", [f"algo.lr={LR}", f"algo.alpha_lr={LR}"], "pers"),
    "FedPer": ("fedper", [f"algo.lr={LR}"], "pers"),
    "LG-FedAvg": ("lgfedavg", [f"algo.lr={LR}"], "pers"),
    "FedRep": ("fedrep", [f"algo.lr={LR}", "algo.head_steps=5"], "pers"),
    "FedBABU": ("fedbabu", [f"algo.lr={LR}", f"algo.alpha={LR}", "algo.finetune_steps=5"], "pers"),
    # the representation methods (issue 36): MOON is a global method (its global model scored)
    "MOON": ("moon", [f"algo.lr={LR}", "algo.mu=1.0", "algo.temperature=0.5"], "global"),
    "FedRoD": ("fedrod", [f"algo.lr={LR}"], "pers"),
    "FedProto": ("fedproto", [f"algo.lr={LR}", "algo.lam=1.0"], "pers"),
    "FedDBE": ("feddbe", [f"algo.lr={LR}", "algo.momentum=0.1", "algo.kappa=1.0"], "pers"),
    # FedPAC, GPFL, FedCP: the table's tau steps like every entry (their local_epochs form is PFLlib's, used beside it:
    # scripts/pfllib_side_by_side.py); FedPAC's head_steps are its yaml's 5 of the 10
    "FedPAC": ("fedpac", [f"algo.lr={LR}"], "pers"),
    "GPFL": ("gpfl", [f"algo.lr={LR}"], "pers"),
    "FedCP": ("fedcp", [f"algo.lr={LR}"], "pers"),
}
# issue 36, the model-mixing methods (their defaults otherwise: conf/algo/<name>.yaml)
ENTRIES["FedAMP"] = ("fedamp", [f"algo.lr={LR}"], "pers")
ENTRIES["FedPHP"] = ("fedphp", [f"algo.lr={LR}"], "pers")
# its ALA a pass over the rows, as PFLlib
ENTRIES["FedALA"] = ("fedala", [f"algo.lr={LR}", "algo.ala_steps=null"], "pers")
ENTRIES["APPLE"] = ("apple", [f"algo.lr={LR}"], "pers")  # dr_lr, mu: the yaml's (PFLlib's 0 turns p_i's learning off)
ENTRIES["FedFomo"] = ("fedfomo", [f"algo.lr={LR}"], "pers")
# FedBN (algo=fedbn: BatchNorm kept local) has no entry: it needs a model with BatchNorm (model=mlp_bn or
# cnn_bn), and these settings' models have none (fedrun refuses the pair in one line).
MNIST_MLP = ["dataset=mnist", "model=dnn", "model.hidden=[100]"]  # 784-100-10 ReLU (pFedMe's DNN; PFLlib's DNN)
CIFAR_CNN = ["dataset=cifar10", "model=cnn"]
DIR01 = ["partition=dirichlet", "partition.alpha=0.1", "partition.num_clients=20"]
SHARDS2 = ["partition=shards", "partition.shards_per_client=2", "partition.num_clients=20"]
# name -> data options, rounds, run options, the group whose `.download` it sets (None: generated data, no files);
# where the files are is dataset.root on every route (for a data= preset fedrun gives it as data.root)
SETTINGS = {
    "mnist_dir01": dict(data=MNIST_MLP + DIR01, rounds=100, run=["tau=10", "batch_size=20", "clients_per_round=20"],
                        root="dataset"),
    "mnist_shards2": dict(data=MNIST_MLP + SHARDS2, rounds=100, run=["tau=10", "batch_size=20", "clients_per_round=20"],
                          root="dataset"),
    "cifar10_dir01": dict(data=CIFAR_CNN + DIR01, rounds=500, run=["tau=10", "batch_size=50", "clients_per_round=20"],
                          root="dataset"),
    "cifar10_shards2": dict(data=CIFAR_CNN + SHARDS2, rounds=500,
                            run=["tau=10", "batch_size=50", "clients_per_round=20"],
                            root="dataset"),
    "mnist_pfedme": dict(data=["data=mnist_pfedme", "model=dnn", "model.hidden=[100]"], rounds=200,
                         run=["tau=10", "batch_size=20", "clients_per_round=5"], root="data"),
    "cifar10_acid": dict(data=["data=cifar10_acid", "model=cnn"], rounds=500,
                         run=["tau=10", "batch_size=50", "clients_per_round=10"], root="data"),
    "synthetic": dict(data=["data=synthetic", "model=dnn"], rounds=200,
                      run=["tau=10", "batch_size=20", "clients_per_round=10"],
                      root=None),
}
# Today's PFL settings (issue 35): ResNet-18 on CIFAR-100, LEAF's character LSTM on Shakespeare's roles, TextCNN
# on AG News. ResNet-18 with GroupNorm (Hsieh et al. 2020): BatchNorm refuses the fine-tuning entries' test-time step.
SETTINGS.update({
    "cifar100_dir01_resnet18": dict(data=["dataset=cifar100", "model=resnet18", "model.norm=gn", "partition=dirichlet",
                                          "partition.alpha=0.1", "partition.num_clients=100"], rounds=500,
                                    run=["tau=10", "batch_size=50", "clients_per_round=10"], root="dataset"),
    "shakespeare_natural_lstm": dict(data=["dataset=shakespeare", "partition=natural", "model=lstm"], rounds=200,
                                     run=["tau=10", "batch_size=10", "clients_per_round=10"], root="dataset"),
    "agnews_dir_textcnn": dict(data=["dataset=agnews", "model=textcnn", "partition=dirichlet", "partition.alpha=0.1",
                                     "partition.num_clients=20"], rounds=200,
                               run=["tau=10", "batch_size=50", "clients_per_round=20"], root="dataset"),
})
QUICK = dict(data=["data.num_clients=6", "data.size_factor=1", "data.seed=9"], run=["tau=2", "clients_per_round=4"],
             rounds=2,
             # tau=2: FedRep's and FedPAC's head_steps=5 would train the head alone (fedrun refuses head_steps >= tau);
             # one head step leaves the body the other
             entries={"FedRep": ["algo.head_steps=1"], "FedPAC": ["algo.head_steps=1"]})


def _setting_options(args) -> tuple[list[str], list[str], int]:
    """The setting's data and model options (with --data-overrides), its run options and its rounds."""
    s = SETTINGS[args.setting]
    data = list(s["data"])
    if s["root"]:
        data += [f"dataset.root={os.path.abspath(args.data_root)}",  # (a data= preset's data.root: fedrun maps it)
                 f"{s['root']}.download={'false' if args.no_download else 'true'}"]
    if args.quick and args.setting == "synthetic":
        data += QUICK["data"]
    own = args.data_overrides.split() if args.data_overrides else []
    data = fitted(data, own, os.path.abspath(args.data_root), args.no_download) + own
    rounds = args.rounds or (QUICK["rounds"] if args.quick else s["rounds"])
    return data, s["run"] + (QUICK["run"] if args.quick else []), rounds


def _entry_options(args, e: str) -> list[str]:
    """algo= and the entry's own options (--quick's replacing the entry's value of the same option)."""
    algo, opts, _ = ENTRIES[e]
    if args.quick:
        quick = QUICK["entries"].get(e, [])
        opts = [o for o in opts if o.split("=")[0] not in {q.split("=")[0] for q in quick}] + quick
    return [f"algo={algo}", *opts]


def train(args, out: str, entries: list[str], seeds: list[int]) -> None:
    data, run, rounds = _setting_options(args)
    for e in entries:
        secs = _paper.run_sweep(args, os.path.join(out, "runs", _slug(e)), [
            *_entry_options(args, e), *data, *run, f"rounds={rounds}", f"seed={','.join(map(str, seeds))}",
            f"device={args.device}", "on_diverge=record"], _paper.HIDDEN_IN_NAMES + ["algo.*", "model.hidden"])
        print(f"{e}: training took {secs:.0f}s")


PLAN_WARMUP = 1  # rounds run before the timed ones (one-time costs: the first kernels, caches, allocations)


def _one_line(err: BaseException) -> str:
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def _device_name(device, threads: int | None) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"CPU{f' {model}' if model else ''}, {threads or torch.get_num_threads()} torch threads"


def _compose_entries(args, entries: list[str], seed: int):
    """(entry, its config as fedrun composes it for seed `seed`, or the one line why composing it failed)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from fedrun.config import CONF_DIR, with_dataset_root, with_env_searchpath

    data, run, rounds = _setting_options(args)
    every = [f"eval_every={args.eval_every}"] if args.eval_every else []
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for e in entries:
            argv = [*_entry_options(args, e), *data, *run, f"rounds={rounds}", f"seed={seed}", f"device={args.device}",
                    "on_diverge=record", *every, "progress=false", "plot=false"]
            try:
                yield e, compose("config", overrides=with_env_searchpath(with_dataset_root(argv))), None
            except HydraException as err:
                yield e, None, _one_line(err)


def refusals(args, entries: list[str], seeds: list[int]) -> dict[str, str]:
    """{entry: the one line fedrun refuses it with} from its options alone (fedrun.run.checks.job_problems,
    no data loaded): what a run without the plan leaves out."""
    from fedrun.run.checks import job_problems

    out = {}
    for e, cfg, why in _compose_entries(args, entries, seeds[0]):
        why = why or "; ".join(job_problems(cfg))
        if why:
            out[e] = why
            print(f"refused {e}: {why}")
    return out


def _time_entry(spec, timed: int) -> tuple[float, float]:
    """Seconds per training round and per evaluation of `spec`'s run, set up as fedrun's round loop sets it
    up (fedrun.run.runner._train: engine, compile=/precision=, memory plan), the means over `timed` rounds
    after PLAN_WARMUP, each round evaluated (one seed)."""
    import dataclasses

    import torch

    from fedrun.clock import RoundClock
    from fedrun.engine import ENGINES, params_of
    from fedrun.run.acceleration import LocalSteps
    from fedrun.run.memory import budget_bytes
    from fedrun.run.memory import plan as plan_memory
    from fedrun.simulate import Replica, simulate_group

    dev = spec.device
    if dev.device.type == "cpu" and dev.threads is not None:
        torch.set_num_threads(dev.threads)
    data, model = spec.data.to(dev.device), spec.model.to(dev.device)
    torch.manual_seed(spec.seed)
    torch.set_rng_state(spec.rng)
    engine = ENGINES[dev.engine](model, max_chunks=dev.max_chunks)
    steps = LocalSteps(dev.compile, dev.precision)
    budget = budget_bytes(dev.memory, dev.device)
    fitted = None if budget is None else plan_memory(
        spec.algo, engine, data, spec.schedule, params_of(model), spec.seed, budget, 1, steps, dev.client_chunk,
        f"model={spec.model_name}", dev.memory)
    sched = dataclasses.replace(spec.schedule, rounds=PLAN_WARMUP + timed, eval_every=1)
    clock = RoundClock(sched.rounds, 1, told=True)  # (told: no estimate line of its own)
    run = Replica(spec.seed, params_of(model))
    simulate_group(spec.algo, engine, data, [run], sched, client_chunk=dev.client_chunk, steps=steps,
                   start_chunk=None if fitted is None else fitted.clients, clock=clock)
    if run.error is not None:
        raise run.error
    train, evals = clock.train[PLAN_WARMUP:], clock.evals[PLAN_WARMUP:]
    return sum(train) / len(train), sum(evals) / len(evals)


def plan(args, entries: list[str], seeds: list[int]) -> dict[str, str]:
    """Prints, per entry, its measured seconds per round and per evaluation (`--plan-rounds` rounds timed in
    this process after PLAN_WARMUP, on the setting's data and device) and the projection rounds x seeds x
    s/round + evaluations x seeds x s/evaluation, then the whole table's; returns {entry: why refused}."""
    import torch

    from fedrun.clock import RoundClock, hms
    from fedrun.errors import ConfigError, DataMissingError
    from fedrun.run.spec import RunSpec

    _, _, rounds = _setting_options(args)
    timed, n = args.plan_rounds, len(seeds)
    every = args.eval_every or 1
    evals = RoundClock(rounds, every).evaluations_after(0)
    threads, t0 = torch.get_num_threads(), time.time()
    cache, refused, total, device = {}, {}, 0.0, None
    try:
        for e, cfg, why in _compose_entries(args, entries, seeds[0]):
            if why is None:
                try:
                    spec = RunSpec.from_config(cfg, cache)
                except (ConfigError, DataMissingError) as err:
                    if isinstance(err, DataMissingError) or isinstance(err.__cause__, DataMissingError):
                        # (fedrun.config.instantiate_checked gives it as a ConfigError): every entry's, so one line
                        _paper.fail(f"--plan: {_one_line(err.__cause__ or err)}")
                    why = _one_line(err)
            if why is not None:
                refused[e] = why
                print(f"plan {e}: refused: {why}", flush=True)
                continue
            if device is None:
                device = spec.device.device
                name = _device_name(device, spec.device.threads)
                print(f"plan: --setting {args.setting}, {rounds} rounds x {n} seed{'s' * (n > 1)} per entry, "
                      f"evaluated every {every} round{'s' * (every > 1)} ({evals} evaluations a seed), on {device} "
                      f"({name}). A projection from {timed} timed round{'s' * (timed > 1)} per entry "
                      f"(after {PLAN_WARMUP} warm-up), each evaluated, one seed, in this process: seeds counted one "
                      f"after another (the batched launcher trains them together)", flush=True)
            s_round, s_eval = _time_entry(spec, timed)
            proj = n * (rounds * s_round + evals * s_eval)
            total += proj
            print(f"plan {e}: {s_round:.4f} s/round, {s_eval:.4f} s/evaluation; projected {rounds} rounds x {n} seeds "
                  f"x {s_round:.4f} + {evals} evaluations x {n} seeds x {s_eval:.4f} = {proj:.1f} s ({hms(proj)})",
                  flush=True)
            del spec
    finally:
        torch.set_num_threads(threads)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # (the training runs are other processes)
    done = len(entries) - len(refused)
    where = f"on {device} ({name})" if device is not None else "(no entry timed)"
    print(f"plan total: {total:.1f} s ({hms(total)}) projected for {done} entries x {n} seeds {where}, from {timed} "
          f"timed round{'s' * (timed > 1)} each; {len(refused)} refused; the plan took {time.time() - t0:.0f} s",
          flush=True)
    return refused


# the config groups of the data and the model: a setting's choice of one gives way to --data-overrides'
DATA_GROUPS = ("data", "dataset", "partition", "model")


def _key(opt: str) -> str:
    return opt.partition("=")[0].lstrip("+~")


def _options(group: str, name: str, roots: list[str]) -> set[str] | None:
    """The options conf/<group>/<name>.yaml takes, with those of the same group's files its defaults
    list names (a partition's _split); None when no config folder has it (fedrun then names it)."""
    from fedrun.config import group_file, load_conf

    try:
        conf = load_conf(group_file(group, name, roots))
    except FileNotFoundError:
        return None
    keys = {str(k) for k in conf if k != "defaults"}
    for d in conf.get("defaults", []):
        if isinstance(d, str) and d != "_self_":
            keys |= _options(group, d, roots) or set()
    return keys


def fitted(setting: list[str], own: list[str], root: str, no_download: bool) -> list[str]:
    """The setting's data and model options that still apply once `own` (--data-overrides) is
    added: a group `own` chooses (model=, dataset=, partition=, data=) replaces the setting's choice,
    and the setting's options of a group are kept only where its final choice takes them (model.hidden
    for an MLP, not for model=fedavg_cnn; partition.alpha for dirichlet, not for shards); a dataset=
    or partition= of `own` replaces a data= preset. Where the final data reads files, the script's
    --dataset.root and --no-download go with it."""
    from fedrun.config import CONF_DIR, load_conf, search_roots

    roots = search_roots(own)
    top = load_conf(os.path.join(CONF_DIR, "config.yaml"))
    choice = {g: None for g in DATA_GROUPS}
    for d in top.defaults:
        if not isinstance(d, str):
            for g, v in d.items():
                if g in choice:
                    choice[g] = v
    mine = {_key(o): o.partition("=")[2] for o in own if _key(o) in DATA_GROUPS}
    composed = "dataset" in mine or "partition" in mine
    for o in setting:
        if _key(o) in DATA_GROUPS and _key(o) not in mine and not (composed and _key(o) == "data"):
            choice[_key(o)] = o.partition("=")[2]
    choice.update(mine)
    if composed or choice["dataset"] is not None or choice["partition"] is not None:
        if "data" not in mine:
            choice["data"] = "composed"
    kept = []
    for o in setting:
        group, _, option = _key(o).partition(".")
        if group not in choice:
            kept.append(o)  # not a data or model option
        elif not option:
            if choice[group] == o.partition("=")[2]:
                kept.append(o)
        elif choice[group] is not None:
            takes = _options(group, str(choice[group]).split(",")[0], roots)
            if takes is None or option.split(".")[0] in takes:
                kept.append(o)
    # the files' folder: dataset.root on every route (fedrun gives a data= preset's as data.root)
    files = (choice["dataset"] is not None and "root" in (_options("dataset", str(choice["dataset"]), roots) or ())) \
        or (choice["dataset"] is None and "root" in (_options("data", str(choice["data"]), roots) or ()))
    kept = [o for o in kept if _key(o) not in ("dataset.root", "dataset.download", "data.download")]
    if files and not any(_key(o) in ("dataset.root", "data.root") for o in own):
        kept.append(f"dataset.root={root}")
    if files:
        kept.append(f"{'dataset' if choice['dataset'] is not None else 'data'}.download="
                    f"{'false' if no_download else 'true'}")
    return kept


def _slug(entry: str) -> str:
    return entry.lower().replace("+", "_").replace("-", "")


def _runs(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, d) for d in os.listdir(folder)
                  if os.path.exists(os.path.join(folder, d, "metrics.csv")))


def _mean(v: list[float]) -> float:
    return sum(v) / len(v) if v else math.nan


def table(out: str, plot_format: str = "png") -> list[dict]:
    import pandas as pd

    from fedrun.outputs import write_atomic, write_csv

    rows, curves = [], {}
    for e, (algo, _, prefix) in ENTRIES.items():
        runs = _runs(os.path.join(out, "runs", _slug(e)))
        col = f"{prefix}_acc"
        last, best, low, used, new_last, new_low = [], [], [], [], [], []
        for r in runs:
            if not os.path.exists(os.path.join(r, "clients.csv")):  # written at the end: the run did not finish
                print(f"warning: left out {r}: unfinished (no clients.csv)")
                continue
            m = pd.read_csv(os.path.join(r, "metrics.csv"))
            if col not in m or not len(m):
                print(f"warning: left out {r}: no {col} column")
                continue
            last.append(100 * float(m[col].iloc[-1]))
            best.append(100 * float(m[col].max()))
            clients = pd.read_csv(os.path.join(r, "clients.csv"))
            held = clients["heldout"] == 1 if "heldout" in clients else pd.Series(False, index=clients.index)
            low.append(100 * float(clients.loc[~held, col].quantile(0.1)))  # training clients only
            if held.any() and f"new_{col}" in m:  # held-out clients, among themselves
                new_last.append(100 * float(m[f"new_{col}"].iloc[-1]))
                new_low.append(100 * float(clients.loc[held, col].quantile(0.1)))
            used.append(m[["round", col]])
        if not used:
            continue
        curves[e] = pd.concat(used).groupby("round")[col].mean()
        rows.append({"entry": e, "algo": algo, "scored": prefix, "seeds": len(used),
                     "rounds": int(used[0]["round"].iloc[-1]), "last": _mean(last), "last_std": _paper.sample_std(last),
                     "best": _mean(best), "best_std": _paper.sample_std(best), "lowest_decile": _mean(low),
                     "new_last": _mean(new_last), "new_last_std": _paper.sample_std(new_last),
                     "new_lowest_decile": _mean(new_low)})
    write_csv(os.path.join(out, "baselines.csv"), rows)
    new = any(not math.isnan(r["new_last"]) for r in rows)  # held-out clients in these runs
    lines = ["Personalized test accuracy % (pooled over all clients' test rows; mean ± std over seeds). "
             "Lowest decile: the 10th percentile of the clients' accuracies at the last round (mean over seeds)."
             + (" Held-out (unseen) clients apart: *new* columns, their decile among themselves; the others over "
                "the training clients." if new else ""), "",
             "| method | fedrun algo | model scored | last round | best round | lowest decile | "
             + ("new: last round | new: lowest decile | " if new else "") + "seeds | rounds |",
             "|---|---|---|---|---|---|" + ("---|---|" if new else "") + "---|---|"]
    for r in rows:
        cells = (f"{_paper.mean_pm_std(r['new_last'], r['new_last_std'])} | {r['new_lowest_decile']:.2f} | "
                 if new else "")
        lines.append(f"| {r['entry']} | {r['algo']} | {r['scored']} | {_paper.mean_pm_std(r['last'], r['last_std'])} | "
                     f"{_paper.mean_pm_std(r['best'], r['best_std'])} | {r['lowest_decile']:.2f} | {cells}"
                     f"{r['seeds']} | {r['rounds']} |")
    text = "\n".join(lines) + "\n"
    write_atomic(os.path.join(out, "baselines.md"), text)
    print(text)
    if curves:  # fedrun's palette (no two methods share colour and marker), the y-axis fitted to the curves
        from fedrun.plots import plot_curve_panels

        panel = {e: pd.DataFrame({"round": c.index, "mean": 100 * c.values,
                                  "std": math.nan}) for e, c in curves.items()}
        plot_curve_panels([("personalized test accuracy", panel)], os.path.join(out, f"baselines.{plot_format}"),
                          ylabel="personalized test accuracy % (mean over seeds)", fit_y=True, legend_title="method")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _paper.common_options(ap, NAME, holds="the setting's files (MNIST/raw, cifar-10-batches-py)",
                          data="the setting's dataset")
    ap.add_argument("--setting", default="synthetic", metavar="NAME",
                    help=f"one of {', '.join(SETTINGS)} (default: synthetic)")
    ap.add_argument("--entries", default=",".join(ENTRIES), help=f"comma-separated, from {', '.join(ENTRIES)}")
    ap.add_argument("--data-overrides", default="", help="extra fedrun options for the data (e.g. a partition)")
    ap.add_argument("--plot-format", default="png", choices=FIGURE_FORMATS,
                    help="the figure's file type (default: png)")
    ap.add_argument("--plan", action="store_true",
                    help="time each entry's rounds here (--plan-rounds after a warm-up round, on the setting's data "
                         "and --device), print its s/round and the whole table's projected time, and exit without "
                         "training; a run without --quick or --no-plan prints the same plan before it trains")
    ap.add_argument("--plan-rounds", type=int, default=2, metavar="N",
                    help="rounds the plan times per entry, after one warm-up round (default: 2)")
    ap.add_argument("--no-plan", action="store_true",
                    help="train without timing the entries first (refused entries are still left out, in one line)")
    args = ap.parse_args(argv)
    if args.setting not in SETTINGS:
        print(f"error: --setting {args.setting!r} is not a setting; choose one of {', '.join(SETTINGS)}",
              file=sys.stderr)
        return 2
    entries = [e for e in args.entries.split(",") if e]
    bad = [e for e in entries if e not in ENTRIES]
    if bad or not entries:
        print(f"error: --entries {','.join(bad) or '(empty)'} is not allowed; choose from {', '.join(ENTRIES)}",
              file=sys.stderr)
        return 2
    if args.plan_rounds < 1:
        print(f"error: --plan-rounds {args.plan_rounds} must be at least 1", file=sys.stderr)
        return 2
    if args.replot and (args.plan or args.no_plan):
        print("error: --plan and --no-plan time or check entries to train; --replot trains none", file=sys.stderr)
        return 2
    t0 = time.time()
    out = _paper.out_dir(args, NAME)
    if not args.replot:
        seeds = _paper.seeds_of(args) if args.seeds else ([0] if args.quick else [0, 1, 2])
        refused = {}
        if args.plan or not (args.quick or args.no_plan):
            refused = plan(args, entries, seeds)
            if args.plan:
                return 0
        elif not args.quick:
            refused = refusals(args, entries, seeds)
        _paper.make_out(out)
        print(f"outputs: {out}")
        train(args, out, [e for e in entries if e not in refused], seeds)
        for e, why in refused.items():
            print(f"not run, refused by fedrun: {e}: {why}")
    table(out, args.plot_format)
    print(f"outputs: {out} (baselines.md, baselines.csv, baselines.{args.plot_format}); {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
