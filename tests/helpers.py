"""Helpers the test files share: the `fedrun` command line run in this process (and, for the smoke
tests, in a new one), config group options as Hydra lists them, toy quadratic problems, and tiny
MNIST / CIFAR files in the formats the loaders read."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import struct
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import torch
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from torch import nn

from fedrun.config import CONF_DIR
from fedrun.data.datasets.cifar import CIFAR_FILES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")  # data recorded from the authors' code (scripts/ record them)


def group_options(group: str) -> list[str]:
    """The options of a config group (algo, data, model, experiment), as Hydra lists them."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def fedrun(args: list[str], cwd, env: dict | None = None) -> Result:
    """`fedrun *args` in `cwd`, run in this process through fedrun.cli.main: what it prints, and the
    exit status its SystemExit carries (0 when it returns). FEDRUN_CACHE is `cwd`/cache; torch uses
    one thread, as the subprocess runs do (OMP_NUM_THREADS=1), so their numbers compare byte for byte."""
    from fedrun.cli import main

    env = {"FEDRUN_CACHE": str(os.path.join(cwd, "cache")), **(env or {})}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    out, err = io.StringIO(), io.StringIO()
    code = 0
    threads = torch.get_num_threads()
    hydra_config = HydraConfig.instance().cfg  # `--cfg job` sets it and leaves it set
    GlobalHydra.instance().clear()
    try:
        torch.set_num_threads(1)
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["fedrun", *map(str, args)]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = hydra_config
        torch.set_num_threads(threads)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for h in root.handlers:  # Hydra's job logging: a console handler on our StringIO, a log file
            if h not in saved_handlers:
                h.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return Result(code, out.getvalue(), err.getvalue())


def fedrun_subprocess(args: list[str], cwd, env: dict | None = None) -> Result:
    """`python -m fedrun.cli *args` in a new process (the smoke tests: what a user really runs)."""
    env = {**os.environ, "FEDRUN_CACHE": str(os.path.join(cwd, "cache")), "OMP_NUM_THREADS": "1", **(env or {})}
    r = subprocess.run([sys.executable, "-m", "fedrun.cli", *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    return Result(r.returncode, r.stdout, r.stderr)


# ----------------------------------------------------------------------------------------------
# toy quadratic problems (hand-computable gradients and Hessians)
# ----------------------------------------------------------------------------------------------

def half_squared(out, y, reduction="mean"):
    """0.5 (x.w - y)^2: a quadratic in w with Hessian X^T X / B."""
    per = 0.5 * (out.squeeze(-1) - y) ** 2
    return per.mean() if reduction == "mean" else per.sum() if reduction == "sum" else per


def quadratic_setup(m=3, B=6, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = nn.Linear(d, 1, bias=False).double()
    w = torch.randn(m, 1, d, generator=g, dtype=torch.float64)
    xs = [torch.randn(m, B, d, generator=g, dtype=torch.float64) for _ in range(3)]
    ys = [torch.randn(m, B, generator=g, dtype=torch.float64) for _ in range(3)]
    return model, {"weight": w}, list(zip(xs, ys))


def quad_grad(w, x, y):  # w [d], x [B, d], y [B]
    return x.T @ (x @ w - y) / len(y)


# ----------------------------------------------------------------------------------------------
# tiny MNIST in torchvision's raw idx layout
# ----------------------------------------------------------------------------------------------

def _write_idx(path: str, magic: int, array: np.ndarray) -> None:
    """Writes `array` (uint8) in the big-endian idx format MNIST uses."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in array.shape:
            f.write(struct.pack(">I", d))
        f.write(array.tobytes())


def _mnist_images(labels: np.ndarray, start: int) -> np.ndarray:
    """uint8 [N, 28, 28] images; pixels (0, 0) and (0, 1) encode the image's global id (start + i)."""
    rng = np.random.RandomState(start + 12345)
    images = rng.randint(0, 256, size=(len(labels), 28, 28)).astype(np.uint8)
    ids = start + np.arange(len(labels))
    images[:, 0, 0] = ids % 256
    images[:, 0, 1] = ids // 256
    return images


def write_mnist_idx(root, train_labels, test_labels):
    """Writes a tiny MNIST in torchvision's raw layout under root/MNIST/raw.

    Returns (train_images, test_images) as uint8 [N, 28, 28]. Train image i carries id i and test
    image i carries id len(train_labels) + i in its first two pixels (see `_mnist_images`).
    """
    train_labels = np.asarray(train_labels, dtype=np.uint8)
    test_labels = np.asarray(test_labels, dtype=np.uint8)
    raw = os.path.join(str(root), "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    train_images = _mnist_images(train_labels, 0)
    test_images = _mnist_images(test_labels, len(train_labels))
    _write_idx(os.path.join(raw, "train-images-idx3-ubyte"), 0x00000803, train_images)
    _write_idx(os.path.join(raw, "train-labels-idx1-ubyte"), 0x00000801, train_labels)
    _write_idx(os.path.join(raw, "t10k-images-idx3-ubyte"), 0x00000803, test_images)
    _write_idx(os.path.join(raw, "t10k-labels-idx1-ubyte"), 0x00000801, test_labels)
    return train_images, test_images


# ----------------------------------------------------------------------------------------------
# tiny CIFAR-10 / CIFAR-100 in the python pickle format
# ----------------------------------------------------------------------------------------------

def _images(n: int, start: int) -> np.ndarray:
    """uint8 [n, 3072]; pixels 0 and 1 (channel 0, row 0) hold the image's global id start + i."""
    x = np.random.RandomState(start + 7).randint(0, 256, size=(n, 3072)).astype(np.uint8)
    ids = start + np.arange(n)
    x[:, 0], x[:, 1] = ids % 256, ids // 256
    return x


def write_cifar(root, num_classes: int, train_per_class: int, test_per_class: int, batches: int = 5):
    """Writes CIFAR-`num_classes` pickles under root; returns (train_x, train_y, test_x, test_y)
    as load_cifar should give them (train ids 0.., test ids after them; labels shuffled)."""
    folder, train_files, test_files, key = CIFAR_FILES[num_classes]
    rng = np.random.RandomState(num_classes)
    try_ = rng.permutation(np.repeat(np.arange(num_classes), train_per_class))
    tey = rng.permutation(np.repeat(np.arange(num_classes), test_per_class))
    trx, tex = _images(len(try_), 0), _images(len(tey), len(try_))
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for files, x, y in ((train_files, trx, try_), (test_files, tex, tey)):
        for f, xs, ys in zip(files, np.array_split(x, len(files)), np.array_split(y, len(files))):
            with open(os.path.join(root, folder, f), "wb") as fh:
                pickle.dump({b"data": xs, key: ys.tolist(), b"batch_label": b"tiny"}, fh)
    return trx.reshape(-1, 3, 32, 32), try_, tex.reshape(-1, 3, 32, 32), tey


# ----------------------------------------------------------------------------------------------
# tiny LEAF (FEMNIST) JSON user files
# ----------------------------------------------------------------------------------------------

def write_leaf(root, writers: int = 6, seed: int = 0) -> None:
    """LEAF's FEMNIST layout: femnist/data/{train,test}/*.json, users split over two files."""
    import json

    rng = np.random.RandomState(seed)
    for split, per in (("train", 9), ("test", 3)):
        folder = os.path.join(root, "femnist", "data", split)
        os.makedirs(folder, exist_ok=True)
        users = [f"f{u:04d}_{u % 3}" for u in range(writers)]
        for i, chunk in enumerate((users[: writers // 2], users[writers // 2:])):
            blob = {"users": chunk, "num_samples": [per] * len(chunk), "user_data": {
                u: {"x": rng.rand(per, 784).round(3).tolist(), "y": rng.randint(0, 62, per).tolist()} for u in chunk}}
            with open(os.path.join(folder, f"all_data_{i}_niid_{split}.json"), "w") as f:
                json.dump(blob, f)


def built(group: str, options: dict):
    """The object `conf/<group>/<name>.yaml` instantiates (group: dataset | partition; `name` picks
    the yaml, the other options override it), as `fedrun dataset=... partition=...` builds it; a bad
    option raises the class's own error."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from fedrun.config import group_conf

    options = dict(options)
    name = options.pop("name") if group == "partition" else options["name"]
    node = group_conf(group, name)  # with the shared options it includes (partition: _split.yaml)
    try:
        return instantiate(OmegaConf.merge(node, options))
    except InstantiationException as e:
        cause = e
        while isinstance(cause, InstantiationException) and cause.__cause__:
            cause = cause.__cause__
        raise cause from None


def compose_data(dataset: dict, partition: dict, cache_dir: str | None = None, chunk_len: int = 256):
    """fedrun.data.composed of the dataset and partition `built` from their yamls and `options`."""
    from fedrun.data.composed import composed

    return composed(built("dataset", dataset), built("partition", partition), cache_dir, chunk_len)


def rounding_bound(dtype: torch.dtype, magnitude: float, ops: int) -> float:
    """A bound on how far two computations of one value in `dtype` can differ when they round in other
    orders (another CPU kernel, vector width, summation order, torch build): every rounding operation on
    the way commits at most eps/2 of the size of the numbers it combines, so one computation is within
    ops * eps/2 * magnitude of the exact value (Higham's gamma_n, first order) and two within
    ops * eps * magnitude. `magnitude`: the largest size of the numbers the value is computed from
    (not of the value: a difference of close numbers keeps their absolute error); `ops`: the longest
    chain of rounding operations that feeds the value (a length-n dot product or sum counts n).
    The golden tests derive their tolerances from it (docs/testing.md, "Golden tolerances")."""
    return ops * torch.finfo(dtype).eps * magnitude
