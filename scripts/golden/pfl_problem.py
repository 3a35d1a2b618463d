"""The tiny fixed problem of the paper-004 golden traces, shared by `record_pfl.py` (which runs the
authors' code on it) and `tests/test_golden_pfl.py` (which runs fedrun on it). Plain torch/numpy.

3 devices with 10/12/14 training and 6/7/8 test images (CIFAR-shaped, 3x32x32), 5 classes each out
of 10 (ACID-style: device c owns classes (2c + j) mod 10, j < 5), every class on every device in
both splits; the images are noise plus a class pattern. Initial weights of the CIFAR CNN drawn
like torch's default init from a fixed generator. Minibatches: a fixed sequence per device of
(support, query) pairs of BATCH=4 distinct rows where every query class occurs in the support batch, so
the authors' Proto loaders never reject a pair.

The fixture stores checksums of what these functions build, so a change in torch's generator shows
up as a clear failure instead of a silent mismatch.

Tensors are recorded by a sketch (`sketch`): per tensor its sum, L2 norm, one fixed entry and
PROJECTIONS random projections <r_j, v> with fixed Gaussian r_j (entries N(0, 1/n), `projections`).
The CNN has 797,962 parameters, so a full float64 copy of one model is 6.4 MB and a trace holds
~25 models and states per method; a projection is a linear function of EVERY entry, so it compares
with the same float tolerance as a full copy would, and a difference e in the tensor moves each
projection by ~||e|| / sqrt(n) (N(0, ||e||^2 / n)); the sum and one entry alone miss e.g. any
permutation of entries and most changes that sum to zero.
"""
from __future__ import annotations

import math

import numpy as np
import torch

NUM_CLIENTS = 3
NUM_CLASSES = 10  # the authors' CIFAR-10 model has 10 outputs in ACID
CLASSES_PER_CLIENT = 5
TRAIN_SIZES = (10, 12, 14)
TEST_SIZES = (6, 7, 8)
BATCH = 4
SEED = 4
SCALE = 3.0  # input scale: large enough that the clip at 10 acts on some steps

# fedrun's CNN parameter names and the authors' (utils_models.client_model, 'cifar10'), in order.
NAMES = [("conv.0.weight", "conv1.weight"), ("conv.0.bias", "conv1.bias"),
         ("conv.3.weight", "conv2.weight"), ("conv.3.bias", "conv2.bias"),
         ("hidden.0.weight", "fc1.weight"), ("hidden.0.bias", "fc1.bias"),
         ("hidden.2.weight", "fc2.weight"), ("hidden.2.bias", "fc2.bias"),
         ("head.weight", "fc3.weight"), ("head.bias", "fc3.bias")]
SHAPES = [(64, 3, 5, 5), (64,), (64, 64, 5, 5), (64,), (384, 1600), (384,), (192, 384), (192,),
          (NUM_CLASSES, 192), (NUM_CLASSES,)]


def client_classes(c: int) -> list[int]:
    return [(2 * c + j) % NUM_CLASSES for j in range(CLASSES_PER_CLIENT)]


def _labels(rng: np.random.RandomState, c: int, n: int) -> np.ndarray:
    cls = client_classes(c)
    y = np.array([cls[j % len(cls)] for j in range(n)])  # every class at least once (n >= 5)
    return y[rng.permutation(n)]


def data() -> dict:
    """{'train': [(x [n,3,32,32] float32, y [n] int64) per device], 'test': [...]}."""
    rng = np.random.RandomState(SEED)
    g = torch.Generator().manual_seed(SEED)
    pattern = torch.rand(NUM_CLASSES, 3, 32, 32, generator=g, dtype=torch.float32)
    out = {}
    for split, sizes in (("train", TRAIN_SIZES), ("test", TEST_SIZES)):
        parts = []
        for c, n in enumerate(sizes):
            y = _labels(rng, c, n)
            x = SCALE * (torch.rand(n, 3, 32, 32, generator=g, dtype=torch.float32) + pattern[torch.as_tensor(y)])
            parts.append((x.numpy().astype(np.float32), y.astype(np.int64)))
        out[split] = parts
    return out


def initial_params() -> dict[str, torch.Tensor]:
    """fedrun-named float32 initial weights: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) per tensor (torch's default
    bounds for conv/linear), from one fixed generator."""
    g = torch.Generator().manual_seed(SEED + 1)
    out = {}
    for i, ((name, _), shape) in enumerate(zip(NAMES, SHAPES)):
        b = 1 / math.sqrt(math.prod(SHAPES[i - i % 2][1:]))  # a bias uses its weight's fan-in
        out[name] = (torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1) * b
    return out


def batch_pairs(n_pairs: int) -> list[list[np.ndarray]]:
    """Per device, `n_pairs` (support, query) pairs of BATCH distinct local row indices each, every
    query class present in the support batch; flattened in order: s0, q0, s1, q1, ..."""
    rng = np.random.RandomState(SEED + 2)
    labels = [y for _, y in data()["train"]]
    out = []
    for c in range(NUM_CLIENTS):
        seq = []
        while len(seq) < 2 * n_pairs:
            s = rng.choice(len(labels[c]), BATCH, replace=False)
            q = rng.choice(len(labels[c]), BATCH, replace=False)
            if set(labels[c][q]) <= set(labels[c][s]):
                seq += [s, q]
        out.append(seq)
    return out


PROJECTIONS = 8


def projections() -> list[torch.Tensor]:
    """Per tensor (NAMES order) a [PROJECTIONS, n] float64 matrix with N(0, 1/n) entries, from one fixed
    generator (float64 draws: the same on every machine and in the recorder and the test)."""
    g = torch.Generator().manual_seed(SEED + 3)
    return [torch.randn(PROJECTIONS, math.prod(s), generator=g, dtype=torch.float64) / math.sqrt(math.prod(s))
            for s in SHAPES]


def sketch(tensors: list[torch.Tensor], proj: list[torch.Tensor], entries: list[int]) -> dict:
    """The recorded summary of one model or state (tensors in NAMES order, any shape, made float64):
    {fedrun name: [sum, L2 norm]}, "entries": the flat vector's entries at `entries`,
    "proj": {fedrun name: [<r_j, v> for the PROJECTIONS rows r_j of its projection matrix]}."""
    return sketches([tensors], proj, entries)[0]


def sketches(models: list[list[torch.Tensor]], proj: list[torch.Tensor], entries: list[int]) -> list[dict]:
    """`sketch` of several models at once (one pass over each projection matrix)."""
    sizes = [math.prod(s) for s in SHAPES]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    where = [next((i, e - o) for i, o in reversed(list(enumerate(starts))) if e >= o) for e in entries]
    sums, norms, projected, picked = [], [], [], [[] for _ in models]
    for i in range(len(NAMES)):
        v = torch.stack([m[i].detach().reshape(-1) for m in models]).to(torch.float64)
        sums.append(v.sum(1).tolist())
        norms.append(v.norm(dim=1).tolist())
        projected.append((v @ proj[i].T).tolist())
        for j, (t, e) in enumerate(where):
            if t == i:
                for k in range(len(models)):
                    picked[k].append((j, float(v[k, e])))
    out = []
    for k in range(len(models)):
        d = {name: [sums[i][k], norms[i][k]] for i, (name, _) in enumerate(NAMES)}
        d["entries"] = [x for _, x in sorted(picked[k])]
        d["proj"] = {name: projected[i][k] for i, (name, _) in enumerate(NAMES)}
        out.append(d)
    return out


def checksums() -> dict:
    d = data()
    p = initial_params()
    return {
        "train_x_sum": [float(x.astype(np.float64).sum()) for x, _ in d["train"]],
        "test_x_sum": [float(x.astype(np.float64).sum()) for x, _ in d["test"]],
        "train_y": [y.tolist() for _, y in d["train"]],
        "test_y": [y.tolist() for _, y in d["test"]],
        "params_sum": {k: float(v.double().sum()) for k, v in p.items()},
        "projections_sum": [float(r.sum()) for r in projections()],
    }
