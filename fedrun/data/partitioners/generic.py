"""The general partitioners, each a pure function `labels, rng, **options -> list[index array]`
(vectorized over rows: one sort or one `bincount`, never a Python loop over rows, so 1,000 clients over
50,000 labels take milliseconds: `python -m fedrun.bench.partitions`) and the small class that
`conf/partition/<name>.yaml` instantiates, which checks the options once, without data.
"""
from __future__ import annotations

import numpy as np

from .base import Partitioner, PartitionError, _choice, _class_blocks, _cuts, _fraction, _groups, _int, _positive


def iid(labels: np.ndarray, rng: np.random.Generator, num_clients: int) -> list[np.ndarray]:
    """Rows shuffled and cut into `num_clients` parts of equal size (within one row)."""
    num_clients = _int("num_clients", num_clients, 1, len(labels))
    owner = np.empty(len(labels), dtype=np.int64)
    owner[rng.permutation(len(labels))] = np.arange(len(labels)) * num_clients // len(labels)
    return _groups(owner, num_clients, np.arange(len(labels)))


def _dirichlet_rows(k: int, n: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """[k, n] rows of Dirichlet(alpha, ..., alpha) proportions, finite for every alpha > 0.

    Drawn as normalized Gamma(alpha) variables; at alpha ~ 0.01 all n of a row can underflow to 0
    (the NaN peers' trackers report from numpy's dirichlet), and such a row is the distribution's
    limit, a one-hot at a uniformly random client."""
    g = rng.standard_gamma(alpha, size=(k, n))
    s = g.sum(1, keepdims=True)
    dead = s[:, 0] <= 0
    if dead.any():
        g[dead] = 0.0
        g[dead, rng.integers(0, n, int(dead.sum()))] = 1.0
        s = g.sum(1, keepdims=True)
    return g / s


def dirichlet(labels: np.ndarray, rng: np.random.Generator, num_clients: int, alpha: float = 0.5,
              min_size: int = 0, max_redraws: int = 100) -> list[np.ndarray]:
    """Label skew (Hsu et al. 2019): each class's rows dealt over the clients in proportions
    q_k ~ Dirichlet(alpha * 1) (one draw per class), every row used once.

    `min_size`: clients with fewer rows make the whole draw be redrawn (plain rejection, so the
    partition keeps the Dirichlet law conditioned on the minimum; no per-client capping that bends
    it), at most `max_redraws` times, then a PartitionError says which options to change. An
    impossible minimum (num_clients * min_size > rows) is refused before any draw.
    """
    return _dirichlet(labels, rng, _int("num_clients", num_clients, 1, len(labels)), alpha, min_size, max_redraws)


def _dirichlet(labels: np.ndarray, rng: np.random.Generator, num_clients: int, alpha: float, min_size: int,
               max_redraws: int) -> list[np.ndarray]:
    """`dirichlet` for any number of clients (mixture's skewed share may hold fewer rows than clients)."""
    n = len(labels)
    alpha = _positive("alpha", alpha)
    min_size = _int("min_size", min_size, 0)
    max_redraws = _int("max_redraws", max_redraws, 0)
    if num_clients * min_size > n:
        raise PartitionError(f"partition.min_size={min_size}: {num_clients} clients x {min_size} rows exceeds the "
                             f"{n} rows; allowed 0..{n // num_clients}")
    order, _, counts = _class_blocks(labels, rng)
    for _ in range(max_redraws + 1):
        shares = _cuts(counts, _dirichlet_rows(len(counts), num_clients, alpha, rng))  # [K, C]
        sizes = shares.sum(0)
        if sizes.min() >= min_size:
            break
    else:
        raise PartitionError(
            f"partition.min_size={min_size}: no Dirichlet draw in {max_redraws + 1} gave every one of the "
            f"{num_clients} clients >= {min_size} rows (partition.alpha={alpha:g}, {n} rows; the smallest client "
            f"had {sizes.min()}); lower partition.min_size, raise partition.alpha or partition.max_redraws, "
            f"or use fewer clients")
    owner = np.repeat(np.tile(np.arange(num_clients), len(counts)), shares.ravel())
    return _groups(owner, num_clients, order)


def shards(labels: np.ndarray, rng: np.random.Generator, num_clients: int,
           shards_per_client: int = 2) -> list[np.ndarray]:
    """Pathological non-iid (McMahan et al. 2017): rows sorted by label, cut into num_clients *
    shards_per_client shards of equal size (within one row), each client given shards_per_client
    of them at random. Ties within a label are broken at random."""
    n = len(labels)
    num_clients = _int("num_clients", num_clients, 1, n)
    s = _int("shards_per_client", shards_per_client, 1, n // num_clients)
    order = np.lexsort((rng.random(n), labels))
    total = num_clients * s
    shard_of_row = np.arange(n) * total // n
    client_of_shard = rng.permutation(total) // s
    return _groups(client_of_shard[shard_of_row], num_clients, order)


def classes(labels: np.ndarray, rng: np.random.Generator, num_clients: int,
            classes_per_client: int = 2) -> list[np.ndarray]:
    """k classes per client: client c owns classes perm[(c*k + j) mod K], j < k, for a random
    permutation perm of the K classes present (so a client's classes are distinct and every class
    has as many owners as possible alike); each class's rows are split equally among its owners.
    Classes nobody owns (num_clients * k < K) are left out."""
    n = len(labels)
    num_clients = _int("num_clients", num_clients, 1, n)
    order, present, counts = _class_blocks(labels, rng)
    k = _int("classes_per_client", classes_per_client, 1, len(present))
    perm = rng.permutation(len(present))
    owned = perm[(np.arange(num_clients)[:, None] * k + np.arange(k)) % len(present)]  # [C, k] class positions
    owners = [np.flatnonzero((owned == j).any(1)) for j in range(len(present))]
    short = [j for j in range(len(present)) if 0 < counts[j] < len(owners[j])]
    if short:
        j = short[0]
        raise PartitionError(f"partition.classes_per_client={k}: class {present[j]} has {counts[j]} rows for its "
                             f"{len(owners[j])} owners; use fewer clients or fewer classes per client")
    owner = np.full(n, -1, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for j, who in enumerate(owners):  # a loop over classes (<= 100s), each one vectorized
        if len(who):
            owner[start[j]:start[j] + counts[j]] = who[np.arange(counts[j]) * len(who) // counts[j]]
    return _groups(owner, num_clients, order)


QUANTITY_SIZES = ("dirichlet", "lognormal")


def quantity(labels: np.ndarray, rng: np.random.Generator, num_clients: int, sizes: str = "dirichlet",
             alpha: float = 0.5, sigma: float = 1.0, min_size: int = 1) -> list[np.ndarray]:
    """Quantity skew, labels iid: client sizes in proportions q ~ Dirichlet(alpha * 1) (`sizes=dirichlet`)
    or q ∝ exp(N(0, sigma^2)) (`lognormal`); each client first gets `min_size` rows and the rest is
    dealt by q (largest remainders), rows drawn uniformly at random."""
    n = len(labels)
    num_clients = _int("num_clients", num_clients, 1, n)
    if sizes not in QUANTITY_SIZES:
        raise PartitionError(f"partition.sizes={sizes!r}: allowed one of {', '.join(QUANTITY_SIZES)}")
    min_size = _int("min_size", min_size, 0, n // num_clients)
    if sizes == "dirichlet":
        q = _dirichlet_rows(1, num_clients, _positive("alpha", alpha), rng)[0]
    else:
        w = np.exp(rng.normal(0.0, _positive("sigma", sigma), num_clients))
        q = w / w.sum()
    rest = n - num_clients * min_size
    exact = q * rest
    share = np.floor(exact).astype(np.int64)
    share[np.argsort(-(exact - share), kind="stable")[: rest - int(share.sum())]] += 1
    share += min_size
    owner = np.repeat(np.arange(num_clients), share)
    return _groups(owner, num_clients, rng.permutation(n))


def mixture(labels: np.ndarray, rng: np.random.Generator, num_clients: int, iid_frac: float = 0.5,
            alpha: float = 0.5, min_size: int = 0, max_redraws: int = 100) -> list[np.ndarray]:
    """A fraction `iid_frac` of the rows (chosen at random) dealt iid, the rest by Dirichlet(alpha)
    label skew; each client holds its share of both."""
    if not isinstance(iid_frac, (int, float)) or isinstance(iid_frac, bool) or not 0 <= iid_frac <= 1:
        raise PartitionError(f"partition.iid_frac={iid_frac!r}: allowed a fraction in [0, 1]")
    n = len(labels)
    num_clients = _int("num_clients", num_clients, 1, n)
    perm = rng.permutation(n)
    k = int(round(iid_frac * n))
    a, b = perm[:k], perm[k:]
    if k >= num_clients:
        parts_a = iid(labels[a], rng, num_clients)
    else:  # fewer iid rows than clients: one each to k clients drawn at random (none is dropped)
        owner = rng.permutation(num_clients)[:k]
        parts_a = _groups(owner, num_clients, np.arange(k))
    parts_b = (_dirichlet(labels[b], rng, num_clients, alpha, min_size, max_redraws) if len(b)
               else [np.zeros(0, np.int64)] * num_clients)
    return [np.sort(np.concatenate([a[pa], b[pb]])).astype(np.int64) for pa, pb in zip(parts_a, parts_b)]


def natural(labels: np.ndarray, rng: np.random.Generator, writers: np.ndarray) -> list[np.ndarray]:
    """The data's own split (LEAF's per-writer FEMNIST, Shakespeare's speakers): one client per
    distinct writer id, in sorted id order. `rng` is unused (the split is fixed)."""
    writers = np.asarray(writers)
    if len(writers) != len(labels):
        raise PartitionError(f"partition=natural: {len(writers)} writer ids for {len(labels)} rows")
    ids, owner = np.unique(writers, return_inverse=True)
    return _groups(owner.astype(np.int64), len(ids), np.arange(len(labels)))


class Iid(Partitioner):
    """`partition=iid`: rows shuffled and cut into `num_clients` parts of equal size (within one row)."""

    name = "iid"

    def __init__(self, num_clients: int = 100, **split) -> None:
        super().__init__(num_clients, **split)

    def __call__(self, labels, rng, groups=None):
        return iid(labels, rng, self.num_clients)


class Dirichlet(Partitioner):
    """`partition=dirichlet`: label skew, each class dealt by Dirichlet(alpha) proportions (see `dirichlet`)."""

    name = "dirichlet"

    def __init__(self, num_clients: int = 100, alpha: float = 0.5, min_size: int = 10, max_redraws: int = 100,
                 **split) -> None:
        super().__init__(num_clients, **split)
        self.alpha, self.min_size = _positive("alpha", alpha), _int("min_size", min_size, 0)
        self.max_redraws = _int("max_redraws", max_redraws, 0)

    def __call__(self, labels, rng, groups=None):
        return dirichlet(labels, rng, self.num_clients, self.alpha, self.min_size, self.max_redraws)


class Shards(Partitioner):
    """`partition=shards`: label-sorted rows cut into shards, `shards_per_client` each (see `shards`)."""

    name = "shards"

    def __init__(self, num_clients: int = 100, shards_per_client: int = 2, **split) -> None:
        super().__init__(num_clients, **split)
        self.shards_per_client = _int("shards_per_client", shards_per_client, 1)

    def __call__(self, labels, rng, groups=None):
        return shards(labels, rng, self.num_clients, self.shards_per_client)


class Classes(Partitioner):
    """`partition=classes`: `classes_per_client` classes each, their rows split equally (see `classes`)."""

    name = "classes"

    def __init__(self, num_clients: int = 100, classes_per_client: int = 2, **split) -> None:
        super().__init__(num_clients, **split)
        self.classes_per_client = _int("classes_per_client", classes_per_client, 1)

    def __call__(self, labels, rng, groups=None):
        return classes(labels, rng, self.num_clients, self.classes_per_client)


class Quantity(Partitioner):
    """`partition=quantity`: quantity skew, labels iid (see `quantity`)."""

    name = "quantity"

    def __init__(self, num_clients: int = 100, sizes: str = "dirichlet", alpha: float = 0.5, sigma: float = 1.0,
                 min_size: int = 1, **split) -> None:
        super().__init__(num_clients, **split)
        self.sizes = _choice("sizes", sizes, QUANTITY_SIZES)
        self.alpha, self.sigma = _positive("alpha", alpha), _positive("sigma", sigma)
        self.min_size = _int("min_size", min_size, 0)

    def __call__(self, labels, rng, groups=None):
        return quantity(labels, rng, self.num_clients, self.sizes, self.alpha, self.sigma, self.min_size)


class Mixture(Partitioner):
    """`partition=mixture`: a share `iid_frac` of the rows dealt iid, the rest by Dirichlet label skew."""

    name = "mixture"

    def __init__(self, num_clients: int = 100, iid_frac: float = 0.5, alpha: float = 0.5, min_size: int = 0,
                 max_redraws: int = 100, **split) -> None:
        super().__init__(num_clients, **split)
        self.iid_frac = _fraction("iid_frac", iid_frac, low_open=False, high_open=False)
        self.alpha, self.min_size = _positive("alpha", alpha), _int("min_size", min_size, 0)
        self.max_redraws = _int("max_redraws", max_redraws, 0)

    def __call__(self, labels, rng, groups=None):
        return mixture(labels, rng, self.num_clients, self.iid_frac, self.alpha, self.min_size, self.max_redraws)


class Natural(Partitioner):
    """`partition=natural`: the data's own split, one client per writer (LEAF's FEMNIST, Synthetic's
    clients). With `test=dataset` each writer keeps the dataset's own test rows."""

    name = "natural"
    needs_groups = True

    def __init__(self, **split) -> None:
        super().__init__(None, **{"test": "dataset", **split})

    def __call__(self, labels, rng, groups=None):
        return natural(labels, rng, groups)

    def deal(self, train_y, test_y, groups=None):
        if self.test == "split":
            return super().deal(train_y, test_y, groups)
        rng = np.random.default_rng([self.seed, 23])
        parts = self(train_y, rng, groups[0])
        train_ids = np.unique(groups[0])  # each test row goes to its writer's client (none: dropped)
        owner = np.searchsorted(train_ids, groups[1])
        owner = np.where((owner < len(train_ids)) & (train_ids[np.minimum(owner, len(train_ids) - 1)] == groups[1]),
                         owner, -1)
        return self._finish(parts, _groups(owner, len(parts), np.arange(len(test_y))), rng, pooled=False)
