"""CIFAR files are data, never code (issue 25): the batches are read by a restricted unpickler that
admits only what the format holds (dicts with bytes keys, numpy uint8 arrays, lists of ints, bytes),
reads them as the Python 2 pickles of the real download are written, refuses a crafted file without
running it, and names the file and the fix when one is truncated or not a CIFAR batch."""
import os
import pickle
import struct

import numpy as np
import pytest
from helpers import write_cifar

from fedrun.data.datasets.cifar import CIFAR_FILES, load_cifar, read_cifar_batch
from fedrun.errors import DataCorruptError, DataMissingError

# ---------------------------------------------------------------- the real download's byte layout

def _py2(obj) -> bytes:
    """`obj` pickled as Python 2's cPickle (protocol 2) pickled the CIFAR batches: py2 `str` as
    (SHORT_)BINSTRING, arrays through numpy.core.multiarray._reconstruct and numpy.dtype."""
    if isinstance(obj, dict):
        return b"}(" + b"".join(_py2(k) + _py2(v) for k, v in obj.items()) + b"u"
    if isinstance(obj, list):
        return b"](" + b"".join(_py2(v) for v in obj) + b"e"
    if isinstance(obj, bool) or obj is None:
        return {True: b"\x88", False: b"\x89", None: b"N"}[obj]
    if isinstance(obj, int):
        return b"J" + struct.pack("<i", obj)
    if isinstance(obj, bytes):
        return (b"U" + bytes([len(obj)]) if len(obj) < 256 else b"T" + struct.pack("<I", len(obj))) + obj
    if isinstance(obj, np.ndarray):
        assert obj.dtype == np.uint8
        dtype = (b"cnumpy\ndtype\n" + _py2(b"u1") + _py2(0) + _py2(1) + b"\x87R"
                 + b"(" + _py2(3) + _py2(b"|") + b"NNN" + _py2(-1) + _py2(-1) + _py2(0) + b"tb")
        return (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + _py2(0) + b"\x85" + _py2(b"b")
                + b"\x87R" + b"(" + _py2(1) + b"(" + b"".join(_py2(d) for d in obj.shape) + b"t" + dtype
                + b"\x89" + _py2(obj.tobytes()) + b"tb")
    raise TypeError(type(obj))


def _batch(num_classes: int, n: int, seed: int) -> dict:
    rng = np.random.RandomState(seed)
    x = rng.randint(0, 256, size=(n, 3072)).astype(np.uint8)
    y = rng.randint(0, num_classes, size=n).tolist()
    names = [f"img_{seed}_{i}.png".encode() for i in range(n)]
    if num_classes == 10:
        return {b"batch_label": b"training batch 1 of 5", b"labels": y, b"data": x, b"filenames": names}
    return {b"filenames": names, b"batch_label": b"training batch 1 of 1", b"fine_labels": y,
            b"coarse_labels": [v // 5 for v in y], b"data": x}


@pytest.mark.parametrize("num_classes", [10, 100])
def test_the_downloads_python2_pickles_read_as_numpy(tmp_path, num_classes):
    folder, train_files, test_files, key = CIFAR_FILES[num_classes]
    os.makedirs(tmp_path / folder)
    batches = {}
    for i, name in enumerate(train_files + test_files):
        batches[name] = _batch(num_classes, 4 + i, seed=i)
        (tmp_path / folder / name).write_bytes(b"\x80\x02" + _py2(batches[name]) + b".")
    one = read_cifar_batch(str(tmp_path / folder / train_files[0]))
    assert one[b"filenames"] == batches[train_files[0]][b"filenames"]
    assert isinstance(one[b"batch_label"], bytes)
    trx, try_, tex, tey = load_cifar(str(tmp_path), num_classes, download=False)
    assert trx.dtype == np.uint8 and trx.shape[1:] == (3, 32, 32)
    want_x = np.concatenate([batches[f][b"data"] for f in train_files]).reshape(-1, 3, 32, 32)
    assert np.array_equal(trx, want_x)
    assert try_.tolist() == sum((batches[f][key] for f in train_files), [])
    assert np.array_equal(tex, np.concatenate([batches[f][b"data"] for f in test_files]).reshape(-1, 3, 32, 32))
    assert tey.tolist() == sum((batches[f][key] for f in test_files), [])


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_python3_pickles_of_every_protocol_read(tmp_path, protocol):
    b = _batch(10, 3, seed=1)
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({**b, b"data": b[b"data"]}, protocol=protocol))
    d = read_cifar_batch(str(path))
    assert np.array_equal(d[b"data"], b[b"data"]) and d[b"labels"] == b[b"labels"]
    assert d[b"filenames"] == b[b"filenames"]


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_cifar_batch_is_refused_without_running_its_payload(tmp_path):
    write_cifar(tmp_path, 10, train_per_class=2, test_per_class=1)
    folder = tmp_path / CIFAR_FILES[10][0]
    marker = tmp_path / "pwned"
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1], b"batch_label": _Payload(marker)}, f)
    with pytest.raises(DataCorruptError) as e:
        load_cifar(str(tmp_path), 10, download=False)
    assert not marker.exists()
    msg = str(e.value)
    assert "data_batch_1" in msg and "posix.system" in msg and "nothing was run" in msg and len(msg.splitlines()) == 1


@pytest.mark.parametrize("damage, says", [
    (lambda raw: raw[: len(raw) // 2], "not a readable CIFAR batch"),
    (lambda raw: b"", "not a readable CIFAR batch"),
    (lambda raw: pickle.dumps([1, 2, 3]), "holds a list"),
    (lambda raw: pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}), "shape [N, 3072]"),
    (lambda raw: pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "2 integer labels"),
])
def test_a_corrupt_cifar_file_names_itself_and_the_fix(tmp_path, damage, says):
    write_cifar(tmp_path, 10, train_per_class=2, test_per_class=1)
    path = tmp_path / CIFAR_FILES[10][0] / "data_batch_3"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataMissingError) as e:  # fedrun exits 2 on it, before any work
        load_cifar(str(tmp_path), 10, download=False)
    msg = str(e.value)
    assert str(path) in msg and says in msg and "download the dataset again" in msg and "\n" not in msg


@pytest.mark.parametrize("damage, says", [
    (lambda raw: raw[:-100], "but its header"),
    (lambda raw: b"\x00\x00\x09\x03" + raw[4:], "not an idx file of bytes"),
    (lambda raw: raw[:6], "truncated in its header"),
])
def test_a_corrupt_mnist_file_names_itself_and_the_fix(tmp_path, damage, says):
    from helpers import write_mnist_idx

    from fedrun.data.datasets.idx import load_mnist

    write_mnist_idx(tmp_path, [0, 1, 2, 3], [1, 2])
    assert load_mnist(str(tmp_path), download=False)[0].shape == (4, 28, 28)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataMissingError) as e:
        load_mnist(str(tmp_path), download=False)
    msg = str(e.value)
    assert str(path) in msg and says in msg and "download the dataset again" in msg and "\n" not in msg
