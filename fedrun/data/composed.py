"""`data=composed`: a dataset (`dataset=`, where rows come from and how they are preprocessed) times
a partition (`partition=`, a pure function of the labels, see `partitioners`). The CLI picks it
whenever `dataset=` or `partition=` is given.

Test rows: `partition.test=split` (default) pools the dataset's training and test rows, partitions
them, and splits each client's rows `train_frac` / rest at random per label (pFedMe's and PFLlib's
protocol); `partition.test=dataset` partitions the training rows and divides the dataset's own test
set the same way: each class's test rows go to clients in proportion to their training rows of it.

`partition.holdout` (a fraction or a count) keeps clients out of training: they come last in the
client order and `FederatedData.num_holdout` says how many; the round loop never samples them and
the evaluation reports them in `new_*` columns.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import replace

import numpy as np

from . import partitioners as P
from .federated import FederatedData
from .partitions import class_lists, deal_classes, perfedavg_mnist, pfedme_mnist
from .sources import (CIFAR_FILES, EMNIST_LABELS, EMNIST_SPLITS, IDX_DATASETS, IDX_LABELS, LEAF_SHAPES, idx_files,
                      load_cifar, load_idx, load_leaf)

# mean / std of the training pixels in [0, 1] (MNIST's as fedrun's MNIST loaders use it)
IDX_STATS = {"mnist": (0.1307, 0.3081), "fmnist": (0.2860, 0.3530), "emnist": (0.1751, 0.3332)}
LEAF_DATASETS = tuple(LEAF_SHAPES)  # rows come with writer ids: partition=natural is theirs
DATASETS = (*IDX_DATASETS, "cifar10", "cifar100", *LEAF_DATASETS)


def _rs(rng: np.random.Generator) -> np.random.RandomState:
    return np.random.RandomState(int(rng.integers(2**32 - 1)))


def perfedavg_split(labels, rng, num_clients: int = 10, a: int = 200):
    """Per-FedAvg's 0-4/5-9 rule (`partitions.perfedavg_mnist`) on any labels 0..9."""
    try:
        return perfedavg_mnist(labels, num_clients, a, _rs(rng))
    except ValueError as e:
        raise P.PartitionError(str(e).replace("data.n=", "partition.num_clients=").replace("data.", "partition.")) from None


def pfedme_labels(labels, rng, num_clients: int = 20, labels_per_client: int = 2):
    """pFedMe's rule (`partitions.pfedme_mnist`): distinct labels per client, weighted sizes; 10 labels."""
    if labels.max() >= 10:
        raise P.PartitionError(f"partition=pfedme_labels: needs a dataset of 10 classes, this one has {labels.max() + 1}")
    try:
        return pfedme_mnist(labels, num_clients, labels_per_client, _rs(rng))
    except ValueError as e:
        raise P.PartitionError(str(e).replace("data.", "partition.")) from None


def acid(labels, rng, num_clients: int = 100, classes_per_client: int = 5, classes: str = "consecutive"):
    """Paper 004's ACID (`partitions.class_lists`, `deal_classes`): k classes per device, equal sizes."""
    rs = _rs(rng)
    try:
        lists = class_lists(int(labels.max()) + 1, num_clients, classes_per_client, classes, rs)
        return deal_classes(labels, lists, rs)
    except ValueError as e:
        raise P.PartitionError(str(e).replace("data.", "partition.")) from None


PARTITIONS = {"iid": P.iid, "dirichlet": P.dirichlet, "shards": P.shards, "classes": P.classes,
              "quantity": P.quantity, "mixture": P.mixture, "perfedavg_split": perfedavg_split,
              "pfedme_labels": pfedme_labels, "acid": acid, "natural": P.natural}
COMMON = ("name", "holdout", "test", "train_frac", "seed")  # partition options every partition has
TESTS = ("split", "dataset")


def load_rows(dataset: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, dict]:
    """(train_x float32, train_y, test_x, test_y, num_classes, extras) of a `dataset=` config."""
    name, root, download = dataset["name"], dataset.get("root", "data"), dataset.get("download", True)
    if name in IDX_DATASETS:
        split = dataset.get("split")
        trx, try_, tex, tey = load_idx(root, name, split, download)
        if name == "emnist" and split == "letters":  # labels 1..26
            try_, tey = try_ - 1, tey - 1
        mean, std = IDX_STATS[name]
        f = lambda x: ((x.astype(np.float32) / 255.0 - mean) / std).reshape(len(x), -1)
        return f(trx), try_, f(tex), tey, (EMNIST_LABELS[split] if name == "emnist" else IDX_LABELS[name])[1], {}
    if name in LEAF_DATASETS:  # pixels as LEAF wrote them (in [0, 1]), normalized by the training rows
        trx, try_, trw, tex, tey, tew = load_leaf(root, name)
        mean, std = float(trx.mean()), float(trx.std()) or 1.0
        return (trx - mean) / std, try_, (tex - mean) / std, tey, LEAF_SHAPES[name][1], {"writers": (trw, tew)}
    from . import _channel_stats  # CIFAR: per-channel normalization by the training set, crop+flip training batches

    trx, try_, tex, tey = load_cifar(root, int(name[5:]), download, root_option="dataset.root (or $FEDRUN_DATA)")
    mean, std = _channel_stats(trx)
    mean, std = mean.astype(np.float32)[:, None, None], std.astype(np.float32)[:, None, None]
    fill = (-mean / std).reshape(-1) if dataset.get("pad_fill", "black") == "black" else None
    norm = lambda x: (x.astype(np.float32) - mean) / std
    return norm(trx), try_, norm(tex), tey, int(name[5:]), {"augment": "crop_flip", "augment_fill": fill}


def check(dataset: dict, partition: dict) -> None:
    """Every dataset / partition option that can be checked without the data, one ValueError."""
    name = dataset.get("name")
    if name not in DATASETS:
        raise P.PartitionError(f"dataset.name={name!r}: allowed one of {', '.join(DATASETS)}")
    if name == "emnist" and dataset.get("split") not in EMNIST_SPLITS:
        raise P.PartitionError(f"dataset.split={dataset.get('split')!r}: allowed one of {', '.join(EMNIST_SPLITS)}")
    if name.startswith("cifar") and dataset.get("pad_fill", "black") not in ("black", "mean"):
        raise P.PartitionError(f"dataset.pad_fill={dataset.get('pad_fill')!r}: allowed one of black, mean")
    pname = partition.get("name")
    if pname not in PARTITIONS:
        raise P.PartitionError(f"partition.name={pname!r}: allowed one of {', '.join(PARTITIONS)}")
    if pname == "natural" and name not in LEAF_DATASETS:
        raise P.PartitionError(f"partition=natural needs rows with writer ids ({', '.join(LEAF_DATASETS)}); "
                               f"dataset={name} has none: choose another partition")
    if partition.get("test", "split") not in TESTS:
        raise P.PartitionError(f"partition.test={partition.get('test')!r}: allowed one of {', '.join(TESTS)}")
    tf = partition.get("train_frac", 0.75)
    if not isinstance(tf, (int, float)) or isinstance(tf, bool) or not 0 < tf < 1:
        raise P.PartitionError(f"partition.train_frac={tf!r}: allowed a fraction strictly between 0 and 1")
    seed = partition.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise P.PartitionError(f"partition.seed={seed!r}: allowed an integer >= 0")
    accepted = set(inspect.signature(PARTITIONS[pname]).parameters) - {"labels", "rng", "writers"}
    for key, v in partition.items():  # the data-free checks, before any file is read
        if key in COMMON:
            continue
        if key not in accepted:
            raise P.PartitionError(f"partition.{key} is not an option of partition={pname}; its options: "
                                   f"{', '.join(sorted(accepted | set(COMMON) - {'name'}))}")
        if key in ("num_clients", "shards_per_client", "classes_per_client", "labels_per_client", "a"):
            P._int(key, v, 1)
        elif key in ("min_size", "max_redraws"):
            P._int(key, v, 0)
        elif key in ("alpha", "sigma"):
            P._positive(key, v)
        elif key == "sizes" and v not in P.QUANTITY_SIZES:
            raise P.PartitionError(f"partition.sizes={v!r}: allowed one of {', '.join(P.QUANTITY_SIZES)}")
    h = partition.get("holdout", 0)
    if isinstance(h, bool) or not isinstance(h, (int, float)) or h < 0 or (isinstance(h, float) and h >= 1):
        raise P.PartitionError(f"partition.holdout={h!r}: allowed a fraction in [0, 1) or a count of clients")
    if "num_clients" in accepted:  # a holdout that rounds to no client (or every one) refused before any reading
        P.holdout_clients(partition.get("num_clients", inspect.signature(PARTITIONS[pname]).parameters["num_clients"].default),
                          h, np.random.default_rng(0))


def stratified_split(owner: np.ndarray, labels: np.ndarray, train_frac: float, rng: np.random.Generator
                     ) -> np.ndarray:
    """True for the training rows. A client of n >= 2 rows keeps t = round((1 - train_frac) n),
    clipped to 1..n-1, as test rows (a single row trains): a systematic sample, at a random offset,
    of its rows ordered by label (random within a label), so its test rows follow its label
    histogram even where a label has one row. One lexsort over all rows."""
    n_rows = len(owner)
    order = np.lexsort((rng.random(n_rows), labels, owner))
    n = np.bincount(owner, minlength=int(owner.max()) + 1 if n_rows else 0)
    start = np.cumsum(n) - n
    t = np.where(n >= 2, np.clip(np.floor((1 - train_frac) * n + 0.5), 1, np.maximum(n - 1, 1)), 0).astype(np.int64)
    who = np.repeat(np.arange(len(n)), t)
    j = np.arange(int(t.sum())) - np.repeat(np.cumsum(t) - t, t)
    pos = np.floor((j + rng.random(len(n))[who]) * n[who] / t[who]).astype(np.int64)
    train = np.ones(n_rows, dtype=bool)
    train[order[start[who] + pos]] = False
    return train


def proportional_test(train_parts: list[np.ndarray], train_y: np.ndarray, test_y: np.ndarray,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """The test rows of each class divided over the clients in proportion to their training rows of
    that class (floors of the cumulative shares), shuffled within the class."""
    k = int(max(train_y.max(), test_y.max())) + 1
    c = len(train_parts)
    counts = np.zeros((k, c), dtype=np.float64)
    for i, p in enumerate(train_parts):
        counts[:, i] = np.bincount(train_y[p], minlength=k)
    tot = counts.sum(1, keepdims=True)
    props = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    order, present, have = P._class_blocks(test_y, rng)
    full = np.zeros(k, dtype=np.int64)
    full[present] = have
    use = np.where(tot[:, 0] > 0, full, 0)  # a class no client trains on gives no test rows
    shares = P._cuts(use, np.where(tot > 0, props, 1.0 / c))
    owner = np.full(len(test_y), -1, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(full)[:-1]])
    for j in range(k):
        if use[j]:
            owner[order[start[j]:start[j] + use[j]]] = np.repeat(np.arange(c), shares[j])
    return P._groups(owner, c, np.arange(len(test_y)))


def build_partition(partition: dict, train_y: np.ndarray, test_y: np.ndarray | None, writers=None
                    ) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """(train index lists, test index lists, number held out). With test=split `train_y` are the
    pooled labels and test_y is None; indices then point into the pooled rows. Held-out clients last.
    `writers`: the rows' writer ids (train, test), for partition=natural."""
    rng = np.random.default_rng([int(partition.get("seed", 0)), 23])
    opts = {k: v for k, v in partition.items() if k not in COMMON}
    fn = PARTITIONS[partition["name"]]
    if fn is P.natural:
        if test_y is None:  # pooled rows: writer of each
            opts["writers"] = np.concatenate(writers)
        else:
            opts["writers"] = writers[0]
    try:
        parts = fn(train_y, rng, **opts)
    except TypeError as e:
        raise P.PartitionError(f"partition={partition['name']}: {e}") from None
    if fn is P.natural and test_y is not None:  # LEAF's own per-writer test rows, aligned with the train writers
        train_ids = np.unique(writers[0])
        owner = np.searchsorted(train_ids, writers[1])
        owner = np.where((owner < len(train_ids)) & (train_ids[np.minimum(owner, len(train_ids) - 1)] == writers[1]),
                         owner, -1)
        return _finish(partition, parts, P._groups(owner, len(parts), np.arange(len(test_y))), test_y, rng)
    if test_y is None:
        owner = np.full(len(train_y), -1, dtype=np.int64)
        for c, p in enumerate(parts):
            owner[p] = c
        used = np.flatnonzero(owner >= 0)
        is_train = stratified_split(owner[used], train_y[used], float(partition.get("train_frac", 0.75)), rng)
        tr, te = P._groups(np.where(is_train, owner[used], -1), len(parts), used), \
            P._groups(np.where(~is_train, owner[used], -1), len(parts), used)
    else:
        tr, te = parts, proportional_test(parts, train_y, test_y, rng)
    return _finish(partition, tr, te, test_y, rng)


def _finish(partition: dict, tr: list[np.ndarray], te: list[np.ndarray], test_y, rng: np.random.Generator
            ) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Held-out clients drawn and put last; clients without training or test rows refused."""
    held = P.holdout_clients(len(tr), partition.get("holdout", 0), rng)
    empty = [c for c in range(len(tr)) if len(tr[c]) == 0 or len(te[c]) == 0]
    if empty:
        fixes = (["raise partition.min_size"] if "min_size" in inspect.signature(PARTITIONS[partition["name"]]).parameters
                 else []) + ["use fewer clients"] + (["use partition.test=split"] if test_y is not None else [])
        raise P.PartitionError(
            f"partition={partition['name']}: clients {empty[:10]} get no training or no test rows; "
            f"{', '.join(fixes[:-1])}{' or ' if len(fixes) > 1 else ''}{fixes[-1]}")
    keep = np.setdiff1d(np.arange(len(tr)), held)
    order = np.r_[keep, held]
    return [tr[c] for c in order], [te[c] for c in order], len(held)


def composed(dataset: dict, partition: dict, cache_dir: str | None = None, chunk_len: int = 256) -> FederatedData:
    """The FederatedData of `dataset` partitioned by `partition` (see the module docstring)."""
    from . import _cached, file_digests  # the cache of fedrun.data: keyed by every setting that shapes the rows

    dataset, partition = dict(dataset), dict(partition)
    check(dataset, partition)
    abs_root = os.path.abspath(dataset.get("root", "data"))

    def build():
        trx, try_, tex, tey, k, more = load_rows(dataset)
        writers = more.pop("writers", None)
        if partition.get("test", "split") == "split":
            x, y = np.concatenate([trx, tex]), np.concatenate([try_, tey])
            tr, te, held = build_partition(partition, y, None, writers)
            train, test = [(x[i], y[i]) for i in tr], [(x[i], y[i]) for i in te]
        else:
            tr, te, held = build_partition(partition, try_, tey, writers)
            train, test = [(trx[i], try_[i]) for i in tr], [(tex[i], tey[i]) for i in te]
        meta = {"num_holdout": np.array(held)}
        if more.get("augment_fill") is not None:
            meta["augment_fill"] = more["augment_fill"]
        return train, test, k, meta

    settings = {"dataset": {k: v for k, v in dataset.items() if k not in ("root", "download")},
                "partition": partition, "root": abs_root}
    if cache_dir:
        name = dataset["name"]
        if name in LEAF_DATASETS:
            sub = [os.path.join(name, "data", s) for s in ("train", "test")]
            folder = abs_root
            files = sorted(os.path.join(d, f) for d in sub if os.path.isdir(os.path.join(abs_root, d))
                           for f in os.listdir(os.path.join(abs_root, d)) if f.endswith(".json"))
        elif name in IDX_DATASETS:
            folder, files = os.path.join(abs_root, IDX_DATASETS[name][0], "raw"), idx_files(name, dataset.get("split"))
        else:
            folder = os.path.join(abs_root, CIFAR_FILES[int(name[5:])][0])
            files = CIFAR_FILES[int(name[5:])][1] + CIFAR_FILES[int(name[5:])][2]
        settings["files"] = file_digests({f: next((p for p in (os.path.join(folder, f), os.path.join(folder, f + ".gz"))
                                                   if os.path.exists(p)), None) for f in files}, cache_dir)
    label = f"{dataset['name']}_{partition['name']}"
    data = _cached(label, settings, cache_dir, build, chunk_len,
                   augment="crop_flip" if dataset["name"].startswith("cifar") else None)
    held = int(data.num_holdout)
    fill = data.augment_fill if dataset.get("pad_fill", "black") == "black" else None
    return replace(data, num_holdout=held, augment_fill=fill)
