"""Tests of the CIFAR part of paper 004 (its Sec. 3 ACID / ALID splits): reading the python pickles,
the ACID/ALID partitions, the cifar loader and its cache, crop_flip augmentation, the CNN and its
Proto features, and the configs.

Tiny CIFAR-10 and CIFAR-100 files are written in the real pickle format; every image carries its
own id in its first two pixels, so a client's rows can be traced back to the written images.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers import write_cifar
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.func import functional_call, stack_module_state, vmap

import fedrun.data.datasets.cifar as fcifar
from fedrun.config import CONF_DIR
from fedrun.data import cifar
from fedrun.data.augment import augment, crop_flip, crop_flip_apply, crop_flip_params
from fedrun.data.datasets.cifar import CIFAR_FILES, channel_stats, load_cifar
from fedrun.data.partitioners.paper import _spread_extras, alid_permutations, class_lists, deal_classes
from fedrun.engine import LoopEngine, VmapEngine, params_of, stack
from fedrun.errors import DataMissingError
from fedrun.models import CNN, MLP, MLR

# ----------------------------------------------------------------------------------------------
# tiny CIFAR files
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def c10(tmp_path_factory):
    root = tmp_path_factory.mktemp("c10")
    return str(root), write_cifar(str(root), 10, 20, 10)


@pytest.fixture(scope="module")
def c100(tmp_path_factory):
    root = tmp_path_factory.mktemp("c100")
    return str(root), write_cifar(str(root), 100, 4, 3)


def _ids(x: torch.Tensor, train_x: np.ndarray) -> np.ndarray:
    """Image ids of normalized rows x [N, 3, 32, 32] (the loader normalizes by the train stats)."""
    raw = train_x.astype(np.float64)
    mean, std = raw.mean((0, 2, 3)), raw.std((0, 2, 3))
    px = np.rint(x[:, 0, 0, :2].double().numpy() * std[0] + mean[0]).astype(np.int64)
    return px[:, 0] + 256 * px[:, 1]


# ----------------------------------------------------------------------------------------------
# sources
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["c10", "c100"])
def test_load_cifar_reads_the_pickles(which, request):
    root, (trx, try_, tex, tey) = request.getfixturevalue(which)
    got = load_cifar(root, 10 if which == "c10" else 100, download=False)
    for a, b in zip(got, (trx, try_, tex, tey)):
        assert np.array_equal(a, b)
    assert got[0].dtype == np.uint8 and got[0].shape[1:] == (3, 32, 32)


@pytest.mark.parametrize("num_classes", [10, 100])
def test_missing_cifar_is_one_clear_line(tmp_path, num_classes):
    folder, train_files, test_files, _ = CIFAR_FILES[num_classes]
    with pytest.raises(DataMissingError) as e:
        load_cifar(str(tmp_path), num_classes, download=False)
    msg = str(e.value)
    assert "\n" not in msg and "download=false" in msg
    assert os.path.abspath(os.path.join(tmp_path, folder)) in msg
    assert all(f in msg for f in train_files + test_files)
    with pytest.raises(DataMissingError):  # through the loader too
        cifar(str(tmp_path), f"cifar{num_classes}", num_clients=10, classes_per_client=2, download=False)


# ----------------------------------------------------------------------------------------------
# partitions
# ----------------------------------------------------------------------------------------------

def test_consecutive_class_lists_follow_the_official_code():
    lists = class_lists(10, 23, 3, "consecutive", np.random.RandomState(0))
    for c in range(23):
        assert lists[c].tolist() == sorted((c + j) % 10 for j in range(3))


@pytest.mark.parametrize("C,n,k", [(10, 100, 3), (10, 7, 4), (100, 100, 7), (10, 10, 10)])
def test_random_class_lists_distinct_balanced_seeded(C, n, k):
    lists = class_lists(C, n, k, "random", np.random.RandomState(1))
    assert lists.shape == (n, k)
    assert all(len(set(row)) == k for row in lists.tolist())
    used = np.bincount(lists.ravel(), minlength=C)
    assert used.max() - used.min() <= 1 and used.sum() == n * k
    assert np.array_equal(lists, class_lists(C, n, k, "random", np.random.RandomState(1)))
    if k < C:
        assert not np.array_equal(lists, class_lists(C, n, k, "random", np.random.RandomState(2)))


@pytest.mark.parametrize("how", ["consecutive", "random"])
@pytest.mark.parametrize("C,per_class,n,k", [(10, 20, 10, 3), (10, 10, 10, 3), (10, 23, 10, 7), (100, 4, 100, 3)])
def test_deal_is_without_replacement_from_own_classes(how, C, per_class, n, k):
    labels = np.random.RandomState(0).permutation(np.repeat(np.arange(C), per_class))
    rng = np.random.RandomState(3)
    lists = class_lists(C, n, k, how, rng)
    parts = deal_classes(labels, lists, rng)
    all_idx = np.concatenate(parts)
    assert len(np.unique(all_idx)) == len(all_idx)  # no example twice
    for c, idx in enumerate(parts):
        assert len(idx) == len(labels) // n
        counts = np.bincount(labels[idx], minlength=C)
        assert set(np.flatnonzero(counts)) <= set(lists[c].tolist())  # only its own classes
        own = counts[lists[c]]
        assert own.max() - own.min() <= 1  # as equal as possible over its k classes


def test_deal_impossible_names_the_options():
    labels = np.repeat(np.arange(10), 5)
    with pytest.raises(ValueError, match="data.classes_per_client"):
        class_lists(10, 4, 11, "consecutive", np.random.RandomState(0))
    with pytest.raises(ValueError, match="data.classes"):
        class_lists(10, 4, 3, "shuffled", np.random.RandomState(0))
    with pytest.raises(ValueError, match="data.num_clients=20.*data.classes_per_client=3"):
        deal_classes(labels, class_lists(10, 20, 3, "consecutive", None), np.random.RandomState(0))
    # 15 devices over 10 classes: class 2 is owned by 6 devices that need 2 of its 10 images each
    with pytest.raises(ValueError, match="data.num_clients=15.*class 2 has 10 examples"):
        deal_classes(np.repeat(np.arange(10), 10), class_lists(10, 15, 3, "consecutive", None),
                     np.random.RandomState(0))


def test_extras_move_along_an_augmenting_path():
    # device 0 first takes class 0's only extra; device 1 (classes 0 and 2, class 2 full) can only
    # get one when device 0 moves its extra to class 1
    extra = _spread_extras(np.array([[0, 1], [0, 2]]), 1, np.array([1, 1, 0]))
    assert extra.tolist() == [[False, True], [True, False]]
    assert _spread_extras(np.array([[0, 1], [0, 1]]), 1, np.array([1, 0, 5])) is None


def test_alid_permutations_are_bijections():
    perms = alid_permutations(50, 5, np.random.RandomState(0))
    assert all(sorted(p) == list(range(5)) for p in perms.tolist())
    assert len({tuple(p) for p in perms.tolist()}) > 1


# ----------------------------------------------------------------------------------------------
# the loader
# ----------------------------------------------------------------------------------------------

def _check_split(split, true_y, ids, n, per_client):
    assert split.sizes.tolist() == [per_client] * n
    assert len(np.unique(ids)) == len(ids)  # no example twice
    return true_y[ids]


@pytest.mark.parametrize("how", ["consecutive", "random"])
def test_cifar10_acid(c10, how):
    root, (trx, try_, tex, tey) = c10
    d = cifar(root, "cifar10", "acid", num_clients=10, classes_per_client=3, classes=how, download=False)
    assert d.num_classes == 10 and d.augment == "crop_flip" and d.client_labels is None
    assert d.feature_shape == (3, 32, 32) and d.train.x.dtype == torch.float32
    lists = d.client_classes.numpy()
    assert np.array_equal(lists, class_lists(10, 10, 3, how, np.random.RandomState(0)))
    for split, x_raw, y_raw, per in ((d.train, trx, try_, 20), (d.test, tex, tey, 10)):
        ids = _ids(split.x, trx) - (0 if split is d.train else len(try_))
        true = _check_split(split, y_raw, ids, 10, per)
        assert np.array_equal(split.y.numpy(), true)  # ACID keeps the labels
        owner = np.repeat(np.arange(10), per)
        assert all(true[i] in lists[owner[i]] for i in range(len(true)))
        # the rows are the images themselves, normalized
        raw = x_raw[ids].astype(np.float64)
        back = split.x.double().numpy() * trx.std((0, 2, 3))[:, None, None] + trx.mean((0, 2, 3))[:, None, None]
        assert np.abs(back - raw).max() < 1e-3
    # every training image is dealt here (200 / 10), so the training data is exactly standardized
    x = d.train.x.double()
    assert torch.allclose(x.mean((0, 2, 3)), torch.zeros(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(x.std((0, 2, 3), unbiased=False), torch.ones(3, dtype=torch.float64), atol=1e-5)


def test_cifar_pad_fill_is_a_black_pixel_normalized(c10):
    """data.pad_fill=black (default): the crop's padding is what normalizing a 0 pixel gives, per
    channel; pad_fill=mean: None (0 after normalization). The data is the same either way."""
    root, (trx, *_) = c10
    kw = dict(num_clients=10, classes_per_client=3, download=False)
    d, m = cifar(root, "cifar10", "acid", **kw), cifar(root, "cifar10", "acid", pad_fill="mean", **kw)
    mean, std = channel_stats(trx)
    black = (np.zeros(3, dtype=np.float32) - mean.astype(np.float32)) / std.astype(np.float32)
    assert d.augment_fill.dtype == torch.float32 and np.array_equal(d.augment_fill.numpy(), black)
    assert (d.augment_fill < -1).all()  # far from the mean colour (0): CIFAR pixels average ~120 of 255
    assert m.augment_fill is None and torch.equal(m.train.x, d.train.x)
    assert torch.equal(d.to("cpu").augment_fill, d.augment_fill)


def test_cifar100_alid_relabels_per_device(c100):
    root, (trx, try_, tex, tey) = c100
    kw = dict(num_clients=100, classes_per_client=3, download=False)
    d = cifar(root, "cifar100", "alid", **kw)
    acid = cifar(root, "cifar100", "acid", **kw)
    assert d.num_classes == 3 and acid.num_classes == 100
    lists, perms = d.client_classes.numpy(), d.client_labels.numpy()
    assert np.array_equal(lists, acid.client_classes.numpy())
    assert all(sorted(p) == [0, 1, 2] for p in perms.tolist())
    assert len({tuple(p) for p in perms.tolist()}) > 1
    for split, asplit, y_raw, per, off in ((d.train, acid.train, try_, 4, 0), (d.test, acid.test, tey, 3, len(try_))):
        ids = _ids(split.x, trx) - off
        true = _check_split(split, y_raw, ids, 100, per)
        assert np.array_equal(ids, _ids(asplit.x, trx) - off)  # same examples as ACID
        owner = np.repeat(np.arange(100), per)
        local = split.y.numpy()
        assert local.min() >= 0 and local.max() < 3
        for i in range(len(true)):  # local label l of device c is class lists[c, j] with perms[c, j] == l
            c = owner[i]
            assert lists[c][list(perms[c]).index(local[i])] == true[i]


def test_cifar_cache_roundtrip(c10, tmp_path, monkeypatch):
    root, _ = c10
    kw = dict(num_clients=10, classes_per_client=3, download=False, cache_dir=str(tmp_path / "cache"))
    d1 = cifar(root, "cifar10", "alid", **kw)
    (name,) = [f for f in os.listdir(tmp_path / "cache") if f != "file-digests.json"]
    assert name.startswith("cifar10_alid-") and name.endswith(".pt")

    def boom(*a, **k):
        raise AssertionError("load_cifar called although a cache file exists")

    monkeypatch.setattr(fcifar, "load_cifar", boom)
    d2 = cifar(root, "cifar10", "alid", **kw)
    for a, b in ((d1.train, d2.train), (d1.test, d2.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.sizes, b.sizes)
    assert torch.equal(d1.client_classes, d2.client_classes) and torch.equal(d1.client_labels, d2.client_labels)
    assert (d2.num_classes, d2.augment) == (3, "crop_flip") and torch.equal(d1.augment_fill, d2.augment_fill)
    moved = d2.to("cpu")
    assert moved.augment == "crop_flip" and torch.equal(moved.client_labels, d2.client_labels)
    with pytest.raises(AssertionError, match="load_cifar called"):  # other settings: a new entry
        cifar(root, "cifar10", "alid", **{**kw, "seed": 1})


def test_cifar_bad_options_name_them(c10):
    root, _ = c10
    with pytest.raises(ValueError, match="data.classes_per_client=11"):
        cifar(root, "cifar10", "acid", num_clients=10, classes_per_client=11, download=False)
    with pytest.raises(ValueError, match="data.dataset"):
        cifar(root, "cifar1000", "acid", download=False)
    with pytest.raises(ValueError, match="data.split"):
        cifar(root, "cifar10", "iid", download=False)
    with pytest.raises(ValueError, match=r"data.pad_fill='zero' is not one of \['black', 'mean'\]"):
        cifar(root, "cifar10", "acid", pad_fill="zero", download=False)
    with pytest.raises(ValueError, match="data.num_clients=300"):  # 200 images for 300 devices
        cifar(root, "cifar10", "acid", num_clients=300, classes_per_client=3, download=False)


# ----------------------------------------------------------------------------------------------
# augmentation
# ----------------------------------------------------------------------------------------------

def _reference_crop_flip(img, dy, dx, flip, p=4, fill=None):
    padded = torch.nn.functional.pad(img, (p, p, p, p))
    if fill is not None:  # the border, channel by channel
        border = torch.ones_like(padded, dtype=torch.bool)
        border[:, p:-p, p:-p] = False
        padded = torch.where(border, fill[:, None, None], padded)
    out = padded[:, dy:dy + img.shape[1], dx:dx + img.shape[2]]
    return torch.flip(out, [-1]) if flip else out


def test_crop_flip_hand_cases():
    x = torch.arange(2 * 3 * 6 * 5, dtype=torch.float32).reshape(2, 3, 6, 5) + 1
    same = crop_flip_apply(x, torch.tensor([4, 4]), torch.tensor([4, 4]), torch.tensor([False, True]))
    assert torch.equal(same[0], x[0]) and torch.equal(same[1], torch.flip(x[1], [-1]))
    # shifted by one row down and two columns right of the padded origin: zeros enter at the bottom/right
    out = crop_flip_apply(x, torch.tensor([5, 4]), torch.tensor([6, 4]), torch.tensor([False, False]))
    assert (torch.equal(out[0, :, :5, :3], x[0, :, 1:, 2:]) and (out[0, :, 5] == 0).all()
            and (out[0, :, :, 3:] == 0).all())
    # with a per-channel fill the border takes channel c's value, the image keeps its own
    fill = torch.tensor([-1.5, -2.0, -0.25])
    out = crop_flip_apply(x, torch.tensor([5, 0]), torch.tensor([6, 8]), torch.tensor([False, True]), fill=fill)
    assert torch.equal(out[0, :, :5, :3], x[0, :, 1:, 2:])
    assert (torch.equal(out[0, :, 5], fill[:, None].expand(3, 5))
            and torch.equal(out[0, :, :, 3:], fill[:, None, None].expand(3, 6, 2)))
    # dy=0: 4 padded rows on top; dx=8 then flip: the right 4 columns padded, mirrored to the left
    assert (torch.equal(out[1, :, :4], fill[:, None, None].expand(3, 4, 5))
            and torch.equal(out[1, :, 4:, :4], fill[:, None, None].expand(3, 2, 4)))
    assert torch.equal(out[1, :, 4:, 4], x[1, :, :2, 4])


def test_crop_flip_matches_per_image_reference_and_is_seeded():
    x = torch.randn(3, 4, 3, 8, 8)  # [clients, batch, C, H, W]
    out = crop_flip(x, torch.Generator().manual_seed(5))
    assert out.shape == x.shape
    dy, dx, flip = crop_flip_params(12, torch.Generator().manual_seed(5))
    flat = x.reshape(12, 3, 8, 8)
    ref = torch.stack([_reference_crop_flip(flat[i], int(dy[i]), int(dx[i]), bool(flip[i])) for i in range(12)])
    assert torch.equal(out.reshape(12, 3, 8, 8), ref)
    fill = torch.randn(3)
    filled = crop_flip(x, torch.Generator().manual_seed(5), fill=fill)
    ref = torch.stack([_reference_crop_flip(flat[i], int(dy[i]), int(dx[i]), bool(flip[i]), fill=fill)
                       for i in range(12)])
    assert torch.equal(filled.reshape(12, 3, 8, 8), ref) and not torch.equal(filled, out)
    assert torch.equal(augment("crop_flip", x, torch.Generator().manual_seed(5), fill=fill), filled)
    assert torch.equal(out, crop_flip(x, torch.Generator().manual_seed(5)))
    assert not torch.equal(out, crop_flip(x, torch.Generator().manual_seed(6)))
    assert augment(None, x, torch.Generator()) is x
    assert torch.equal(augment("crop_flip", x, torch.Generator().manual_seed(5)), out)


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------

def test_cnn_shapes_features_and_vmap():
    torch.manual_seed(0)
    net = CNN(in_features=3072, num_classes=7)
    assert [p.shape for p in net.parameters()][4] == (384, 1600)
    x = torch.randn(5, 3, 32, 32)
    assert net(x).shape == (5, 7) and net(x, features=True).shape == (5, 192)
    assert torch.equal(net(x.flatten(1)), net(x))
    nets = [CNN(3072, 7) for _ in range(2)]
    params, buffers = stack_module_state(nets)
    xs = torch.randn(2, 4, 3, 32, 32)

    def f(p, xb):
        return functional_call(net, p, (xb,), {"features": True})

    feats = vmap(f)(params, xs)
    assert feats.shape == (2, 4, 192)
    assert torch.allclose(feats[1], nets[1](xs[1], features=True), atol=1e-5)
    logits = vmap(lambda p, xb: functional_call(net, p, (xb,)))(params, xs)
    assert torch.allclose(logits[0], nets[0](xs[0]), atol=1e-5)


def test_cnn_stacked_forward_and_vmap_engine_gradients_match_per_client_autograd():
    # the vmap engine's CNN path on the CPU (convolutions client by client, linear layers batched)
    torch.manual_seed(0)
    net = CNN(in_features=3072, num_classes=5)
    params = {k: v + 0.01 * torch.randn_like(v) for k, v in stack(params_of(net), 3).items()}
    xs, ys = torch.randn(3, 4, 3, 32, 32), torch.randint(0, 5, (3, 4))
    direct = vmap(lambda p, xb: functional_call(net, p, (xb,)))(params, xs)
    torch.testing.assert_close(net.stacked_forward(params, xs), direct)
    (gv, lv), (gl, ll) = VmapEngine(net).grad(params, xs, ys), LoopEngine(net).grad(params, xs, ys)
    torch.testing.assert_close(lv, ll)
    for k in params:
        torch.testing.assert_close(gv[k], gl[k], rtol=1e-4, atol=1e-6)


def test_features_of_mlr_and_mlp():
    x = torch.randn(4, 2, 3)
    assert torch.equal(MLR(6, 3)(x, features=True), x.flatten(1))
    mlp = MLP(6, 3, hidden=[5, 4], activation="elu")
    h = mlp(x, features=True)
    assert h.shape == (4, 4)
    assert torch.allclose(mlp(x), mlp.net[-1](h))
    assert set(dict(mlp.named_parameters())) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias",
                                                  "net.4.weight", "net.4.bias"}  # checkpoints keep their keys


# ----------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["cifar10_acid", "cifar10_alid", "cifar100_acid", "cifar100_alid"])
def test_cifar_configs_compose_and_load(name, c10, c100):
    root = (c10 if name.startswith("cifar10_") else c100)[0]
    small = ["data.num_clients=10"] if name.startswith("cifar10_") else ["data.classes_per_client=3"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"data={name}", "model=cnn", f"data.root={root}", "cache_dir=null",
                                           "data.download=false", *small])
    d = instantiate(cfg.data)
    assert d.name == name and d.augment == "crop_flip"
    net = instantiate(cfg.model, in_features=d.in_features, num_classes=d.num_classes)
    assert net(d.test.x[:2]).shape == (2, d.num_classes)
