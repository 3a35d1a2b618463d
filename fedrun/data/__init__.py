"""Federated datasets. Each loader returns a FederatedData on the CPU; the run moves it to its device.

Generated and partitioned data is cached in `cache_dir`, keyed by every setting that shapes it, so
a second run with the same data settings starts at once.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import torch

from .federated import ClientSplit, FederatedData
from .partitions import perfedavg_mnist, pfedme_mnist, split_train_test
from .sources import DataMissingError, load_mnist
from .synthetic import generate_synthetic

__all__ = ["ClientSplit", "FederatedData", "DataMissingError", "synthetic", "mnist_perfedavg", "mnist_pfedme"]

_CACHE_VERSION = 1
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def _cached(name: str, settings: dict, cache_dir: str | None, build, chunk_len: int) -> FederatedData:
    """Returns the dataset `build()` makes, from `cache_dir` when it was built before."""
    key = json.dumps({"name": name, "v": _CACHE_VERSION, **settings}, sort_keys=True)
    path = None
    blob = None
    if cache_dir:
        digest = hashlib.sha1(key.encode()).hexdigest()[:16]
        path = os.path.join(cache_dir, f"{name}-{digest}.pt")
        if os.path.exists(path):
            try:
                blob = torch.load(path, weights_only=True)
            except Exception:  # a torn or stale cache file is rebuilt, never trusted
                blob = None
    if blob is None:
        train, test, num_classes = build()
        blob = {"num_classes": num_classes}
        for split, parts in (("train", train), ("test", test)):
            blob[split] = {
                "x": torch.as_tensor(np.concatenate([p[0] for p in parts])),
                "y": torch.as_tensor(np.concatenate([p[1] for p in parts]).astype(np.int64)),
                "sizes": torch.as_tensor([len(p[1]) for p in parts], dtype=torch.int64),
            }
        if path:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            torch.save(blob, tmp)
            os.replace(tmp, path)
    splits = {s: ClientSplit.from_flat(chunk_len=chunk_len, **blob[s]) for s in ("train", "test")}
    return FederatedData(name, splits["train"], splits["test"], int(blob["num_classes"]))


def synthetic(
    num_clients: int = 100,
    alpha: float = 0.5,
    beta: float = 0.5,
    dim: int = 60,
    num_classes: int = 10,
    train_frac: float = 0.9,
    seed: int = 0,
    cache_dir: str | None = None,
    chunk_len: int = 256,
) -> FederatedData:
    """Power-law Synthetic(alpha, beta) (see `synthetic.generate_synthetic`)."""
    settings = dict(num_clients=num_clients, alpha=alpha, beta=beta, dim=dim,
                    num_classes=num_classes, train_frac=train_frac, seed=seed)

    def build():
        train, test = generate_synthetic(**settings)
        return train, test, num_classes

    return _cached(f"synthetic_{alpha:g}_{beta:g}", settings, cache_dir, build, chunk_len)


def _mnist_x(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD).reshape(len(images), -1)


def mnist_perfedavg(
    root: str = "data",
    n: int = 10,
    a: int = 200,
    test_a: int | None = None,
    seed: int = 0,
    download: bool = True,
    cache_dir: str | None = None,
    chunk_len: int = 256,
) -> FederatedData:
    """MNIST 0-4/5-9 split of Per-FedAvg (papers 000/001 Sec. 5), on train and test data alike.

    Args:
        root: folder holding MNIST/raw (torchvision layout).
        n, a: number of users and images per digit (see `partitions.perfedavg_mnist`).
        test_a: `a` for the test split; None scales `a` by |test set| / |training set| (even).
        seed: seed of the partition (fixed data across run seeds).
    """
    abs_root = os.path.abspath(root)

    def build():
        trx, try_, tex, tey = load_mnist(root, download)
        ta = test_a if test_a is not None else max(2, int(a * len(tey) / len(try_)) // 2 * 2)
        rng = np.random.RandomState(seed)
        tr_parts = perfedavg_mnist(try_, n, a, rng)
        try:
            te_parts = perfedavg_mnist(tey, n, ta, rng)
        except ValueError as e:
            raise ValueError(f"test split (data.test_a={ta}): {e}") from None
        train = [(_mnist_x(trx[i]), try_[i]) for i in tr_parts]
        test = [(_mnist_x(tex[i]), tey[i]) for i in te_parts]
        return train, test, 10

    settings = dict(root=abs_root, n=n, a=a, test_a=test_a, seed=seed)
    if cache_dir:
        settings["files"] = _mnist_files_key(abs_root)
    return _cached("mnist_perfedavg", settings, cache_dir, build, chunk_len)


def _mnist_files_key(abs_root: str) -> dict:
    """The label files' sizes, for cache keys: a different copy of MNIST is new data."""
    raw = os.path.join(abs_root, "MNIST", "raw")
    return {f: os.path.getsize(os.path.join(raw, f)) if os.path.exists(os.path.join(raw, f)) else None
            for f in ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte")}


def mnist_pfedme(
    root: str = "data",
    num_clients: int = 20,
    labels_per_client: int = 2,
    train_frac: float = 0.75,
    seed: int = 0,
    download: bool = True,
    cache_dir: str | None = None,
    chunk_len: int = 256,
) -> FederatedData:
    """MNIST split of pFedMe (paper 002 Sec. 5.1): all train and test images pooled (70,000 for full
    MNIST), `num_clients` clients with `labels_per_client` distinct labels each, every label owned by
    equally many clients, heterogeneous sizes (see `partitions.pfedme_mnist` for the size rule);
    each client's images split at random `train_frac` / 1 - train_frac into train / test, per label
    (`partitions.split_train_test`), so a client's test data has its labels.

    Args:
        root: folder holding MNIST/raw (torchvision layout).
        seed: seed of the partition and of the split (fixed data across run seeds).
    """
    abs_root = os.path.abspath(root)

    def build():
        trx, try_, tex, tey = load_mnist(root, download)
        x = np.concatenate([trx, tex])
        y = np.concatenate([try_, tey]).astype(np.int64)
        rng = np.random.RandomState(seed)
        try:
            parts = pfedme_mnist(y, num_clients, labels_per_client, rng)
            tr_parts, te_parts = split_train_test(y, parts, train_frac, rng)
        except ValueError as e:
            raise ValueError(f"mnist_pfedme: {e}") from None
        train = [(_mnist_x(x[i]), y[i]) for i in tr_parts]
        test = [(_mnist_x(x[i]), y[i]) for i in te_parts]
        return train, test, 10

    settings = dict(root=abs_root, num_clients=num_clients, labels_per_client=labels_per_client,
                    train_frac=train_frac, seed=seed)
    if cache_dir:
        settings["files"] = _mnist_files_key(abs_root)
    return _cached("mnist_pfedme", settings, cache_dir, build, chunk_len)
