"""Rounds of phases (Algorithm.phases): per-client step counts in epochs of each client's own rows,
beside fixed-length phases, run as one masked computation (fedrun.simulate.sample_phases and
local_training). On the golden clients (12, 16, 20 and 8 training rows) with batches of 5, an epoch
is 2, 3, 4 and 1 steps (the partial last minibatch dropped)."""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import pytest
import torch
from test_golden_pfedme import golden_data

from fedrun.algorithms.base import Phase
from fedrun.algorithms.fedavg import FedAvg
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.models import MLP
from fedrun.simulate import Progress, Replica, Schedule, sample_phases, simulate, simulate_group

PER_EPOCH = torch.tensor([2, 3, 4, 1])


class TwoPhasesClients(NamedTuple):
    n: torch.Tensor  # [C, 2]: each client's steps of each phase in the last round it trained


class TwoPhasesLocal(NamedTuple):
    params: dict
    n: torch.Tensor  # [m, 2]: each client's steps of each phase
    buffers: dict = {}  # (FedAvg's: a BatchNorm model's statistics)
    opt: dict = {}


class TwoPhases(FedAvg):
    """FedAvg whose round is 2 epochs of SGD, then 3 steps with a smaller lr; `n` counts each
    client's steps per phase."""

    Clients = TwoPhasesClients

    def init(self, params, num_clients):
        return replace(super().init(params, num_clients), clients=TwoPhasesClients(n=torch.zeros(num_clients, 2)))

    def client_init(self, state, clients, rnd):
        return TwoPhasesLocal(params=super().client_init(state, clients, rnd).params, n=torch.zeros(len(clients), 2))

    def phases(self):
        return Phase(self.first, epochs=2), Phase(self.second, steps=3)

    def first(self, engine, local, batches, rnd):
        return self.sgd_step(engine, local, batches, self.lr, rnd)._replace(n=local.n + torch.tensor([1.0, 0.0]))

    def second(self, engine, local, batches, rnd):
        return self.sgd_step(engine, local, batches, self.lr / 2, rnd)._replace(n=local.n + torch.tensor([0.0, 1.0]))

    def server_update(self, state, local, clients, selected, weights):
        new = super().server_update(state, local, clients, selected, weights)
        return replace(new, clients=TwoPhasesClients(n=state.clients.n.index_copy(0, clients, local.n)))


SCHED = Schedule(rounds=3, tau=2, clients_per_round=4, batch_size=5, eval_every=3)


def test_epochs_walk_each_clients_own_rows_and_count_its_own_steps():
    data = golden_data()
    clients, _, (first, second) = sample_phases(data, SCHED, TwoPhases(lr=0.1).phases(), seed=0, rnd=1)
    assert first.idx.shape == (4, 2 * 4, 1, 5) and second.idx.shape == (4, 3, 1, 5) and second.live is None
    assert first.live.sum(1).tolist() == (2 * PER_EPOCH).tolist()
    for c in range(4):
        lo, n = int(data.train.offsets[c]), int(data.train.sizes[c])
        for e in range(2):  # one epoch: distinct rows of the client's own, the partial last batch dropped
            rows = first.idx[c, e * 4:(e + 1) * 4][first.live[c, e * 4:(e + 1) * 4]].flatten()
            assert len(set(rows.tolist())) == len(rows) == PER_EPOCH[c] * 5
            assert lo <= rows.min() and rows.max() < lo + n
    torch.manual_seed(0)
    model = MLP(12, 4, hidden=[8])
    state, _ = simulate(TwoPhases(lr=0.1), VmapEngine(model), data, params_of(model), SCHED, seed=0)
    assert state.clients.n.tolist() == [[2 * int(p), 3] for p in PER_EPOCH]  # (the last round's)


def test_phases_agree_across_engines_grouped_seeds_and_resume():
    data = golden_data()
    torch.manual_seed(0)
    model = MLP(12, 4, hidden=[8])
    params = params_of(model)
    ref, _ = simulate(TwoPhases(lr=0.1), VmapEngine(model), data, params, SCHED, seed=0)
    loop, _ = simulate(TwoPhases(lr=0.1), LoopEngine(model), data, params, SCHED, seed=0)
    other, _ = simulate(TwoPhases(lr=0.1), VmapEngine(model), data, params, SCHED, seed=1)
    for k in ref.params:
        torch.testing.assert_close(loop.params[k], ref.params[k], rtol=1e-5, atol=1e-6)
    runs = [Replica(0, params), Replica(1, params)]  # two seeds trained as one computation
    simulate_group(TwoPhases(lr=0.1), VmapEngine(model), data, runs, SCHED)
    saved = []
    simulate(TwoPhases(lr=0.1), VmapEngine(model), data, params, Schedule(**{**SCHED.__dict__, "rounds": 1}), seed=0,
             on_checkpoint=saved.append)
    resumed, _ = simulate(TwoPhases(lr=0.1), VmapEngine(model), data, params, SCHED, seed=0,
                          start=Progress(saved[0].state, 1))
    for k in ref.params:
        assert (torch.equal(runs[0].at.state.params[k], ref.params[k])
                and torch.equal(runs[1].at.state.params[k], other.params[k]))
        assert torch.equal(resumed.params[k], ref.params[k])


class Passes(FedAvg):
    """FedAvg whose round is 1 epoch."""

    def phases(self):
        return (Phase(self.client_step, epochs=1),)


class PassesThenSteps(Passes):
    def phases(self):
        return (*super().phases(), Phase(self.client_step, steps=2))


def test_a_round_of_passes_no_client_holds_a_minibatch_of_is_refused_and_a_partial_one_warned():
    """The golden clients' 12, 16, 20, 8 rows: batches of 21 give no client a step (the run would
    report its initial model every round); of 13, the clients of 12 and 8 rows train no step."""
    import pytest

    from fedrun.errors import ConfigError
    from fedrun.run.spec import check_passes

    sizes = torch.tensor([12, 16, 20, 8])
    sched = lambda B: Schedule(rounds=1, tau=2, clients_per_round=4, batch_size=B)
    with pytest.raises(ConfigError) as e:
        check_passes(Passes(lr=0.1), sched(21), sizes)
    assert str(e.value).startswith("batch_size=21 is larger than every training client's rows (largest: 20): "
                                   "algo=fedavg runs passes over each client's training rows")
    assert "\n" not in str(e.value)
    assert "so no client trains; allowed: batch_size <= 20" in str(e.value)
    with pytest.raises(ConfigError, match="so these passes train nothing"):  # a phase of steps after them
        check_passes(PassesThenSteps(lr=0.1), sched(21), sizes)
    warned, = check_passes(Passes(lr=0.1), sched(13), sizes)
    assert warned.startswith("2 of 4 training clients hold fewer than batch_size=13 rows") and "unchanged" in warned
    assert check_passes(Passes(lr=0.1), sched(8), sizes) == [] and check_passes(FedAvg(lr=0.1), sched(21), sizes) == []
    # what the refusal saves: sample_phases draws no step at all, and at 13 no step for those two clients
    _, _, (d,) = sample_phases(golden_data(), sched(13), Passes(lr=0.1).phases(), 0, 1)
    assert d.live.sum(1).tolist() == [0, 1, 1, 0]


def test_per_fedavg_in_epochs_needs_two_minibatches_of_rows_a_meta_step():
    """Per-FedAvg's meta-step takes 2 disjoint minibatches of a pass (Phase.disjoint): a client needs
    2 x batch_size rows for one step, so batches of 11 over clients of at most 20 rows train nothing."""
    import pytest

    from fedrun.algorithms import build
    from fedrun.errors import ConfigError
    from fedrun.run.spec import check_passes

    sizes = torch.tensor([12, 16, 20, 8])
    sched = lambda B: Schedule(rounds=1, tau=2, clients_per_round=4, batch_size=B)
    algo = build("perfedavg", local_epochs=1)
    with pytest.raises(ConfigError, match=r"batch_size=11 is larger than every training client's rows / 2 "
                                          r"\(largest: 20\).*allowed: batch_size <= 10$"):
        check_passes(algo, sched(11), sizes)
    warned, = check_passes(algo, sched(7), sizes)
    assert warned.startswith("2 of 4 training clients hold fewer than 2 x batch_size=7 rows")
    assert check_passes(algo, sched(4), sizes) == []


@pytest.mark.parametrize("per_round", [2, 1])
def test_a_round_without_the_largest_client_takes_each_clients_own_passes(per_round):
    """Rounds that sample fewer clients than train (golden clients of 2, 3, 4, 1 steps a pass): each
    trained client's count is still 2 passes of its own, and the round computed by work (the default)
    gives the masked round's numbers. (A pass of the draw is as long as ALL training clients' largest;
    a round without that client once walked extra "passes" on the shorter stride.)"""
    from fedrun.simulate import local_training, one_step

    data = golden_data()
    sched = Schedule(rounds=3, tau=2, clients_per_round=per_round, batch_size=5, eval_every=3)
    out = {}
    for name, steps in (("by_work", None), ("masked", one_step)):
        torch.manual_seed(0)
        model = MLP(12, 4, hidden=[8])

        def train(a, e, local, d, idx, rnd, aug=None, steps=steps):
            return local_training(a, e, local, d, idx, rnd, aug, step=steps)

        out[name], _ = simulate(TwoPhases(lr=0.1), VmapEngine(model), data, params_of(model), sched, seed=0,
                                steps=train)
    counts = out["by_work"].clients.n.tolist()
    assert any(n != [0, 0] for n in counts)
    for c, n in enumerate(counts):  # (the last round that trained client c; [0, 0]: never trained)
        assert n in ([0, 0], [2 * int(PER_EPOCH[c]), 3]), (c, n)
    assert out["masked"].clients.n.tolist() == counts
    for k, v in out["by_work"].params.items():
        torch.testing.assert_close(v, out["masked"].params[k], rtol=0, atol=0)  # (per-client ops: as test_side_by_side)
