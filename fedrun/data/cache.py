"""The data cache: a built dataset (every client's rows) kept in `cache_dir`, keyed by every setting
that shapes it and by the content of the files it was read from, so a second run with the same data
settings starts at once.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys

import numpy as np
import torch

from .federated import ClientSplit, FederatedData

_CACHE_VERSION = 1


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
            if blob is not None and not _labels_fit(blob):  # written before its reader refused such labels
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


def _labels_fit(blob) -> bool:
    """Every label of a cache file's rows is one of its 0..num_classes-1 (a file cached by a reader
    that let a label 100 of CIFAR-100 through would otherwise stop training mid-run on every use)."""
    try:
        k = int(blob["num_classes"])
        return all(len(y) == 0 or (int(y.min()) >= 0 and int(y.max()) < k)
                   for y in (blob["train"]["y"], blob["test"]["y"]))
    except Exception:  # noqa: BLE001 - a blob of another layout: rebuilt
        return False


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
