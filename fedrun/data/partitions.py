"""Partitioners: pure functions `labels, rng -> list of index arrays` (one per client)."""
from __future__ import annotations

import numpy as np


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
