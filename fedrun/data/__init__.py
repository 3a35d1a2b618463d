"""Federated datasets. Each loader returns a FederatedData on the CPU; the run moves it to its device.

Generated and partitioned data is cached in `cache_dir`, keyed by every setting that shapes it, so
a second run with the same data settings starts at once.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from dataclasses import replace

import numpy as np
import torch

from .augment import augment
from .federated import ClientSplit, FederatedData
from .partitions import (alid_permutations, class_lists, deal_classes, perfedavg_mnist, pfedme_mnist,
                         pfedme_mnist_authors, split_train_test)
from .sources import CIFAR_FILES, load_cifar, load_mnist
from ..errors import DataMissingError
from .synthetic import DRAW_VERSION, check_settings, generate_synthetic

__all__ = ["ClientSplit", "FederatedData", "DataMissingError", "augment", "synthetic", "mnist_perfedavg", "mnist_pfedme",
           "mnist_pfedme_authors", "cifar"]

_CACHE_VERSION = 1
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def _cached(name: str, settings: dict, cache_dir: str | None, build, chunk_len: int,
            augment: str | None = None) -> FederatedData:
    """Returns the dataset `build()` makes, from `cache_dir` when it was built before.

    `build()` returns (train parts, test parts, num_classes[, meta]); meta maps FederatedData field
    names (client_classes, client_labels, augment_fill) to arrays and is cached with the data.
    """
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
        train, test, num_classes, *meta = build()
        blob = {"num_classes": num_classes, "meta": {k: torch.as_tensor(v) for k, v in (meta or [{}])[0].items()}}
        for split, parts in (("train", train), ("test", test)):
            blob[split] = {
                "x": torch.as_tensor(np.concatenate([p[0] for p in parts])),
                "y": torch.as_tensor(np.concatenate([p[1] for p in parts]).astype(np.int64)),
                "sizes": torch.as_tensor([len(p[1]) for p in parts], dtype=torch.int64),
            }
        if path:
            _write_cache(blob, path)
    splits = {s: ClientSplit.from_flat(chunk_len=chunk_len, **blob[s]) for s in ("train", "test")}
    return FederatedData(name, splits["train"], splits["test"], int(blob["num_classes"]), augment=augment,
                         **blob.get("meta", {}))


DIGESTS = "file-digests.json"  # in the cache folder: path -> [size, mtime_ns, ctime_ns, inode, sha1]


def _sha1(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_digests(paths: dict[str, str | None], cache_dir: str) -> dict[str, str | None]:
    """The content hash of each data file (name -> path; None or a missing path: None), for cache
    keys: a file repaired in place, even to the same size and modification time, is new data and
    its rows are read again. A hash is computed once and kept in `cache_dir`/file-digests.json
    beside the file's size, mtime, ctime and inode; any of them changed (ctime moves on every
    write and cannot be set back), the file is hashed again."""
    book_path = os.path.join(cache_dir, DIGESTS)
    try:
        with open(book_path) as f:
            book = json.load(f)
        book = book if isinstance(book, dict) else {}
    except (OSError, ValueError):
        book = {}
    out, changed = {}, False
    for name, path in paths.items():
        if not path or not os.path.isfile(path):
            out[name] = None
            continue
        path = os.path.abspath(path)
        st = os.stat(path)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        kept = book.get(path)
        if not (isinstance(kept, list) and kept[:4] == stamp and len(kept) == 5):
            book[path], changed = [*stamp, _sha1(path)], True
        out[name] = book[path][4]
    if changed:  # through a temp file; when it cannot be written the hashes are computed again next time
        tmp = f"{book_path}.{os.getpid()}.tmp"
        try:
            os.makedirs(cache_dir, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(book, f)
            os.replace(tmp, book_path)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(tmp)
    return out


def _write_cache(blob: dict, path: str) -> None:
    """Writes the cache file through a temp file. The cache only saves time: when it cannot be written
    (a full disk, no permission) the run goes on with the data in memory, says so in one line, and
    leaves no partial file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(blob, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch's zip writer reports ENOSPC as RuntimeError('... unexpected pos ...')
        with contextlib.suppress(OSError):
            os.remove(tmp)
        print(f"fedrun: warning: could not write the data cache {path} ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:120] if str(e) else ''}); going on with the data in memory", file=sys.stderr)


def synthetic(
    num_clients: int = 100,
    alpha: float = 0.5,
    beta: float = 0.5,
    iid: bool = False,
    size_factor: int = 5,
    dim: int = 60,
    num_classes: int = 10,
    train_frac: float = 0.9,
    seed: int = 0,
    cache_dir: str | None = None,
    chunk_len: int = 256,
) -> FederatedData:
    """Power-law Synthetic(alpha, beta) of FedProx / pFedMe (see `synthetic.generate_synthetic`)."""
    settings = dict(num_clients=num_clients, alpha=alpha, beta=beta, iid=iid, size_factor=size_factor, dim=dim,
                    num_classes=num_classes, train_frac=train_frac, seed=seed)
    check_settings(**settings)  # before the cache lookup, which formats alpha and beta

    def build():
        train, test = generate_synthetic(**settings)
        return train, test, num_classes

    name = "synthetic_iid" if iid else f"synthetic_{alpha:g}_{beta:g}"
    # DRAW_VERSION in the key: a cache file written by an older generator is never served
    return _cached(name, {**settings, "draw": DRAW_VERSION}, cache_dir, build, chunk_len)


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
        settings["files"] = _mnist_files_key(abs_root, cache_dir)
    return _cached("mnist_perfedavg", settings, cache_dir, build, chunk_len)


def _mnist_files_key(abs_root: str, cache_dir: str) -> dict:
    """The MNIST files' content hashes, for cache keys: a different or repaired copy is new data."""
    from .sources import MNIST_FILES

    return file_digests({f: os.path.join(abs_root, "MNIST", "raw", f) for f in MNIST_FILES}, cache_dir)


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
        settings["files"] = _mnist_files_key(abs_root, cache_dir)
    return _cached("mnist_pfedme", settings, cache_dir, build, chunk_len)


def mnist_pfedme_authors(
    root: str = "data",
    num_clients: int = 20,
    labels_per_client: int = 2,
    seed: int = 1,
    train_frac: float = 0.75,
    download: bool = True,
    cache_dir: str | None = None,
    chunk_len: int = 256,
) -> FederatedData:
    """pFedMe's MNIST exactly as the authors' generator made it for the paper (see
    `partitions.pfedme_mnist_authors`): the same rows, labels and order, client by client, when
    `root` holds the published MNIST. Their features: every pixel standardized over all 70,000
    images, (x - mean) / (std + 0.001), in float32 as numpy computes it (fedrun's other MNIST
    loaders use MNIST's single mean and std).

    It is NOT a clean benchmark: the clients that own a digit share a prefix of its images, so 89%
    of the pooled test rows are also some client's training rows (the global model is tested
    largely on images it trained on), and a few rows carry a neighbour's label. `data=mnist_pfedme`
    is the split the paper describes, without those defects.
    """
    abs_root = os.path.abspath(root)

    def build():
        trx, try_, tex, tey = load_mnist(root, download)
        y = np.concatenate([try_, tey]).astype(np.int64)  # OpenML's mnist_784 order: training, then test images
        try:
            train_parts, test_parts = pfedme_mnist_authors(y, num_clients, labels_per_client, seed, train_frac)
        except ValueError as e:
            raise ValueError(f"mnist_pfedme_authors: {e}") from None
        x = np.concatenate([trx, tex]).reshape(len(y), -1).astype(np.float32)
        mean, std = np.mean(x, 0), np.std(x, 0)  # the generator's arithmetic: numpy, in float32
        x -= mean
        x /= std + np.float32(0.001)
        return [(x[i], lab) for i, lab in train_parts], [(x[i], lab) for i, lab in test_parts], 10

    settings = dict(root=abs_root, num_clients=num_clients, labels_per_client=labels_per_client, seed=seed,
                    train_frac=train_frac)
    if cache_dir:
        settings["files"] = _mnist_files_key(abs_root, cache_dir)
    return _cached("mnist_pfedme_authors", settings, cache_dir, build, chunk_len)


CIFAR_SPLITS = ("acid", "alid")
PAD_FILLS = ("black", "mean")


def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of uint8 images [N, 3, H, W], in float64 chunks (no full float copy)."""
    s = np.zeros(x.shape[1])
    s2 = np.zeros(x.shape[1])
    for i in range(0, len(x), 4096):
        b = x[i:i + 4096].astype(np.float64)
        s += b.sum((0, 2, 3))
        s2 += (b * b).sum((0, 2, 3))
    count = len(x) * x.shape[2] * x.shape[3]
    mean = s / count
    return mean, np.sqrt(np.maximum(s2 / count - mean**2, 1e-12))


def cifar(
    root: str = "data",
    dataset: str = "cifar10",
    split: str = "acid",
    num_clients: int = 100,
    classes_per_client: int = 5,
    classes: str = "consecutive",
    seed: int = 0,
    download: bool = True,
    cache_dir: str | None = None,
    chunk_len: int = 256,
    pad_fill: str = "black",
) -> FederatedData:
    """CIFAR-10/100 ACID or ALID split of paper 004 (paper 004 Sec. 3).

    Every device owns `classes_per_client` classes (`partitions.class_lists`) and gets
    floor(N / num_clients) training and test examples of them, dealt without replacement
    (`partitions.deal_classes`). ALID renames each device's classes by a private permutation onto
    0..k-1 and the dataset then has k classes (the model has k outputs, as in the official code).
    Inputs are float32 [N, 3, 32, 32] normalized by the training set's per-channel mean/std; training
    batches are to be augmented by `augment.crop_flip` (FederatedData.augment), whose padding takes
    the value `pad_fill` names (FederatedData.augment_fill).

    Args:
        root: folder holding cifar-10-batches-py or cifar-100-python (python pickles).
        dataset: cifar10 | cifar100.  split: acid | alid.
        classes: consecutive (device c owns (c + j) mod C, official code) | random (seeded, balanced).
        seed: seed of the partition (fixed data across run seeds).
        pad_fill: black (a pixel of value 0 before normalization, i.e. -mean/std per channel: the
            authors' code, torchvision's RandomCrop on the image before Normalize) | mean (0 after
            normalization: the training set's mean colour; fedrun before 2026-11-22).
    """
    sources = {f"cifar{c}": c for c in CIFAR_FILES}
    if dataset not in sources:
        raise ValueError(f"data.dataset={dataset!r} is not one of {sorted(sources)}")
    if split not in CIFAR_SPLITS:
        raise ValueError(f"data.split={split!r} is not one of {list(CIFAR_SPLITS)}")
    if pad_fill not in PAD_FILLS:
        raise ValueError(f"data.pad_fill={pad_fill!r} is not one of {list(PAD_FILLS)}")
    num_classes, k = sources[dataset], classes_per_client
    abs_root = os.path.abspath(root)
    class_lists(num_classes, num_clients, k, classes, np.random.RandomState(seed))  # bad options fail before any reading

    def build():
        trx, try_, tex, tey = load_cifar(root, num_classes, download)
        rng = np.random.RandomState(seed)
        lists = class_lists(num_classes, num_clients, k, classes, rng)
        tr_parts = deal_classes(try_, lists, rng)
        try:
            te_parts = deal_classes(tey, lists, rng)
        except ValueError as e:
            raise ValueError(f"test split: {e}") from None
        mean, std = _channel_stats(trx)
        mean = mean.astype(np.float32)[:, None, None]
        std = std.astype(np.float32)[:, None, None]
        meta = {"client_classes": lists, "augment_fill": (-mean / std).reshape(-1)}  # black, normalized
        if split == "alid":
            perms = alid_permutations(num_clients, k, rng)
            meta["client_labels"] = perms
        parts = []
        for x, y, idx_list in ((trx, try_, tr_parts), (tex, tey, te_parts)):
            out = []
            for c, idx in enumerate(idx_list):
                yc = y[idx]
                if split == "alid":  # local label of class lists[c, j] is perms[c, j]
                    yc = perms[c][np.searchsorted(lists[c], yc)]
                out.append(((x[idx].astype(np.float32) - mean) / std, yc))
            parts.append(out)
        return parts[0], parts[1], (k if split == "alid" else num_classes), meta

    settings = dict(root=abs_root, dataset=dataset, split=split, num_clients=num_clients,
                    classes_per_client=k, classes=classes, seed=seed,
                    meta=2)  # 2: the cached meta holds augment_fill (a file from before it is not served)
    if cache_dir:  # the cache key includes the files' hashes: a different copy of CIFAR is new data
        folder, train_files, test_files, _ = CIFAR_FILES[num_classes]
        paths = {f: os.path.join(abs_root, folder, f) for f in train_files + test_files}
        settings["files"] = file_digests(paths, cache_dir)
    data = _cached(f"{dataset}_{split}", settings, cache_dir, build, chunk_len, augment="crop_flip")
    return data if pad_fill == "black" else replace(data, augment_fill=None)
