"""Property tests of the partitioners (fedrun.data.partitioners): every row used at most once, seeds
deterministic, sizes and label histograms following the parameters (at large n, against the
distributions' own moments), and the failure modes peers' trackers report (a min-size loop that
never ends, alpha ignored, NaN at tiny alpha) refused or absent."""
from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import built

from fedrun.config import group_options
from fedrun.data import partitioners as P

PARTITIONS = group_options("partition")  # every partition= of conf/partition


def _partition(name: str, labels, rng, **opts):
    """The rows of each client under `partition=name` with `opts` (writers: the rows' natural groups)."""
    writers = opts.pop("writers", None)
    return built("partition", {"name": name, **opts})(labels, rng, writers)

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
    return _partition(name, labels, np.random.default_rng(seed), **CASES[name])


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
        _partition(name, LABELS, np.random.default_rng(0), **kw)


def test_natural_split_is_one_client_per_writer():
    writers = np.array(["b", "a", "b", "c", "a", "b"])
    parts = P.natural(np.zeros(6, np.int64), None, writers)
    assert [p.tolist() for p in parts] == [[1, 4], [0, 2, 5], [3]]  # writers in sorted order
    with pytest.raises(P.PartitionError, match="5 writer ids for 6 rows"):
        P.natural(np.zeros(6, np.int64), None, writers[:5])


def test_partition_benchmark_runs(capsys):
    from fedrun.bench.partitions import main

    main(["--repeats", "1", "--clients", "50"])
    out = capsys.readouterr().out
    assert "dirichlet alpha=0.1, 50 clients" in out and "3500 clients" in out


# ---------------------------------------------------------------------------- every row accounted for

def _rows_the_rule_uses(name: str, labels: np.ndarray) -> int:
    """How many rows each partitioner's own rule deals out of `labels` with CASES[name]; the rest it
    leaves out by design (Per-FedAvg's `a` images per digit, ACID's floor(N / n) per device)."""
    o = CASES[name]
    if name == "perfedavg_split":
        n, a = o["num_clients"], o["a"]
        return n // 2 * 5 * a + (n - n // 2) * (a // 2 + 2 * a)
    if name == "acid":
        return len(labels) // o["num_clients"] * o["num_clients"]
    return len(labels)  # the rest use every row (classes and pfedme_labels: every class owned here)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_partition_accounts_for_every_row(name):
    """No row is dropped beyond what the rule says: the rows dealt are exactly the rule's count."""
    assert len(np.concatenate(_parts(name))) == _rows_the_rule_uses(name, LABELS)


@pytest.mark.parametrize("iid_frac", [0.001, 0.004, 0.999])
def test_mixture_with_a_share_smaller_than_the_clients_drops_no_row(iid_frac):
    """The red team's 70 of 70,000 rows lost: an iid share (or a skewed one) of fewer rows than
    clients went to nobody."""
    parts = P.mixture(LABELS, np.random.default_rng(0), 20, iid_frac=iid_frac, alpha=0.5)
    flat = np.concatenate(parts)
    assert len(flat) == len(LABELS) and len(np.unique(flat)) == len(LABELS)


@pytest.mark.parametrize("holdout, clients", [(0.004, 100), (0.04, 10), (0.999, 100)])
def test_holdout_that_rounds_to_no_client_or_every_client_refused(holdout, clients):
    with pytest.raises(P.PartitionError) as e:
        P.holdout_clients(clients, holdout, np.random.default_rng(0))
    assert f"partition.holdout={holdout}: holds out round({holdout} x {clients} clients) = " in str(e.value)
    assert "allowed 0 (none), a fraction in (" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------- partition.seed pins the lists

PARTITION_OPTIONS = {k: {o: v for o, v in opts.items() if o != "writers"} for k, opts in CASES.items()}


def _composed_lists(name: str, seed: int, test: str = "split"):
    writers = CASES["natural"]["writers"].astype(str)
    partition = built("partition", {"name": name, "seed": seed, "test": test, **PARTITION_OPTIONS[name]})
    if test == "split":  # LABELS pooled
        dealt = partition.deal(LABELS[:2500], LABELS[2500:], (writers[:2500], writers[2500:]))
    else:  # LABELS the training rows, the same labels reversed the dataset's test rows
        dealt = partition.deal(LABELS, LABELS[::-1].copy(), (writers, writers[::-1].copy()))
    return dealt.train + dealt.test


@pytest.mark.parametrize("test", ["split", "dataset"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_partition_seed_gives_the_same_lists_and_another_seed_other_lists(name, test):
    """What a partition is drawn from is `partition.seed` (the planted bug: every composed partition
    drawn with seed 0, caught by no test). natural with test=dataset is LEAF's own split: no draw."""
    a, again, other = _composed_lists(name, 5, test), _composed_lists(name, 5, test), _composed_lists(name, 6, test)
    assert len(a) == len(again) and all(np.array_equal(x, y) for x, y in zip(a, again))
    if name == "natural" and test == "dataset":
        assert all(np.array_equal(x, y) for x, y in zip(a, other))
    else:
        assert not all(np.array_equal(x, y) for x, y in zip(a, other))


def test_partition_does_not_depend_on_the_runs_seed():
    """cfg.data of a composed run resolves to the same settings under every run `seed` (the model,
    sampling and minibatches change with it; the partition does not); and no partition's yaml
    interpolates anything (composing all ten twice would take seconds)."""
    import glob

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fedrun.config import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        seen = [OmegaConf.to_container(compose("config", overrides=[
            "dataset=mnist", "partition=dirichlet", f"seed={s}"]).data, resolve=True) for s in (0, 7)]
    assert seen[0] == seen[1] and seen[0]["partition"]["seed"] == 0
    files = glob.glob(os.path.join(CONF_DIR, "partition", "*.yaml"))
    assert len(files) == len(PARTITIONS) + 1  # and _split.yaml, the options they share
    for f in files:
        assert "${" not in open(f).read(), f


# ---------------------------------------------------------------------------- label-iid partitions

def _within_sampling_error(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """The largest |count - expected| / sd over clients and labels, where a client of m rows drawn
    without replacement from the pool has a hypergeometric count of label j: mean m p_j, variance
    m p_j (1 - p_j) (N - m) / (N - 1)."""
    N = len(labels)
    p = np.bincount(labels) / N
    worst = 0.0
    for part in parts:
        m = len(part)
        if m < 2:
            continue
        sd = np.sqrt(m * p * (1 - p) * (N - m) / (N - 1))
        worst = max(worst, float((np.abs(np.bincount(labels[part], minlength=len(p)) - m * p) / sd).max()))
    return worst


@pytest.mark.parametrize("name, opts", [
    ("iid", dict(num_clients=20)),
    ("quantity", dict(num_clients=20, sizes="lognormal", sigma=1.0, min_size=10)),
    ("quantity", dict(num_clients=20, sizes="dirichlet", alpha=1.0, min_size=10)),
])
def test_iid_and_quantity_clients_label_histograms_match_the_pool(name, opts):
    """Rows in dataset order sorted by label (as MNIST's are not, and some datasets are): a
    partitioner that deals rows in order instead of shuffled gives each client a contiguous,
    label-skewed block (the planted bug no test caught). 200 counts, each within 5 sd."""
    labels = np.repeat(np.arange(10), 2000)
    parts = _partition(name, labels, np.random.default_rng(0), **opts)
    assert _within_sampling_error(labels, parts) < 5


def test_shards_are_dealt_at_random_not_in_order():
    """200 shards of 10 labels, 2 per client: drawn at random a client's two shards share a label
    with probability ~19/199 (~1.9 labels each); dealt in order every client holds one label."""
    labels = np.repeat(np.arange(10), 400)
    parts = P.shards(labels, np.random.default_rng(0), 100, shards_per_client=2)
    assert np.mean([len(np.unique(labels[p])) for p in parts]) > 1.7


def test_classes_owned_depend_on_the_seed():
    """The classes a client owns come from a seeded permutation, not the classes' order."""
    first = {tuple(np.unique(LABELS[P.classes(LABELS, np.random.default_rng(s), 20, classes_per_client=3)[0]]))
             for s in range(8)}
    assert len(first) > 1


@pytest.mark.parametrize("name, advice", [("iid", "use fewer clients or use partition.test=split"),
                                          ("dirichlet",
                                           "raise partition.min_size, use fewer clients or use partition.test=split")])
def test_clients_without_rows_advice_names_only_the_partitions_options(name, advice):
    """partition=iid partition.num_clients=<rows> advised a min_size iid does not have."""
    part = built("partition", {"name": name, "num_clients": 2500, "test": "dataset", "seed": 0,
                               **({"min_size": 0} if name == "dirichlet" else {})})
    with pytest.raises(P.PartitionError) as e:
        part.deal(LABELS[:2500], LABELS[2500:])
    assert str(e.value).endswith(f"get no training or no test rows; {advice}")


def test_holdout_rounding_to_no_client_refused_before_any_file_is_read():
    with pytest.raises(P.PartitionError, match=r"partition.holdout=0.004: holds out round\(0.004 x 100 clients\) = 0"):
        built("partition", {"name": "iid", "num_clients": 100, "holdout": 0.004})  # no data: built only


@pytest.mark.parametrize("name, opts", [
    ("quantity", dict(num_clients=20, sizes="lognormal", sigma=1.0, min_size=3)),
    ("quantity", dict(num_clients=20, sizes="dirichlet", alpha=1.0, min_size=3)),
    ("dirichlet", dict(num_clients=20, alpha=0.5)),
    ("mixture", dict(num_clients=20, iid_frac=0.3, alpha=0.5)),
    ("pfedme_labels", dict(num_clients=20, labels_per_client=2)),
])
def test_random_client_sizes_are_drawn_from_the_seed(name, opts):
    """Where the sizes are part of the draw, another seed gives other sizes (a partition whose rows
    follow the seed but whose sizes were drawn with a fixed one passed the seed test)."""
    sizes = {tuple(len(p) for p in _partition(name, LABELS, np.random.default_rng(s), **opts)) for s in range(3)}
    assert len(sizes) == 3


def test_stratified_split_draws_test_rows_at_random_within_a_label():
    """A client's test rows of one label are a random sample of its rows of that label, not every
    fourth row in the file's order (which can follow writers, time or sources)."""
    from fedrun.data.partitioners import stratified_split

    train = stratified_split(np.zeros(400, np.int64), np.zeros(400, np.int64), 0.75, np.random.default_rng(0))
    test = np.flatnonzero(~train)
    assert len(test) == 100 and len(set(np.diff(test).tolist())) > 3
