"""CIFAR-10 and CIFAR-100: 32 x 32 colour images from the python pickles, float32 [N, 3, 32, 32]
normalized per channel by the training set's mean and std; training batches random-crop (pad 4) +
flip augmented (`augment.crop_flip`), the padding black (a 0 pixel before normalization, as the
authors' code: torchvision's RandomCrop on the image before Normalize) or mean (0 after it).

The pickles are read by a restricted unpickler: a crafted file cannot run code.
"""
from __future__ import annotations

import os
import pickle

import numpy as np

from ...errors import DataCorruptError, DataMissingError
from .base import Dataset, Rows, all_present, choice, corrupt, download_into

PAD_FILLS = ("black", "mean")
# CIFAR-100's two label sets (100 classes, 20 superclasses)
LABELS = {"fine": b"fine_labels", "coarse": b"coarse_labels"}
LABEL_COUNTS = {b"labels": 10, b"fine_labels": 100, b"coarse_labels": 20}  # a label key -> its labels 0..n-1


class Cifar(Dataset):
    """`dataset=cifar10|cifar100` (conf/dataset): the python pickles under `root`."""

    augment = "crop_flip"

    def __init__(self, name: str = "cifar10", root: str = "data", download: bool = True, pad_fill: str = "black",
                 labels: str = "fine") -> None:
        choice("dataset.name", name, [f"cifar{c}" for c in CIFAR_FILES])
        choice("dataset.pad_fill", pad_fill, PAD_FILLS)
        choice("dataset.labels", labels, list(LABELS) if name == "cifar100" else ["fine"])
        super().__init__(root, download)
        self.name, self.pad_fill, self.labels = name, pad_fill, labels

    def settings(self) -> dict:
        s = super().settings()  # labels=fine keys the cache as before the option existed (its cache files stay good)
        return {k: v for k, v in s.items() if not (k == "labels" and v == "fine")}

    @property
    def num_classes(self) -> int:
        return 20 if self.labels == "coarse" else self.files_classes

    @property
    def files_classes(self) -> int:
        """10 or 100: which release's files (CIFAR_FILES) the rows come from."""
        return int(self.name[len("cifar"):])

    def files(self) -> dict[str, str | None]:
        folder, train, test, _ = CIFAR_FILES[self.files_classes]
        return {f: os.path.join(os.path.abspath(self.root), folder, f) for f in train + test}

    def load(self) -> Rows:
        trx, try_, tex, tey = load_cifar(self.root, self.files_classes, self.download,
                                         label_key=LABELS[self.labels] if self.files_classes == 100 else None)
        mean, std = channel_stats(trx)
        mean, std = mean.astype(np.float32)[:, None, None], std.astype(np.float32)[:, None, None]
        fill = (-mean / std).reshape(-1) if self.pad_fill == "black" else None
        norm = lambda x: (x.astype(np.float32) - mean) / std
        return Rows(norm(trx), try_, norm(tex), tey, self.num_classes, augment_fill=fill)


def channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


CIFAR_FILES = {
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels"),
    100: ("cifar-100-python", ["train"], ["test"], b"fine_labels"),
}

def _latin1(text, encoding="latin1", errors="strict"):
    """`_codecs.encode` as Python 3 pickles bytes at protocol 2 (`encode(str, 'latin1')`), no other codec."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode({type(text).__name__}, {encoding!r}) is not part of the format")
    return text.encode("latin1")


# The callables a CIFAR python pickle may name: numpy's array and dtype reconstructors (numpy 1.x
# and 2.x module paths, pickle protocols 2-5) and bytes in Python 3 protocol-2 pickles. The rest
# of the format is dicts, lists, ints and bytes, which need no callable.
_CIFAR_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): lambda: np.ndarray.__reduce__(np.zeros(0))[0],
    ("numpy._core.multiarray", "_reconstruct"): lambda: np.ndarray.__reduce__(np.zeros(0))[0],
    ("numpy.core.numeric", "_frombuffer"): lambda: _numeric()._frombuffer,
    ("numpy._core.numeric", "_frombuffer"): lambda: _numeric()._frombuffer,
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: _latin1,
}


def _numeric():
    try:
        from numpy._core import numeric
    except ImportError:  # numpy < 2
        from numpy.core import numeric
    return numeric


class _CifarUnpickler(pickle.Unpickler):
    """Reads a CIFAR batch without running code: any callable outside `_CIFAR_GLOBALS` is refused
    (plain pickle.load would call whatever a crafted file names, e.g. os.system)."""

    def find_class(self, module: str, name: str):
        get = _CIFAR_GLOBALS.get((module, name))
        if get is None:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR batch never holds; refused, "
                                         f"nothing was run")
        return get()


def read_cifar_batch(path: str) -> dict:
    """One CIFAR-10/100 python batch as the dict it holds (bytes keys), read by `_CifarUnpickler`."""
    try:
        with open(path, "rb") as f:
            d = _CifarUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            MemoryError, OverflowError) as e:
        raise DataCorruptError(corrupt(path, f"not a readable CIFAR batch ({type(e).__name__}: "
                                              f"{str(e).splitlines()[0][:160] if str(e) else 'truncated?'})")) from None
    if not isinstance(d, dict):
        raise DataCorruptError(corrupt(path, f"holds a {type(d).__name__}, not the dict of a CIFAR batch"))
    return d


def _read_cifar(paths: list[str], label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p in paths:
        d = read_cifar_batch(p)
        x, y = d.get(b"data"), d.get(label_key)
        if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            got = (f"{x.dtype} array of shape {list(x.shape)}" if isinstance(x, np.ndarray)
                   else type(x).__name__)
            raise DataCorruptError(corrupt(p, f"not a CIFAR batch: its {b'data'!r} is a {got}, expected a "
                                               f"uint8 array of shape [N, 3072]"))
        try:  # the release's labels are a list of Python ints: a float (3.7) or a bool is not one
            y = np.asarray(y)
            y = y.astype(np.int64) if y.dtype.kind in "iu" or (y.size == 0 and y.dtype.kind == "f") else None
        except (TypeError, ValueError, OverflowError):
            y = None
        if y is None or y.ndim != 1 or len(y) != len(x):
            raise DataCorruptError(corrupt(p, f"not a CIFAR batch: its {label_key!r} is not {len(x)} integer "
                                               f"labels, one per image"))
        count = LABEL_COUNTS[label_key]
        bad = np.flatnonzero((y < 0) | (y >= count))
        if len(bad):  # one label past the model's outputs would stop training mid-run (IndexError)
            rows = f"{len(bad)} row{'s' if len(bad) > 1 else ''}"
            raise DataCorruptError(corrupt(p, f"not a CIFAR batch: its {label_key!r} include label {int(y[bad[0]])} "
                                               f"at row {int(bad[0])} ({rows} outside 0..{count - 1})"))
        xs.append(x.reshape(-1, 3, 32, 32))
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def load_cifar(root: str, num_classes: int = 10, download: bool = True,
               root_option: str = "dataset.root (or $FEDRUN_DATA)",
               label_key: bytes | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CIFAR-10/100 as (train_x uint8 [N,3,32,32], train_y, test_x, test_y) from the python pickles.

    Reads `root`/cifar-10-batches-py/{data_batch_1..5,test_batch} or `root`/cifar-100-python/
    {train,test} itself (torchvision would check every file's md5); downloads them there through
    torchvision when they are missing and `download` is set. `root_option`: the option that set
    `root`, as the missing-files message names it (`data.root` for data=cifar*, `dataset.root`).
    `label_key`: the labels read (None: the release's own, CIFAR_FILES; b"coarse_labels": CIFAR-100's 20 superclasses).
    """
    if num_classes not in CIFAR_FILES:
        raise ValueError(f"CIFAR has 10 or 100 classes, not {num_classes}")
    folder, train_files, test_files, own_key = CIFAR_FILES[num_classes]
    label_key = label_key or own_key
    base = os.path.join(root, folder)
    names = train_files + test_files
    if not all_present(base, names):
        why = "download=false"
        if download:
            from torchvision.datasets import CIFAR10, CIFAR100

            source = CIFAR10 if num_classes == 10 else CIFAR100
            why = download_into(root, [folder, source.filename], lambda: source(root, train=True, download=True)) or why
        if not all_present(base, names):
            raise DataMissingError(
                f"CIFAR-{num_classes} not found: expected {', '.join(names)} in {os.path.abspath(base)} "
                f"({why}); copy them there or point {root_option} at the folder that holds {folder}"
            )
    trx, try_ = _read_cifar([os.path.join(base, f) for f in train_files], label_key)
    tex, tey = _read_cifar([os.path.join(base, f) for f in test_files], label_key)
    return trx, try_, tex, tey

