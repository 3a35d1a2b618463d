"""Power-law Synthetic(alpha, beta) data of FedProx, as generated for pFedMe (paper 002, Sec. 5.1).

Facts reproduced (../shared/SPEC.md section 2): 100 clients, 60 features, 10 classes; samples per
client = (int(lognormal(4, 2)) + 50) * 5; u_k ~ N(0, alpha), W_k ~ N(u_k, 1), b_k ~ N(u_k, 1);
B_k ~ N(0, beta), v_k ~ N(B_k, 1); x ~ N(v_k, diag(j^-1.2)); y = argmax(x W_k + b_k); each client's
data shuffled and split 90% train / 10% test. The draws follow the reference generator's order, so
seed 0 gives its 205,795 samples.
"""
from __future__ import annotations

import numpy as np


def generate_synthetic(
    num_clients: int = 100,
    alpha: float = 0.5,
    beta: float = 0.5,
    dim: int = 60,
    num_classes: int = 10,
    train_frac: float = 0.9,
    seed: int = 0,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]]]:
    """Returns (train, test): per client a pair (x float32 [n, dim], y int64 [n])."""
    rng = np.random.RandomState(seed)
    sizes = (rng.lognormal(4, 2, num_clients).astype(int) + 50) * 5
    mean_w = rng.normal(0, alpha, num_clients)
    mean_b = mean_w
    big_b = rng.normal(0, beta, num_clients)
    cov_x = np.diag(np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2))
    mean_x = np.stack([rng.normal(big_b[k], 1, dim) for k in range(num_clients)])
    train, test = [], []
    for k in range(num_clients):
        w = rng.normal(mean_w[k], 1, (dim, num_classes))
        b = rng.normal(mean_b[k], 1, num_classes)
        x = rng.multivariate_normal(mean_x[k], cov_x, sizes[k])
        y = np.argmax(x @ w + b, axis=1)
        perm = rng.permutation(sizes[k])
        x, y = x[perm].astype(np.float32), y[perm].astype(np.int64)
        n_train = int(train_frac * sizes[k])
        train.append((x[:n_train], y[:n_train]))
        test.append((x[n_train:], y[n_train:]))
    return train, test
