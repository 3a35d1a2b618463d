"""Federated datasets: a dataset (`datasets/`, one module per source) times a partition
(`partitioners/`), composed by `composed.composed`; the papers' `data=` presets in `presets`. Every
route returns a FederatedData on the CPU; the run moves it to its device. Built data is cached in
`cache_dir` (`cache`).

The names below are imported on first use (`__getattr__`): a data source's file check
(`fedrun.data.datasets.idx.load_mnist` on a folder without MNIST) runs and fails without importing
torch, so a missing-data error comes before torch's ~3 s import, not after it."""
from __future__ import annotations

import importlib
import sys
import types

from ..errors import DataMissingError

# name -> the module of this package that defines it
_HOME = {"ClientSplit": "federated", "FederatedData": "federated", "augment": "augment", "file_digests": "cache",
         **dict.fromkeys(("synthetic", "mnist_perfedavg", "mnist_pfedme", "mnist_pfedme_authors", "cifar"), "presets")}

__all__ = ["ClientSplit", "FederatedData", "DataMissingError", "augment", "file_digests", "synthetic",
           "mnist_perfedavg", "mnist_pfedme", "mnist_pfedme_authors", "cifar"]


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """`fedrun.data.augment` is the function, as when this package imported it eagerly: importing the
    submodule augment.py sets the package's attribute of that name to the module, this keeps the function."""

    def __setattr__(self, name: str, value) -> None:
        if name == "augment" and isinstance(value, types.ModuleType):
            value = value.augment
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
