"""bn=local (issue 44, item 3): the model each client is served carries ITS OWN running statistics of
the shared model, as PFLlib d832e76's clients are scored with their own `self.model`, whose buffers
its server never overwrites (`set_parameters` walks `parameters()`); a held-out client's start from
its own (the initial model's) and keep what its onboarding's training-mode forwards moved. Two rounds
of 2 of 3 clients (one more held out) of a tiny MLPBN through simulate, both engines.

- methods serving the shared part as it is (the body/head family, FedDBE, FedRoD, P-Avg's prototypes):
  the served statistics ARE each client's `trainer["bn_local"]` row (after onboarding), and differ from
  the server's (its first aggregated client's) for some client;
- methods fine-tuning from the shared model at test time (FedAvg's update, the generic fine-tuning of
  a method serving only the shared model, Per-FedAvg's test-batch update): a training-mode step moves a
  running statistic r to (1 - m) r + m (batch statistic), so after s steps from each client's own r the
  served statistic minus the one served from the server's r is (1 - m)^s (own - server's)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedrun.algorithms import build
from fedrun.algorithms.base import RunInfo
from fedrun.data import ClientSplit, FederatedData
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.tree import stack
from fedrun.models.small import MLPBN
from fedrun.simulate import Schedule, eval_context, simulate

D, K, H = 5, 4, 6  # features, classes, hidden width
SIZES = (12, 10, 9, 8)  # 3 training clients and 1 held out (the last)
C, NEW = len(SIZES), len(SIZES) - 1
SCHED = Schedule(rounds=2, tau=2, clients_per_round=2, batch_size=4, eval_every=2)
ENGINES = [VmapEngine, LoopEngine]
MEAN, VAR, COUNT = "net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked"
MOMENTUM = 0.1  # BatchNorm1d's default

SERVED_AS_KEPT = {  # method -> (options, a held-out client's training-mode forwards: its onboarding steps, tau)
    # (the body/head family's LG-FedAvg keeps the BatchNorm layers in its personal part)
    "fedper": ({}, SCHED.tau), "fedrep": ({"head_steps": 1}, SCHED.tau), "fedpac": ({"head_steps": 1}, SCHED.tau),
    "fedcp": ({}, SCHED.tau),
    "gpfl": ({"mu": 0.0}, SCHED.tau), "feddbe": ({}, SCHED.tau), "fedrod": ({}, SCHED.tau),
    "pavg": ({"adaptation": "proto"}, 0),  # (nothing fitted: a held-out client is served the initial model's)
}
FINETUNED = {  # case -> (method, options, test-time training-mode steps: all clients', or each training client's)
    "fedavg": ("fedavg", {"alpha": 0.05, "finetune_steps": 2}, 2),
    # (epochs: floor(n_c / B) steps a pass, B = batch_size 4: the training clients' 12, 10, 9 rows)
    "fedavg-epochs": ("fedavg", {"alpha": 0.05, "finetune_epochs": 2}, (6, 4, 4)),
    "moon": ("moon", {"finetune_steps": 2}, 2),  # (serves the global model: the generic fine-tuning, `finetune_served`)
    "moon-epochs": ("moon", {"finetune_epochs": 1}, (3, 2, 2)),
    "perfedavg": ("perfedavg", {"test_time": "test_batches", "variant": "fo"}, 2),
    "perfedavg-test-then-train": ("perfedavg", {"test_time": "test_then_train", "variant": "fo"}, 2),
}


def _data() -> FederatedData:
    g = torch.Generator().manual_seed(5)
    s = torch.tensor(SIZES)
    n = int(s.sum())
    split = [(torch.randn(n, D, generator=g, dtype=torch.float64) * 2 + 1, torch.randint(0, K, (n,), generator=g))
             for _ in range(2)]
    return FederatedData("bnserve", ClientSplit.from_flat(*split[0], s, C), ClientSplit.from_flat(*split[1], s, C), K,
                         num_holdout=1)


def _run(name: str, options: dict, engine_cls):
    """(bound algorithm, engine, data, state after 2 rounds under bn=local, the initial model state)."""
    torch.manual_seed(0)
    model = MLPBN(D, K, hidden=[H]).double()
    data = _data()
    algo = build(name, **options)
    algo = algo.bind(RunInfo.of(SCHED, data, algo.optim, "local"))
    algo.check_tau(SCHED.tau)  # (a run the CLI takes: both parts of a split round train)
    engine = engine_cls(model)
    state, _ = simulate(algo, engine, data, params_of(model), SCHED, 0)
    return algo, engine, data, state, params_of(model)


def _served_after_onboarding(algo, engine, state, data):
    """(served models, the state they were served from): `fedrun.evaluate.served`'s steps."""
    ctx = eval_context(data, SCHED, 0, SCHED.rounds)
    onboarded = algo.onboard(engine, state, ctx, torch.tensor([NEW]))
    state = replace(onboarded, trainer={**state.trainer, **onboarded.trainer})
    served, _ = algo.finetune_served(engine, state, ctx, *algo.personalize(engine, state, ctx))
    return (served.params if hasattr(served, "centers") else served), state


def _served_and_from_server(name: str, options: dict, engine_cls):
    """(every client's own statistics after 2 rounds, the server's, the served models, the models served
    when every client's own are replaced by the server's, the initial model state)."""
    algo, engine, data, state, initial = _run(name, options, engine_cls)
    own = state.trainer["bn_local"]
    server = {k: algo.eval_params(state)[k] for k in own}  # (FedAvg keeps them apart: `BatchNormState`)
    as_server = replace(state, trainer={**state.trainer, "bn_local": stack(server, C)})  # everyone the server's
    served, _ = _served_after_onboarding(algo, engine, state, data)
    from_server, _ = _served_after_onboarding(algo, engine, as_server, data)
    return own, server, served, from_server, initial


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("name", list(SERVED_AS_KEPT))
def test_served_models_carry_each_clients_own_statistics(name, engine_cls):
    options, forwards = SERVED_AS_KEPT[name]
    algo, engine, data, state, initial = _run(name, options, engine_cls)
    own = state.trainer["bn_local"]
    assert set(own) == {MEAN, VAR, COUNT}
    assert torch.equal(own[COUNT][NEW], initial[COUNT])  # (a held-out client never trains)
    served, after = _served_after_onboarding(algo, engine, state, data)
    kept = after.trainer["bn_local"]
    for k in own:
        assert torch.equal(served[k], kept[k]), k  # every client's, the held-out one's included
        assert torch.equal(kept[k][:NEW], own[k][:NEW]), k  # (onboarding writes the held-out client's only)
    # the held-out client's onboarding started from its own (the initial model's) and moved them: its
    # counter is the initial one plus its forwards (from the server's it would carry the server's count)
    assert kept[COUNT][NEW] == initial[COUNT] + forwards
    assert torch.equal(kept[MEAN][NEW], initial[MEAN]) == (forwards == 0)
    if name == "pavg":  # (prototypes only read the shared parameters: views of the server's, no copy per client)
        assert all(v.stride(0) == 0 for k, v in served.items() if k not in own)
    # the test can fail: some client's own are not the server's (its first aggregated client's)
    assert any(not torch.equal(own[MEAN][c], state.params[MEAN]) for c in range(NEW))
    assert state.params[COUNT] != initial[COUNT]


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("case", list(FINETUNED))
def test_test_time_steps_start_from_each_clients_own_statistics(case, engine_cls):
    name, options, steps = FINETUNED[case]
    own, server, served, from_server, _ = _served_and_from_server(name, options, engine_cls)
    trained = slice(0, NEW)  # (the held-out client's own are the initial model's either way: not compared)
    kept = (1 - MOMENTUM) ** torch.tensor(steps, dtype=torch.float64).reshape(-1, 1)  # [1 or NEW, 1]
    for k, factor in ((MEAN, kept), (VAR, kept), (COUNT, 1)):
        want = factor * (own[k][trained] - server[k]).double()
        got = (served[k][trained] - from_server[k][trained]).double()
        # float64: each statistic is a few steps of (1 - m) r + m b over numbers <= ~10: 1e-12 is ~1e3 eps64
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=k)
    assert any(not torch.equal(own[MEAN][c], server[MEAN]) for c in range(NEW))  # (so the test can fail)


ONBOARDED_WHOLE = {  # methods serving a whole model per client: their held-out clients' onboarding start
    "ditto": {}, "apfl": {"follow": "paper"}, "fedphp": {}, "fedamp": {}, "fedfomo": {},
    "fedala": {"start_epochs": 1, "ala_steps": 1},  # (its first ALA: 1 step, not 11 x 5)
}


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("name", list(ONBOARDED_WHOLE))
def test_held_out_whole_models_start_from_their_own_statistics(name, engine_cls):
    """A held-out client's own statistics are the initial model's; its onboarding's f training-mode
    forwards take a statistic r to (1 - m)^f r + (its batches' part), so its served model minus the one
    onboarded from the server's (every client given the server's) is (1 - m)^f (initial - server's), f
    the counter's difference from the initial one (PFLlib's new client: a deepcopy of the initial model)."""
    _, server, served, from_server, initial = _served_and_from_server(name, ONBOARDED_WHOLE[name], engine_cls)
    f = int(served[COUNT][NEW] - initial[COUNT])
    assert f > 0 and server[COUNT] != initial[COUNT]  # (so the test can fail)
    assert served[COUNT][NEW] - from_server[COUNT][NEW] == initial[COUNT] - server[COUNT]
    for k in (MEAN, VAR):
        want = (1 - MOMENTUM) ** f * (initial[k] - server[k]).double()
        # float64: as above
        torch.testing.assert_close((served[k][NEW] - from_server[k][NEW]).double(), want, rtol=0, atol=1e-12, msg=k)
