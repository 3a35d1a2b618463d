"""dataset= x partition= (fedrun.data.composed): the idx loaders (MNIST, Fashion-MNIST, EMNIST in
torchvision's layout, plain or gzipped), CIFAR through the same path, test rows (split / dataset),
held-out clients and their new_* columns end to end, and the one-line errors.

Tiny files in the real formats are written here; every image carries its id in its first pixels."""
from __future__ import annotations

import gzip
import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import _write_idx, fedrun, write_cifar, write_leaf, write_mnist_idx
from helpers import compose_data as composed

from fedrun.data.datasets.idx import idx_files, load_idx, read_idx
from fedrun.errors import DataMissingError

TRAIN = np.random.RandomState(0).permutation(np.repeat(np.arange(10), 60))
TEST = np.random.RandomState(1).permutation(np.repeat(np.arange(10), 20))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("data")
    write_mnist_idx(r, TRAIN, TEST)
    shutil.copytree(r / "MNIST", r / "FashionMNIST")
    raw = r / "FashionMNIST" / "raw"
    for f in os.listdir(raw):  # Fashion-MNIST as its own repository ships it: gzipped
        with open(raw / f, "rb") as src, gzip.open(raw / f"{f}.gz", "wb") as dst:
            dst.write(src.read())
        os.remove(raw / f)
    # EMNIST letters: labels 1..26, images stored transposed
    emnist = r / "EMNIST" / "raw"
    os.makedirs(emnist)
    rng = np.random.RandomState(2)
    for name in idx_files("emnist", "letters"):
        n = 260 if "train" in name else 52
        y = rng.permutation(np.repeat(np.arange(1, 27), n // 26))
        _write_idx(str(emnist / name), 0x801 if "labels" in name else 0x803,
                   y if "labels" in name else rng.randint(0, 256, (n, 28, 28)))
    write_cifar(str(r), 10, 20, 10)
    return str(r)


def _ids(x: torch.Tensor) -> np.ndarray:
    px = np.rint((x[:, :2].numpy().astype(np.float64) * 0.3081 + 0.1307) * 255).astype(np.int64)
    return px[:, 0] + 256 * px[:, 1]


def test_idx_loaders_read_plain_and_gzipped_files(root):
    a = load_idx(root, "mnist", download=False)
    b = load_idx(root, "fmnist", download=False)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(a[1], TRAIN)
    trx, try_, tex, tey = load_idx(root, "emnist", "letters", download=False)
    raw = read_idx(os.path.join(root, "EMNIST", "raw", idx_files("emnist", "letters")[0]))
    np.testing.assert_array_equal(trx, raw.transpose(0, 2, 1))  # upright
    assert try_.min() == 1 and try_.max() == 26


def test_missing_dataset_error_names_files_and_folder(tmp_path):
    with pytest.raises(DataMissingError) as e:
        load_idx(str(tmp_path), "fmnist", download=False)
    msg = str(e.value)
    assert "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte" in msg
    assert str(tmp_path / "FashionMNIST" / "raw") in msg and "\n" not in msg


@pytest.mark.parametrize("test", ["split", "dataset"])
def test_mnist_rows_each_used_once_with_held_out_clients_last(root, test):
    part = dict(name="dirichlet", num_clients=10, alpha=0.5, min_size=20, holdout=0.3, test=test, seed=4)
    d = composed(dict(name="mnist", root=root, download=False), part)
    assert d.num_clients == 10 and d.num_holdout == 3 and d.num_train_clients == 7
    tr, te = _ids(d.train.x), _ids(d.test.x)
    both = np.concatenate([tr, te])
    assert len(np.unique(both)) == len(both)  # no image in two clients or in train and test
    labels = np.concatenate([TRAIN, TEST])
    np.testing.assert_array_equal(d.train.y.numpy(), labels[tr])
    if test == "dataset":  # training rows from the training file, test rows from the test file
        assert tr.max() < len(TRAIN) and te.min() >= len(TRAIN)
        assert len(tr) == len(TRAIN) and len(te) == len(TEST)
        # each client's test labels only where it has training rows of that label
        trc, tec = d.train.label_counts(10).numpy(), d.test.label_counts(10).numpy()
        assert ((tec > 0) <= (trc > 0)).all()
    again = composed(dict(name="mnist", root=root, download=False), part)
    assert torch.equal(again.train.x, d.train.x) and torch.equal(again.test.y, d.test.y)


def test_emnist_letters_and_cifar_compose(root):
    e = composed(dict(name="emnist", split="letters", root=root, download=False), dict(name="shards", num_clients=13))
    assert e.num_classes == 26 and e.train.y.min() == 0 and e.feature_shape == (784,)
    c = composed(dict(name="cifar10", root=root, download=False, pad_fill="black"),
                 dict(name="classes", num_clients=5, classes_per_client=2))
    assert c.feature_shape == (3, 32, 32) and c.augment == "crop_flip" and c.augment_fill is not None
    assert (c.train.label_counts(10) > 0).sum(1).tolist() == [2] * 5


def test_composed_cache_serves_the_same_rows(root, tmp_path):
    ds, part = dict(name="fmnist", root=root, download=False), dict(name="iid", num_clients=4, holdout=1)
    a = composed(ds, part, cache_dir=str(tmp_path))
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".pt")]) == 1  # beside file-digests.json
    b = composed(ds, part, cache_dir=str(tmp_path))
    assert torch.equal(a.train.x, b.train.x) and b.num_holdout == 1


def test_a_dataset_choice_composes_data_with_partition_iid_and_no_argv_is_rewritten():
    """Hydra does it: conf/dataset/*.yaml select data=composed and partition=iid (a partition= of the
    command line wins), conf/partition/*.yaml select data=composed; the shared options are one node."""
    from hydra import compose, initialize_config_dir

    from fedrun.config import CONF_DIR

    with initialize_config_dir(CONF_DIR, version_base=None):
        for overrides, partition in ((["dataset=mnist"], "Iid"), (["partition=shards", "dataset=fmnist"], "Shards")):
            cfg = compose("config", overrides=[*overrides, "partition.holdout=0.2"], return_hydra_config=True)
            assert cfg.hydra.runtime.choices.data == "composed"
            assert cfg.data.partition._target_.endswith(partition) and cfg.data.partition.holdout == 0.2
        assert compose("config").data._target_ == "fedrun.data.presets.synthetic"


def test_dataset_and_partition_before_a_flag_compose(tmp_path):
    from helpers import fedrun

    r = fedrun(["dataset=mnist", "partition=iid", "--cfg", "job"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "_target_: fedrun.data.composed" in r.stdout and "name: mnist" in r.stdout


SMALL = ["rounds=2", "tau=2", "clients_per_round=3", "batch_size=5", "model=mlr", "progress=false"]


@pytest.mark.parametrize("algo", ["fedavg", "pfedme"])
def test_holdout_run_reports_new_columns_and_never_trains_held_out_clients(root, tmp_path, algo):
    out = tmp_path / "o"
    r = fedrun(["dataset=mnist", "partition=shards", "partition.num_clients=10", "partition.holdout=0.2",
                f"dataset.root={root}", "dataset.download=false", f"algo={algo}", *SMALL, f"hydra.run.dir={out}"],
               tmp_path)
    assert r.returncode == 0, r.stderr
    m = pd.read_csv(out / "metrics.csv")
    for col in ("new_global_acc", "new_global_acc_min", "new_pers_acc", "new_pers_loss"):
        assert col in m and m[col].notna().all()
    s = json.loads((out / "summary.json").read_text())
    assert "new_global_acc_last_round" in s and "new_pers_acc_last_round" in s
    clients = pd.read_csv(out / "clients.csv")
    assert clients["heldout"].tolist() == [0] * 8 + [1] * 2
    # the held-out clients' pooled accuracy is theirs alone: recomputed from clients.csv
    held = clients[clients.heldout == 1]
    acc = (held.global_acc * held.n_test).sum() / held.n_test.sum()
    assert m.new_global_acc.iloc[-1] == pytest.approx(acc, abs=1e-6)
    seen = clients[clients.heldout == 0]
    assert m.global_acc.iloc[-1] == pytest.approx((seen.global_acc * seen.n_test).sum() / seen.n_test.sum(), abs=1e-6)
    assert pd.read_csv(out / "partition.csv")["heldout"].sum() == 2
    assert (out / "partition.png").exists()


def test_held_out_clients_are_never_sampled():
    from fedrun.data.federated import ClientSplit, FederatedData
    from fedrun.simulate import Schedule, sample_round

    split = ClientSplit.from_parts([(np.zeros((3, 2), np.float32), np.zeros(3, np.int64))] * 10)
    d = FederatedData("t", split, split, 2, num_holdout=4)
    sched = Schedule(rounds=1, tau=1, clients_per_round=6, batch_size=2)
    for rnd in range(20):
        clients, trained, _ = sample_round(d, sched, 1, 0, rnd, train_all=True)
        assert clients.max() < 6 and trained.tolist() == list(range(6))


@pytest.mark.parametrize("args, expected", [
    (["partition.alpha=-1"], "partition.alpha=-1"),
    (["data=synthetic"], "cannot go with data=synthetic"),
    (["partition=nope"], "partition='nope' is not a known partition"),
    (["partition.shards_per_client=2"], "partition.shards_per_client is not an option of partition=dirichlet"),
])
def test_bad_partition_options_one_line_exit_2(root, tmp_path, args, expected):
    r = fedrun(["dataset=mnist", "partition=dirichlet", f"dataset.root={root}", "dataset.download=false", *SMALL,
                *args, f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path)
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1 and expected in lines[0], r.stderr
    assert not (tmp_path / "bad" / "partition.png").exists()


def test_holdout_with_train_all_refused(root, tmp_path):
    r = fedrun(["dataset=mnist", "partition=iid", "partition.num_clients=6", "partition.holdout=1",
                f"dataset.root={root}",
                "dataset.download=false", "algo=pfedme", "algo.train_all=true", *SMALL], tmp_path)
    assert r.returncode == 2 and "algo.train_all=true trains every client" in r.stderr
    assert not (tmp_path / "bad" / "metrics.csv").exists()


def test_partition_without_dataset_refused(tmp_path):
    r = fedrun(["partition=iid", *SMALL], tmp_path)
    assert r.returncode == 2 and ("data=composed needs dataset=<option>; choose one of: agnews, cifar10, cifar100, "
                                  "emnist" in r.stderr)


def test_fedrun_data_prints_stats_and_draws_without_training(root, tmp_path, capsys):
    from fedrun.data_cli import main

    out = tmp_path / "p"
    main(["--out", str(out), "--clients", "3", "dataset=mnist", "partition=classes", "partition.num_clients=6",
          "partition.classes_per_client=2", "partition.holdout=2", f"dataset.root={root}", "dataset.download=false",
          f"cache_dir={tmp_path / 'cache'}"])
    text = capsys.readouterr().out
    assert "clients: 6 (2 held out), labels: 10, training rows: 600, test rows: 200" in text
    assert "labels per client: min 2, median 2, mean 2.0, max 2" in text
    assert "... 3 more in partition.csv" in text
    part = pd.read_csv(out / "partition.csv")
    assert part.heldout.tolist() == [0, 0, 0, 0, 1, 1] and (out / "partition.png").stat().st_size > 1000
    with pytest.raises(SystemExit) as e:
        main(["--out", str(out), "dataset=mnist", "partition=shards", "partition.shards_per_client=0",
              f"dataset.root={root}", "dataset.download=false"])
    assert e.value.code == 2 and "partition.shards_per_client=0" in capsys.readouterr().err


def test_femnist_natural_split_is_per_writer_with_leafs_test_rows(tmp_path):
    write_leaf(str(tmp_path))
    d = composed(dict(name="femnist", root=str(tmp_path)), dict(name="natural", test="dataset", holdout=2))
    assert d.num_clients == 6 and d.num_holdout == 2 and d.num_classes == 62 and d.feature_shape == (784,)
    assert d.train.sizes.tolist() == [9] * 6 and d.test.sizes.tolist() == [3] * 6
    pooled = composed(dict(name="femnist", root=str(tmp_path)), dict(name="natural", test="split", train_frac=0.75))
    assert (pooled.train.sizes + pooled.test.sizes).tolist() == [12] * 6


def test_natural_partition_refused_without_writer_ids(root, tmp_path):
    with pytest.raises(ValueError, match="partition=natural needs rows with writer ids"):
        composed(dict(name="cifar10", root=root), dict(name="natural"))
    with pytest.raises(DataMissingError, match=r"LEAF's JSON user files \(\*.json\) in .*femnist/data/train"):
        composed(dict(name="femnist", root=str(tmp_path)), dict(name="natural"))


def test_stratified_split_sizes_and_labels_follow_train_frac():
    from fedrun.data.partitioners import stratified_split

    rng = np.random.default_rng(0)
    owner = rng.integers(0, 30, 6000)
    labels = rng.integers(0, 10, 6000)
    train = stratified_split(owner, labels, 0.75, np.random.default_rng(1))
    for c in range(30):
        mine = owner == c
        n, t = mine.sum(), (mine & ~train).sum()
        assert t == min(max(int(np.floor(0.25 * n + 0.5)), 1), n - 1)
        per_label = np.bincount(labels[mine & ~train], minlength=10) - 0.25 * np.bincount(labels[mine], minlength=10)
        assert np.abs(per_label).max() <= 1  # a systematic sample over the label-sorted rows
    tiny = stratified_split(np.array([0, 1, 1]), np.array([3, 4, 5]), 0.75, np.random.default_rng(0))
    assert tiny[0] and tiny[1:].sum() == 1  # a single row trains; two rows: one of each


def test_partition_options_checked_before_any_file_is_read(tmp_path):
    """No data under tmp_path: a bad option must be named before the missing files are."""
    for part, msg in ((dict(name="dirichlet", alpha=-1.0), "partition.alpha=-1.0: allowed a number > 0"),
                      (dict(name="shards", alpha=0.5), "partition.alpha is not an option of partition=shards"),
                      (dict(name="quantity", sizes="zipf"), "partition.sizes='zipf'"),
                      (dict(name="iid", num_clients=0), "partition.num_clients=0"),
                      (dict(name="iid", holdout=1.5), "partition.holdout=1.5"),
                      (dict(name="iid", test="both"), "partition.test='both': allowed one of split, dataset")):
        with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
            composed(dict(name="mnist", root=str(tmp_path), download=False), part)
    from fedrun.data.datasets.idx import Idx

    with pytest.raises(ValueError, match="dataset.name='svhn': allowed one of mnist, fmnist, emnist"):
        Idx("svhn", str(tmp_path))


@pytest.mark.parametrize("option, says", [("rounds=abc", "rounds='abc' must be an integer >= 1"),
                                          ("device=tpu", "device='tpu' is not allowed"),
                                          ("seed=-3", "seed=-3 must be an integer >= 0")])
def test_fedrun_data_checks_the_options_it_does_not_use(root, tmp_path, capsys, option, says):
    """fedrun-data ignores the training options, but a command it accepts must be one fedrun accepts:
    `rounds=abc` drew the partition and said nothing."""
    from fedrun.data_cli import main

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "p"), "dataset=mnist", "partition=iid", "partition.num_clients=4",
              f"dataset.root={root}", "dataset.download=false", option])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(f"fedrun-data: error: {says}") and "\n" not in err
    assert not (tmp_path / "p").exists()
