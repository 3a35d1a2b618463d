"""Held-out (unseen) clients are served after the method's own personalization on their TRAINING
rows (`Algorithm.onboard`, docs/data.md "Unseen clients"), not with an untrained personal model."""
from dataclasses import replace

import pytest
import torch

from fedrun.algorithms import build, names
from fedrun.algorithms.adaptation import Prototypes
from fedrun.algorithms.ditto import Ditto
from fedrun.algorithms.fedproto import NearestPrototype
from fedrun.algorithms.fedrep import FedRep
from fedrun.algorithms.personalize import onboarding_batches
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of, stack
from fedrun.engine.tree import head_names
from fedrun.errors import ConfigError
from fedrun.evaluate import evaluate, served
from fedrun.models import MLP, MLPBN
from fedrun.simulate import Schedule, eval_context, simulate

HELD = 2  # the last two of 6 clients never train
SCHED = Schedule(rounds=1, tau=2, clients_per_round=3, batch_size=5)


def _data():
    data = synthetic(num_clients=6, dim=6, num_classes=4, seed=1, cache_dir=None, chunk_len=16)
    return replace(data, num_holdout=HELD)


def _relabelled(data):
    """`data` with the held-out clients' TRAINING labels changed (their test rows and every training
    client's rows as they were)."""
    y = data.train.y.clone()
    start = int(data.train.offsets[data.num_train_clients])
    y[start:] = (y[start:] + 1) % data.num_classes
    return replace(data, train=replace(data.train, y=y))


def _trained(name: str, data, **options):
    algo = build(name, **options)
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5])
    try:
        algo.check_params(params_of(model))
    except ConfigError:  # FedBN needs BatchNorm
        torch.manual_seed(0)
        model = MLPBN(6, 4, hidden=[5])
    engine = VmapEngine(model)
    state, _ = simulate(algo, engine, data, params_of(model), SCHED, 0)
    return algo, engine, state


def _served(algo, engine, state, data):
    pers, _ = served(algo, engine, state, eval_context(data, SCHED, 0, SCHED.rounds))
    if isinstance(pers, Prototypes):
        return {"centers": pers.centers}
    if isinstance(pers, NearestPrototype):  # FedProto: each client's own model, the global prototypes
        return pers.params
    return pers


@pytest.mark.parametrize("name", names())
def test_a_held_out_client_is_served_what_its_own_training_rows_give(name):
    """For every algorithm of conf/algo: a held-out client's served model depends on its own
    training rows (an untrained personal part, or the global model alone, would not), and the
    training clients' served models do not depend on the held-out clients' rows."""
    data = _data()
    algo, engine, state = _trained(name, data)
    a = _served(algo, engine, state, data)
    if a is None:  # serves the global model only (FedDyn, SCAFFOLD): nothing personal to score
        return
    b = _served(algo, engine, state, _relabelled(data))
    t = data.num_train_clients
    for k in a:
        assert torch.equal(a[k][:t], b[k][:t]), k
    assert any(not torch.equal(a[k][t + i], b[k][t + i]) for k in a for i in range(HELD)), \
        f"algo={name}: a held-out client is served a model its training rows do not change"


@pytest.mark.parametrize("name", ["fedper", "lgfedavg", "fedrep"])
def test_split_methods_fit_a_held_out_clients_personal_part_with_the_shared_part_frozen(name):
    data = _data()
    algo, engine, state = _trained(name, data)
    pers = _served(algo, engine, state, data)
    head = head_names(state.params)
    mine = head if algo.personal_part == "head" else [k for k in state.params if k not in head]
    t = data.num_train_clients
    for k, v in state.params.items():
        for c in range(t, data.num_clients):
            if k in mine:  # fitted: moved away from the (never trained) initial part
                assert not torch.equal(pers[k][c], state.clients.part[k][c]), k
            else:  # frozen: exactly the server's shared part
                assert torch.equal(pers[k][c], v), k


def test_ditto_serves_a_held_out_client_its_personal_objective_from_the_global_model():
    """new_client_steps=1 from v = w: one step of personal_lr on grad f(w; D) (the lam term is 0
    at v = w), D the minibatch the evaluation's stream draws first."""
    data = _data()
    algo, engine, state = _trained("ditto", data, lr=0.1, personal_lr=0.3, lam=0.5, new_client_steps=1)
    assert isinstance(algo, Ditto)
    pers = _served(algo, engine, state, data)
    new = torch.arange(data.num_train_clients, data.num_clients)
    (batch,), = onboarding_batches(eval_context(data, SCHED, 0, SCHED.rounds), new, 1)
    w = stack(state.params, HELD)
    g, _ = engine.grad(w, *batch)
    for k in w:
        torch.testing.assert_close(pers[k][new], w[k] - 0.3 * g[k])


def test_new_client_columns_summarize_the_held_out_clients_among_themselves():
    data = _data()
    algo, engine, state = _trained("ditto", data)
    ev = evaluate(algo, engine, state, data, eval_context(data, SCHED, 0, SCHED.rounds))
    acc, t = ev.per_client["pers_acc"], data.num_train_clients
    assert ev.row["pers_acc_min"] == pytest.approx(float(acc[:t].min()))
    assert ev.row["new_pers_acc_min"] == pytest.approx(float(acc[t:].min()))
    assert ev.row["pers_acc_p10"] == pytest.approx(float(torch.quantile(acc[:t].double(), 0.1)))
    assert ev.row["new_pers_acc_p10"] == pytest.approx(float(torch.quantile(acc[t:].double(), 0.1)))


def test_new_client_steps_is_checked():
    with pytest.raises(ConfigError, match=r"algo.new_client_steps=0 must be an integer >= 1 or null"):
        FedRep(new_client_steps=0)
