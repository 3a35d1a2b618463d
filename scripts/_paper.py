"""Shared by the paper scripts: options, MNIST check and the largest fitting `a`, running `fedrun -m`."""
from __future__ import annotations

import argparse
import atexit
import math
import os
import subprocess
import sys
import time
from typing import NoReturn

from fedrun.config import neutral_options

# Options a paper script keeps out of job folder names (they are the same for every job of the script).
# The seed and the options that do not change the numbers first (fedrun.config.NEUTRAL_OPTIONS).
HIDDEN_IN_NAMES = neutral_options("seed") + ["algo", "data", "model", "data.n", "data.a", "batch_size", "rounds"]


def common_options(ap: argparse.ArgumentParser, name: str, holds: str = "MNIST/raw", data: str = "MNIST") -> None:
    """The options every paper script has; `holds` is what --dataset.root holds, `data` what --no-download
    refuses to fetch (the script's dataset). --dataset.root is passed on as fedrun's `dataset.root`
    (the one option for where data is; --data-root is its old name, still accepted)."""
    ap.add_argument("--quick", action="store_true", help="a few rounds only (smoke test); default: the paper's rounds")
    ap.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    ap.add_argument("--seeds", default=None, help="comma-separated run seeds (default: 0)")
    ap.add_argument("--dataset.root", "--data-root", dest="data_root", default=os.environ.get("FEDRUN_DATA", "data"),
                    metavar="DIR",
                    help=f"folder holding {holds}, fedrun's dataset.root (default: $FEDRUN_DATA or ./data)")
    ap.add_argument("--no-download", action="store_true",
                    help=f"fail instead of downloading {data} (via torchvision) when it is not in --dataset.root")
    ap.add_argument("--device", default="auto", help="fedrun device= (auto, cpu, cuda, cuda:N)")
    ap.add_argument("--eval-every", type=int, default=None, metavar="N",
                    help="evaluate every N rounds and after the last (default: every round); the best round is then "
                         "the best evaluated round")
    ap.add_argument("--launcher", default="batched", choices=("batched", "basic"),
                    help="hydra/launcher: batched (default) trains a setting's seeds as one computation, "
                         "basic one job after another; the numbers agree to float rounding "
                         "(tests/test_batched.py: 2e-6)")
    ap.add_argument("--out", default=None,
                    help=f"output folder (default: outputs/papers/{name}/<date>_<time>[_quick])")
    ap.add_argument("--replot", metavar="DIR", default=None,
                    help="train nothing: redraw the figure and table from the runs already in DIR (a previous --out)")


def fail(message: str) -> NoReturn:
    """Bad input (an option's value, missing data or configs): one line on stderr, exit status 2,
    as argparse's own errors and fedrun's; an output folder make_out made and nothing was written
    into is removed first."""
    discard_empty_outputs()
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


_MADE: list[str] = []  # folders make_out created, each before its parents


def make_out(out: str) -> str:
    """Creates the output folder (and its missing parents). If the script stops on bad input
    (fail) or ends otherwise with it still empty, the folders this made are removed again, so a
    refused command leaves no empty folder under outputs/."""
    made, p = [], os.path.abspath(out)
    while not os.path.exists(p):
        made.append(p)
        p = os.path.dirname(p)
    os.makedirs(out, exist_ok=True)
    if made and not _MADE:
        atexit.register(discard_empty_outputs)
    _MADE.extend(made)
    return out


def discard_empty_outputs() -> None:
    while _MADE:
        try:
            os.rmdir(_MADE.pop(0))
        except OSError:  # not empty (the script wrote there), or gone: its parents stay too
            _MADE.clear()


def out_dir(args, name: str) -> str:
    if args.replot:
        return os.path.abspath(args.replot)
    if args.out:
        return os.path.abspath(args.out)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S") + ("_quick" if args.quick else "")
    return os.path.abspath(os.path.join("outputs", "papers", name, stamp))


def seeds_of(args) -> list[int]:
    try:
        return [int(s) for s in (args.seeds or "0").split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds {args.seeds!r} must be comma-separated integers")


def mnist_labels(root: str, download: bool = True):
    """(train labels, test labels) of the MNIST in root/MNIST/raw (downloaded there if absent and
    `download`); exits with one line if it is not there."""
    from fedrun.data.datasets.idx import load_mnist
    from fedrun.errors import DataMissingError

    try:
        _, tr, _, te = load_mnist(root, download=download)
    except DataMissingError as e:
        fail(f"{e}")
    return tr, te


def describe_data(root: str, tr, te) -> None:
    full = "" if len(tr) == 60000 and len(te) == 10000 else " (NOT the full 60,000 / 10,000)"
    print(f"data: MNIST from {os.path.abspath(os.path.join(root, 'MNIST', 'raw'))}: {len(tr)} training and "
          f"{len(te)} test images{full}; split over users as in Per-FedAvg Sec. 5 (fedrun data=mnist_perfedavg)")


def fitting_a(tr, te, n: int, wanted: int) -> int:
    """The largest a <= wanted for which the training AND the test split fit (fedrun derives the test
    split's a from a, scaled by |test| / |train|, as fedrun.data.mnist_perfedavg does)."""
    from fedrun.data.partitioners.paper import max_fitting_a

    a = min(wanted, max_fitting_a(tr, n))
    test_fit = max_fitting_a(te, n)
    while a >= 2 and max(2, int(a * len(te) / len(tr)) // 2 * 2) > test_fit:
        a -= 1
    if a < 2:
        fail(f"the MNIST in use is too small for n={n} users (no a >= 2 fits)")
    if a != wanted:
        print(f"note: a={wanted} does not fit this MNIST with n={n} users; using a={a}, the largest that fits "
              f"(fedrun.data.partitioners.paper.max_fitting_a on the training and test labels)")
    return a


def run_sweep(args, sweep_dir: str, overrides: list[str], hidden: list[str] | None = None) -> float:
    """`fedrun -m <overrides>` into sweep_dir, with the common options' --launcher and --eval-every;
    returns its seconds. Exits if fedrun fails."""
    keys = hidden if hidden is not None else HIDDEN_IN_NAMES
    every = [f"eval_every={args.eval_every}"] if args.eval_every else []
    cmd = [sys.executable, "-m", "fedrun.cli", "-m", *overrides, *every, "progress=false", "plot=false",
           f"hydra/launcher={args.launcher}", "~hydra.callbacks.sweep_report",  # the script writes its own report
           f"hydra.sweep.dir='{sweep_dir}'", f"hydra.job.config.override_dirname.exclude_keys=[{','.join(keys)}]"]
    print("run: fedrun " + " ".join(cmd[4:]), flush=True)
    t0 = time.time()
    r = subprocess.run(cmd)
    if r.returncode != 0:
        print(f"error: fedrun exited with status {r.returncode} (outputs so far in {sweep_dir})", file=sys.stderr)
        sys.exit(r.returncode if 0 < r.returncode < 128 else 1)  # 2: fedrun refused the options, 3: diverged
    return time.time() - t0


def sample_std(v: list[float]) -> float:
    """Sample standard deviation (n - 1) of the seeds' values; nan with fewer than two."""
    if len(v) < 2:
        return math.nan
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def mean_pm_std(m: float, s: float) -> str:
    """'m ± s' for values already in percent; 'missing' when there is no mean, no '±' without a std."""
    if m != m:
        return "missing"
    return f"{m:.2f}" + ("" if s != s else f" ± {s:.2f}")


def pct(x) -> str:
    return "" if x is None or x != x else f"{100 * x:.2f}"


def write_tiny_cifar(root: str, num_classes: int, train_per_class: int, test_per_class: int, seed: int = 0) -> str:
    """Random images in CIFAR's python-pickle layout under root (as fedrun.data.datasets.cifar.load_cifar
    reads them), `train_per_class` / `test_per_class` of every class: data for smoke tests only."""
    import pickle

    import numpy as np

    from fedrun.data.datasets.cifar import CIFAR_FILES

    folder, train_files, test_files, key = CIFAR_FILES[num_classes]
    rng = np.random.RandomState(seed)
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for files, per_class in ((train_files, train_per_class), (test_files, test_per_class)):
        y = rng.permutation(np.repeat(np.arange(num_classes), per_class))
        x = rng.randint(0, 256, size=(len(y), 3072)).astype(np.uint8)
        for f, xs, ys in zip(files, np.array_split(x, len(files)), np.array_split(y, len(files))):
            with open(os.path.join(root, folder, f), "wb") as fh:
                pickle.dump({b"data": xs, key: ys.tolist(), b"batch_label": b"fedrun tiny"}, fh)
    return root
