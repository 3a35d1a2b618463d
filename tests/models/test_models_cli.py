"""The image models through `fedrun` end to end, on a tiny MNIST in torchvision's raw layout: the
input shape comes from the data (1x28x28), a round trains and is scored, and metrics.csv is written.
(The text models and the LSTM take token ids, which no dataset= gives yet: tests/models/test_models.py
runs them through the engines directly.)"""
import numpy as np
import pandas as pd
import pytest
from helpers import fedrun, write_mnist_idx

RUN = ["dataset=mnist", "partition=iid", "partition.num_clients=4", "dataset.download=false", "rounds=1", "tau=1",
       "clients_per_round=2", "batch_size=4", "progress=false"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("mnist")
    rng = np.random.RandomState(0)
    write_mnist_idx(r, rng.permutation(np.repeat(np.arange(10), 4)), rng.permutation(np.repeat(np.arange(10), 2)))
    return r


@pytest.mark.parametrize("args", [["model=fedavg_cnn", "algo=fedavg"],
                                  ["model=resnet10", "model.width=4", "model.norm=bn", "algo=fedbn"]])
def test_image_model_runs_a_round_through_the_cli(root, tmp_path, args):
    out = tmp_path / "run"
    r = fedrun([*RUN, f"dataset.root={root}", *args, f"hydra.run.dir={out}"], tmp_path)
    assert r.returncode == 0, r.stderr
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics["round"]) == [1]
    assert np.isfinite(metrics["train_loss"]).all() and 0 <= metrics["global_acc"].iloc[0] <= 1


def test_a_bad_norm_is_one_line(root, tmp_path):
    r = fedrun([*RUN, f"dataset.root={root}", "model=resnet18", "model.norm=layer"], tmp_path)
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "model.norm='layer' is not allowed; choose one of: bn, gn, none" in lines[0]
