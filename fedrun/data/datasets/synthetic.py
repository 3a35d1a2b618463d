"""Power-law Synthetic(alpha, beta) data of FedProx (paper 002 Sec. 5.1 uses pFedMe's copy of it).

Facts reproduced (FedProx's generator as pFedMe's code copies it): 60 features, 10 classes; samples per client =
(int(lognormal(4, 2)) + 50) * size_factor; u_k ~ N(0, alpha), W_k ~ N(u_k, 1), b_k ~ N(u_k, 1);
B_k ~ N(0, beta), v_k ~ N(B_k, 1); x ~ N(v_k, diag(j^-1.2)), j = 1..60; y = argmax(x W_k + b_k);
each client's data shuffled, then its first int(train_frac * n) rows train, the rest test.

The model parameters and samples come from one numpy RandomState(seed) stream, drawn in the order
of the reference generators, so that a seed gives the same rows per client as running them after
np.random.seed(seed):
- non-iid (pFedMe data/Synthetic/generate_synthetic_05_05.py, which seeds 0; FedProx
  data/synthetic_{0_0,0.5_0.5,1_1}/generate_synthetic.py, which do not seed): sizes, u (all
  clients), B (all clients), v_k for every client, then per client k in turn W_k, b_k, x_k;
- iid (FedProx data/synthetic_iid/generate_iid.py): sizes, one W and b shared by all clients,
  then x_k per client with v_k = 0; alpha and beta take no part (both must be 0). (The iid=1
  branch inside the non-iid files, never called by their main(), draws otherwise; not offered.)
pFedMe's setting is the default (100 clients, size_factor 5, alpha = beta = 0.5; seed 0 gives its
205,795 samples); FedProx's is num_clients=30, size_factor=1.

The reference generators shuffle each client only after all clients are drawn, with Python's
unseeded `random.shuffle`, so their train/test cut is not reproducible; fedrun shuffles client k
with its own seeded generator, np.random.default_rng([seed, k, SHUFFLE_STREAM]) (PCG64), which never
touches the draws' stream. Rows per client (train and test together) therefore equal the
reference's exactly (x stored as float32); which of them are test rows differs.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from ...device import physical_memory
from .base import Dataset, Rows

# Bumped whenever the same settings would produce different data: it is part of the cache key.
# 2: draws in the reference order, shuffle on its own stream (1 shuffled with the draws' stream).
DRAW_VERSION = 2
SHUFFLE_STREAM = 0x5EED5  # tells the shuffle's SeedSequence apart from any other use of `seed`


class Synthetic(Dataset):
    """`data=synthetic` (its own clients: partition=natural) and `dataset=synthetic` (any partition of
    its rows). Rows come grouped by the client that drew them."""

    has_groups = True

    def __init__(self, num_clients: int = 100, alpha: float = 0.5, beta: float = 0.5, iid: bool = False,
                 size_factor: int = 5, dim: int = 60, num_classes: int = 10, train_frac: float = 0.9,
                 seed: int = 0) -> None:
        self.settings_ = dict(num_clients=num_clients, alpha=alpha, beta=beta, iid=iid, size_factor=size_factor,
                              dim=dim, num_classes=num_classes, train_frac=train_frac, seed=seed)
        check_settings(**self.settings_, prefix="dataset")
        self.name = "synthetic_iid" if iid else f"synthetic_{alpha:g}_{beta:g}"

    @property
    def num_classes(self) -> int:
        return int(self.settings_["num_classes"])

    def settings(self) -> dict:
        return {**self.settings_, "draw": DRAW_VERSION}  # a cache file of an older generator is never served

    def load(self) -> Rows:
        train, test = generate_synthetic(**self.settings_)
        cat = lambda parts, i: np.concatenate([p[i] for p in parts])
        owner = lambda parts: np.repeat(np.arange(len(parts)), [len(p[1]) for p in parts])
        return Rows(cat(train, 0), cat(train, 1), cat(test, 0), cat(test, 1), self.num_classes,
                    groups=(owner(train), owner(test)))


def check_settings(num_clients, alpha, beta, iid, size_factor, dim, num_classes, train_frac, seed=0,
                   prefix="data") -> None:
    """Raises ValueError naming the first bad option (`prefix`.name: the config node they were given in)."""
    for name, v in (("num_clients", num_clients), ("size_factor", size_factor), ("dim", dim),
                    ("num_classes", num_classes), ("seed", seed)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{prefix}.{name}={v!r}: allowed an integer")
    for name, v in (("alpha", alpha), ("beta", beta), ("train_frac", train_frac)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{prefix}.{name}={v!r}: allowed a number")
    if seed < 0:
        raise ValueError(f"{prefix}.seed={seed}: allowed an integer >= 0")
    if int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"{prefix}.num_clients={num_clients}: allowed an integer >= 1")
    if int(size_factor) != size_factor or size_factor < 1:
        raise ValueError(f"{prefix}.size_factor={size_factor}: allowed an integer >= 1 (pFedMe 5, FedProx 1)")
    # rows drawn: (lognormal(4, 2) + 50) * size_factor per client, mean (e^6 + 50) * size_factor;
    # generated in float64 with the label: (dim + 1) * 8 bytes a row. Refused above a quarter of memory.
    row_bytes = (math.exp(6) + 50) * size_factor * (int(dim) + 1) * 8
    limit = physical_memory() // 4
    if limit and num_clients * row_bytes > limit:
        raise ValueError(f"{prefix}.num_clients={num_clients}: the synthetic generator would draw about "
                         f"{num_clients * row_bytes / 2**30:.0f} GiB, more than a quarter of this machine's "
                         f"{physical_memory() / 2**30:.0f} GiB; allowed: 1..{int(limit // row_bytes)} "
                         f"(with {prefix}.dim={dim}, {prefix}.size_factor={size_factor})")
    if int(dim) != dim or dim < 1:
        raise ValueError(f"{prefix}.dim={dim}: allowed an integer >= 1")
    if int(num_classes) != num_classes or num_classes < 2:
        raise ValueError(f"{prefix}.num_classes={num_classes}: allowed an integer >= 2")
    if not 0 < train_frac < 1:
        raise ValueError(f"{prefix}.train_frac={train_frac}: allowed strictly between 0 and 1")
    if iid not in (True, False):
        raise ValueError(f"{prefix}.iid={iid!r}: allowed true or false")
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not v >= 0:
            raise ValueError(f"{prefix}.{name}={v}: allowed a number >= 0 (a standard deviation)")
        if iid and v != 0:
            raise ValueError(f"{prefix}.{name}={v}: must be 0 with {prefix}.iid=true "
                             f"(the iid generator has no client priors)")


def generate_synthetic(
    num_clients: int = 100,
    alpha: float = 0.5,
    beta: float = 0.5,
    iid: bool = False,
    size_factor: int = 5,
    dim: int = 60,
    num_classes: int = 10,
    train_frac: float = 0.9,
    seed: int = 0,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]]]:
    """Returns (train, test): per client a pair (x float32 [n, dim], y int64 [n])."""
    check_settings(num_clients, alpha, beta, iid, size_factor, dim, num_classes, train_frac)
    num_clients, size_factor, dim, num_classes = int(num_clients), int(size_factor), int(dim), int(num_classes)
    rng = np.random.RandomState(seed)
    sizes = (rng.lognormal(4, 2, num_clients).astype(int) + 50) * size_factor
    cov_x = np.diag(np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2))
    _, s, v = np.linalg.svd(cov_x)  # as numpy's legacy multivariate_normal factors cov_x
    factor = np.sqrt(s)[:, None] * v
    if iid:
        w_all = rng.normal(0, 1, (dim, num_classes))
        b_all = rng.normal(0, 1, num_classes)
        mean_x = np.zeros((num_clients, dim))
    else:
        mean_w = rng.normal(0, alpha, num_clients)
        mean_b = mean_w
        big_b = rng.normal(0, beta, num_clients)
        mean_x = np.stack([rng.normal(big_b[k], 1, dim) for k in range(num_clients)])
    train, test = [], []
    for k in range(num_clients):
        if iid:
            w, b = w_all, b_all
        else:
            w = rng.normal(mean_w[k], 1, (dim, num_classes))
            b = rng.normal(mean_b[k], 1, num_classes)
        # rng.multivariate_normal(mean_x[k], cov_x, n) draws n x dim standard normals and multiplies
        # them by a factor of cov_x from an SVD it recomputes on every call (100 SVDs, most of the
        # generation time with BLAS threads contending); the factor is computed once, and the rows
        # are the same bytes (tests/data: the digests pinned from the authors' generator)
        x = np.dot(rng.standard_normal((sizes[k], dim)), factor)
        x += mean_x[k]
        y = np.argmax(x @ w + b, axis=1)
        # shuffling here is safe: its generator is not `rng`, so later clients' draws are unchanged
        perm = np.random.default_rng([seed, k, SHUFFLE_STREAM]).permutation(len(y))
        x, y = x[perm].astype(np.float32), y[perm].astype(np.int64)
        n_train = int(train_frac * len(y))
        train.append((x[:n_train], y[:n_train]))
        test.append((x[n_train:], y[n_train:]))
    return train, test


def rows_digest(x: np.ndarray, y: np.ndarray) -> str:
    """Order-free fingerprint of one client's rows: sha256 of its (x as float32, y as int64) rows, sorted.

    Two clients holding the same multiset of rows, in any order, have the same digest; this is how
    fedrun's data is checked against the reference generators, whose shuffle is unseeded.
    """
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(len(y), -1)
    y = np.asarray(y).astype("<i8").reshape(len(y), 1)
    rows = np.concatenate([x.astype("<f4").view(np.uint8), y.view(np.uint8)], axis=1)
    rows = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1]))).ravel()
    return hashlib.sha256(np.sort(rows).tobytes()).hexdigest()
