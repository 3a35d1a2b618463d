"""The papers' `data=` presets (conf/data/*.yaml): each maps its options, as they always were, onto a
dataset and a partitioner and composes them (`composed`). Nothing here makes rows: the sources are
`fedrun.data.datasets`, the splits `fedrun.data.partitioners.paper`.
"""
from __future__ import annotations

from .composed import composed
from .datasets.cifar import PAD_FILLS, Cifar
from .datasets.idx import Idx
from .datasets.synthetic import Synthetic, check_settings
from .federated import FederatedData
from .partitioners.generic import Natural
from .partitioners.paper import Paper004, PerFedAvgPaper, PfedmeAuthors, PfedmePaper


def synthetic(num_clients: int = 100, alpha: float = 0.5, beta: float = 0.5, iid: bool = False, size_factor: int = 5,
              dim: int = 60, num_classes: int = 10, train_frac: float = 0.9, seed: int = 0,
              cache_dir: str | None = None, chunk_len: int = 256) -> FederatedData:
    """Power-law Synthetic(alpha, beta) of FedProx / pFedMe, its own clients (`datasets.synthetic`)."""
    settings = dict(num_clients=num_clients, alpha=alpha, beta=beta, iid=iid, size_factor=size_factor, dim=dim,
                    num_classes=num_classes, train_frac=train_frac, seed=seed)
    check_settings(**settings)  # named as this preset's options: data.<name>
    return composed(Synthetic(**settings), Natural(), cache_dir, chunk_len)


def mnist_perfedavg(root: str = "data", n: int = 10, a: int = 200, test_a: int | None = None, seed: int = 0,
                    download: bool = True, cache_dir: str | None = None, chunk_len: int = 256) -> FederatedData:
    """MNIST 0-4/5-9 split of Per-FedAvg (papers 000/001 Sec. 5), on train and test data alike
    (`partitioners.paper.PerFedAvgPaper`)."""
    return composed(Idx("mnist", root, download), PerFedAvgPaper(n, a, test_a, seed), cache_dir, chunk_len)


def mnist_pfedme(root: str = "data", num_clients: int = 20, labels_per_client: int = 2, train_frac: float = 0.75,
                 seed: int = 0, download: bool = True, cache_dir: str | None = None,
                 chunk_len: int = 256) -> FederatedData:
    """MNIST split of pFedMe (paper 002 Sec. 5.1; `partitioners.paper.PfedmePaper`)."""
    return composed(Idx("mnist", root, download), PfedmePaper(num_clients, labels_per_client, train_frac, seed),
                    cache_dir, chunk_len)


def mnist_pfedme_authors(root: str = "data", num_clients: int = 20, labels_per_client: int = 2, seed: int = 1,
                         train_frac: float = 0.75, download: bool = True, cache_dir: str | None = None,
                         chunk_len: int = 256) -> FederatedData:
    """pFedMe's MNIST exactly as the authors' generator made it for the paper, with their per-pixel
    standardization (`partitioners.paper.PfedmeAuthors`). NOT a clean benchmark: 89% of the pooled
    test rows are also some client's training rows; `data=mnist_pfedme` is the split the paper describes."""
    return composed(Idx("mnist", root, download, normalize="pixel"),
                    PfedmeAuthors(num_clients, labels_per_client, seed, train_frac), cache_dir, chunk_len)


def cifar(root: str = "data", dataset: str = "cifar10", split: str = "acid", num_clients: int = 100,
          classes_per_client: int = 5, classes: str = "consecutive", seed: int = 0, download: bool = True,
          cache_dir: str | None = None, chunk_len: int = 256, pad_fill: str = "black") -> FederatedData:
    """CIFAR-10/100 ACID or ALID split of paper 004 (paper 004 Sec. 3; `partitioners.paper.Paper004`)."""
    if dataset not in ("cifar10", "cifar100"):
        raise ValueError(f"data.dataset={dataset!r} is not one of ['cifar10', 'cifar100']")
    if pad_fill not in PAD_FILLS:
        raise ValueError(f"data.pad_fill={pad_fill!r} is not one of {list(PAD_FILLS)}")
    return composed(Cifar(dataset, root, download, pad_fill),
                    Paper004(num_clients, classes_per_client, classes, seed, split), cache_dir, chunk_len)
