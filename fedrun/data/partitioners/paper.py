"""The papers' splits: the rules as pure functions, and the partitioners built on them.

`perfedavg_mnist`: the MNIST split of Per-FedAvg (papers 000/001). `class_lists`, `deal_classes` and
`alid_permutations`: the ACID/ALID splits of paper 004 (paper 004 Sec. 3, "Active/Anonymous Label
Induced Diversity"). `pfedme_mnist`: the MNIST split of pFedMe (paper 002); `pfedme_mnist_authors`:
the one its authors' generator made.

Two kinds of partitioner use them:
- `PerFedAvgSplit`, `PfedmeLabels`, `Acid` (`partition=perfedavg_split|pfedme_labels|acid`): the
  rule on any dataset's labels, with the shared options (test rows, holdout) of every partition;
- `PerFedAvgPaper`, `PfedmePaper`, `PfedmeAuthors`, `Paper004` (the `data=` presets of the papers,
  `fedrun.data.presets`): the paper's exact split, its own test rows and random streams, so that
  they give the rows they always gave (tests/data/test_row_digests.py). Their options are the
  presets' `data.` options, and their messages name them so.
"""
from __future__ import annotations

import random

import numpy as np

from .base import Dealt, Partitioner, PartitionError, _choice, _int


def perfedavg_mnist(labels: np.ndarray, n: int, a: int, rng: np.random.RandomState) -> list[np.ndarray]:
    """The MNIST split of Per-FedAvg (papers 000/001 Section 5).

    Users 0 .. n//2 - 1 get `a` images of each digit 0-4. Each other user j gets a/2 images of one
    digit in 0-4 and 2a of one digit in 5-9; the low digits cycle 0..4 over those users and the high
    digits cycle over a seeded permutation of 5..9, so every digit is used as evenly as possible.
    Images are drawn without replacement, so every index goes to at most one user.

    Raises:
        ValueError: if some digit has too few images for (n, a), naming the largest `a` that fits.
    """
    if n < 2 or a < 2:
        raise ValueError(f"need n >= 2 and a >= 2, got n={n}, a={a}")
    n_full = n // 2
    high = 5 + rng.permutation(5)
    wants: list[dict[int, int]] = [{d: a for d in range(5)} for _ in range(n_full)]
    for j in range(n - n_full):
        wants.append({j % 5: a // 2, int(high[j % 5]): 2 * a})
    need = np.zeros(10, dtype=np.int64)
    for w in wants:
        for d, k in w.items():
            need[d] += k
    have = np.bincount(labels, minlength=10)
    if (need > have).any():
        d = int(np.argmax(need - have))
        fit = max_fitting_a(labels, n)
        hint = f"the largest a that fits is {fit}" if fit >= 2 else f"no a >= 2 fits with n={n}"
        raise ValueError(
            f"data.a={a} with data.n={n} needs {need[d]} images of digit {d} but only {have[d]} exist; {hint}"
        )
    pools = {d: list(rng.permutation(np.flatnonzero(labels == d))) for d in range(10)}
    out = []
    for w in wants:
        idx = []
        for d, k in w.items():
            idx.extend(pools[d][:k])
            del pools[d][:k]
        out.append(np.array(sorted(idx), dtype=np.int64))
    return out


def max_fitting_a(labels: np.ndarray, n: int) -> int:
    """Largest `a` for which `perfedavg_mnist(labels, n, a, rng)` has enough images of every digit
    whatever the seed (the high digits' order is seeded, so the rarest of 5-9 is assumed)."""
    have = np.bincount(labels, minlength=10)
    best = 0
    for a in range(2, int(have.max()) + 1):
        need = np.zeros(10, dtype=np.int64)
        need[:5] += (n // 2) * a
        m = n - n // 2
        for j in range(m):
            need[j % 5] += a // 2
        # high digits: each of the first min(m, 5) slots of the cycle gets ceil/floor share of 2a
        counts = np.bincount(np.arange(m) % 5, minlength=5)
        if (need > have).any() or (counts.max() * 2 * a > have[5:].min()):
            break
        best = a
    return best


# ---------------------------------------------------------------------------------------------
# ACID / ALID (paper 004): every device owns k classes; ALID also renames them per device.
# ---------------------------------------------------------------------------------------------

CLASS_CHOICES = ("consecutive", "random")


def class_lists(num_classes: int, n: int, k: int, how: str, rng: np.random.RandomState) -> np.ndarray:
    """[n, k] the classes each device owns (sorted within a device, k distinct per device).

    `consecutive`: device c owns (c + j) mod C for j < k (paper 004's official code).
    `random`: seeded; each device takes k of the least-used classes so far (random tie-break), so
    every class is used floor or ceil(n k / C) times.
    """
    if how not in CLASS_CHOICES:
        raise ValueError(f"data.classes={how!r} is not one of {list(CLASS_CHOICES)}")
    if not 1 <= k <= num_classes:
        raise ValueError(f"data.classes_per_client={k} must be in 1..{num_classes} "
                         f"(the dataset has {num_classes} classes)")
    if n < 1:
        raise ValueError(f"data.num_clients={n} must be >= 1")
    if how == "consecutive":
        return np.sort((np.arange(n)[:, None] + np.arange(k)[None, :]) % num_classes, axis=1)
    used = np.zeros(num_classes, dtype=np.int64)
    out = np.empty((n, k), dtype=np.int64)
    for c in range(n):
        pick = np.sort(np.lexsort((rng.random_sample(num_classes), used))[:k])
        used[pick] += 1
        out[c] = pick
    return out


def deal_classes(labels: np.ndarray, lists: np.ndarray, rng: np.random.RandomState) -> list[np.ndarray]:
    """Deals examples WITHOUT replacement: device c gets floor(N / n) examples, all from its classes
    `lists[c]`, split as equally as possible over them (each class floor or ceil of the share).

    Which of a device's classes get the "+1" is solved as a bipartite b-matching (augmenting paths),
    so the deal succeeds whenever the class counts allow it.

    Raises:
        ValueError: when the classes do not hold enough examples, naming the options to change.
    """
    n, k = lists.shape
    num_classes = int(max(labels.max(initial=-1), lists.max())) + 1
    have = np.bincount(labels, minlength=num_classes)
    m = len(labels) // n
    base, r = divmod(m, k)
    opts = f"data.num_clients={n}, data.classes_per_client={k}"
    if base < 1:
        raise ValueError(f"{opts}: {len(labels)} examples give each device {m}, fewer than its {k} classes")
    cap = have - base * np.bincount(lists.ravel(), minlength=num_classes)
    if (cap < 0).any():
        c = int(np.argmin(cap))
        raise ValueError(f"{opts}: class {c} has {have[c]} examples but its devices need at least "
                         f"{have[c] - cap[c]}; use fewer clients or other classes per client")
    extra = _spread_extras(lists, r, cap)
    if extra is None:
        raise ValueError(f"{opts}: the classes cannot give every device {m} examples of its own classes; "
                         "use fewer clients or other classes per client")
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in range(num_classes)}
    out = []
    for c in range(n):
        idx = []
        for j in range(k):
            take = base + int(extra[c, j])
            pool = pools[int(lists[c, j])]
            idx.extend(pool[:take])
            del pool[:take]
        out.append(np.array(sorted(idx), dtype=np.int64))
    return out


def _spread_extras(lists: np.ndarray, r: int, cap: np.ndarray) -> np.ndarray | None:
    """[n, k] bool: which r of each device's classes give one example more, with at most cap[c] such
    extras per class c; None when impossible. Augmenting paths: a device blocked by full classes
    takes the extra of another device that can move its own extra to a class with room."""
    n, k = lists.shape
    cap = cap.copy()
    extra = np.zeros((n, k), dtype=bool)
    slot = [{int(cl): j for j, cl in enumerate(row)} for row in lists]  # device -> class -> slot
    holders: dict[int, list[int]] = {}
    for c in range(n):
        for cl in lists[c]:
            holders.setdefault(int(cl), []).append(c)
    for start in range(n):
        for _ in range(r):
            parent = {start: None}  # device -> (previous device, class it hands over)
            queue, end = [start], None
            while queue and end is None:
                u = queue.pop(0)
                for t in range(k):  # rotate the preference so extras spread over the classes
                    j = (u + t) % k
                    if extra[u, j]:
                        continue
                    cl = int(lists[u, j])
                    if cap[cl] > 0:
                        end = (u, cl)
                        break
                    for v in holders[cl]:
                        if v not in parent and extra[v, slot[v][cl]]:
                            parent[v] = (u, cl)
                            queue.append(v)
            if end is None:
                return None
            u, cl = end
            cap[cl] -= 1
            while True:  # walk back: u takes class cl's extra, the device before it gives it up
                extra[u, slot[u][cl]] = True
                if parent[u] is None:
                    break
                prev, cl = parent[u]
                extra[u, slot[u][cl]] = False
                u = prev
    return extra


def alid_permutations(n: int, k: int, rng: np.random.RandomState) -> np.ndarray:
    """[n, k] device-private relabelings (ALID): device c calls its class lists[c, j] label perms[c, j]."""
    return np.stack([rng.permutation(k) for _ in range(n)]) if n else np.zeros((0, k), dtype=np.int64)


PFEDME_MIN_SHARE = 2  # images of each owned digit a client gets at least (one for train, one for test)


def pfedme_label_owners(num_clients: int, labels_per_client: int, rng: np.random.RandomState,
                        num_labels: int = 10) -> list[np.ndarray]:
    """Each client's `labels_per_client` distinct labels, every label owned by as many clients as
    possible alike (exactly num_clients * labels_per_client / num_labels each when that divides).

    Which labels own the extra slots is seeded; clients then take, one after the other, the labels
    with the most slots left (ties broken at random). Taking the largest residual counts first always
    completes (Gale-Ryser), so no client ever repeats a label. Client order is shuffled at the end.
    """
    q, r = divmod(num_clients * labels_per_client, num_labels)
    left = np.full(num_labels, q, dtype=np.int64)
    left[rng.permutation(num_labels)[:r]] += 1
    owned = []
    for _ in range(num_clients):
        order = np.lexsort((rng.permutation(num_labels), -left))  # most slots left first, ties random
        pick = np.sort(order[:labels_per_client])
        assert (left[pick] > 0).all()
        left[pick] -= 1
        owned.append(pick)
    return [owned[i] for i in rng.permutation(num_clients)]


def pfedme_max_clients(labels: np.ndarray, labels_per_client: int, num_labels: int = 10) -> int:
    """Largest number of clients `pfedme_mnist` can serve whatever the seed: every owner of a digit
    needs PFEDME_MIN_SHARE of its images and a digit has at most ceil(N * labels_per_client / 10) owners."""
    have = int(np.bincount(labels, minlength=num_labels)[:num_labels].min())
    # ceil(n * L / 10) <= have // MIN  <=>  n * L <= 10 * (have // MIN)
    return num_labels * (have // PFEDME_MIN_SHARE) // labels_per_client


def pfedme_mnist(
    labels: np.ndarray,
    num_clients: int = 20,
    labels_per_client: int = 2,
    rng: np.random.RandomState | None = None,
    weight_range: tuple[float, float] = (1165.0, 3834.0),
) -> list[np.ndarray]:
    """The MNIST split of pFedMe (paper 002 Section 5.1): `labels` of ALL images (train and test
    pooled), N clients with `labels_per_client` distinct labels each, local sizes heterogeneous.

    Labels: see `pfedme_label_owners` (every label owned by the same number of clients: 4 each for
    20 clients x 2 labels). The official pFedMe generator has a bug that gives users the same labels;
    fedrun gives every client distinct labels instead.

    Sizes (rule): every client draws a weight w_c ~ Uniform(weight_range) (the paper's size range
    [1165, 3834] by default). Each digit's images are split among the clients that own it: each owner
    first gets PFEDME_MIN_SHARE images, the rest goes in proportion to the owners' weights (largest
    remainders). So every image is used exactly once (when num_clients * labels_per_client >= 10;
    otherwise the digits nobody owns are left out), no digit is ever asked for more images than it
    has, and client sizes spread like the weights (max/min about 3.3) but scale with the pooled data:
    on full MNIST (70,000 images, mean 3,500 per client) they come out larger than the paper's range,
    which cannot hold 70,000 images without nearly all clients at its top.

    Returns one sorted int64 index array (into `labels`) per client.

    Raises:
        ValueError: labels_per_client not in 1..10, num_clients < 1, or too few images of some digit
            for num_clients (naming the largest num_clients that fits).
    """
    rng = rng if rng is not None else np.random.RandomState(0)
    labels = np.asarray(labels)
    if not 1 <= labels_per_client <= 10:
        raise ValueError(f"data.labels_per_client={labels_per_client}: allowed 1..10 (MNIST has 10 labels)")
    fit = pfedme_max_clients(labels, labels_per_client)
    if not 1 <= num_clients <= fit:
        raise ValueError(
            f"data.num_clients={num_clients}: allowed 1..{fit} with data.labels_per_client={labels_per_client} "
            f"on these {len(labels)} images (every owner of a digit needs {PFEDME_MIN_SHARE} of its images)"
        )
    owned = pfedme_label_owners(num_clients, labels_per_client, rng)
    lo, hi = weight_range
    weights = rng.uniform(lo, hi, size=num_clients)
    out: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for d in range(10):
        owners = np.array([c for c in range(num_clients) if d in owned[c]], dtype=np.int64)
        if len(owners) == 0:  # only when num_clients * labels_per_client < 10
            continue
        pool = rng.permutation(np.flatnonzero(labels == d))
        rest = len(pool) - PFEDME_MIN_SHARE * len(owners)
        exact = rest * weights[owners] / weights[owners].sum()
        share = np.floor(exact).astype(np.int64)
        extra = rest - int(share.sum())
        share[np.argsort(-(exact - share), kind="stable")[:extra]] += 1
        share += PFEDME_MIN_SHARE
        for c, chunk in zip(owners, np.split(pool, np.cumsum(share)[:-1])):
            out[c].append(chunk)
    return [np.sort(np.concatenate(parts)).astype(np.int64) for parts in out]


def split_train_test(labels: np.ndarray, parts: list[np.ndarray], train_frac: float,
                     rng: np.random.RandomState) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's indices split at random into train / test, per label (stratified), so both hold
    all the client's labels: of a client's n images of a label, round(train_frac * n) clipped to
    1 .. n - 1 go to train (n >= 2). A client's train share is train_frac within rounding (at most
    half an image per label off).

    Raises:
        ValueError: train_frac not in (0, 1).
    """
    if not 0.0 < train_frac < 1.0:
        raise ValueError(f"data.train_frac={train_frac}: allowed strictly between 0 and 1")
    train, test = [], []
    for p in parts:
        tr, te = [], []
        y = labels[p]
        for d in np.unique(y):
            idx = rng.permutation(p[y == d])
            k = int(np.floor(train_frac * len(idx) + 0.5))
            if len(idx) >= 2:
                k = min(max(k, 1), len(idx) - 1)
            tr.append(idx[:k])
            te.append(idx[k:])
        train.append(np.sort(np.concatenate(tr)).astype(np.int64))
        test.append(np.sort(np.concatenate(te)).astype(np.int64))
    return train, test


def _authors_sizes(total: int, size: int, rs: np.random.RandomState) -> list[int]:
    """The pFedMe generator's `ram_dom_gen`: `size` parts of `total`, each but the last drawn from
    [rest // (size + 1), rest // 2) of what is left."""
    parts = []
    for _ in range(size - 1):
        val = int(rs.randint(total // (size + 1), total // 2))
        parts.append(val)
        total -= val
    return parts + [total]


def pfedme_mnist_authors(labels: np.ndarray, num_clients: int = 20, labels_per_client: int = 2,
                         seed: int = 1, train_frac: float = 0.75
                         ) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]]]:
    """pFedMe's MNIST split as the authors' generator made it when the paper was written
    (CharlieDinh/pFedMe data/Mnist/generate_niid_20users.py at commit 1819c29, May 2020), step for
    step. `labels` are ALL images' labels in OpenML's mnist_784 order (the 60,000 training images,
    then the 10,000 test images, each in file order); `seed` seeds both numpy's and Python's streams,
    as their `np.random.seed(1)` and `random.seed(1)` did.

    Client u owns digits (u + j) % 10, j < labels_per_client. Each digit's count is cut into as
    many parts as it has owners (`_authors_sizes`), and the (client, digit) pairs take those parts
    in the generator's order, which pairs digit d's slot with another digit's draws. What they then
    did, and what this reproduces:
    - a client's images of digit l are digit l's images [s:n] with n its part and s = 0 or 1 (their
      slice started at a leftover boolean mask, not at a running offset), so the owners of a digit
      share a prefix of its images: on full MNIST, 23,536 distinct images are used, not 70,000, and
      89% of the pooled test rows are also another client's training rows;
    - a client's label list gets n labels l where s = 1 gave it n - 1 images, so its rows after that
      part shift by one label and its last label is dropped: when that part is the client's first,
      the first image of its second digit carries the first digit's label (19 such rows on full MNIST);
    - each client's rows are shuffled with Python's `random.shuffle` and cut int(train_frac * n)
      train / the rest test.
    Client sizes on full MNIST: 1,165 to 3,834 training rows, the paper's range.

    Returns (train, test): per client, (indices into `labels`, the labels the generator gave them).

    Raises:
        ValueError: num_clients not a positive multiple of 10, or labels_per_client not in 1..10.
    """
    labels = np.asarray(labels)
    if num_clients < 10 or num_clients % 10:
        raise ValueError(f"data.num_clients={num_clients}: the authors' generator needs a positive multiple of 10")
    if not 1 <= labels_per_client <= 10:
        raise ValueError(f"data.labels_per_client={labels_per_client}: allowed 1..10 (MNIST has 10 labels)")
    rs = np.random.RandomState(seed)
    shuffle = random.Random(seed).shuffle
    digits = [np.flatnonzero(labels == d) for d in range(10)]
    owners = np.bincount([(u + j) % 10 for u in range(num_clients) for j in range(labels_per_client)], minlength=10)
    draws = [_authors_sizes(len(rows), int(k), rs) for rows, k in zip(digits, owners)]
    order = [d[i] for i in range(len(draws[0])) for d in draws]  # slot i of every digit, digit by digit
    start = (labels[:10] == 9).astype(np.int64)  # their `idx`: the label-9 mask left over from a loop
    train, test = [], []
    count = 0
    for u in range(num_clients):
        rows, ys = [], []
        for j in range(labels_per_client):
            lab = (u + j) % 10
            n = order[count]
            count += 1
            if start[lab] + n < len(digits[lab]):
                rows.append(digits[lab][start[lab]:n])
                ys.append(np.full(n, lab, dtype=np.int64))
                start[lab] = 1  # `idx[l] += n` on a boolean array stores True
        idx = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        y = np.concatenate(ys)[:len(idx)] if ys else np.zeros(0, np.int64)  # zip() stops at the shorter
        perm = list(range(len(idx)))
        shuffle(perm)  # the same swaps as shuffling their list of (x, y) pairs
        idx, y = idx[perm], y[perm]
        cut = int(train_frac * len(idx))
        train.append((idx[:cut], y[:cut]))
        test.append((idx[cut:], y[cut:]))
    return train, test


def _rs(rng: np.random.Generator) -> np.random.RandomState:
    return np.random.RandomState(int(rng.integers(2**32 - 1)))


def _renamed(e: ValueError) -> PartitionError:
    """A rule's message (written for the `data=` presets' options) for `partition=` options."""
    return PartitionError(str(e).replace("data.n=", "partition.num_clients=").replace("data.", "partition."))


def _ten_classes(name: str, dataset) -> None:
    """PartitionError, before any file is read, unless `dataset` has the 10 classes of the MNIST rules."""
    if dataset.num_classes != 10:
        raise PartitionError(f"partition={name} is its paper's MNIST rule and needs a dataset of 10 classes; "
                             f"dataset={dataset.name} has {dataset.num_classes}: choose another partition")


class PerFedAvgSplit(Partitioner):
    """`partition=perfedavg_split`: Per-FedAvg's 0-4/5-9 rule (`perfedavg_mnist`) on any labels 0..9."""

    name = "perfedavg_split"

    def __init__(self, num_clients: int = 10, a: int = 200, **split) -> None:
        super().__init__(num_clients, **split)
        self.a = _int("a", a, 1)

    def check_dataset(self, dataset) -> None:
        super().check_dataset(dataset)
        _ten_classes(self.name, dataset)

    def __call__(self, labels, rng, groups=None):
        if labels.max() >= 10:
            raise PartitionError(f"partition=perfedavg_split: needs a dataset of 10 classes, "
                                 f"this one has {labels.max() + 1}")
        try:
            return perfedavg_mnist(labels, self.num_clients, self.a, _rs(rng))
        except ValueError as e:
            raise _renamed(e) from None


class PfedmeLabels(Partitioner):
    """`partition=pfedme_labels`: pFedMe's rule (`pfedme_mnist`): distinct labels per client, weighted sizes;
    10 labels."""

    name = "pfedme_labels"

    def __init__(self, num_clients: int = 20, labels_per_client: int = 2, **split) -> None:
        super().__init__(num_clients, **split)
        self.labels_per_client = _int("labels_per_client", labels_per_client, 1)

    def check_dataset(self, dataset) -> None:
        super().check_dataset(dataset)
        _ten_classes(self.name, dataset)

    def __call__(self, labels, rng, groups=None):
        if labels.max() >= 10:
            raise PartitionError(f"partition=pfedme_labels: needs a dataset of 10 classes, "
                                 f"this one has {labels.max() + 1}")
        try:
            return pfedme_mnist(labels, self.num_clients, self.labels_per_client, _rs(rng))
        except ValueError as e:
            raise _renamed(e) from None


class Acid(Partitioner):
    """`partition=acid`: paper 004's ACID (`class_lists`, `deal_classes`): k classes per device, equal sizes."""

    name = "acid"

    def __init__(self, num_clients: int = 100, classes_per_client: int = 5, classes: str = "consecutive",
                 **split) -> None:
        super().__init__(num_clients, **split)
        self.classes_per_client = _int("classes_per_client", classes_per_client, 1)
        self.classes = _choice("classes", classes, CLASS_CHOICES)

    def __call__(self, labels, rng, groups=None):
        rs = _rs(rng)
        try:
            lists = class_lists(int(labels.max()) + 1, self.num_clients, self.classes_per_client, self.classes, rs)
            return deal_classes(labels, lists, rs)
        except ValueError as e:
            raise _renamed(e) from None


class _Paper(Partitioner):
    """A paper's exact split: `deal` is all of it (no shared options: its test rows are its own)."""

    def __init__(self, num_clients: int, seed: int) -> None:
        self.num_clients = _int("num_clients", num_clients, 1, prefix="data")
        self.seed = _int("seed", seed, 0, prefix="data")

    def __call__(self, labels, rng, groups=None):
        raise PartitionError(f"the {self.name} split of its paper deals train and test rows itself (`deal`)")


class PerFedAvgPaper(_Paper):
    """`data=mnist_perfedavg`: `perfedavg_mnist` on the training images, then on the test images with
    `test_a` (None: `a` scaled by |test| / |train|, even), one RandomState(seed) for both."""

    name = "perfedavg"

    def __init__(self, n: int = 10, a: int = 200, test_a: int | None = None, seed: int = 0) -> None:
        super().__init__(n, seed)
        self.a = _int("a", a, 1, prefix="data")
        self.test_a = None if test_a is None else _int("test_a", test_a, 1, prefix="data")

    def deal(self, train_y, test_y, groups=None) -> Dealt:
        ta = self.test_a if self.test_a is not None else max(2, int(self.a * len(test_y) / len(train_y)) // 2 * 2)
        rng = np.random.RandomState(self.seed)
        train = perfedavg_mnist(train_y, self.num_clients, self.a, rng)
        try:
            test = perfedavg_mnist(test_y, self.num_clients, ta, rng)
        except ValueError as e:
            raise ValueError(f"test split (data.test_a={ta}): {e}") from None
        return Dealt(train, test, pooled=False)


class PfedmePaper(_Paper):
    """`data=mnist_pfedme`: `pfedme_mnist` on all images pooled, then each client's images split
    `train_frac` / rest per label (`split_train_test`), one RandomState(seed) for both."""

    name = "pfedme"

    def __init__(self, num_clients: int = 20, labels_per_client: int = 2, train_frac: float = 0.75,
                 seed: int = 0) -> None:
        super().__init__(num_clients, seed)
        self.labels_per_client = _labels_per_client(labels_per_client)
        self.train_frac = _train_frac(train_frac)

    def deal(self, train_y, test_y, groups=None) -> Dealt:
        y = np.concatenate([train_y, test_y]).astype(np.int64)
        rng = np.random.RandomState(self.seed)
        try:
            parts = pfedme_mnist(y, self.num_clients, self.labels_per_client, rng)
            train, test = split_train_test(y, parts, self.train_frac, rng)
        except ValueError as e:
            raise ValueError(f"mnist_pfedme: {e}") from None
        return Dealt(train, test, pooled=True)


class PfedmeAuthors(_Paper):
    """`data=mnist_pfedme_authors`: `pfedme_mnist_authors` on all images pooled (OpenML's order:
    training, then test images), with the labels their generator gave the rows."""

    name = "pfedme_authors"

    def __init__(self, num_clients: int = 20, labels_per_client: int = 2, seed: int = 1,
                 train_frac: float = 0.75) -> None:
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 10 or num_clients % 10:
            raise ValueError(f"mnist_pfedme_authors: data.num_clients={num_clients!r}: the authors' generator needs a "
                             f"positive multiple of 10")
        super().__init__(num_clients, seed)
        self.labels_per_client = _labels_per_client(labels_per_client)
        self.train_frac = _train_frac(train_frac)

    def deal(self, train_y, test_y, groups=None) -> Dealt:
        y = np.concatenate([train_y, test_y]).astype(np.int64)
        try:
            train, test = pfedme_mnist_authors(y, self.num_clients, self.labels_per_client, self.seed, self.train_frac)
        except ValueError as e:
            raise ValueError(f"mnist_pfedme_authors: {e}") from None
        return Dealt([i for i, _ in train], [i for i, _ in test], pooled=True,
                     train_labels=[lab for _, lab in train], test_labels=[lab for _, lab in test])


CIFAR_SPLITS = ("acid", "alid")


class Paper004(_Paper):
    """`data=cifar10_acid|..._alid|cifar100_*`: every device owns `classes_per_client` classes
    (`class_lists`) and gets floor(N / num_clients) training and test examples of them, dealt without
    replacement (`deal_classes`), training then test set, one RandomState(seed). ALID (`split=alid`)
    renames each device's classes by a private permutation onto 0..k-1 (the model has k outputs)."""

    def __init__(self, num_clients: int = 100, classes_per_client: int = 5, classes: str = "consecutive",
                 seed: int = 0, split: str = "acid") -> None:
        super().__init__(num_clients, seed)
        if split not in CIFAR_SPLITS:
            raise ValueError(f"data.split={split!r} is not one of {list(CIFAR_SPLITS)}")
        self.classes_per_client, self.classes, self.split, self.name = classes_per_client, classes, split, split
        self._num_classes = None  # the dataset's, told by check_dataset

    def check_dataset(self, dataset) -> None:
        self._num_classes = dataset.num_classes
        class_lists(dataset.num_classes, self.num_clients, self.classes_per_client, self.classes,
                    np.random.RandomState(self.seed))  # bad options fail before any reading

    def deal(self, train_y, test_y, groups=None) -> Dealt:
        rng = np.random.RandomState(self.seed)
        k = self.classes_per_client
        lists = class_lists(self._num_classes or int(max(train_y.max(), test_y.max())) + 1,
                            self.num_clients, k, self.classes, rng)
        train = deal_classes(train_y, lists, rng)
        try:
            test = deal_classes(test_y, lists, rng)
        except ValueError as e:
            raise ValueError(f"test split: {e}") from None
        out = Dealt(train, test, pooled=False, meta={"client_classes": lists})
        if self.split == "alid":  # the local label of class lists[c, j] is perms[c, j]
            perms = alid_permutations(self.num_clients, k, rng)
            relabel = lambda y, parts: [perms[c][np.searchsorted(lists[c], y[i])] for c, i in enumerate(parts)]
            out.train_labels, out.test_labels = relabel(train_y, train), relabel(test_y, test)
            out.num_classes, out.meta["client_labels"] = k, perms
        return out


def _labels_per_client(v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 10:
        raise ValueError(f"data.labels_per_client={v}: allowed 1..10 (MNIST has 10 labels)")
    return int(v)


def _train_frac(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v < 1.0:
        raise ValueError(f"data.train_frac={v}: allowed strictly between 0 and 1")
    return float(v)
