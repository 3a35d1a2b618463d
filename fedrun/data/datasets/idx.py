"""MNIST, Fashion-MNIST and EMNIST: 28 x 28 grey images in idx files (torchvision's layout), flattened
to 784 features and normalized by the training set's mean and std (`STATS`), or (`normalize=pixel`)
every pixel standardized over all train + test images as pFedMe's generator did
((x - mean) / (std + 0.001), float32, numpy's arithmetic).

Only the files' headers and bytes are read (no pickle: nothing in a data file can run code).
"""
from __future__ import annotations

import os

import numpy as np

from ...errors import DataCorruptError, DataMissingError
from .base import Dataset, Rows, choice, corrupt, download_into, present

# mean / std of the training pixels in [0, 1]
STATS = {"mnist": (0.1307, 0.3081), "fmnist": (0.2860, 0.3530), "emnist": (0.1751, 0.3332)}
TITLES = {"mnist": "MNIST", "fmnist": "Fashion-MNIST", "emnist": "EMNIST"}
NORMALIZE = ("mean_std", "pixel")


class Idx(Dataset):
    """`dataset=mnist|fmnist|emnist` (conf/dataset): the idx files under `root`."""

    def __init__(self, name: str = "mnist", root: str = "data", download: bool = True, split: str | None = None,
                 normalize: str = "mean_std") -> None:
        choice("dataset.name", name, IDX_DATASETS)
        if name == "emnist":
            choice("dataset.split", split, EMNIST_SPLITS)
        choice("dataset.normalize", normalize, NORMALIZE)
        super().__init__(root, download)
        self.name, self.split, self.normalize = name, split if name == "emnist" else None, normalize

    @property
    def num_classes(self) -> int:
        return (EMNIST_LABELS[self.split] if self.name == "emnist" else IDX_LABELS[self.name])[1]

    def files(self) -> dict[str, str | None]:
        return present(os.path.join(os.path.abspath(self.root), IDX_DATASETS[self.name][0], "raw"),
                       idx_files(self.name, self.split))

    def load(self) -> Rows:
        trx, try_, tex, tey = load_idx(self.root, self.name, self.split, self.download)
        if self.name == "emnist" and self.split == "letters":  # labels 1..26
            try_, tey = try_ - 1, tey - 1
        k = self.num_classes
        if self.normalize == "pixel":
            x = np.concatenate([trx, tex]).reshape(len(trx) + len(tex), -1).astype(np.float32)
            mean, std = np.mean(x, 0), np.std(x, 0)
            x -= mean
            x /= std + np.float32(0.001)
            return Rows(x[:len(trx)], try_, x[len(trx):], tey, k)
        mean, std = STATS[self.name]
        f = lambda x: ((x.astype(np.float32) / 255.0 - mean) / std).reshape(len(x), -1)
        return Rows(f(trx), try_, f(tex), tey, k)


IDX_DATASETS = {  # dataset -> (folder under root, file stem per split; {split}: EMNIST's split name)
    "mnist": ("MNIST", "{part}-{kind}-idx{d}-ubyte"),
    "fmnist": ("FashionMNIST", "{part}-{kind}-idx{d}-ubyte"),
    "emnist": ("EMNIST", "emnist-{split}-{part}-{kind}-idx{d}-ubyte"),
}
# the labels each idx dataset has: (lowest, count); EMNIST by split (letters are stored as 1..26)
IDX_LABELS = {"mnist": (0, 10), "fmnist": (0, 10)}
EMNIST_LABELS = {"balanced": (0, 47), "byclass": (0, 62), "bymerge": (0, 47), "digits": (0, 10),
                 "letters": (1, 26), "mnist": (0, 10)}
EMNIST_SPLITS = tuple(EMNIST_LABELS)


def idx_files(dataset: str, split: str | None = None) -> list[str]:
    """The four idx file names of `dataset` (train/test images/labels), as torchvision writes them."""
    _, stem = IDX_DATASETS[dataset]
    parts = {"mnist": ("train", "t10k"), "fmnist": ("train", "t10k"), "emnist": ("train", "test")}[dataset]
    return [stem.format(split=split, part=p, kind=k, d=d) for p in parts for k, d in (("images", 3), ("labels", 1))]


def read_idx(path: str) -> np.ndarray:
    """An idx file (MNIST's big-endian format; `path` or `path`.gz) as a numpy array. Only the header
    and raw bytes are read: no pickle, nothing in a data file can run code. A file that is not a
    whole idx file of bytes (empty, torn, garbage, a .gz that does not decompress) is a
    DataCorruptError naming it, in one line."""
    import gzip
    import zlib

    gz = not os.path.exists(path) and os.path.exists(path + ".gz")
    name = path + ".gz" if gz else path
    try:
        with (gzip.open if gz else open)(name, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataCorruptError(corrupt(name, f"not readable as {'gzip' if gz else 'a file'} ({type(e).__name__}: "
                                              f"{str(e).splitlines()[0][:120] if str(e) else 'truncated?'})")) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or not 1 <= data[3] <= 4:
        raise DataCorruptError(corrupt(name, f"not an idx file of bytes ({len(data)} bytes; an idx file starts "
                                              f"00 00 08 01..04)"))
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise DataCorruptError(corrupt(name, f"truncated in its header ({len(data)} bytes)"))
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise DataCorruptError(corrupt(name, f"{arr.size} bytes of data, but its header "
                                             f"({' x '.join(map(str, shape))}) says {int(np.prod(shape))} "
                                             f"(a torn copy?)"))
    return arr.reshape(shape)


def check_labelled_images(images: np.ndarray, labels: np.ndarray, image_file: str, label_file: str,
                          lowest: int, count: int, what: str) -> None:
    """DataCorruptError in one line unless `images` is [n, 28, 28], `labels` is [n] (the same n: a
    label file one entry short would shift every later image onto the next row's label) and every
    label is one of the dataset's `count` labels from `lowest` (one 0xff byte would make a
    256-class problem)."""
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataCorruptError(corrupt(image_file, f"not a file of 28 x 28 images (its header says "
                                                    f"{' x '.join(map(str, images.shape))})"))
    if labels.ndim != 1:
        raise DataCorruptError(corrupt(label_file, f"not a file of labels (its header says "
                                                    f"{' x '.join(map(str, labels.shape))}, expected one dimension)"))
    if len(images) != len(labels):
        raise DataCorruptError(f"{os.path.abspath(image_file)} holds {len(images)} images but "
                               f"{os.path.abspath(label_file)} holds {len(labels)} labels; they must agree, one label "
                               f"per image: delete both and download the dataset again (or copy good copies there)")
    bad = np.flatnonzero((labels < lowest) | (labels >= lowest + count))
    if len(bad):
        raise DataCorruptError(corrupt(label_file, f"a label file with label {int(labels[bad[0]])} "
                                                   f"at row {int(bad[0])} ({len(bad)} "
                                                   f"row{'s' if len(bad) > 1 else ''} outside {what}'s labels "
                                                   f"{lowest}..{lowest + count - 1})"))


def load_idx(root: str, dataset: str, split: str | None = None, download: bool = True
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST, Fashion-MNIST or EMNIST as (train_x uint8 [N,28,28], train_y, test_x, test_y) from
    `root`/<MNIST|FashionMNIST|EMNIST>/raw (plain or .gz idx files, torchvision's layout). EMNIST
    images are transposed upright. Downloads MNIST and Fashion-MNIST through torchvision when their
    files are missing and `download` is set."""
    folder, _ = IDX_DATASETS[dataset]
    raw = os.path.join(root, folder, "raw")
    names = idx_files(dataset, split)
    present = lambda: all(os.path.exists(os.path.join(raw, f)) or os.path.exists(os.path.join(raw, f + ".gz"))
                          for f in names)
    if not present():
        why = "download=false"
        if download and dataset != "emnist":
            from torchvision.datasets import MNIST, FashionMNIST

            source = MNIST if dataset == "mnist" else FashionMNIST
            why = download_into(root, [f"{folder}/raw"], lambda: (source(root, train=True, download=True),
                                                              source(root, train=False, download=True))) or why
        elif download:
            why = "EMNIST is not downloaded by fedrun (~560 MB zip)"
        if not present():
            raise DataMissingError(
                f"{TITLES[dataset]} not found: expected {', '.join(names)} (or .gz) in {os.path.abspath(raw)} "
                f"({why}); copy them there or point dataset.root (or $FEDRUN_DATA) at the folder that holds "
                f"{folder}/raw"
            )
    paths = [os.path.join(raw, f) for f in names]
    paths = [p if os.path.exists(p) or not os.path.exists(p + ".gz") else p + ".gz" for p in paths]
    trx, try_, tex, tey = (read_idx(os.path.join(raw, f)) for f in names)
    lowest, count = EMNIST_LABELS[split] if dataset == "emnist" else IDX_LABELS[dataset]
    what = f"dataset={dataset}" + (f" dataset.split={split}" if dataset == "emnist" else "")
    check_labelled_images(trx, try_, paths[0], paths[1], lowest, count, what)
    check_labelled_images(tex, tey, paths[2], paths[3], lowest, count, what)
    if dataset == "emnist":  # stored transposed (column-major), as torchvision leaves them
        trx, tex = trx.transpose(0, 2, 1), tex.transpose(0, 2, 1)
    return trx, try_.astype(np.int64), tex, tey.astype(np.int64)


MNIST_FILES = idx_files("mnist")  # train/test images/labels, as torchvision names them


def load_mnist(root: str, download: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST as (train_x uint8 [N, 28, 28], train_y, test_x, test_y): `load_idx` of `root`/MNIST/raw."""
    return load_idx(root, "mnist", None, download)
