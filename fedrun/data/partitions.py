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
