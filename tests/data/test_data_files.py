"""Dataset files that are there but wrong (issue 38 items 10 and 12): every one is refused in one
line naming the file, before any work, never read as rows that look fine. MNIST's idx files
(counts that disagree, labels outside the classes, empty, torn, garbage .gz), LEAF's JSON
(metadata that contradicts the rows, labels outside FEMNIST's 62, mixed feature widths, no users),
and the data cache, which must not serve the rows of a file since repaired."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
from helpers import _write_idx, fedrun, write_mnist_idx
from helpers import compose_data as composed

from fedrun.data.datasets.idx import load_idx
from fedrun.errors import DataCorruptError, DataMissingError

TRAIN = np.random.RandomState(0).permutation(np.repeat(np.arange(10), 60))
TEST = np.random.RandomState(1).permutation(np.repeat(np.arange(10), 20))
RAW = os.path.join("MNIST", "raw")


@pytest.fixture
def root(tmp_path):
    write_mnist_idx(tmp_path, TRAIN, TEST)
    return tmp_path


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_label_file_one_short_refused_naming_both_files(root):  # dataset=mnist and data=mnist_*: one reader
    """59,999 labels beside 60,000 images ran on shifted labels: every image after the gap carried
    the next row's label."""
    _write_idx(str(root / RAW / "train-labels-idx1-ubyte"), 0x801, TRAIN[:-1])
    with pytest.raises(DataCorruptError) as e:
        load_idx(str(root), "mnist", download=False)
    msg = _one_line(e)
    assert f"{root / RAW / 'train-images-idx3-ubyte'} holds 600 images but " in msg
    assert f"{root / RAW / 'train-labels-idx1-ubyte'} holds 599 labels" in msg


def test_label_outside_the_classes_refused_naming_the_file(root):
    """One 0xff label byte made a 256-class problem."""
    bad = TEST.copy()
    bad[7] = 255
    _write_idx(str(root / RAW / "t10k-labels-idx1-ubyte"), 0x801, bad)
    with pytest.raises(DataCorruptError) as e:
        load_idx(str(root), "mnist", download=False)
    msg = _one_line(e)
    assert msg.startswith(f"{root / RAW / 't10k-labels-idx1-ubyte'} is a label file with label 255 at row 7 (1 row "
                          f"outside ")
    assert "labels 0..9)" in msg


def test_emnist_letters_labels_checked_against_their_own_range(root):
    raw = root / "EMNIST" / "raw"
    os.makedirs(raw)
    for name, y in (("train-labels", np.arange(1, 27).repeat(2)), ("test-labels", np.r_[np.arange(1, 26), 0])):
        _write_idx(str(raw / f"emnist-letters-{name}-idx1-ubyte"), 0x801, y)
        _write_idx(str(raw / f"emnist-letters-{name.replace('labels', 'images')}-idx3-ubyte"), 0x803,
                   np.zeros((len(y), 28, 28)))
    with pytest.raises(DataCorruptError, match=r"with label 0 at row 25 .*dataset=emnist dataset.split=letters's "
                                               r"labels 1..26\)"):
        load_idx(str(root), "emnist", "letters", download=False)


@pytest.mark.parametrize("content, what", [
    (b"", "not an idx file of bytes (0 bytes"),
    (b"\x00\x00\x08", "not an idx file of bytes (3 bytes"),
    (b"\x00\x00\x08\x03\x00\x00", "truncated in its header (6 bytes)"),
    (b"\x00\x00\x08\x03" + (2).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\x01" * 100,
     "100 bytes of data, but its header (2 x 28 x 28) says 1568"),
], ids=["empty", "3-bytes", "torn-header", "torn-data"])
def test_empty_or_torn_image_file_is_one_line(root, content, what):
    (root / RAW / "train-images-idx3-ubyte").write_bytes(content)
    with pytest.raises(DataCorruptError) as e:
        load_idx(str(root), "mnist", download=False)
    assert _one_line(e).startswith(f"{root / RAW / 'train-images-idx3-ubyte'} is {what}")


@pytest.mark.parametrize("content", [b"garbage, not gzip" * 10,
                                     gzip.compress(np.random.RandomState(0).bytes(5000))[:2000]],
                         ids=["garbage", "torn"])
def test_garbage_or_torn_gz_is_one_line(root, content):
    os.remove(root / RAW / "train-images-idx3-ubyte")
    (root / RAW / "train-images-idx3-ubyte.gz").write_bytes(content)
    with pytest.raises(DataCorruptError) as e:
        load_idx(str(root), "mnist", download=False)
    assert _one_line(e).startswith(f"{root / RAW / 'train-images-idx3-ubyte.gz'} is not readable as gzip (")


def test_garbage_gz_under_dataset_mnist_is_one_line_exit_2_and_no_run_folder(root, tmp_path):
    os.remove(root / RAW / "t10k-labels-idx1-ubyte")
    (root / RAW / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b garbage")
    r = fedrun(["dataset=mnist", "partition=iid", "partition.num_clients=5", f"dataset.root={root}",
                "dataset.download=false", "rounds=1", "tau=1", "clients_per_round=2", "progress=false", "plot=false",
                f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert (r.returncode == 2 and len(lines) == 1
            and "t10k-labels-idx1-ubyte.gz is not readable as gzip" in lines[0]), r.stderr
    assert not (tmp_path / "run" / "metrics.csv").exists()


# ---------------------------------------------------------------------------- LEAF JSON (FEMNIST)

def _leaf(tmp_path, change) -> str:
    """write_leaf's FEMNIST with `change(blob)` applied to the first training file; that file's path."""
    import json

    from helpers import write_leaf

    write_leaf(str(tmp_path))
    path = tmp_path / "femnist" / "data" / "train" / "all_data_0_niid_train.json"
    blob = json.loads(path.read_text())
    change(blob)
    path.write_text(json.dumps(blob))
    return str(path)


def _set(blob, key, value):
    blob[key] = value


def _x(blob, rows):
    blob["user_data"][blob["users"][0]]["x"] = rows


def _y(blob, value):
    blob["user_data"][blob["users"][-1]]["y"][4] = value


LEAF_BAD = [  # the red team's cases, each with what the one line must say
    (lambda b: _set(b, "users", b["users"][:1]), 'metadata contradicts its rows: "users" lists 1 users, "user_data" '
                                                  "holds 3 (2 not listed, e.g. 'f0001_1')"),
    (lambda b: _set(b, "users", b["users"] + ["f0999_0"]), "(1 without rows, e.g. 'f0999_0')"),
    (lambda b: _set(b, "num_samples", [999, 9, 9]),
     "\"num_samples\" gives user 'f0000_0' 999 rows, its user_data holds 9"),
    (lambda b: _set(b, "num_samples", [9]), '"num_samples" is not 3 counts, one per user'),
    (lambda b: _x(b, [[0.5] * 10] * 9), "not femnist rows: user 'f0000_0''s rows have 10 features, femnist has 784"),
    (lambda b: _x(b, [[0.5] * 784] * 8 + [[0.5] * 10]), "user 'f0000_0''s x or y is not numbers in rows of one width"),
    (lambda b: _y(b, 99), "not femnist rows: user 'f0002_2' has label 99, outside femnist's labels 0..61"),
    (lambda b: _y(b, -1), "has label -1, outside femnist's labels 0..61"),
    (lambda b: (_set(b, "users", []), _set(b, "user_data", {}), _set(b, "num_samples", [])),
     "a LEAF user file with no users"),
]


@pytest.mark.parametrize("change, says", LEAF_BAD,
                         ids=["users-short", "users-extra", "num-samples", "num-samples-length", "width-10",
                              "mixed-widths", "label-99", "label-negative", "no-users"])
def test_leaf_file_that_contradicts_itself_or_femnist_is_one_line_naming_it(tmp_path, change, says):
    """LEAF metadata was not read at all (users listing 4 of 6 user_data entries, num_samples
    [999, 1] and rows of 10 features were accepted as FEMNIST); a label 99 ended in a 56-line
    `index 99 is out of bounds` at training time; mixed widths and no users in numpy's
    concatenation errors."""
    from fedrun.data.datasets.leaf import load_leaf

    path = _leaf(tmp_path, change)
    with pytest.raises(DataCorruptError) as e:
        load_leaf(str(tmp_path), "femnist")
    msg = _one_line(e)
    assert (msg.startswith(f"{path} is ") and says in msg
            and msg.endswith("preprocess.sh again (or copy a good copy there)"))


def test_leaf_label_99_under_fedrun_is_one_line_exit_2(tmp_path):
    _leaf(tmp_path / "leaf", lambda b: _y(b, 99))
    r = fedrun(["dataset=femnist", f"dataset.root={tmp_path / 'leaf'}", "partition=natural", "rounds=1",
                "clients_per_round=2", "progress=false", "plot=false", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert (r.returncode == 2 and len(lines) == 1
            and "has label 99, outside femnist's labels 0..61" in lines[0]), r.stderr


# ---------------------------------------------------------------------------- the data cache

@pytest.mark.parametrize("keep_mtime", [False, True])
def test_cache_rereads_a_file_repaired_to_the_same_size(root, tmp_path, keep_mtime):
    """The cache key held file sizes only: after a bad label file was replaced by the good one (same
    size), the cache kept serving the bad rows. Also when the repair keeps the old mtime."""
    labels = root / RAW / "train-labels-idx1-ubyte"
    good = labels.read_bytes()
    wrong = TRAIN.copy()
    wrong[0] = (wrong[0] + 1) % 10  # one label wrong, same size
    _write_idx(str(labels), 0x801, wrong)
    ds, part, cache = (dict(name="mnist", root=str(root), download=False), dict(name="iid", num_clients=4),
                       str(tmp_path / "c"))
    bad = composed(ds, part, cache_dir=cache)
    stamp = os.stat(labels)
    labels.write_bytes(good)
    if keep_mtime:
        os.utime(labels, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    fixed = composed(ds, part, cache_dir=cache)
    fresh = composed(ds, part)
    assert not np.array_equal(bad.train.y.numpy(), fresh.train.y.numpy())
    np.testing.assert_array_equal(fixed.train.y.numpy(), fresh.train.y.numpy())


def test_file_digests_hash_an_unchanged_file_once(root, tmp_path, monkeypatch):
    import fedrun.data.cache as D

    paths = {"a": str(root / RAW / "train-labels-idx1-ubyte"), "gone": str(root / "nope")}
    first = D.file_digests(paths, str(tmp_path))
    assert first["gone"] is None and len(first["a"]) == 40
    monkeypatch.setattr(D, "_sha1", lambda p: pytest.fail(f"{p} hashed again although unchanged"))
    assert D.file_digests(paths, str(tmp_path)) == first


# ---------------------------------------------------------------------------- failed downloads

def _offline(monkeypatch, cls, leave: str):
    """torchvision's download of `cls` as it fails offline: its folders made, a partial file, then an error."""
    def download(self):
        os.makedirs(os.path.join(self.root, os.path.dirname(leave)), exist_ok=True)
        with open(os.path.join(self.root, leave), "wb") as f:
            f.write(b"\x1f\x8b partial")
        raise RuntimeError("Error downloading: <urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(cls, "download", download)


@pytest.mark.parametrize("how", ["dataset=mnist", "dataset=fmnist"])  # data=mnist_* read MNIST through dataset=mnist
def test_a_failed_mnist_download_leaves_no_folder(tmp_path, monkeypatch, how):
    import torchvision.datasets as tv

    folder = "FashionMNIST" if how == "dataset=fmnist" else "MNIST"
    _offline(monkeypatch, tv.FashionMNIST if how == "dataset=fmnist" else tv.MNIST,
             f"{folder}/raw/train-images-idx3-ubyte.gz")
    (tmp_path / "kept").mkdir()
    root = tmp_path / "kept" / "data"
    with pytest.raises(DataMissingError, match="download failed \\(RuntimeError: Error downloading"):
        load_idx(str(root), how.split("=")[1])
    assert os.listdir(tmp_path / "kept") == []  # data/, data/MNIST/raw and the partial file removed


def test_a_failed_cifar_download_leaves_no_folder_and_names_the_option_used(tmp_path, monkeypatch):
    """The missing-files message said `data.root` for `dataset=cifar10` runs, whose option is dataset.root."""
    import torchvision.datasets as tv

    from fedrun.data.datasets.cifar import Cifar

    _offline(monkeypatch, tv.CIFAR10, "cifar-10-python.tar.gz")
    (tmp_path / "mine").mkdir()
    with pytest.raises(DataMissingError) as e:
        Cifar("cifar10", str(tmp_path)).load()
    msg = _one_line(e)
    assert "download failed (RuntimeError" in msg and "point dataset.root (or $FEDRUN_DATA) at the folder" in msg
    assert os.listdir(tmp_path) == ["mine"]  # the tarball removed, what was there kept
