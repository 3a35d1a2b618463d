"""Partition times at scale: `python -m fedrun.bench.partitions [--repeats 3]`.

Labels of CIFAR-100's size (50,000 rows, 100 classes) dealt to 1,000 clients by every generic
partitioner, and FEMNIST's size (805,263 rows, 62 classes) grouped by 3,500 writers (`natural`),
then the per-client stratified train/test split and the device layout (ClientSplit) of the
Dirichlet partition. Prints the best of `--repeats` wall-clock times per line (one process, CPU).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv: list[str] | None = None) -> None:
    import torch

    from ..data import partitioners as P
    from ..data.federated import ClientSplit
    from ..data.partitioners.base import stratified_split

    ap = argparse.ArgumentParser(prog="python -m fedrun.bench.partitions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=1000)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(100), 500))  # CIFAR-100's training labels: 500 per class
    c = args.clients
    cases = {
        f"iid, {c} clients": lambda: P.iid(labels, np.random.default_rng(1), c),
        f"dirichlet alpha=0.1, {c} clients": lambda: P.dirichlet(labels, np.random.default_rng(1), c, alpha=0.1),
        f"dirichlet alpha=0.1 min_size=10, {c} clients": lambda: P.dirichlet(labels, np.random.default_rng(1), c,
                                                                             alpha=0.1, min_size=10, max_redraws=1000),
        f"dirichlet alpha=0.5 min_size=20, {c} clients": lambda: P.dirichlet(labels, np.random.default_rng(1), c,
                                                                             alpha=0.5, min_size=20, max_redraws=1000),
        f"shards 2 per client, {c} clients": lambda: P.shards(labels, np.random.default_rng(1), c, 2),
        f"classes 10 per client, {c} clients": lambda: P.classes(labels, np.random.default_rng(1), c, 10),
        f"quantity lognormal sigma=1, {c} clients": lambda: P.quantity(labels, np.random.default_rng(1), c,
                                                                       "lognormal"),
        f"mixture iid_frac=0.5 alpha=0.1, {c} clients": lambda: P.mixture(labels, np.random.default_rng(1), c,
                                                                          0.5, 0.1),
    }
    print(f"50,000 labels, 100 classes (CIFAR-100 sized); best of {args.repeats}; numpy {np.__version__}")
    for name, fn in cases.items():
        t, parts = _best(fn, args.repeats)
        sizes = np.array([len(p) for p in parts])
        print(f"  {name:<48} {t * 1000:8.1f} ms   sizes {sizes.min()}..{sizes.max()}")
    parts = P.dirichlet(labels, np.random.default_rng(1), c, alpha=0.1, min_size=10, max_redraws=1000)
    owner = np.full(len(labels), -1)
    for i, p in enumerate(parts):
        owner[p] = i
    t, _ = _best(lambda: stratified_split(owner, labels, 0.75, np.random.default_rng(2)), args.repeats)
    print(f"  {'+ per-client stratified 75/25 split':<48} {t * 1000:8.1f} ms")
    order = np.concatenate(parts)
    y = torch.as_tensor(labels[order])
    x = torch.zeros(len(order), 1)
    sizes = torch.as_tensor([len(p) for p in parts])
    t, _ = _best(lambda: ClientSplit.from_flat(x, y, sizes, 256), args.repeats)
    print(f"  {'+ device layout (ClientSplit.from_flat)':<48} {t * 1000:8.1f} ms")
    n_writers, n_rows = 3500, 805_263  # FEMNIST (LEAF): 3,550 writers, 805,263 images, 62 classes
    writers = np.random.default_rng(3).integers(0, n_writers, n_rows)
    femnist_labels = np.random.default_rng(4).integers(0, 62, n_rows)
    t, parts = _best(lambda: P.natural(femnist_labels, None, writers), args.repeats)
    print(f"805,263 rows by {n_writers:,} writers (FEMNIST sized)")
    print(f"  {'natural (one client per writer)':<48} {t * 1000:8.1f} ms   {len(parts)} clients")


if __name__ == "__main__":
    main()
