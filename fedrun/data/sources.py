"""Raw datasets: torchvision when the files are there (or can be downloaded), a clear error if not."""
from __future__ import annotations

import os

import numpy as np


class DataMissingError(RuntimeError):
    """The dataset's files are absent and could not be downloaded."""


MNIST_FILES = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
]


def _mnist_present(root: str) -> bool:
    raw = os.path.join(root, "MNIST", "raw")
    return all(os.path.exists(os.path.join(raw, f)) for f in MNIST_FILES)


def load_mnist(root: str, download: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST as (train_x uint8 [N,28,28], train_y, test_x, test_y) via torchvision.

    Looks in `root`/MNIST/raw; downloads there when the files are missing and `download` is set.
    """
    from torchvision.datasets import MNIST

    if not _mnist_present(root):
        why = "download=false"
        if download:
            try:
                MNIST(root, train=True, download=True)
                MNIST(root, train=False, download=True)
            except Exception as e:  # offline: URLError, timeouts, ...
                why = f"download failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        if not _mnist_present(root):
            raise DataMissingError(
                f"MNIST not found: expected {', '.join(MNIST_FILES)} in "
                f"{os.path.abspath(os.path.join(root, 'MNIST', 'raw'))} ({why}); copy them there "
                f"or point data.root at the folder that holds MNIST/raw"
            )
    tr = MNIST(root, train=True, download=False)
    te = MNIST(root, train=False, download=False)
    return tr.data.numpy(), tr.targets.numpy(), te.data.numpy(), te.targets.numpy()
