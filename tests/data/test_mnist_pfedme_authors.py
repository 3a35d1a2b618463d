"""`data=mnist_pfedme_authors` against facts recorded by RUNNING the authors' May 2020 MNIST generator
(scripts/golden/record_mnist_pfedme_authors.py; the fixture holds its output, so CI needs neither
their code nor the real MNIST).
"""
from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest
from helpers import FIXTURES, write_mnist_idx

from fedrun.data import mnist_pfedme_authors
from fedrun.data.partitioners.paper import pfedme_mnist_authors

FACTS = json.load(open(os.path.join(FIXTURES, "mnist_pfedme_authors.json")))


def test_rows_labels_and_features_equal_the_generators_on_a_tiny_mnist(tmp_path):
    tiny = FACTS["tiny"]
    images = np.concatenate(write_mnist_idx(tmp_path, tiny["train_labels"], tiny["test_labels"]))
    images = images.reshape(len(images), -1).astype(np.float64)
    mu, sigma = images.mean(0), images.std(0) + 0.001
    d = mnist_pfedme_authors(root=str(tmp_path), download=False, cache_dir=None)
    assert d.num_clients == len(tiny["clients"]) == 20 and d.feature_shape == (784,)
    for name in ("train", "test"):
        split = getattr(d, name)
        for c, want in enumerate(tiny["clients"]):
            rows = split.client_rows(c)
            x = split.x[rows].numpy().astype(np.float64)
            px = np.rint(x[:, :2] * sigma[:2] + mu[:2]).astype(np.int64)
            assert (px[:, 0] + 256 * px[:, 1]).tolist() == want[name]["ids"], (name, c)
            assert split.y[rows].tolist() == want[name]["labels"], (name, c)
            np.testing.assert_allclose(x.sum(), want[name]["x_sum"], rtol=1e-6, atol=1e-3)
            np.testing.assert_allclose((x**2).sum(), want[name]["x_sq_sum"], rtol=1e-6)
    # the features are their per-pixel standardization, not MNIST's single mean and std
    x = d.train.x.numpy().astype(np.float64)
    first = d.train.client_rows(0).start
    px = np.rint(x[first, :2] * sigma[:2] + mu[:2]).astype(np.int64)
    np.testing.assert_allclose(x[first], (images[px[0] + 256 * px[1]] - mu) / sigma, rtol=1e-5, atol=1e-5)


def _full_mnist_like(counts, first) -> np.ndarray:
    """70,000 labels with full MNIST's digit counts and first ten labels, the rest in another order:
    the split's sizes, labels and overlaps depend on nothing else."""
    rest = np.bincount(first, minlength=10)
    tail = np.repeat(np.arange(10), np.asarray(counts) - rest)
    return np.concatenate([first, np.random.RandomState(0).permutation(tail)])


def test_full_mnist_sizes_labels_and_leak_equal_the_generators():
    full = FACTS["full"]
    labels = _full_mnist_like(full["digit_counts"], full["first_labels"])
    train, test = pfedme_mnist_authors(labels)
    for c, want in enumerate(full["clients"]):
        for name, (idx, y) in (("train", train[c]), ("test", test[c])):
            assert len(idx) == len(y) == want[name]["size"], (name, c)
            assert np.bincount(y, minlength=10).tolist() == want[name]["label_counts"], (name, c)
    assert min(len(i) for i, _ in train) == 1165 and max(len(i) for i, _ in train) == 3834  # the paper's range
    used = np.concatenate([i for i, _ in train + test])
    assert len(np.unique(used)) == full["distinct_images"] == 23536
    in_train = np.isin(np.concatenate([i for i, _ in test]), np.concatenate([i for i, _ in train]))
    assert (len(in_train), int(in_train.sum())) == (full["test_rows"], full["test_rows_in_some_train"])
    wrong = sum(int((labels[i] != y).sum()) for i, y in train + test)
    assert wrong == full["mislabelled_rows"] == 19


def test_bad_values_name_the_option(tmp_path):
    labels = np.repeat(np.arange(10), 80)
    with pytest.raises(ValueError,
                       match=r"^data.num_clients=15: the authors' generator needs a positive multiple of 10"):
        pfedme_mnist_authors(labels, num_clients=15)
    with pytest.raises(ValueError, match=r"^data.labels_per_client=11: allowed 1..10"):
        pfedme_mnist_authors(labels, labels_per_client=11)
    write_mnist_idx(tmp_path, FACTS["tiny"]["train_labels"], FACTS["tiny"]["test_labels"])
    with pytest.raises(ValueError, match=r"^mnist_pfedme_authors: data.num_clients=0"):
        mnist_pfedme_authors(root=str(tmp_path), num_clients=0, download=False, cache_dir=None)


def test_config_composes_with_every_parameter():
    from hydra import compose, initialize_config_dir

    from fedrun.config import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["experiment=pfedme_mnist_dnn_fedavg", "data=mnist_pfedme_authors"])
    assert cfg.data._target_ == "fedrun.data.presets.mnist_pfedme_authors"
    assert (cfg.data.num_clients, cfg.data.labels_per_client, cfg.data.seed, cfg.data.train_frac) == (20, 2, 1, 0.75)
    assert set(cfg.data) - {"_target_"} == set(inspect.signature(mnist_pfedme_authors).parameters)
