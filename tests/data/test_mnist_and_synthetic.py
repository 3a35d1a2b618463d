"""Tests of fedrun.data: synthetic generator, caching, ClientSplit, the Per-FedAvg and pFedMe MNIST
partitions, MNIST loading from torchvision-format files, and the clear error when MNIST is missing offline.

Everything here is offline and small; the only sizeable work is generating Synthetic(0.5, 0.5) once.
"""
from __future__ import annotations

import ctypes
import json
import os
import re

import numpy as np
import pytest
import torch
from helpers import FIXTURES, write_mnist_idx

import fedrun.data as fdata
import fedrun.data.datasets.synthetic as fsyn
from fedrun.data import ClientSplit, mnist_perfedavg, mnist_pfedme
from fedrun.data.datasets.idx import MNIST_FILES, STATS, load_mnist
from fedrun.data.datasets.synthetic import generate_synthetic, rows_digest
from fedrun.data.partitioners.paper import (
    max_fitting_a,
    perfedavg_mnist,
    pfedme_label_owners,
    pfedme_max_clients,
    pfedme_mnist,
    split_train_test,
)
from fedrun.errors import DataMissingError

# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def _check_perfedavg_structure(counts: np.ndarray, n: int, a: int) -> None:
    """counts: [n, 10] label counts per user, checked against the Per-FedAvg MNIST split."""
    assert counts.shape == (n, 10)
    n_full = n // 2
    for c in range(n_full):
        assert counts[c].tolist() == [a] * 5 + [0] * 5, (c, counts[c])
    highs = []
    for j, c in enumerate(range(n_full, n)):
        row = counts[c]
        low_digits = np.flatnonzero(row[:5])
        high_digits = 5 + np.flatnonzero(row[5:])
        assert len(low_digits) == 1 and len(high_digits) == 1, (c, row)
        assert row[low_digits[0]] == a // 2, (c, row)
        assert row[high_digits[0]] == 2 * a, (c, row)
        assert low_digits[0] == j % 5  # low digits cycle 0..4
        highs.append(int(high_digits[0]))
    # high digits cycle over a permutation of 5..9: the first min(m, 5) are distinct, then repeat
    m = n - n_full
    assert len(set(highs[:5])) == min(m, 5)
    for j in range(5, m):
        assert highs[j] == highs[j % 5]


def _ids_from_x(x: torch.Tensor) -> np.ndarray:
    """Recovers the image ids encoded by `_mnist_images` from normalized flattened features."""
    px = x[:, :2].numpy().astype(np.float64) * STATS['mnist'][1] + STATS['mnist'][0]
    px = np.rint(px * 255.0).astype(np.int64)
    return px[:, 0] + 256 * px[:, 1]


# ----------------------------------------------------------------------------------------------
# 1. synthetic generator
# ----------------------------------------------------------------------------------------------

def _openblas_thread_controls():
    """(get, set) pairs of every OpenBLAS loaded in this process (Linux only, best effort)."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted(set(re.findall(r"(/\S*openblas\S*\.so[\S]*)", f.read())))
    except OSError:
        return []
    controls = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"),
                               ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                controls.append((get, set_))
                break
    return controls


@pytest.fixture(scope="module", autouse=True)
def _single_thread_blas():
    """numpy's multithreaded OpenBLAS next to torch's thread pool makes generate_synthetic ~40x
    slower on a small CPU (10 s instead of 0.25 s for seed 0); the tests run it single-threaded."""
    controls = _openblas_thread_controls()
    saved = []
    for get, set_ in controls:
        try:
            saved.append((set_, int(get())))
            set_(1)
        except Exception:
            pass
    yield
    for set_, n in saved:
        try:
            set_(n)
        except Exception:
            pass


@pytest.fixture(scope="module")
def synth0():
    return generate_synthetic(seed=0)


def test_synthetic_paper_facts(synth0):
    train, test = synth0
    assert len(train) == 100 and len(test) == 100
    totals = np.array([len(tr[1]) + len(te[1]) for tr, te in zip(train, test)])
    assert totals.sum() == 205_795
    assert totals.min() == 250
    assert totals.max() == 25_810
    for (xtr, ytr), (xte, yte), n in zip(train, test, totals):
        assert len(ytr) == int(0.9 * n)
        assert len(xtr) == len(ytr) and len(xte) == len(yte)
        assert xtr.shape[1:] == (60,) and xte.shape[1:] == (60,)
        assert xtr.dtype == np.float32 and xte.dtype == np.float32
        assert ytr.dtype == np.int64 and yte.dtype == np.int64
        for y in (ytr, yte):
            assert y.min() >= 0 and y.max() <= 9
        # sizes are (int(lognormal) + 50) * 5
        assert n % 5 == 0 and n >= 250
    all_y = np.concatenate([y for _, y in train] + [y for _, y in test])
    assert set(np.unique(all_y).tolist()) <= set(range(10))
    assert len(np.unique(all_y)) > 1


def test_synthetic_same_seed_identical(synth0):
    # a second full generation is cheap with single-threaded BLAS (0.3 s), slow without it (10 s)
    full = len(_openblas_thread_controls()) > 0
    first = synth0 if full else generate_synthetic(num_clients=10, seed=0)
    train2, test2 = generate_synthetic(seed=0) if full else generate_synthetic(num_clients=10, seed=0)
    for split_a, split_b in ((first[0], train2), (first[1], test2)):
        assert len(split_a) == len(split_b)
        for (xa, ya), (xb, yb) in zip(split_a, split_b):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)


def test_synthetic_other_seed_differs():
    tr0, te0 = generate_synthetic(num_clients=10, seed=0)
    tr1, te1 = generate_synthetic(num_clients=10, seed=1)
    sizes0 = [len(y) for _, y in tr0]
    sizes1 = [len(y) for _, y in tr1]
    if sizes0 == sizes1:  # same sizes by chance: the values must still differ
        assert any(not np.array_equal(a[0], b[0]) for a, b in zip(tr0, tr1))
    else:
        assert sizes0 != sizes1
    assert not np.array_equal(tr0[0][0][:5], tr1[0][0][:5])


# The official data, as recorded by RUNNING the reference generators (scripts/golden/record_synthetic_facts.py):
# per client its train/test sizes, label histogram and rows_digest (rows = train + test, since the
# official shuffle is unseeded). fedrun must hold the same rows per client for the same seed.
_OFFICIAL = json.load(open(os.path.join(FIXTURES, "synthetic_official.json")))


def _assert_official(name, train, test):
    want = _OFFICIAL["variants"][name]
    assert len(train) == len(want["digest"]), name
    for k, ((xtr, ytr), (xte, yte)) in enumerate(zip(train, test)):
        x, y = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
        assert (len(ytr), len(yte)) == (want["n_train"][k], want["n_test"][k]), (name, k)
        assert np.bincount(y, minlength=10).tolist() == want["labels"][k], (name, k)
        assert rows_digest(x, y) == want["digest"][k], (name, k)


def test_synthetic_is_pfedme_official_data(synth0):
    """Default settings, seed 0 = pFedMe's generate_synthetic_05_05.py (client 1: 855 rows, all label 2)."""
    assert _OFFICIAL["variants"]["pfedme_0.5_0.5"]["fedrun"] == {"seed": 0}
    _assert_official("pfedme_0.5_0.5", *synth0)


@pytest.mark.parametrize("name", ["fedprox_0_0", "fedprox_0.5_0.5", "fedprox_1_1", "fedprox_iid"])
def test_synthetic_is_fedprox_official_data(name):
    """FedProx's generators (unseeded) run after np.random.seed(0) = fedrun with the recorded settings."""
    _assert_official(name, *generate_synthetic(**_OFFICIAL["variants"][name]["fedrun"]))


def test_rows_digest_is_order_free_and_exact():
    x = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    y = np.arange(50) % 4
    perm = np.random.default_rng(1).permutation(50)
    assert rows_digest(x[perm], y[perm]) == rows_digest(x, y)
    x2 = x.copy()
    x2[7, 2] = np.nextafter(x2[7, 2], np.float32(np.inf))
    assert rows_digest(x2, y) != rows_digest(x, y)
    y2 = y.copy()
    y2[[3, 4]] = y2[[4, 3]]  # same labels, moved to other rows
    assert rows_digest(x, y2) != rows_digest(x, y)


@pytest.mark.parametrize("bad, option", [
    (dict(alpha=-1), "data.alpha=-1"),
    (dict(beta=float("nan")), "data.beta=nan"),
    (dict(iid=True), "data.alpha=0.5: must be 0 with data.iid=true"),
    (dict(iid="yes"), "data.iid='yes'"),
    (dict(size_factor=0), "data.size_factor=0"),
    (dict(num_clients=0), "data.num_clients=0"),
    (dict(train_frac=1.0), "data.train_frac=1.0"),
])
def test_synthetic_bad_settings_one_line_error(bad, option):
    for make in (generate_synthetic, fdata.synthetic):
        with pytest.raises(ValueError) as e:
            make(**{"num_clients": 3, **bad})
        assert str(e.value).startswith(option) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------
# 2. the data cache (fedrun.data.cache), through data=synthetic
# ----------------------------------------------------------------------------------------------

_SMALL = dict(num_clients=5, seed=3, chunk_len=64)


def _assert_same_data(d1, d2):
    assert d1.name == d2.name and d1.num_classes == d2.num_classes
    for s in ("train", "test"):
        a, b = getattr(d1, s), getattr(d2, s)
        for f in ("x", "y", "offsets", "sizes", "chunk_idx", "chunk_mask", "chunk_client"):
            assert torch.equal(getattr(a, f), getattr(b, f)), (s, f)


def test_synthetic_matches_generator_without_cache():
    d = fdata.synthetic(num_clients=5, seed=3, cache_dir=None)
    train, test = generate_synthetic(num_clients=5, seed=3)
    assert d.num_clients == 5 and d.num_classes == 10 and d.feature_shape == (60,)
    assert d.train.sizes.tolist() == [len(y) for _, y in train]
    assert d.test.sizes.tolist() == [len(y) for _, y in test]
    assert torch.equal(d.train.x, torch.as_tensor(np.concatenate([x for x, _ in train])))
    assert torch.equal(d.test.y, torch.as_tensor(np.concatenate([y for _, y in test])))
    assert d.train.y.dtype == torch.int64


def test_synthetic_cache_roundtrip(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    d1 = fdata.synthetic(cache_dir=str(cache), **_SMALL)
    files = sorted(os.listdir(cache))
    assert len(files) == 1 and files[0].endswith(".pt") and files[0].startswith("synthetic_")
    assert not any(f.endswith(".tmp") for f in files)

    # the second call must not generate again: it loads the .pt file
    def boom(**kw):
        raise AssertionError("generate_synthetic called although a cache file exists")

    monkeypatch.setattr(fsyn, "generate_synthetic", boom)
    d2 = fdata.synthetic(cache_dir=str(cache), **_SMALL)
    _assert_same_data(d1, d2)

    # different settings are a different cache entry (and so would generate)
    with pytest.raises(AssertionError, match="generate_synthetic called"):
        fdata.synthetic(cache_dir=str(cache), num_clients=5, seed=4)


def test_synthetic_cache_never_serves_another_draw_version(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    fdata.synthetic(cache_dir=str(cache), **_SMALL)
    calls = []
    real = fsyn.generate_synthetic
    monkeypatch.setattr(fsyn, "generate_synthetic", lambda **kw: calls.append(kw) or real(**kw))
    monkeypatch.setattr(fsyn, "DRAW_VERSION", fsyn.DRAW_VERSION + 1)
    fdata.synthetic(cache_dir=str(cache), **_SMALL)
    assert len(calls) == 1 and len(os.listdir(cache)) == 2


def test_synthetic_corrupt_cache_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    d1 = fdata.synthetic(cache_dir=str(cache), **_SMALL)
    (path,) = [cache / f for f in os.listdir(cache)]
    path.write_bytes(b"\x00garbage, not a torch file\xff" * 10)
    d2 = fdata.synthetic(cache_dir=str(cache), **_SMALL)
    _assert_same_data(d1, d2)
    # the rebuilt file is valid again
    blob = torch.load(path, weights_only=True)
    assert torch.equal(blob["train"]["x"], d1.train.x)
    # an empty (torn) file too
    path.write_bytes(b"")
    _assert_same_data(d1, fdata.synthetic(cache_dir=str(cache), **_SMALL))


# ----------------------------------------------------------------------------------------------
# 3. ClientSplit
# ----------------------------------------------------------------------------------------------

SIZES = [1, 5, 300]


def _parts(sizes=SIZES, num_classes=4, seed=0):
    rng = np.random.RandomState(seed)
    parts, start = [], 0
    for c, n in enumerate(sizes):
        x = np.stack([np.arange(start, start + n), np.full(n, c)], axis=1).astype(np.float32)
        y = rng.randint(0, num_classes, n).astype(np.int64)
        parts.append((x, y))
        start += n
    return parts


@pytest.mark.parametrize("chunk_len", [4, 256, 1000])
def test_client_split_layout(chunk_len):
    parts = _parts()
    s = ClientSplit.from_parts(parts, chunk_len=chunk_len)
    N = sum(SIZES)
    assert s.num_clients == 3
    assert s.sizes.tolist() == SIZES
    assert s.offsets.tolist() == [0, 1, 6]
    assert s.x.shape == (N, 2) and s.y.shape == (N,) and s.y.dtype == torch.int64
    for c in range(3):
        rows = s.client_rows(c)
        assert (s.x[rows, 1] == c).all()
        assert torch.equal(s.y[rows], torch.as_tensor(parts[c][1]))

    L = min(chunk_len, max(SIZES))
    n_chunks = sum(-(-n // L) for n in SIZES)
    assert s.chunk_idx.shape == (n_chunks, L)
    assert s.chunk_mask.shape == (n_chunks, L)
    assert s.chunk_client.shape == (n_chunks,)
    assert s.chunk_idx.dtype == torch.int64 and s.chunk_mask.dtype == torch.float32
    assert set(s.chunk_mask.unique().tolist()) <= {0.0, 1.0}

    # chunk_client: chunks in client order, ceil(n / L) per client
    expected_owner = np.concatenate([np.full(-(-n // L), c) for c, n in enumerate(SIZES)])
    assert s.chunk_client.tolist() == expected_owner.tolist()

    # real rows: every row exactly once, in the right client's chunks
    mask = s.chunk_mask.bool()
    real = s.chunk_idx[mask]
    assert sorted(real.tolist()) == list(range(N))
    owner_of_row = np.repeat(np.arange(3), SIZES)
    owner_of_chunk_entry = s.chunk_client[:, None].expand_as(s.chunk_idx)
    assert (torch.as_tensor(owner_of_row)[real] == owner_of_chunk_entry[mask]).all()
    # padding: mask 0, still a valid row index (of the chunk's own client)
    pad = s.chunk_idx[~mask]
    assert ((pad >= 0) & (pad < N)).all()
    assert (torch.as_tensor(owner_of_row)[pad] == owner_of_chunk_entry[~mask]).all()
    # number of padding entries: each client's last chunk is padded up to L
    assert int((~mask).sum()) == sum(-(-n // L) * L - n for n in SIZES)
    # per-client real-row count in chunks equals its size
    per_client = torch.zeros(3).index_add_(0, s.chunk_client, s.chunk_mask.sum(1))
    assert per_client.tolist() == [float(n) for n in SIZES]


def test_client_split_default_chunk_len():
    s = ClientSplit.from_parts(_parts())
    # L = min(256, largest client) = 256: 1 + 1 + 2 chunks
    assert s.chunk_idx.shape == (4, 256)
    assert s.chunk_client.tolist() == [0, 1, 2, 2]
    assert s.chunk_mask.sum(1).tolist() == [1.0, 5.0, 256.0, 44.0]


def test_client_split_rejects_empty_client():
    parts = _parts([3, 0, 2])
    with pytest.raises(ValueError, match=r"\[1\]"):
        ClientSplit.from_parts(parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_client_split_sample_indices(dtype):
    s = ClientSplit.from_parts(_parts(), chunk_len=4)
    g = torch.Generator().manual_seed(0)
    clients = torch.tensor([2, 0, 1, 2, 1, 0])
    u = torch.rand(6, 3, 400, generator=g, dtype=dtype)
    # edge draws: 0, values very close to 1
    u[:, 0, :5] = torch.tensor([0.0, 0.9999999, 1.0 - 1e-12, torch.nextafter(torch.tensor(1.0, dtype=dtype),
                                                                              torch.tensor(0.0, dtype=dtype)).item(),
                                0.5], dtype=dtype)
    idx = s.sample_indices(clients, u)
    assert idx.shape == u.shape and idx.dtype == torch.int64
    lo = s.offsets[clients].view(-1, 1, 1)
    hi = lo + s.sizes[clients].view(-1, 1, 1)
    assert ((idx >= lo) & (idx < hi)).all()
    # the rows really belong to the requested client
    assert (s.x[idx][..., 1] == clients.view(-1, 1, 1).to(s.x.dtype)).all()
    # u = 0 -> first row; u ~ 1 -> last row of the client
    assert torch.equal(idx[:, 0, 0], s.offsets[clients])
    for k in (1, 2, 3):
        assert torch.equal(idx[:, 0, k], (s.offsets + s.sizes - 1)[clients])
    # many draws reach every row of the small clients
    assert set(idx[2].flatten().tolist()) == set(range(1, 6))
    assert set(idx[1].flatten().tolist()) == {0}
    # 1-D u (one draw per client) works too
    idx1 = s.sample_indices(clients, torch.full((6,), 0.9999999, dtype=dtype))
    assert torch.equal(idx1, (s.offsets + s.sizes - 1)[clients])


def test_client_split_label_counts():
    parts = _parts(num_classes=4, seed=1)
    s = ClientSplit.from_parts(parts, chunk_len=4)
    for num_classes in (4, 6):
        counts = s.label_counts(num_classes)
        assert counts.shape == (3, num_classes)
        expected = np.stack([np.bincount(y, minlength=num_classes) for _, y in parts])
        np.testing.assert_array_equal(counts.numpy(), expected)


def test_client_split_to_cpu_keeps_everything():
    s = ClientSplit.from_parts(_parts(), chunk_len=4)
    t = s.to("cpu")
    for f in ("x", "y", "offsets", "sizes", "chunk_idx", "chunk_mask", "chunk_client"):
        assert torch.equal(getattr(s, f), getattr(t, f))


# ----------------------------------------------------------------------------------------------
# 4. Per-FedAvg MNIST partition
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def labels700():
    rng = np.random.RandomState(7)
    return rng.permutation(np.repeat(np.arange(10), 700))


def _counts(labels, parts):
    return np.stack([np.bincount(labels[p], minlength=10) for p in parts])


@pytest.mark.parametrize("n,a", [(10, 20), (7, 13), (13, 10), (2, 2)])
def test_perfedavg_partition_structure(labels700, n, a):
    parts = perfedavg_mnist(labels700, n, a, np.random.RandomState(0))
    assert len(parts) == n
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)  # each index at most once
    assert allidx.min() >= 0 and allidx.max() < len(labels700)
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)  # sorted
    _check_perfedavg_structure(_counts(labels700, parts), n, a)


def test_perfedavg_partition_seeded(labels700):
    p1 = perfedavg_mnist(labels700, 10, 20, np.random.RandomState(5))
    p2 = perfedavg_mnist(labels700, 10, 20, np.random.RandomState(5))
    assert all(np.array_equal(x, y) for x, y in zip(p1, p2))
    p3 = perfedavg_mnist(labels700, 10, 20, np.random.RandomState(6))
    assert not all(np.array_equal(x, y) for x, y in zip(p1, p3))


def test_perfedavg_partition_bad_args(labels700):
    for n, a in ((1, 10), (10, 1)):
        with pytest.raises(ValueError):
            perfedavg_mnist(labels700, n, a, np.random.RandomState(0))


def _suggested_a(msg: str) -> int:
    m = re.search(r"largest a that fits is (\d+)", msg)
    assert m, msg
    return int(m.group(1))


@pytest.mark.parametrize("n", [10, 7, 13])
def test_perfedavg_partition_too_large_a(labels700, n):
    with pytest.raises(ValueError) as ei:
        perfedavg_mnist(labels700, n, 500, np.random.RandomState(0))
    msg = str(ei.value)
    assert "data.a=500" in msg and f"data.n={n}" in msg
    best = _suggested_a(msg)
    assert best == max_fitting_a(labels700, n)
    assert best >= 2
    # the suggestion works (for several partition seeds) and is reproduced by the structure
    for seed in range(3):
        parts = perfedavg_mnist(labels700, n, best, np.random.RandomState(seed))
        _check_perfedavg_structure(_counts(labels700, parts), n, best)


def test_perfedavg_partition_suggestion_is_tight(labels700):
    # n=10: each low digit needs 5a + a//2 <= 700 -> a = 127; a = 128 needs 704
    with pytest.raises(ValueError) as ei:
        perfedavg_mnist(labels700, 10, 200, np.random.RandomState(0))
    assert _suggested_a(str(ei.value)) == 127
    perfedavg_mnist(labels700, 10, 127, np.random.RandomState(0))
    with pytest.raises(ValueError, match="largest a that fits is 127"):
        perfedavg_mnist(labels700, 10, 128, np.random.RandomState(0))


def test_perfedavg_partition_uneven_digits():
    # realistic MNIST-like uneven counts: the suggestion still fits
    rng = np.random.RandomState(1)
    per_digit = [592, 674, 595, 613, 584, 542, 591, 626, 585, 594]
    labels = rng.permutation(np.repeat(np.arange(10), per_digit))
    for n in (10, 12, 20):
        with pytest.raises(ValueError) as ei:
            perfedavg_mnist(labels, n, 400, np.random.RandomState(0))
        best = _suggested_a(str(ei.value))
        assert best >= 2
        for seed in range(5):
            parts = perfedavg_mnist(labels, n, best, np.random.RandomState(seed))
            _check_perfedavg_structure(_counts(labels, parts), n, best)


# ----------------------------------------------------------------------------------------------
# 5. MNIST via torchvision-format files
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def tiny_mnist(tmp_path):
    rng = np.random.RandomState(0)
    train_labels = rng.permutation(np.repeat(np.arange(10), 60)).astype(np.uint8)
    test_labels = rng.permutation(np.repeat(np.arange(10), 20)).astype(np.uint8)
    root = tmp_path / "mnist_root"
    train_images, test_images = write_mnist_idx(root, train_labels, test_labels)
    return root, train_labels, test_labels, train_images, test_images


def test_load_mnist_reads_idx_files(tiny_mnist):
    root, train_labels, test_labels, train_images, test_images = tiny_mnist
    trx, try_, tex, tey = load_mnist(str(root), download=False)
    np.testing.assert_array_equal(trx, train_images)
    np.testing.assert_array_equal(try_, train_labels)
    np.testing.assert_array_equal(tex, test_images)
    np.testing.assert_array_equal(tey, test_labels)


def _check_mnist_split(split, labels, images, id_offset, n, a):
    assert split.num_clients == n
    assert split.x.dtype == torch.float32 and split.x.shape[1:] == (784,)
    assert split.y.dtype == torch.int64
    _check_perfedavg_structure(split.label_counts(10).numpy(), n, a)
    ids = _ids_from_x(split.x) - id_offset
    assert len(np.unique(ids)) == len(ids)  # no image twice
    assert ids.min() >= 0 and ids.max() < len(labels)
    np.testing.assert_array_equal(split.y.numpy(), labels[ids].astype(np.int64))
    expected = ((images[ids].astype(np.float32) / 255.0 - 0.1307) / 0.3081).reshape(len(ids), 784)
    np.testing.assert_allclose(split.x.numpy(), expected, rtol=0, atol=1e-5)


def test_mnist_perfedavg_from_idx_files(tiny_mnist):
    root, train_labels, test_labels, train_images, test_images = tiny_mnist
    d = mnist_perfedavg(root=str(root), n=4, a=8, test_a=2, cache_dir=None, download=False)
    assert d.num_clients == 4 and d.num_classes == 10
    assert d.feature_shape == (784,) and d.in_features == 784
    _check_mnist_split(d.train, train_labels, train_images, 0, 4, 8)
    _check_mnist_split(d.test, test_labels, test_images, len(train_labels), 4, 2)
    # train sizes: 5a for full users, a/2 + 2a for the others
    assert d.train.sizes.tolist() == [40, 40, 20, 20]
    assert d.test.sizes.tolist() == [10, 10, 5, 5]
    # the same seed gives the same data
    d2 = mnist_perfedavg(root=str(root), n=4, a=8, test_a=2, cache_dir=None, download=False)
    _assert_same_data(d, d2)


def test_mnist_perfedavg_default_test_a_and_cache(tiny_mnist, tmp_path):
    root, train_labels, test_labels, train_images, test_images = tiny_mnist
    cache = tmp_path / "cache"
    # test_a=None: a * 200 / 600 = 2.67 -> 2
    d = mnist_perfedavg(root=str(root), n=4, a=8, cache_dir=str(cache), download=False)
    _check_mnist_split(d.test, test_labels, test_images, len(train_labels), 4, 2)
    assert len([f for f in os.listdir(cache) if f.endswith(".pt")]) == 1  # beside file-digests.json
    d2 = mnist_perfedavg(root=str(root), n=4, a=8, cache_dir=str(cache), download=False)
    _assert_same_data(d, d2)


def test_mnist_perfedavg_test_split_too_small(tiny_mnist):
    root = tiny_mnist[0]
    with pytest.raises(ValueError, match=r"test split \(data.test_a=10\).*data.a=10"):
        mnist_perfedavg(root=str(root), n=4, a=8, test_a=10, cache_dir=None, download=False)


# ----------------------------------------------------------------------------------------------
# 6. missing MNIST offline
# ----------------------------------------------------------------------------------------------

def _check_missing_message(msg: str, root) -> None:
    raw = os.path.abspath(os.path.join(str(root), "MNIST", "raw"))
    assert raw in msg
    for f in MNIST_FILES:
        assert f in msg


def test_load_mnist_missing_no_download(tmp_path):
    with pytest.raises(DataMissingError) as ei:
        load_mnist(str(tmp_path), download=False)
    _check_missing_message(str(ei.value), tmp_path)
    assert "download=false" in str(ei.value)
    assert isinstance(ei.value, RuntimeError)


def test_load_mnist_missing_download_fails(tmp_path, monkeypatch):
    import torchvision.datasets

    calls = []

    def offline(self):
        calls.append(self)
        raise OSError("offline")

    monkeypatch.setattr(torchvision.datasets.MNIST, "download", offline)
    with pytest.raises(DataMissingError) as ei:
        load_mnist(str(tmp_path), download=True)
    msg = str(ei.value)
    _check_missing_message(msg, tmp_path)
    assert "download failed" in msg
    assert "OSError" in msg and "offline" in msg
    assert calls  # the download was attempted


def test_load_mnist_partial_files_is_missing(tmp_path):
    # one file short is "missing", not a torchvision crash
    labels = np.repeat(np.arange(10), 2).astype(np.uint8)
    write_mnist_idx(tmp_path, labels, labels)
    os.remove(os.path.join(tmp_path, "MNIST", "raw", "t10k-labels-idx1-ubyte"))
    with pytest.raises(DataMissingError):
        load_mnist(str(tmp_path), download=False)


def test_mnist_perfedavg_missing_offline(tmp_path):
    with pytest.raises(DataMissingError, match="MNIST/raw|MNIST\\\\raw"):
        mnist_perfedavg(root=str(tmp_path), n=4, a=8, cache_dir=None, download=False)


# ----------------------------------------------------------------------------------------------
# 7. pFedMe MNIST partition (paper 002 Sec. 5.1)
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def labels_uneven():
    """MNIST-like uneven digit counts, about 1/25 of the pooled 70,000."""
    per_digit = [276, 315, 280, 286, 273, 253, 275, 292, 273, 278]
    return np.random.RandomState(3).permutation(np.repeat(np.arange(10), per_digit))


def _check_pfedme_parts(labels, parts, n, lpc, all_used=True):
    assert len(parts) == n
    counts = _counts(labels, parts)
    # every client: exactly lpc distinct labels
    assert ((counts > 0).sum(1) == lpc).all(), counts
    # every label owned by equally many clients (within one when n * lpc is not a multiple of 10)
    owners = (counts > 0).sum(0)
    assert owners.sum() == n * lpc
    assert owners.max() - owners.min() <= 1
    if n * lpc % 10 == 0:
        assert (owners == n * lpc // 10).all()
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)  # no image twice
    if all_used:
        assert sorted(allidx.tolist()) == list(range(len(labels)))
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
    return counts


@pytest.mark.parametrize("n,lpc", [(20, 2), (10, 3), (7, 2), (13, 4), (5, 10), (30, 1)])
def test_pfedme_partition_structure(labels_uneven, n, lpc):
    parts = pfedme_mnist(labels_uneven, n, lpc, np.random.RandomState(0))
    _check_pfedme_parts(labels_uneven, parts, n, lpc)


def test_pfedme_partition_paper_setting(labels_uneven):
    parts = pfedme_mnist(labels_uneven, 20, 2, np.random.RandomState(0))
    counts = _check_pfedme_parts(labels_uneven, parts, 20, 2)
    assert ((counts > 0).sum(0) == 4).all()  # each label on 4 clients
    sizes = np.array([len(p) for p in parts])
    # heterogeneous: the weights span [1165, 3834], so sizes spread well beyond rounding
    assert sizes.max() > 1.5 * sizes.min()
    assert len(set(sizes.tolist())) > 10
    # not every client has the same pair of labels (the official generator's bug)
    pairs = {tuple(np.flatnonzero(c)) for c in counts}
    assert len(pairs) > 1


def test_pfedme_partition_few_clients_leave_digits_out(labels_uneven):
    # 3 clients x 2 labels own 6 digits: the other 4 digits' images are unused
    parts = pfedme_mnist(labels_uneven, 3, 2, np.random.RandomState(1))
    counts = _check_pfedme_parts(labels_uneven, parts, 3, 2, all_used=False)
    owned = np.flatnonzero(counts.sum(0))
    assert len(owned) == 6
    assert sum(len(p) for p in parts) == int(np.isin(labels_uneven, owned).sum())


def test_pfedme_partition_seeded(labels_uneven):
    p1 = pfedme_mnist(labels_uneven, 20, 2, np.random.RandomState(5))
    p2 = pfedme_mnist(labels_uneven, 20, 2, np.random.RandomState(5))
    assert all(np.array_equal(x, y) for x, y in zip(p1, p2))
    p3 = pfedme_mnist(labels_uneven, 20, 2, np.random.RandomState(6))
    assert not all(np.array_equal(x, y) for x, y in zip(p1, p3))


@pytest.mark.parametrize("seed", range(20))
def test_pfedme_label_owners_always_distinct(seed):
    for n, lpc in ((20, 2), (9, 7), (11, 9), (3, 10), (17, 3)):
        owned = pfedme_label_owners(n, lpc, np.random.RandomState(seed))
        assert all(len(set(o.tolist())) == lpc for o in owned)
        used = np.bincount(np.concatenate(owned), minlength=10)
        assert used.max() - used.min() <= 1


def test_pfedme_partition_bad_args(labels_uneven):
    for lpc in (0, 11):
        with pytest.raises(ValueError, match=rf"data.labels_per_client={lpc}: allowed 1..10"):
            pfedme_mnist(labels_uneven, 20, lpc, np.random.RandomState(0))
    fit = pfedme_max_clients(labels_uneven, 2)
    assert fit == 10 * (253 // 2) // 2  # digit 5 (253 images) bounds it: 2 images per owner
    with pytest.raises(ValueError, match=rf"data.num_clients={fit + 1}: allowed 1..{fit} ") as ei:
        pfedme_mnist(labels_uneven, fit + 1, 2, np.random.RandomState(0))
    assert "\n" not in str(ei.value)
    with pytest.raises(ValueError, match="data.num_clients=0"):
        pfedme_mnist(labels_uneven, 0, 2, np.random.RandomState(0))
    for seed in range(3):  # the largest allowed fits whatever the seed
        parts = pfedme_mnist(labels_uneven, fit, 2, np.random.RandomState(seed))
        _check_pfedme_parts(labels_uneven, parts, fit, 2)


def test_split_train_test_per_client(labels_uneven):
    parts = pfedme_mnist(labels_uneven, 20, 2, np.random.RandomState(0))
    tr, te = split_train_test(labels_uneven, parts, 0.75, np.random.RandomState(1))
    for p, a, b in zip(parts, tr, te):
        assert sorted(np.concatenate([a, b]).tolist()) == p.tolist()
        assert len(np.intersect1d(a, b)) == 0
        assert abs(len(a) - 0.75 * len(p)) <= 1.0  # half an image per label
        assert set(labels_uneven[a].tolist()) == set(labels_uneven[b].tolist()) == set(labels_uneven[p].tolist())
    # tiny shares still put every label on both sides
    labels = np.array([0, 0, 1, 1, 1])
    (a,), (b,) = split_train_test(labels, [np.arange(5)], 0.75, np.random.RandomState(0))
    assert set(labels[a].tolist()) == set(labels[b].tolist()) == {0, 1}
    for frac in (0.0, 1.0):
        with pytest.raises(ValueError, match="data.train_frac"):
            split_train_test(labels, [np.arange(5)], frac, np.random.RandomState(0))


def test_mnist_pfedme_from_idx_files(tiny_mnist, tmp_path):
    root, train_labels, test_labels, train_images, test_images = tiny_mnist
    all_labels = np.concatenate([train_labels, test_labels]).astype(np.int64)
    all_images = np.concatenate([train_images, test_images])
    d = mnist_pfedme(root=str(root), cache_dir=None, download=False)
    assert d.num_clients == 20 and d.num_classes == 10 and d.feature_shape == (784,)
    ids = {}
    for s in ("train", "test"):
        split = getattr(d, s)
        assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
        ids[s] = _ids_from_x(split.x)
        np.testing.assert_array_equal(split.y.numpy(), all_labels[ids[s]])
        expected = ((all_images[ids[s]].astype(np.float32) / 255.0 - 0.1307) / 0.3081).reshape(-1, 784)
        np.testing.assert_allclose(split.x.numpy(), expected, rtol=0, atol=1e-5)
    # train and test images pooled: each of the 800 images used exactly once
    both = np.concatenate([ids["train"], ids["test"]])
    assert sorted(both.tolist()) == list(range(len(all_labels)))
    tr_counts = d.train.label_counts(10).numpy()
    te_counts = d.test.label_counts(10).numpy()
    assert ((tr_counts > 0).sum(1) == 2).all() and ((te_counts > 0).sum(1) == 2).all()
    assert ((tr_counts > 0) == (te_counts > 0)).all()  # test data has the client's own labels
    assert ((tr_counts > 0).sum(0) == 4).all()  # each label on 4 of the 20 clients
    n_tr, n_te = d.train.sizes.numpy(), d.test.sizes.numpy()
    assert (np.abs(n_tr - 0.75 * (n_tr + n_te)) <= 1.0).all()
    assert len(set((n_tr + n_te).tolist())) > 1  # heterogeneous sizes
    # same seed, same data; another seed, other data; the cache returns the same data
    _assert_same_data(d, mnist_pfedme(root=str(root), cache_dir=None, download=False))
    d1 = mnist_pfedme(root=str(root), seed=1, cache_dir=None, download=False)
    assert not torch.equal(d1.train.sizes, d.train.sizes) or not torch.equal(d1.train.y, d.train.y)
    cache = tmp_path / "cache"
    c1 = mnist_pfedme(root=str(root), cache_dir=str(cache), download=False)
    c2 = mnist_pfedme(root=str(root), cache_dir=str(cache), download=False)
    assert len([f for f in os.listdir(cache) if f.endswith(".pt")]) == 1  # beside file-digests.json
    _assert_same_data(d, c1)
    _assert_same_data(d, c2)


def test_mnist_pfedme_bad_values(tiny_mnist):
    root = str(tiny_mnist[0])
    # 80 images per digit: at most 40 owners per digit -> 200 clients with 2 labels each
    with pytest.raises(ValueError, match=r"^mnist_pfedme: data.num_clients=201: allowed 1..200 "):
        mnist_pfedme(root=root, num_clients=201, cache_dir=None, download=False)
    with pytest.raises(ValueError, match=r"data.labels_per_client=11: allowed 1..10"):
        mnist_pfedme(root=root, labels_per_client=11, cache_dir=None, download=False)
    with pytest.raises(ValueError, match=r"data.train_frac=1.5"):
        mnist_pfedme(root=root, train_frac=1.5, cache_dir=None, download=False)


def test_mnist_pfedme_config_composes():
    from hydra import compose, initialize_config_dir

    from fedrun.config import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["data=mnist_pfedme", "model=mlr"])
    assert cfg.data._target_ == "fedrun.data.presets.mnist_pfedme"
    assert (cfg.data.num_clients, cfg.data.labels_per_client, cfg.data.train_frac) == (20, 2, 0.75)
    assert cfg.data.cache_dir == cfg.cache_dir
    import inspect

    params = set(inspect.signature(mnist_pfedme).parameters)
    assert set(cfg.data) - {"_target_"} == params
