"""Property tests of the partitioners (fedrun.data.partitioners): every row used at most once, seeds
deterministic, sizes and label histograms following the parameters (at large n, against the
distributions' own moments), and the failure modes peers' trackers report (a min-size loop that
never ends, alpha ignored, NaN at tiny alpha) refused or absent."""
from __future__ import annotations

import numpy as np
import pytest

from fedrun.data import partitioners as P
from fedrun.data.composed import PARTITIONS

LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 300))

CASES = {
    "iid": dict(num_clients=20),
    "dirichlet": dict(num_clients=20, alpha=0.3, min_size=5),
    "shards": dict(num_clients=20, shards_per_client=3),
    "classes": dict(num_clients=20, classes_per_client=3),
    "quantity": dict(num_clients=20, sizes="lognormal", sigma=1.5, min_size=3),
    "mixture": dict(num_clients=20, iid_frac=0.3, alpha=0.2),
    "perfedavg_split": dict(num_clients=10, a=20),
    "pfedme_labels": dict(num_clients=20, labels_per_client=2),
    "acid": dict(num_clients=20, classes_per_client=4),
    "natural": dict(writers=np.arange(3000) % 7),
}


def _parts(name, seed=0, labels=LABELS):
    return PARTITIONS[name](labels, np.random.default_rng(seed), **CASES[name])


def test_every_partition_has_a_case():
    assert set(CASES) == set(PARTITIONS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rows_used_at_most_once_and_seed_deterministic(name):
    parts = _parts(name)
    assert len(parts) == CASES[name].get("num_clients", 7)
    flat = np.concatenate(parts)
    assert flat.dtype == np.int64 and len(np.unique(flat)) == len(flat)  # no row twice
    assert flat.min() >= 0 and flat.max() < len(LABELS)
    assert all((np.diff(p) > 0).all() for p in parts)  # sorted
    again = _parts(name)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = _parts(name, seed=1)
    if name == "natural":  # fixed by the data, no randomness
        return
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "quantity", "mixture"])
def test_partitions_of_every_row_use_every_row(name):
    assert len(np.concatenate(_parts(name))) == len(LABELS)


def test_iid_sizes_equal_and_label_histograms_close_to_the_whole():
    labels = np.random.default_rng(1).integers(0, 10, 100_000)
    parts = P.iid(labels, np.random.default_rng(0), 10)
    sizes = np.array([len(p) for p in parts])
    assert sizes.max() - sizes.min() <= 1
    hist = np.array([np.bincount(labels[p], minlength=10) / len(p) for p in parts])
    assert np.abs(hist - np.bincount(labels) / len(labels)).max() < 0.01  # ~ 5 standard errors


@pytest.mark.parametrize("alpha", [0.1, 1.0, 10.0])
def test_dirichlet_label_proportions_spread_as_the_concentration_says(alpha):
    """Class k's share at client c is q_kc ~ Beta(alpha, (C-1) alpha): mean 1/C and variance
    (1/C)(1 - 1/C)/(C alpha + 1). Over 200 classes x 10 clients the sample variance is within 15%."""
    C, K = 10, 200
    labels = np.repeat(np.arange(K), 500)
    parts = P.dirichlet(labels, np.random.default_rng(3), C, alpha=alpha)
    share = np.stack([np.bincount(labels[p], minlength=K) for p in parts], 1) / 500.0  # [K, C]
    expected = (1 / C) * (1 - 1 / C) / (C * alpha + 1)
    assert share.mean() == pytest.approx(1 / C)
    assert share.var() == pytest.approx(expected, rel=0.15)


def test_dirichlet_tiny_alpha_has_no_nan_and_uses_every_row():
    parts = P.dirichlet(LABELS, np.random.default_rng(0), 50, alpha=1e-4)
    assert len(np.concatenate(parts)) == len(LABELS)
    # alpha -> 0: every class goes to one client
    owners = [{c for c, p in enumerate(parts) if (LABELS[p] == k).any()} for k in range(10)]
    assert all(len(o) == 1 for o in owners)


def test_dirichlet_min_size_infeasible_refused_before_any_draw():
    with pytest.raises(P.PartitionError, match=r"partition.min_size=200: 20 clients x 200 rows exceeds the 3000 rows"):
        P.dirichlet(LABELS, np.random.default_rng(0), 20, alpha=0.5, min_size=200)


def test_dirichlet_min_size_unreachable_stops_after_bounded_redraws():
    """500 clients at alpha 0.1 with a minimum near the mean: the loop peers' code never leaves."""
    labels = np.random.default_rng(0).integers(0, 10, 50_000)
    with pytest.raises(P.PartitionError, match=r"no Dirichlet draw in 21 gave every one of the 500 clients >= 90 rows"):
        P.dirichlet(labels, np.random.default_rng(0), 500, alpha=0.1, min_size=90, max_redraws=20)


def test_dirichlet_min_size_reached_by_redrawing():
    parts = P.dirichlet(LABELS, np.random.default_rng(0), 30, alpha=0.5, min_size=40)
    assert min(len(p) for p in parts) >= 40


def test_shards_give_equal_sizes_and_at_most_shards_per_client_labels():
    labels = np.repeat(np.arange(10), 200)  # shards of 20 rows never straddle two labels
    parts = P.shards(labels, np.random.default_rng(0), 50, shards_per_client=2)
    assert {len(p) for p in parts} == {40}
    assert max(len(np.unique(labels[p])) for p in parts) <= 2


def test_classes_give_k_distinct_labels_each_and_balanced_owners():
    parts = P.classes(LABELS, np.random.default_rng(0), 20, classes_per_client=3)
    per = [np.unique(LABELS[p]) for p in parts]
    assert all(len(u) == 3 for u in per)
    owners = np.bincount(np.concatenate(per), minlength=10)
    assert owners.max() - owners.min() <= 1  # 60 slots over 10 classes: 6 each
    with pytest.raises(P.PartitionError, match="partition.classes_per_client=11"):
        P.classes(LABELS, np.random.default_rng(0), 20, classes_per_client=11)


def test_quantity_sizes_follow_the_law_and_labels_stay_iid():
    labels = np.random.default_rng(1).integers(0, 10, 200_000)
    parts = P.quantity(labels, np.random.default_rng(0), 2000, sizes="lognormal", sigma=1.0, min_size=0)
    sizes = np.array([len(p) for p in parts], dtype=float)
    # sizes ~ n * w / sum(w), w lognormal(0, 1): log-sizes have std 1
    assert np.log(sizes[sizes > 0]).std() == pytest.approx(1.0, rel=0.1)
    big = [p for p in parts if len(p) > 500]
    hist = np.array([np.bincount(labels[p], minlength=10) / len(p) for p in big])
    assert np.abs(hist.mean(0) - 0.1).max() < 0.01
    d = P.quantity(labels, np.random.default_rng(0), 100, sizes="dirichlet", alpha=1.0, min_size=50)
    ds = np.array([len(p) for p in d])
    assert ds.min() >= 50 and ds.sum() == len(labels)
    # Dirichlet(1) shares: variance (1/C)(1-1/C)/(C+1)
    assert np.var(ds / ds.sum()) == pytest.approx(0.01 * 0.99 / 101, rel=0.35)
    with pytest.raises(P.PartitionError, match="partition.sizes='zipf': allowed one of dirichlet, lognormal"):
        P.quantity(labels, np.random.default_rng(0), 10, sizes="zipf")


def test_mixture_ends_are_iid_and_dirichlet():
    full = P.mixture(LABELS, np.random.default_rng(0), 10, iid_frac=1.0)
    assert max(len(p) for p in full) - min(len(p) for p in full) <= 1
    skewed = P.mixture(LABELS, np.random.default_rng(0), 10, iid_frac=0.0, alpha=0.05)
    assert np.mean([len(np.unique(LABELS[p])) for p in skewed if len(p)]) < 6


@pytest.mark.parametrize("holdout, count", [(0, 0), (0.2, 4), (3, 3), (0.0, 0)])
def test_holdout_fraction_or_count(holdout, count):
    held = P.holdout_clients(20, holdout, np.random.default_rng(0))
    assert len(held) == count and len(np.unique(held)) == count


@pytest.mark.parametrize("holdout", [1.0, 20, -1, "a", True])
def test_holdout_bad_values_refused(holdout):
    with pytest.raises(P.PartitionError, match=r"partition.holdout="):
        P.holdout_clients(20, holdout, np.random.default_rng(0))


@pytest.mark.parametrize("name, opts, msg", [
    ("dirichlet", dict(alpha=0), "partition.alpha=0: allowed a number > 0"),
    ("dirichlet", dict(alpha=float("nan")), "partition.alpha=nan"),
    ("iid", dict(num_clients=0), "partition.num_clients=0"),
    ("shards", dict(shards_per_client=1000), "partition.shards_per_client=1000"),
])
def test_bad_options_name_the_option(name, opts, msg):
    kw = {**CASES[name], **opts}
    with pytest.raises(P.PartitionError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        PARTITIONS[name](LABELS, np.random.default_rng(0), **kw)


def test_natural_split_is_one_client_per_writer():
    writers = np.array(["b", "a", "b", "c", "a", "b"])
    parts = P.natural(np.zeros(6, np.int64), None, writers)
    assert [p.tolist() for p in parts] == [[1, 4], [0, 2, 5], [3]]  # writers in sorted order
    with pytest.raises(P.PartitionError, match="5 writer ids for 6 rows"):
        P.natural(np.zeros(6, np.int64), None, writers[:5])


def test_partition_benchmark_runs(capsys):
    from fedrun.data.bench_partitions import main

    main(["--repeats", "1", "--clients", "50"])
    out = capsys.readouterr().out
    assert "dirichlet alpha=0.1, 50 clients" in out and "3500 clients" in out
