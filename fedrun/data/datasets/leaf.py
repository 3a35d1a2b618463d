"""LEAF's JSON user files (FEMNIST): rows grouped by writer, so `partition=natural` gives one client
per writer. Pixels as LEAF wrote them (in [0, 1]), normalized by the training rows' mean and std.
JSON only: nothing in the files can run code; fedrun never downloads LEAF data.
"""
from __future__ import annotations

import os

import numpy as np

from ...errors import DataCorruptError, DataMissingError
from .base import Dataset, Rows, choice


class Leaf(Dataset):
    """`dataset=femnist` (conf/dataset): `root`/<name>/data/{train,test}/*.json, as LEAF's scripts write them."""

    has_groups = True

    def __init__(self, name: str = "femnist", root: str = "data", download: bool = False) -> None:
        choice("dataset.name", name, LEAF_SHAPES)
        super().__init__(root, download)
        self.name = name

    @property
    def num_classes(self) -> int:
        return LEAF_SHAPES[self.name][1]

    def files(self) -> dict[str, str | None]:
        return leaf_files(self.root, self.name)

    def load(self) -> Rows:
        trx, try_, trw, tex, tey, tew = load_leaf(self.root, self.name)
        mean, std = float(trx.mean()), float(trx.std()) or 1.0
        return Rows((trx - mean) / std, try_, (tex - mean) / std, tey, self.num_classes, groups=(trw, tew))


def leaf_files(root: str, dataset: str) -> dict[str, str | None]:
    """name -> path of every JSON file under `root`/<dataset>/data/{train,test} (the cache key's files)."""
    root = os.path.abspath(root)
    sub = [os.path.join(dataset, "data", s) for s in ("train", "test")]
    return {f: os.path.join(root, f) for f in sorted(os.path.join(d, f) for d in sub
                                                     if os.path.isdir(os.path.join(root, d))
                                                     for f in os.listdir(os.path.join(root, d)) if f.endswith(".json"))}


LEAF_SHAPES = {"femnist": (784, 62)}  # dataset -> (features per row, labels 0..n-1)

def leaf_blob(path: str, dataset: str):
    """(users, user_data, num_samples or None, bad) of one LEAF JSON file, its metadata checked
    against its rows; `bad(what)` is the DataCorruptError naming the file and the fix, in one line
    (a torn or foreign file is one)."""
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
                  f"\"user_data\" holds {len(data)}"
                  + (f" ({len(extra)} not listed, e.g. {extra[0]!r})" if extra else "")
                  + (f" ({len(missing)} without rows, e.g. {missing[0]!r})" if missing else "")
                  + (" (a user listed twice)" if not extra and not missing else ""))
    counts = blob.get("num_samples")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        raise bad(f"a LEAF user file whose metadata contradicts its rows: \"num_samples\" is not {len(users)} counts, "
                  f"one per user")
    return users, data, counts, bad


def _leaf_users(path: str, dataset: str):
    """(user, x float32 [n, features], y int64 [n]) of each user in one LEAF JSON file (FEMNIST's
    pixel rows); a torn or foreign file is a DataCorruptError naming it and the fix, in one line."""
    users, data, counts, bad = leaf_blob(path, dataset)
    width, classes = LEAF_SHAPES[dataset]
    out = []
    for i, user in enumerate(users):
        u = data.get(user) if isinstance(user, str) else None
        if not isinstance(u, dict) or "x" not in u or "y" not in u:
            raise bad(f"not a LEAF user file: user {user!r} has no x and y in user_data")
        try:
            y = np.asarray(u["y"])
            x = np.asarray(u["x"], dtype=np.float32)
        except (ValueError, TypeError, OverflowError):  # ragged rows (mixed feature widths) land here too
            raise bad(f"not a LEAF user file: user {user!r}'s x or y is not numbers in rows of one width") from None
        if y.dtype.kind not in "iu" and not (y.size == 0 and y.dtype.kind == "f"):  # 3.7 or true is not a label
            raise bad(f"not {dataset} rows: user {user!r}'s y is not integer labels ({str(u['y'])[:40]})")
        y = y.astype(np.int64).reshape(-1)
        if x.ndim < 1 or len(x) != len(y):
            raise bad(f"not a LEAF user file: user {user!r} has {len(x) if x.ndim else 0} rows of x but {len(y)} of y")
        if counts is not None and counts[i] != len(y):
            raise bad(f"a LEAF user file whose metadata contradicts its rows: \"num_samples\" gives user {user!r} "
                      f"{counts[i]!r} rows, its user_data holds {len(y)}")
        x = x.reshape(len(y), -1) if len(y) else np.zeros((0, width), np.float32)  # a user of no rows: [0, width]
        if not np.isfinite(x).all():  # JSON's NaN / Infinity (json.dump writes them) would train to NaN
            r = int(np.flatnonzero(~np.isfinite(x).all(1))[0])
            raise bad(f"not {dataset} rows: user {user!r}'s row {r} holds a pixel that is not a finite number")
        if len(y) and x.shape[1] != width:
            raise bad(f"not {dataset} rows: user {user!r}'s rows have {x.shape[1]} features, {dataset} has {width} "
                      f"(28 x 28 pixels)")
        if len(y) and (y.min() < 0 or y.max() >= classes):
            v = int(y[(y < 0) | (y >= classes)][0])
            raise bad(f"not {dataset} rows: user {user!r} has label {v}, outside {dataset}'s labels 0..{classes - 1}")
        out.append((user, x, y))
    return out


def load_leaf(root: str, dataset: str = "femnist", users_of=None) -> tuple[np.ndarray, ...]:
    """A LEAF dataset as its scripts write it: `root`/<dataset>/data/{train,test}/*.json, each
    {"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}.

    Returns (train_x float32 [N, 784], train_y, train_writers, test_x, test_y, test_writers); writer
    ids are the user names. JSON only: nothing in the files can run code. `users_of(path, dataset)`
    reads one file's users as (user, x, y) (default: FEMNIST's pixel rows, `_leaf_users`)."""
    base = os.path.join(root, dataset, "data")
    folders = [os.path.join(base, s) for s in ("train", "test")]
    files = [sorted(f for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else [] for d in folders]
    if not all(files):
        raise DataMissingError(
            f"dataset={dataset} not found: expected LEAF's JSON user files (*.json) in {os.path.abspath(folders[0])} "
            f"and {os.path.abspath(folders[1])} (fedrun does not download LEAF data: run LEAF's "
            f"data/{dataset}/preprocess.sh, then point dataset.root (or $FEDRUN_DATA) at the folder that holds "
            f"{dataset}/data)")
    out = []
    for d, names in zip(folders, files):
        xs, ys, ws = [], [], []
        for name in names:
            path = os.path.join(d, name)
            for user, x, y in (users_of or _leaf_users)(path, dataset):
                xs.append(x)
                ys.append(y)
                ws.append(np.full(len(y), user, dtype=object))
        out += [np.concatenate(xs), np.concatenate(ys), np.concatenate(ws).astype(str)]
    return tuple(out)
