"""`sampling`: how a round's training minibatches draw their rows.

replacement (the default): uniform draws, with replacement; epochs: each client walks shuffled
passes over its rows through the round (the PFL code's FedDyn/SCAFFOLD, a shuffling DataLoader);
steps: every local step's batches hold distinct rows of a fresh shuffle (its MAML/Proto steps).
A bad value's one-line error: tests/test_package.py.
"""
import pytest
import torch

from fedrun.data.federated import ClientSplit, FederatedData
from fedrun.simulate import Schedule, sample_round

SIZES = [3, 5, 7, 12]


def split(sizes=SIZES) -> ClientSplit:
    n = sum(sizes)
    return ClientSplit.from_flat(torch.arange(n, dtype=torch.float32).view(n, 1), torch.zeros(n, dtype=torch.long),
                                 torch.tensor(sizes), chunk_len=4)


def data(sizes=SIZES) -> FederatedData:
    s = split(sizes)
    return FederatedData(name="toy", train=s, test=s, num_classes=2)


def local_rows(s: ClientSplit, clients, idx):
    """Row indices relative to each client's first row, checking every row is the client's own."""
    off = s.offsets[clients].view(-1, *([1] * (idx.dim() - 1)))
    n = s.sizes[clients].view(-1, *([1] * (idx.dim() - 1)))
    rel = idx - off
    assert bool((rel >= 0).all()) and bool((rel < n).all())
    return rel


@pytest.mark.parametrize("blocks,length", [(1, 30), (3, 5), (2, 12)])
def test_every_pass_is_a_permutation_of_the_clients_rows(blocks, length):
    s = split()
    clients = torch.tensor([0, 1, 2, 3])
    idx = s.shuffled_indices(clients, blocks, length, torch.Generator().manual_seed(1))
    assert idx.shape == (4, blocks, length)
    rel = local_rows(s, clients, idx)
    for i, n in enumerate(SIZES):
        for b in range(blocks):
            seq = rel[i, b].tolist()
            for start in range(0, length, n):  # pass by pass; the last may be cut short
                part = seq[start : start + n]
                assert len(set(part)) == len(part)  # no row twice within a pass
                if len(part) == n:
                    assert sorted(part) == list(range(n))


def test_passes_and_blocks_are_fresh_shuffles():
    s = split([12])
    passes = s.shuffled_indices(torch.tensor([0]), 1000, 24, torch.Generator().manual_seed(0))[0].view(2000, 12)
    assert len({tuple(p) for p in passes[:100].tolist()}) == 100  # fresh orders (12! of them), not one reused
    for pos in (0, 11):  # every row equally likely at a position: 2000/12 = 167 each, sd 12.4; bounds at 5 sd
        counts = torch.bincount(passes[:, pos], minlength=12)
        assert int(counts.min()) >= 105 and int(counts.max()) <= 229, counts


def test_a_subset_of_clients_draws_within_its_own_rows():
    s = split()
    clients = torch.tensor([3, 1])
    idx = s.shuffled_indices(clients, 2, 9, torch.Generator().manual_seed(2))
    local_rows(s, clients, idx)


@pytest.mark.parametrize("sampling", ["epochs", "steps"])
def test_sample_round_shapes_and_structure(sampling):
    d = data()
    sched = Schedule(rounds=1, tau=4, clients_per_round=3, batch_size=2, sampling=sampling)
    clients, trained, idx = sample_round(d, sched, 2, seed=0, rnd=1)
    assert torch.equal(clients, trained) and idx.shape == (3, 4, 2, 2)
    rel = local_rows(d.train, trained, idx)
    for i, c in enumerate(trained.tolist()):
        n = SIZES[c]
        if sampling == "steps":  # each step's 2 x 2 rows: distinct where the client has 4 rows or more
            for st in range(4):
                rows = rel[i, st].flatten().tolist()
                assert len(set(rows)) == min(n, 4) or n < 4
        else:  # the round's 16 rows walk passes of n
            seq = rel[i].flatten().tolist()
            for start in range(0, 16 - n + 1, n):
                assert sorted(seq[start : start + n]) == list(range(n))


@pytest.mark.parametrize("sampling", ["replacement", "epochs", "steps"])
def test_train_all_keeps_the_sampled_clients_batches(sampling):
    d = data()
    sched = Schedule(rounds=1, tau=3, clients_per_round=2, batch_size=2, sampling=sampling)
    clients, trained, idx = sample_round(d, sched, 1, seed=4, rnd=2)
    c_all, t_all, idx_all = sample_round(d, sched, 1, seed=4, rnd=2, train_all=True)
    assert torch.equal(clients, c_all) and torch.equal(t_all, torch.arange(4))
    assert torch.equal(idx_all[clients], idx)
    local_rows(d.train, t_all, idx_all)


def test_the_options_draw_differently_and_replacement_repeats_rows():
    d = data([40])
    draws = {}
    for sampling in ("replacement", "epochs", "steps"):
        sched = Schedule(rounds=1, tau=4, clients_per_round=1, batch_size=5, sampling=sampling)
        draws[sampling] = sample_round(d, sched, 2, seed=0, rnd=1)[2][0]
    assert len({tuple(v.flatten().tolist()) for v in draws.values()}) == 3
    assert len(set(draws["epochs"].flatten().tolist())) == 40  # 40 rows, one pass, each row once
    assert len(set(draws["replacement"].flatten().tolist())) < 40  # 40 draws with replacement: ~25 distinct
    for st in range(4):
        assert len(set(draws["steps"][st].flatten().tolist())) == 10



def test_replacement_draws_what_fedrun_drew_before_the_option():
    """Indices recorded from fedrun before `sampling` existed (commit 629178b): the default must keep
    every earlier run reproducible, with and without train_all."""
    d = data()
    sched = Schedule(rounds=1, tau=2, clients_per_round=2, batch_size=3)
    clients, trained, idx = sample_round(d, sched, 1, seed=3, rnd=2)
    assert clients.tolist() == trained.tolist() == [0, 3]
    assert idx.tolist() == [[[[1, 2, 2]], [[1, 2, 2]]], [[[15, 23, 17]], [[16, 19, 24]]]]
    _, trained, idx = sample_round(d, sched, 1, seed=3, rnd=2, train_all=True)
    assert trained.tolist() == [0, 1, 2, 3]
    assert idx.tolist() == [[[[1, 2, 2]], [[1, 2, 2]]], [[[4, 4, 4]], [[7, 6, 5]]], [[[10, 11, 8]], [[10, 13, 9]]],
                            [[[15, 23, 17]], [[16, 19, 24]]]]


def test_train_all_clients_draw_without_replacement_too():
    d = data()
    sched = Schedule(rounds=1, tau=6, clients_per_round=1, batch_size=2, sampling="epochs")
    _, trained, idx = sample_round(d, sched, 1, seed=0, rnd=1, train_all=True)
    rel = local_rows(d.train, trained, idx)
    for i, n in enumerate(SIZES):  # 12 rows each round: every full pass of the client's rows a permutation
        seq = rel[i].flatten().tolist()
        for start in range(0, 12 - n + 1, n):
            assert sorted(seq[start : start + n]) == list(range(n))


def test_an_unknown_sampling_is_refused():
    with pytest.raises(ValueError, match="sampling='epoch' is not allowed; choose one of: replacement, epochs, steps"):
        Schedule(rounds=1, tau=1, clients_per_round=1, batch_size=1, sampling="epoch")


def test_the_option_reaches_the_run(tmp_path):
    """`sampling=` on the command line changes the run's batches (and so its numbers); null is replacement."""
    from helpers import fedrun
    from test_package import composed

    from fedrun.run.spec import schedule

    assert schedule(composed("sampling=epochs"), 10).sampling == "epochs"
    # null (and the default) is replacement where the run reads it, its schedule: a run of its own showed the same
    # metrics.csv as replacement's (4 runs -> 3)
    assert schedule(composed(), 10).sampling == "replacement"
    assert schedule(composed("sampling=null"), 10).sampling == "replacement"
    tiny = ["data.num_clients=5", "data.dim=6", "data.num_classes=4", "model=mlr", "rounds=2", "tau=3",
            "clients_per_round=2", "batch_size=4", "progress=false", "plot=false"]
    metrics = {}
    for sampling in ("replacement", "epochs", "steps"):
        r = fedrun([*tiny, f"sampling={sampling}", f"hydra.run.dir={tmp_path / sampling}"], tmp_path)
        assert r.returncode == 0, r.stderr
        metrics[sampling] = (tmp_path / sampling / "metrics.csv").read_text()
    assert len({metrics["replacement"], metrics["epochs"], metrics["steps"]}) == 3
