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


# clients of 1 row to many times B = 4 rows (B is the draws' minibatch below), and rows each block reads:
# none, less than a pass, exactly one, one and a bit, all of the block
UNEVEN = [1, 3, 4, 9, 41]


def coarse_rand(*args, **kwargs):
    """torch.rand's draws (and generator use) cut to 3 values: many tied keys, to check their order too."""
    coarse_rand.calls += 1
    return (RAND(*args, **kwargs) * 3).floor() / 3


RAND, coarse_rand.calls = torch.rand, 0


@pytest.mark.parametrize("ties", [False, True], ids=["keys", "tied_keys"])
@pytest.mark.parametrize("blocks,length", [(1, 24), (3, 50), (2, 7)])
def test_used_rows_are_the_full_draws_rows_and_the_generator_ends_the_same(blocks, length, ties, monkeypatch):
    """`used`: each client's rows before used[i] of every block are the full computation's bit for bit, the
    generator is left where the full computation leaves it (every key drawn), and every other position holds
    one of the client's own rows, in storage order from the first permutation not sorted."""
    calls = coarse_rand.calls
    if ties:
        monkeypatch.setattr(torch, "rand", coarse_rand)
    s = split(UNEVEN)
    clients = torch.tensor([4, 0, 2, 1, 3, 4])
    n = s.sizes[clients]
    for used in ([0, 1, 3, 4, 9, 41], [41, 0, 5, 2, 0, 17], [length] * 6, [2 * c + 1 for c in n.tolist()]):
        used = torch.tensor(used).clamp(max=length)
        g_full, g = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        full = s.shuffled_indices(clients, blocks, length, g_full)
        got = s.shuffled_indices(clients, blocks, length, g, used)
        assert torch.equal(g.get_state(), g_full.get_state())
        drawn = torch.Generator().manual_seed(7)  # a key per row of every permutation: m x blocks x passes x n
        RAND(int((blocks * -(-length // n) * n).sum()), generator=drawn)
        assert torch.equal(g.get_state(), drawn.get_state())
        rel = local_rows(s, clients, got)  # every position a row of its client
        for i in range(len(clients)):
            u, c = int(used[i]), int(n[i])
            sorted_ = min(length, -(-u // c) * c)  # the permutations that start before u, whole
            assert torch.equal(got[i, :, :sorted_], full[i, :, :sorted_]), (i, u)
            assert rel[i, :, sorted_:].tolist() == [[p % c for p in range(sorted_, length)]] * blocks, (i, u)
    assert coarse_rand.calls - calls == (8 if ties else 0)  # (the draws' keys were the tied ones)


@pytest.mark.parametrize("k,disjoint", [(1, False), (2, True), (2, False)])
def test_an_epochs_phase_sorts_only_the_rows_its_clients_read(k, disjoint):
    """draw_passes (both layouts: a step's k minibatches consecutive rows of one shuffle, or one from each of
    k shuffles): the rows of every live step, and the generator after the draw, are those of the full
    shuffles (`used` None); every step's rows are its client's own."""
    from unittest import mock

    from fedrun.algorithms.base import Phase
    from fedrun.simulate import draw_passes

    s, B = split(UNEVEN), 2
    sizes, cs = s.sizes, torch.tensor([0, 1, 2, 3, 4])
    ph = Phase(lambda *a: None, epochs=2, batches=k, disjoint=disjoint)
    g_full, g = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    real = ClientSplit.shuffled_indices
    with mock.patch.object(ClientSplit, "shuffled_indices",
                           lambda self, clients, blocks, length, gen, used=None: real(self, clients, blocks, length,
                                                                                        gen)):
        full, live_full, per_pass_full = draw_passes(s, sizes, cs, ph, B, g_full)
    idx, live, per_pass = draw_passes(s, sizes, cs, ph, B, g)
    assert torch.equal(g.get_state(), g_full.get_state())
    assert torch.equal(live, live_full) and torch.equal(per_pass, per_pass_full)
    assert per_pass.tolist() == ([0, 0, 1, 2, 10] if disjoint else [0, 1, 2, 4, 20])
    assert torch.equal(idx[live], full[live])
    assert not torch.equal(idx, full)  # (the rows no step reads are not the full draw's: not sorted)
    local_rows(s, cs, idx)


def test_fine_tuning_in_epochs_sorts_only_the_rows_its_clients_read():
    """personalize.finetune_epochs: the rows of every step a client takes (floor(n_c / B) a pass), and the
    generator after the draw, are those of the full shuffles; the other positions are the client's rows."""
    from unittest import mock

    from fedrun.algorithms.base import EvalContext
    from fedrun.algorithms.personalize import finetune_epochs

    d, B, epochs = data(UNEVEN), 4, 2
    steps = d.train.sizes // B  # [0, 0, 1, 2, 10]
    seen = {}
    with mock.patch("fedrun.algorithms.personalize.steps_by_work", lambda *a: seen.update(draws=a[1], per=a[2])):
        finetune_epochs(None, {}, EvalContext(d, g := torch.Generator().manual_seed(5), B, 1), 0.1, epochs)
    g_full = torch.Generator().manual_seed(5)
    full = d.train.shuffled_indices(torch.arange(5), epochs, 10 * B, g_full).view(5, epochs * 10, B)
    assert torch.equal(g.get_state(), g_full.get_state()) and torch.equal(seen["per"], steps)
    live = (torch.arange(10).view(1, 1, -1) < steps.view(-1, 1, 1)).expand(5, epochs, 10).reshape(5, -1)
    assert torch.equal(seen["draws"][live], full[live]) and not torch.equal(seen["draws"], full)
    local_rows(d.train, torch.arange(5), seen["draws"])


@pytest.mark.parametrize("used", [False, True])
def test_a_draws_peak_memory_is_within_what_the_memory_check_counts(used):
    """fedrun.run.spec.ROW_BYTES["shuffled"]: the bytes a drawn row takes at the peak of `shuffled_indices`
    (check_round_draws refuses a round whose draws would not fit), counted by the allocation meter, on
    blocks that each client's passes fill (as an epochs phase's: its pass about its largest client's rows)."""
    from fedrun.run.memory import AllocationMeter
    from fedrun.run.spec import ROW_BYTES

    sizes, B, blocks, length = [410, 505, 1000, 2000], 20, 3, 2000
    s = split(sizes)
    with AllocationMeter() as meter:
        s.shuffled_indices(torch.arange(4), blocks, length, torch.Generator().manual_seed(0),
                           s.sizes // B * B if used else None)
    assert meter.peak <= ROW_BYTES["shuffled"] * len(sizes) * blocks * length


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
