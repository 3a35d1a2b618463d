"""The authors' paper-004 code (alpemreacar/PFL) at full size on real CIFAR, on fedrun's split and
fedrun's initial weights: the end-to-end check beside the golden traces (record_pfl.py).

    python scripts/golden/run_pfl_authors.py --authors /path/to/PFL/work/tree --method pfldyn_proto \
        --rounds 5 --seed 0 --data-root DIR [--out result.json]

What runs: THEIR train_* function for --method (record_pfl.METHODS, with the paper's 5 MAML
adaptation steps), unchanged and in float32, with the arguments of their cifar10_ACID.py (100
devices, act_prob 0.1, lr 0.1 decayed x0.997 per round, batch 50, K=50, weight decay 1e-3) and
fast_exec=True (their test-set evaluation only). Their selection is their own (np.random.seed(round
+ rand_seed), rand_seed = --seed; note that seed S's round r selects what seed S+1's round r-1
does), or with --clients fedrun the devices fedrun samples for --seed (their shuffle of the device
list still runs, then fedrun's devices are moved to its front); their minibatches, shuffles and
crop+flip augmentation draw from torch's global stream, seeded with --seed. What they get from fedrun:
  * the data: the devices' training and test images of fedrun's `data=cifar10_acid` (the preset's
    data settings, ACID 5 classes, data.seed 0), turned back into their [0, 1] layout (fedrun's
    normalized images times std plus mean, rounded to the uint8 pixel; checked exact), and their
    Normalize mean/std set to fedrun's per-channel training-set statistics / 255 (their own
    DatasetObject computes the same statistics from the same 50,000 images);
  * the initial weights: fedrun's CNN at torch.manual_seed(--seed), as a run with seed=--seed starts.
Printed and written (--out): per round, their plotted number (tst_perf_all: the personalized
accuracy of the mean of ALL devices' latest models, averaged over devices) and the lowest / highest
device, the same for the average of the round's devices ("sel"), and the wall time. fedrun's
`protocol=official` scores the same model (algo.eval_model=clients_mean): compare with
`python scripts/pfl_cifar.py --methods <method> --rounds N --seeds ... --protocol official` on
the same data (pfl_cifar.py's name for pavg_maml is perfedavg_maml).
Their stdout (a line per device and step) goes to --log (default: discarded).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pfl_problem as P  # noqa: E402
import record_pfl as R  # noqa: E402

# their cifar10_ACID.py
ACT_PROB, LR, LR_DECAY, BATCH, K, WEIGHT_DECAY = 0.1, 0.1, 0.997, 50, 50, 1e-3
PRESET = {"pavg_maml": "perfedavg_maml"}  # record_pfl's method name -> fedrun's preset, where they differ
EVAL = {"maml": "get_all_results_maml", "proto": "get_all_results_proto", "plain": "get_all_results_plain"}
# FedDyn / SCAFFOLD: their plain evaluation only (the global model, fedrun's number for them); their
# script also scores MAML- and Proto-adapted copies, which fedrun does not serve
PLAIN_ONLY = dict(meta_learning_rate_list=[], num_grad_step_list=[], do_proto=False, do_plain=True)


def fedrun_setup(method: str, seed: int, data_root: str):
    """fedrun's data (normalized, CPU) and initial CNN weights for `experiment=cifar10_acid5_<method>`."""
    from hydra import compose, initialize_config_dir

    from fedrun.config import CONF_DIR, instantiate_checked

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment=cifar10_acid5_{PRESET.get(method, method)}", f"seed={seed}",
                                           f"data.root={data_root}", "data.download=false", "device=cpu"])
    data = instantiate_checked(cfg.data)
    torch.manual_seed(seed)  # as fedrun.run.runner.Job.model
    model = instantiate_checked(cfg.model, in_features=data.in_features, num_classes=data.num_classes)
    return cfg, data, dict(model.named_parameters())


def their_layout(data, cfg):
    """Per device [0, 1] float32 images (uint8 / 255, as their ToTensor) and float labels [n, 1]; the
    channel mean / std in [0, 1] units."""
    from fedrun.data.datasets.cifar import channel_stats as _channel_stats
    from fedrun.data.datasets.cifar import load_cifar

    trx = load_cifar(cfg.data.root, 10, False)[0]
    mean, std = _channel_stats(trx)
    m32, s32 = mean.astype(np.float32)[:, None, None], std.astype(np.float32)[:, None, None]
    out = {}
    for split in ("train", "test"):
        s = getattr(data, split)
        x = s.x.numpy() * s32 + m32
        px = np.rint(x)
        err = float(np.abs(x - px).max())
        assert err < 1e-2 and px.min() >= 0 and px.max() <= 255, f"{split}: not uint8 pixels ({err})"
        x01 = px.astype(np.uint8).astype(np.float32) / np.float32(255)
        y = s.y.numpy().astype(np.float32).reshape(-1, 1)
        bounds = np.concatenate([[0], np.cumsum(s.sizes.numpy())])
        out[split] = ([x01[a:b] for a, b in zip(bounds[:-1], bounds[1:])],
                      [y[a:b] for a, b in zip(bounds[:-1], bounds[1:])])
    return out, mean / 255, std / 255


def fedrun_clients(cfg, data, seed: int, rounds: int) -> list[list[int]]:
    """The devices a fedrun run with `seed` samples in rounds 1..rounds."""
    from fedrun.run.spec import schedule
    from fedrun.simulate import sample_round

    sched = schedule(cfg, data.num_clients)
    return [sample_round(data, sched, 1, seed, r)[0].tolist() for r in range(1, rounds + 1)]


def selecting(shuffle, picks: list[list[int]], n_clients: int):
    """np.random.shuffle as their selection calls it (on arange(n_clients), once per round, then the
    first act_prob * n of the list train), but putting round r's `picks` first. Their own shuffle
    still runs first, so numpy's stream is what it would have been; any other array is left to it."""
    done = []

    def shuffle_(x):
        shuffle(x)
        if (isinstance(x, np.ndarray) and x.ndim == 1 and len(x) == n_clients
                and np.array_equal(np.sort(x), np.arange(n_clients))):
            if len(done) == len(picks):
                raise RuntimeError(f"their code selected devices more than the {len(picks)} rounds asked for")
            pick = picks[len(done)]
            done.append(pick)
            chosen = set(pick)
            x[:] = np.array(pick + [c for c in x.tolist() if c not in chosen])

    return shuffle_


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, help="work tree of alpemreacar/PFL (utils_methods.py ...)")
    ap.add_argument("--method", required=True, choices=list(R.METHODS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-root", required=True, help="folder holding cifar-10-batches-py")
    ap.add_argument("--clients", choices=["authors", "fedrun"], default="authors",
                    help="whose device selection: authors (theirs, np.random.seed(round + seed)) or fedrun (the "
                         "devices "
                         "fedrun samples for --seed each round, so both codes train the same devices)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--log", default=os.devnull, help="file for their stdout")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    data_root = os.path.abspath(a.data_root)
    authors = os.path.abspath(a.authors)
    out_path = os.path.abspath(a.out) if a.out else None
    log_path = os.path.abspath(a.log)

    cfg, data, params = fedrun_setup(a.method, a.seed, data_root)
    picks = fedrun_clients(cfg, data, a.seed, a.rounds) if a.clients == "fedrun" else None
    parts, mean, std = their_layout(data, cfg)
    del data

    sys.path.insert(0, authors)
    os.chdir(tempfile.mkdtemp(prefix="pfl_authors_"))  # their Model/<name>/... files go there
    import utils_dataset
    import utils_methods
    import utils_models

    utils_dataset.DatasetObject.mean, utils_dataset.DatasetObject.std = mean, std
    model_func = lambda: utils_models.client_model("cifar10")  # noqa: E731
    init = model_func()
    init.load_state_dict({theirs: params[ours].detach().clone() for ours, theirs in P.NAMES})
    (trx, try_), (tex, tey) = parts["train"], parts["test"]
    data_obj = type("FedrunSplit", (), dict(dataset="CIFAR10", name=f"fedrun_acid5_{a.method}_s{a.seed}",
                                            n_client=len(trx), clnt_x=trx, clnt_y=try_, tst_x=tex, tst_y=tey))()
    os.makedirs(f"Model/{data_obj.name}", exist_ok=True)
    fn_name, extra, _ = R.METHODS[a.method]
    extra = {**extra, **R.PAPER.get(a.method, {})}
    kind = "maml" if "maml" in fn_name.lower() else "proto" if "proto" in fn_name.lower() else "plain"
    if kind == "plain":
        extra.update(PLAIN_ONLY)

    times = []
    real = getattr(utils_methods, EVAL[kind])

    def timed(*args, **kw):  # wall time at each round's evaluation
        times.append(time.perf_counter() - t0)
        return real(*args, **kw)

    setattr(utils_methods, EVAL[kind], timed)
    if picks is not None:
        np.random.shuffle = selecting(np.random.shuffle, picks, len(trx))
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    t0 = time.perf_counter()
    with open(log_path, "w") as log, contextlib.redirect_stdout(log):
        res = getattr(utils_methods, fn_name)(
            data_obj=data_obj, act_prob=ACT_PROB, learning_rate=LR, batch_size=BATCH, K=K, com_amount=a.rounds,
            print_per=K // 4, weight_decay=WEIGHT_DECAY, model_func=model_func, init_model=init,
            save_period=a.rounds, lr_decay=LR_DECAY, rand_seed=a.seed, save_models=False, fast_exec=True, **extra)
    wall = time.perf_counter() - t0
    tst_sel, tst_all = res[2], res[5]  # [rounds, (loss, acc, max, min[, failures])]
    if kind == "plain":  # [cases, rounds, ...]: the one case, plain
        tst_sel, tst_all = tst_sel[0], tst_all[0]
    rows = []
    for i in range(a.rounds):
        sel, al = np.asarray(tst_sel[i]).reshape(-1), np.asarray(tst_all[i]).reshape(-1)
        rows.append({"round": i + 1, "all_acc": float(al[1]), "all_min": float(al[3]), "all_max": float(al[2]),
                     "all_loss": float(al[0]), "sel_acc": float(sel[1]), "sel_min": float(sel[3]),
                     "sel_max": float(sel[2])})
        print(f"round {i + 1}: all {100 * al[1]:.2f}% (devices {100 * al[3]:.0f}-{100 * al[2]:.0f}), "
              f"sel {100 * sel[1]:.2f}%", flush=True)
    print(f"{a.method} seed {a.seed}: {a.rounds} rounds in {wall:.0f} s")
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"method": a.method, "authors_function": fn_name, "arguments": extra, "seed": a.seed,
                       "clients": a.clients, "selected": picks,
                       "rounds": rows, "wall_s": wall, "eval_at_s": times, "torch": torch.__version__,
                       "threads": a.threads}, f, indent=1)


if __name__ == "__main__":
    main()
