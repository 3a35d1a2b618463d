"""Federated datasets: a dataset (`datasets/`, one module per source) times a partition
(`partitioners/`), composed by `composed.composed`; the papers' `data=` presets in `presets`. Every
route returns a FederatedData on the CPU; the run moves it to its device. Built data is cached in
`cache_dir` (`cache`)."""
from __future__ import annotations

from ..errors import DataMissingError
from .augment import augment
from .cache import file_digests
from .federated import ClientSplit, FederatedData
from .presets import cifar, mnist_perfedavg, mnist_pfedme, mnist_pfedme_authors, synthetic

__all__ = ["ClientSplit", "FederatedData", "DataMissingError", "augment", "file_digests", "synthetic",
           "mnist_perfedavg", "mnist_pfedme", "mnist_pfedme_authors", "cifar"]
