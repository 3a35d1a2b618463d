"""Raw datasets: torchvision when the files are there (or can be downloaded), a clear error if not."""
from __future__ import annotations

import contextlib
import os
import pickle

import numpy as np

from ..errors import DataCorruptError, DataMissingError


def _download(root: str, leaves: list[str], fetch) -> str | None:
    """Runs `fetch()` (a torchvision download into `root`); None when it worked, else why not, in a
    few words. A failed download leaves nothing behind: of `root` and `leaves` (the paths under
    `root` it writes, e.g. MNIST/raw), those that were not there before are removed again (an
    offline run left empty MNIST/raw folders)."""
    import shutil

    paths = [root] + [os.path.join(root, *leaf.split("/")[:i + 1]) for leaf in leaves
                      for i in range(len(leaf.split("/")))]
    new = [p for p in dict.fromkeys(paths) if not os.path.lexists(p)]
    try:
        fetch()
        return None
    except Exception as e:  # offline: URLError, timeouts, torchvision's RuntimeError, ...
        for p in reversed(new):  # deepest first; root only when nothing else is in it
            if os.path.isdir(p) and not os.path.islink(p):
                if p == root:
                    with contextlib.suppress(OSError):
                        os.rmdir(p)
                else:
                    shutil.rmtree(p, ignore_errors=True)
            elif os.path.lexists(p):
                with contextlib.suppress(OSError):
                    os.remove(p)
        return f"download failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"


MNIST_FILES = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
]


def _mnist_present(root: str) -> bool:
    raw = os.path.join(root, "MNIST", "raw")
    return all(os.path.exists(os.path.join(raw, f)) for f in MNIST_FILES)


def load_mnist(root: str, download: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST as (train_x uint8 [N,28,28], train_y, test_x, test_y) via torchvision.

    Looks in `root`/MNIST/raw; downloads there when the files are missing and `download` is set.
    """
    from torchvision.datasets import MNIST

    if not _mnist_present(root):
        why = "download=false"
        if download:
            why = _download(root, ["MNIST/raw"], lambda: (MNIST(root, train=True, download=True),
                                                          MNIST(root, train=False, download=True))) or why
        if not _mnist_present(root):
            raise DataMissingError(
                f"MNIST not found: expected {', '.join(MNIST_FILES)} in "
                f"{os.path.abspath(os.path.join(root, 'MNIST', 'raw'))} ({why}); copy them there "
                f"or point dataset.root (or $FEDRUN_DATA) at the folder that holds MNIST/raw"
            )
    for name in MNIST_FILES:
        _check_idx(os.path.join(root, "MNIST", "raw", name))
    tr = MNIST(root, train=True, download=False)
    te = MNIST(root, train=False, download=False)
    raw = os.path.join(root, "MNIST", "raw")
    for ds, (images, labels) in ((tr, MNIST_FILES[:2]), (te, MNIST_FILES[2:])):
        check_labelled_images(ds.data.numpy(), ds.targets.numpy(), os.path.join(raw, images), os.path.join(raw, labels),
                              *IDX_LABELS["mnist"], "MNIST")
    return tr.data.numpy(), tr.targets.numpy(), te.data.numpy(), te.targets.numpy()


def _check_idx(path: str) -> None:
    """DataCorruptError naming `path` unless it is a whole uint8 idx file: magic 0x0000 08 <ndim>,
    ndim big-endian sizes, then exactly their product of bytes (torchvision would fail on a torn
    file with a bare AssertionError or a numpy shape error)."""
    import struct

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(4)
        if len(head) < 4 or head[:3] != b"\x00\x00\x08" or not 1 <= head[3] <= 3:
            raise DataCorruptError(_corrupt(path, "not an MNIST idx file of bytes (its first 4 bytes are not "
                                                  "00 00 08 01..03)"))
        raw = f.read(4 * head[3])
    if len(raw) < 4 * head[3]:
        raise DataCorruptError(_corrupt(path, "truncated in its header"))
    dims = struct.unpack(f">{head[3]}I", raw)
    want = 4 + 4 * head[3] + int(np.prod(dims))
    if size != want:
        raise DataCorruptError(_corrupt(path, f"{size} bytes, but its header ({' x '.join(map(str, dims))}) "
                                              f"says {want}"))


CIFAR_FILES = {
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels"),
    100: ("cifar-100-python", ["train"], ["test"], b"fine_labels"),
}


def _all_present(folder: str, names: list[str]) -> bool:
    return all(os.path.exists(os.path.join(folder, f)) for f in names)


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
        raise DataCorruptError(_corrupt(path, f"not a readable CIFAR batch ({type(e).__name__}: "
                                              f"{str(e).splitlines()[0][:160] if str(e) else 'truncated?'})")) from None
    if not isinstance(d, dict):
        raise DataCorruptError(_corrupt(path, f"holds a {type(d).__name__}, not the dict of a CIFAR batch"))
    return d


def _corrupt(path: str, what: str) -> str:
    return (f"{os.path.abspath(path)} is {what}; delete it and download the dataset again "
            f"(or copy a good copy there)")


def _read_cifar(paths: list[str], label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p in paths:
        d = read_cifar_batch(p)
        x, y = d.get(b"data"), d.get(label_key)
        if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            got = (f"{x.dtype} array of shape {list(x.shape)}" if isinstance(x, np.ndarray)
                   else type(x).__name__)
            raise DataCorruptError(_corrupt(p, f"not a CIFAR batch: its {b'data'!r} is a {got}, expected a "
                                               f"uint8 array of shape [N, 3072]"))
        try:
            y = np.asarray(y, dtype=np.int64)
        except (TypeError, ValueError):
            y = None
        if y is None or y.ndim != 1 or len(y) != len(x):
            raise DataCorruptError(_corrupt(p, f"not a CIFAR batch: its {label_key!r} is not {len(x)} integer "
                                               f"labels, one per image"))
        xs.append(x.reshape(-1, 3, 32, 32))
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def load_cifar(root: str, num_classes: int = 10, download: bool = True, root_option: str = "dataset.root (or $FEDRUN_DATA)"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CIFAR-10/100 as (train_x uint8 [N,3,32,32], train_y, test_x, test_y) from the python pickles.

    Reads `root`/cifar-10-batches-py/{data_batch_1..5,test_batch} or `root`/cifar-100-python/
    {train,test} itself (torchvision would check every file's md5); downloads them there through
    torchvision when they are missing and `download` is set. `root_option`: the option that set
    `root`, as the missing-files message names it (`data.root` for data=cifar*, `dataset.root`).
    """
    if num_classes not in CIFAR_FILES:
        raise ValueError(f"CIFAR has 10 or 100 classes, not {num_classes}")
    folder, train_files, test_files, label_key = CIFAR_FILES[num_classes]
    base = os.path.join(root, folder)
    names = train_files + test_files
    if not _all_present(base, names):
        why = "download=false"
        if download:
            from torchvision.datasets import CIFAR10, CIFAR100

            source = CIFAR10 if num_classes == 10 else CIFAR100
            why = _download(root, [folder, source.filename], lambda: source(root, train=True, download=True)) or why
        if not _all_present(base, names):
            raise DataMissingError(
                f"CIFAR-{num_classes} not found: expected {', '.join(names)} in {os.path.abspath(base)} "
                f"({why}); copy them there or point {root_option} at the folder that holds {folder}"
            )
    trx, try_ = _read_cifar([os.path.join(base, f) for f in train_files], label_key)
    tex, tey = _read_cifar([os.path.join(base, f) for f in test_files], label_key)
    return trx, try_, tex, tey


# ---------------------------------------------------------------------------- idx files (MNIST family)

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
        raise DataCorruptError(_corrupt(name, f"not readable as {'gzip' if gz else 'a file'} ({type(e).__name__}: "
                                              f"{str(e).splitlines()[0][:120] if str(e) else 'truncated?'})")) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or not 1 <= data[3] <= 4:
        raise DataCorruptError(_corrupt(name, f"not an idx file of bytes ({len(data)} bytes; an idx file starts "
                                              f"00 00 08 01..04)"))
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise DataCorruptError(_corrupt(name, f"truncated in its header ({len(data)} bytes)"))
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise DataCorruptError(_corrupt(name, f"{arr.size} bytes of data, but its header ({' x '.join(map(str, shape))}) "
                                              f"says {int(np.prod(shape))} (a torn copy?)"))
    return arr.reshape(shape)


def check_labelled_images(images: np.ndarray, labels: np.ndarray, image_file: str, label_file: str,
                          lowest: int, count: int, what: str) -> None:
    """DataCorruptError in one line unless `images` is [n, 28, 28], `labels` is [n] (the same n: a
    label file one entry short would shift every later image onto the next row's label) and every
    label is one of the dataset's `count` labels from `lowest` (one 0xff byte would make a
    256-class problem)."""
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataCorruptError(_corrupt(image_file, f"not a file of 28 x 28 images (its header says "
                                                    f"{' x '.join(map(str, images.shape))})"))
    if labels.ndim != 1:
        raise DataCorruptError(_corrupt(label_file, f"not a file of labels (its header says "
                                                    f"{' x '.join(map(str, labels.shape))}, expected one dimension)"))
    if len(images) != len(labels):
        raise DataCorruptError(f"{os.path.abspath(image_file)} holds {len(images)} images but "
                               f"{os.path.abspath(label_file)} holds {len(labels)} labels; they must agree, one label "
                               f"per image: delete both and download the dataset again (or copy good copies there)")
    bad = np.flatnonzero((labels < lowest) | (labels >= lowest + count))
    if len(bad):
        raise DataCorruptError(_corrupt(label_file, f"a label file with label {int(labels[bad[0]])} at row {int(bad[0])} "
                                                    f"({len(bad)} row{'s' if len(bad) > 1 else ''} outside {what}'s labels "
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
            why = _download(root, [f"{folder}/raw"], lambda: (source(root, train=True, download=True),
                                                              source(root, train=False, download=True))) or why
        elif download:
            why = "EMNIST is not downloaded by fedrun (~560 MB zip)"
        if not present():
            raise DataMissingError(
                f"dataset={dataset} not found: expected {', '.join(names)} (or .gz) in {os.path.abspath(raw)} "
                f"({why}); copy them there or point dataset.root (or $FEDRUN_DATA) at the folder that holds {folder}/raw"
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


# ---------------------------------------------------------------------------- LEAF JSON (FEMNIST)

LEAF_SHAPES = {"femnist": (784, 62)}  # dataset -> (features per row, labels 0..n-1)

def _leaf_users(path: str, dataset: str):
    """(user, x float32 [n, features], y int64 [n]) of each user in one LEAF JSON file; a torn or
    foreign file is a DataCorruptError naming it and the fix, in one line."""
    import json

    def bad(what: str) -> DataCorruptError:
        return DataCorruptError(f"{os.path.abspath(path)} is {what}; delete it and run LEAF's "
                                f"data/{dataset}/preprocess.sh again (or copy a good copy there)")

    try:
        with open(path, "rb") as f:
            blob = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise bad(f"not valid JSON ({str(e).splitlines()[0][:120] if str(e) else 'empty?'}; a torn copy?)") from None
    if not (isinstance(blob, dict) and isinstance(blob.get("users"), list) and isinstance(blob.get("user_data"), dict)):
        raise bad('not a LEAF user file (expected {"users": [...], "user_data": {user: {"x": ..., "y": ...}}})')
    users, data = blob["users"], blob["user_data"]
    if not users:
        raise bad("a LEAF user file with no users")
    if len(set(map(str, users))) != len(users) or set(map(str, users)) != set(data):
        extra, missing = sorted(set(data) - set(map(str, users))), sorted(set(map(str, users)) - set(data))
        raise bad(f"a LEAF user file whose metadata contradicts its rows: \"users\" lists {len(users)} users, "
                  f"\"user_data\" holds {len(data)}" + (f" ({len(extra)} not listed, e.g. {extra[0]!r})" if extra else "")
                  + (f" ({len(missing)} without rows, e.g. {missing[0]!r})" if missing else "")
                  + (" (a user listed twice)" if not extra and not missing else ""))
    counts = blob.get("num_samples")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        raise bad(f"a LEAF user file whose metadata contradicts its rows: \"num_samples\" is not {len(users)} counts, "
                  f"one per user")
    width, classes = LEAF_SHAPES[dataset]
    out = []
    for i, user in enumerate(users):
        u = data.get(user) if isinstance(user, str) else None
        if not isinstance(u, dict) or "x" not in u or "y" not in u:
            raise bad(f"not a LEAF user file: user {user!r} has no x and y in user_data")
        try:
            y = np.asarray(u["y"], dtype=np.int64).reshape(-1)
            x = np.asarray(u["x"], dtype=np.float32)
        except (ValueError, TypeError):  # ragged rows (mixed feature widths) land here too
            raise bad(f"not a LEAF user file: user {user!r}'s x or y is not numbers in rows of one width") from None
        if x.ndim < 1 or len(x) != len(y):
            raise bad(f"not a LEAF user file: user {user!r} has {len(x) if x.ndim else 0} rows of x but {len(y)} of y")
        if counts is not None and counts[i] != len(y):
            raise bad(f"a LEAF user file whose metadata contradicts its rows: \"num_samples\" gives user {user!r} "
                      f"{counts[i]!r} rows, its user_data holds {len(y)}")
        x = x.reshape(len(y), -1)
        if len(y) and x.shape[1] != width:
            raise bad(f"not {dataset} rows: user {user!r}'s rows have {x.shape[1]} features, {dataset} has {width} "
                      f"(28 x 28 pixels)")
        if len(y) and (y.min() < 0 or y.max() >= classes):
            v = int(y[(y < 0) | (y >= classes)][0])
            raise bad(f"not {dataset} rows: user {user!r} has label {v}, outside {dataset}'s labels 0..{classes - 1}")
        out.append((user, x, y))
    return out


def load_leaf(root: str, dataset: str = "femnist") -> tuple[np.ndarray, ...]:
    """A LEAF dataset as its scripts write it: `root`/<dataset>/data/{train,test}/*.json, each
    {"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}.

    Returns (train_x float32 [N, 784], train_y, train_writers, test_x, test_y, test_writers); writer
    ids are the user names. JSON only: nothing in the files can run code."""
    base = os.path.join(root, dataset, "data")
    folders = [os.path.join(base, s) for s in ("train", "test")]
    files = [sorted(f for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else [] for d in folders]
    if not all(files):
        raise DataMissingError(
            f"dataset={dataset} not found: expected LEAF's JSON user files (*.json) in {os.path.abspath(folders[0])} "
            f"and {os.path.abspath(folders[1])} (fedrun does not download LEAF data: run LEAF's "
            f"data/{dataset}/preprocess.sh, then point dataset.root (or $FEDRUN_DATA) at the folder that holds {dataset}/data)")
    out = []
    for d, names in zip(folders, files):
        xs, ys, ws = [], [], []
        for name in names:
            path = os.path.join(d, name)
            for user, x, y in _leaf_users(path, dataset):
                xs.append(x)
                ys.append(y)
                ws.append(np.full(len(y), user, dtype=object))
        out += [np.concatenate(xs), np.concatenate(ys), np.concatenate(ws).astype(str)]
    return tuple(out)
