"""Partitioners: pure functions `labels, rng, **options -> list[index array]`, one per client.

They know nothing of where the rows come from (pfl-research's and flwr-datasets' shape): `labels`
is the dataset's label column (int64 [N]), `rng` a `numpy.random.Generator`; each returns one sorted
int64 array of row indices per client, and no row is ever given to two clients. They are
vectorized over rows (one sort or one `bincount`, never a Python loop over rows), so 1,000 clients
over 50,000 labels take milliseconds (`python -m fedrun.bench.partitions`).

Every bad option raises `PartitionError` (a ValueError) naming `partition.<option>` and what is
allowed, before any row is dealt. The paper rules (Per-FedAvg's 0-4/5-9, pFedMe's labels, paper
004's ACID) live in `partitions.py` and are offered here under their `partition=` names.
"""
from __future__ import annotations

import numpy as np


class PartitionError(ValueError):
    """A partition option that cannot work, named as `partition.<option>`."""


def _int(name: str, v, low: int, high: int | None = None) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < low or (high is not None and v > high):
        allowed = f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}"
        raise PartitionError(f"partition.{name}={v!r}: allowed {allowed}")
    return int(v)


def _positive(name: str, v) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v <= 0:
        raise PartitionError(f"partition.{name}={v!r}: allowed a number > 0")
    return float(v)


def _groups(owner: np.ndarray, num_clients: int, rows: np.ndarray) -> list[np.ndarray]:
    """Rows grouped by their owner (owner -1: unused), each group sorted: one stable sort."""
    keep = owner >= 0
    owner, rows = owner[keep], rows[keep]
    order = np.lexsort((rows, owner))
    counts = np.bincount(owner, minlength=num_clients)
    return [g.astype(np.int64) for g in np.split(rows[order], np.cumsum(counts)[:-1])]


def _class_blocks(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by class, shuffled within each class; the classes present and their counts."""
    order = np.lexsort((rng.random(len(labels)), labels))
    classes, counts = np.unique(labels, return_counts=True)
    return order, classes, counts


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


def _cuts(counts: np.ndarray, props: np.ndarray) -> np.ndarray:
    """[k, n] integer shares of counts[k] rows in proportions props[k] (floors of the cumulative sums)."""
    edges = np.floor(np.cumsum(props, 1) * counts[:, None] + 1e-9).astype(np.int64)
    edges[:, -1] = counts
    return np.diff(edges, prepend=0, axis=1)


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


def holdout_clients(num_clients: int, holdout, rng: np.random.Generator) -> np.ndarray:
    """The clients kept out of training: `holdout` a fraction in [0, 1) of num_clients (rounded) or a
    count (an integer >= 1); at least one client must train, and a fraction > 0 must hold out at
    least one client (one that rounds to none is refused, not ignored). Returns them sorted."""
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)):
        raise PartitionError(f"partition.holdout={holdout!r}: allowed a fraction in [0, 1) or a count of clients")
    count = int(holdout) if isinstance(holdout, int) else int(round(holdout * num_clients))
    if isinstance(holdout, float) and 0 < holdout < 1 and not 0 < count < num_clients:
        lo, hi = 0.5 / num_clients, (num_clients - 0.5) / num_clients  # the fractions that round to 1..C-1
        raise PartitionError(f"partition.holdout={holdout!r}: holds out round({holdout!r} x {num_clients} clients) = "
                             f"{count}; allowed 0 (none), a fraction in ({lo:.4g}, {hi:.4g}) (it rounds to 1..{num_clients - 1} "
                             f"clients) or a count 0..{num_clients - 1}")
    if (isinstance(holdout, float) and not 0 <= holdout < 1) or not 0 <= count < num_clients:
        raise PartitionError(f"partition.holdout={holdout!r}: allowed a fraction in [0, 1) or a count 0..{num_clients - 1} "
                             f"({num_clients} clients, at least one must train)")
    return np.sort(rng.permutation(num_clients)[:count])


def natural(labels: np.ndarray, rng: np.random.Generator, writers: np.ndarray) -> list[np.ndarray]:
    """The data's own split (LEAF's per-writer FEMNIST, Shakespeare's speakers): one client per
    distinct writer id, in sorted id order. `rng` is unused (the split is fixed)."""
    writers = np.asarray(writers)
    if len(writers) != len(labels):
        raise PartitionError(f"partition=natural: {len(writers)} writer ids for {len(labels)} rows")
    ids, owner = np.unique(writers, return_inverse=True)
    return _groups(owner.astype(np.int64), len(ids), np.arange(len(labels)))
