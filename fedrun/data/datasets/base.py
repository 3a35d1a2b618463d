"""What every data source gives the composition (`fedrun.data.composed`), and the file helpers the
sources share.

A source is a small class chosen by its `conf/dataset/<name>.yaml`'s `_target_`. Its `__init__`
checks its options without reading anything (a bad option is one line before any work); `load()`
returns the `Rows`; `files()` names the files whose content keys the data cache; `settings()` is
every option that shapes the rows (the cache key; never the root or download).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np


@dataclass
class Rows:
    """A dataset's rows as it ships them: train and test, normalized, with labels 0..num_classes-1."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    groups: tuple[np.ndarray, np.ndarray] | None = None  # the rows' natural groups (writer ids), train and test
    augment_fill: np.ndarray | None = None  # [channels] value the training augmentation pads with
    vocab_size: int | None = None  # rows of token ids: how many ids they use (a text model's embedding rows)


class Dataset:
    """The contract of a data source (see the module docstring)."""

    name: str = ""  # in cache file names, FederatedData.name and messages (e.g. mnist, cifar10)
    has_groups: bool = False  # its rows come with natural groups (writer ids): partition=natural works
    augment: str | None = None  # the training batches' augmentation (`augment.AUGMENTATIONS`)

    def __init__(self, root: str = "data", download: bool = True) -> None:
        self.root, self.download = root, download

    num_classes: int  # known from the options alone (checks before any reading use it)

    def settings(self) -> dict:
        """The options that shape the rows (the cache key)."""
        return {k: v for k, v in vars(self).items() if k not in ("root", "download")}

    def files(self) -> dict[str, str | None]:
        """name -> path of each file the rows are read from (None: not there); content-hashed into the cache key."""
        return {}

    def load(self) -> Rows:
        raise NotImplementedError


def choice(option: str, value, allowed) -> None:
    """ValueError naming `option` and the allowed values unless `value` is one of them."""
    if value not in allowed:
        raise ValueError(f"{option}={value!r}: allowed one of {', '.join(map(str, allowed))}")


def present(folder: str, names: list[str]) -> dict[str, str | None]:
    """name -> the path of `folder`/name (or name.gz) when it exists, else None."""
    return {f: next((p for p in (os.path.join(folder, f), os.path.join(folder, f + ".gz")) if os.path.exists(p)), None)
            for f in names}


def download_into(root: str, leaves: list[str], fetch) -> str | None:
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


def corrupt(path: str, what: str) -> str:
    return (f"{os.path.abspath(path)} is {what}; delete it and download the dataset again "
            f"(or copy a good copy there)")


def all_present(folder: str, names: list[str]) -> bool:
    return all(os.path.exists(os.path.join(folder, f)) for f in names)

