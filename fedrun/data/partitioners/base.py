"""The partitioner contract (flwr-datasets' shape) and the options every partition shares.

A partitioner is a small class: `__init__` checks its options without any data (a bad option is one
line naming `partition.<option>` and what is allowed, before any file is read), and
`__call__(labels, rng, groups=None)` maps a label column (int64 [N]) and a `numpy.random.Generator`
to one sorted int64 index array per client, no row given twice. `groups` are the rows' natural
groups (writer ids) when the dataset has them.

The shared options (`conf/partition/_split.yaml`, one node every partition yaml includes) say how
test rows are made and which clients are held out; `deal` applies them around `__call__`:
- `test=split` (default) pools the dataset's training and test rows, partitions them, and splits each
  client's rows `train_frac` / rest per label (pFedMe's and PFLlib's protocol; `stratified_split`);
- `test=dataset` partitions the training rows and divides the dataset's own test set the same way:
  each class's test rows go to clients in proportion to their training rows of it (`proportional_test`);
- `holdout` (a fraction or a count) keeps clients out of training: they come last in the client order
  and `FederatedData.num_holdout` says how many;
- `seed` is the partition's own seed (the data stays fixed across run seeds).
A paper's exact split (its own test rows, its own random streams) overrides `deal` instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class PartitionError(ValueError):
    """A partition option that cannot work, named as `partition.<option>`."""


TESTS = ("split", "dataset")


def _int(name: str, v, low: int, high: int | None = None, prefix: str = "partition") -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < low or (high is not None and v > high):
        allowed = f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}"
        raise PartitionError(f"{prefix}.{name}={v!r}: allowed {allowed}")
    return int(v)


def _positive(name: str, v) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v <= 0:
        raise PartitionError(f"partition.{name}={v!r}: allowed a number > 0")
    return float(v)


def _fraction(name: str, v, low_open: bool = True, high_open: bool = True, prefix: str = "partition") -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (0 < v if low_open else 0 <= v) and \
        (v < 1 if high_open else v <= 1)
    if not ok:
        what = "strictly between 0 and 1" if low_open and high_open else "in [0, 1]"
        raise PartitionError(f"{prefix}.{name}={v!r}: allowed a fraction {what}")
    return float(v)


def _choice(name: str, v, allowed, prefix: str = "partition"):
    if v not in allowed:
        raise PartitionError(f"{prefix}.{name}={v!r}: allowed one of {', '.join(map(str, allowed))}")
    return v


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


def _cuts(counts: np.ndarray, props: np.ndarray) -> np.ndarray:
    """[k, n] integer shares of counts[k] rows in proportions props[k] (floors of the cumulative sums)."""
    edges = np.floor(np.cumsum(props, 1) * counts[:, None] + 1e-9).astype(np.int64)
    edges[:, -1] = counts
    return np.diff(edges, prepend=0, axis=1)


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
                             f"{count}; allowed 0 (none), a fraction in ({lo:.4g}, {hi:.4g}) "
                             f"(it rounds to 1..{num_clients - 1} clients) or a count 0..{num_clients - 1}")
    if (isinstance(holdout, float) and not 0 <= holdout < 1) or not 0 <= count < num_clients:
        raise PartitionError(f"partition.holdout={holdout!r}: allowed a fraction in [0, 1) "
                             f"or a count 0..{num_clients - 1} ({num_clients} clients, at least one must train)")
    return np.sort(rng.permutation(num_clients)[:count])


def stratified_split(owner: np.ndarray, labels: np.ndarray, train_frac: float, rng: np.random.Generator
                     ) -> np.ndarray:
    """True for the training rows. A client of n >= 2 rows keeps t = round((1 - train_frac) n),
    clipped to 1..n-1, as test rows (a single row trains): a systematic sample, at a random offset,
    of its rows ordered by label (random within a label), so its test rows follow its label
    histogram even where a label has one row. One lexsort over all rows."""
    n_rows = len(owner)
    order = np.lexsort((rng.random(n_rows), labels, owner))
    n = np.bincount(owner, minlength=int(owner.max()) + 1 if n_rows else 0)
    start = np.cumsum(n) - n
    t = np.where(n >= 2, np.clip(np.floor((1 - train_frac) * n + 0.5), 1, np.maximum(n - 1, 1)), 0).astype(np.int64)
    who = np.repeat(np.arange(len(n)), t)
    j = np.arange(int(t.sum())) - np.repeat(np.cumsum(t) - t, t)
    pos = np.floor((j + rng.random(len(n))[who]) * n[who] / t[who]).astype(np.int64)
    train = np.ones(n_rows, dtype=bool)
    train[order[start[who] + pos]] = False
    return train


def proportional_test(train_parts: list[np.ndarray], train_y: np.ndarray, test_y: np.ndarray,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """The test rows of each class divided over the clients in proportion to their training rows of
    that class (floors of the cumulative shares), shuffled within the class."""
    k = int(max(train_y.max(), test_y.max())) + 1
    c = len(train_parts)
    counts = np.zeros((k, c), dtype=np.float64)
    for i, p in enumerate(train_parts):
        counts[:, i] = np.bincount(train_y[p], minlength=k)
    tot = counts.sum(1, keepdims=True)
    props = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    order, present, have = _class_blocks(test_y, rng)
    full = np.zeros(k, dtype=np.int64)
    full[present] = have
    use = np.where(tot[:, 0] > 0, full, 0)  # a class no client trains on gives no test rows
    shares = _cuts(use, np.where(tot > 0, props, 1.0 / c))
    owner = np.full(len(test_y), -1, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(full)[:-1]])
    for j in range(k):
        if use[j]:
            owner[order[start[j]:start[j] + use[j]]] = np.repeat(np.arange(c), shares[j])
    return _groups(owner, c, np.arange(len(test_y)))


@dataclass
class Dealt:
    """Each client's training and test rows. Indices point into the dataset's training rows and its
    test rows, or (`pooled`) into the training rows followed by the test rows. A paper's split may
    give the rows labels of its own (`train_labels`, `test_labels`: ALID's renaming, the pFedMe
    authors' generator) and say the model's number of outputs (`num_classes`) and more
    (`meta`: FederatedData fields such as client_classes)."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    pooled: bool
    num_holdout: int = 0
    train_labels: list[np.ndarray] | None = None
    test_labels: list[np.ndarray] | None = None
    num_classes: int | None = None
    meta: dict = field(default_factory=dict)


class Partitioner:
    """The base of every partitioner: the shared options, checked here, and `deal`."""

    name = ""  # as conf/partition names it: in messages and the cache file's name
    needs_groups = False  # True: `__call__` needs the rows' natural groups (the dataset must have them)

    def __init__(self, num_clients: int | None = None, holdout=0, test: str = "split", train_frac: float = 0.75,
                 seed: int = 0, **unknown) -> None:
        if unknown:  # a key its yaml lacks (a user's own partition yaml, or a Python caller's typo)
            import inspect

            known = {*inspect.signature(type(self).__init__).parameters,
                     *inspect.signature(Partitioner.__init__).parameters}
            known -= {"self", "split", "unknown"} | ({"num_clients"} if num_clients is None else set())
            raise PartitionError(f"partition.{sorted(unknown)[0]} is not an option of partition={self.name}; "
                                 f"its options: {', '.join(sorted(known))}")
        self.num_clients = None if num_clients is None else _int("num_clients", num_clients, 1)
        if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or holdout < 0 or \
                (isinstance(holdout, float) and holdout >= 1):
            raise PartitionError(f"partition.holdout={holdout!r}: allowed a fraction in [0, 1) or a count of clients")
        if self.num_clients is not None:  # a holdout that rounds to no client (or every one), refused now
            holdout_clients(self.num_clients, holdout, np.random.default_rng(0))
        self.holdout = holdout
        self.test = _choice("test", test, TESTS)
        self.train_frac = _fraction("train_frac", train_frac)
        self.seed = _int("seed", seed, 0)

    def __call__(self, labels: np.ndarray, rng: np.random.Generator, groups: np.ndarray | None = None
                 ) -> list[np.ndarray]:
        raise NotImplementedError

    def settings(self) -> dict:
        """Every option (the cache key)."""
        return {"name": self.name, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    def check_dataset(self, dataset) -> None:
        """PartitionError when the dataset cannot be partitioned so (before any file is read)."""
        if self.needs_groups and not dataset.has_groups:
            raise PartitionError(f"partition={self.name} needs rows with writer ids (natural groups); "
                                 f"dataset={dataset.name} has none: choose another partition")

    def deal(self, train_y: np.ndarray, test_y: np.ndarray, groups=None) -> Dealt:
        """The clients' rows by the shared options (see the module docstring); `groups`: (train, test) or None."""
        rng = np.random.default_rng([self.seed, 23])
        if self.test == "split":
            y = np.concatenate([train_y, test_y])
            parts = self(y, rng, None if groups is None else np.concatenate(groups))
            owner = np.full(len(y), -1, dtype=np.int64)
            for c, p in enumerate(parts):
                owner[p] = c
            used = np.flatnonzero(owner >= 0)
            is_train = stratified_split(owner[used], y[used], self.train_frac, rng)
            tr = _groups(np.where(is_train, owner[used], -1), len(parts), used)
            te = _groups(np.where(~is_train, owner[used], -1), len(parts), used)
            return self._finish(tr, te, rng, pooled=True)
        parts = self(train_y, rng, None if groups is None else groups[0])
        return self._finish(parts, proportional_test(parts, train_y, test_y, rng), rng, pooled=False)

    def _finish(self, tr: list[np.ndarray], te: list[np.ndarray], rng: np.random.Generator, pooled: bool) -> Dealt:
        """Held-out clients drawn and put last; clients without training or test rows refused."""
        held = holdout_clients(len(tr), self.holdout, rng)
        empty = [c for c in range(len(tr)) if len(tr[c]) == 0 or len(te[c]) == 0]
        if empty:
            fixes = (["raise partition.min_size"] if hasattr(self, "min_size") else []) + ["use fewer clients"] + \
                (["use partition.test=split"] if not pooled else [])
            raise PartitionError(
                f"partition={self.name}: clients {empty[:10]} get no training or no test rows; "
                f"{', '.join(fixes[:-1])}{' or ' if len(fixes) > 1 else ''}{fixes[-1]}")
        order = np.r_[np.setdiff1d(np.arange(len(tr)), held), held]
        return Dealt([tr[c] for c in order], [te[c] for c in order], pooled, len(held))
