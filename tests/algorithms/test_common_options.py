"""The options every algorithm shares, so that one sweep compares algorithms (`fedrun -m
algo=fedavg,ditto,fedrep,apfl algo.lr=0.05 algo.finetune_steps=5`): `lr`, the local learning rate
(each yaml maps it to the paper's name: FedAvg's beta, pFedMe's eta, ...), and test-time
fine-tuning of the served model (`finetune_steps` / `finetune_epochs`)."""
import pytest
import torch
from hydra.errors import InstantiationException

from fedrun.algorithms import build, names
from fedrun.algorithms.base import client_entries
from fedrun.algorithms.ditto import Ditto
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.feddyn import FedDyn
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.algorithms.personalize import finetune
from fedrun.algorithms.pfedme import PFedMe
from fedrun.data import synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.evaluate import served
from fedrun.models import MLP
from fedrun.simulate import Schedule, eval_context

SCHED = Schedule(rounds=1, tau=2, clients_per_round=3, batch_size=5)


def _first_step(name: str, lr: float) -> dict:
    """Every client's model after one local step of `build(name, lr=lr)` on the agreement's tiny data."""
    from fedrun.bench import agreement

    model_name = "mlp_bn" if name == "fedbn" else "mlp"
    data = agreement.data_of(model_name, torch.float64, "cpu")
    torch.manual_seed(0)
    model = agreement.MODELS[model_name](data).double()
    algo = build(name, lr=lr)
    clients = torch.arange(3)
    local = algo.client_init(algo.init(params_of(model), data.num_clients), clients, 1)
    g = torch.Generator().manual_seed(0)
    batches = [data.train.rows(data.train.sample_indices(clients, torch.rand(3, 4, generator=g)))
               for _ in range(algo.batches_per_step)]
    return algo.client_step(LoopEngine(model), local, batches, 1).params, local.params


@pytest.mark.parametrize("name", names())
def test_every_algorithm_takes_lr_and_finetune_steps(name):
    """`algo.lr` is every algorithm's local lr (one sweep: `fedrun -m algo=fedavg,ditto,pfedme algo.lr=...`):
    it is the step size of the clients' models' local step (twice the lr, twice the step)."""
    assert build(name, lr=0.037).lr == 0.037
    (p1, p0), (p2, _) = _first_step(name, 0.01), _first_step(name, 0.02)
    assert any((p1[k] - p0[k]).abs().max() > 0 for k in p0)
    assert all(torch.allclose(p2[k] - p0[k], 2 * (p1[k] - p0[k]), rtol=1e-9, atol=1e-12) for k in p0), name
    try:
        algo = build(name, finetune_steps=5)
    except InstantiationException as e:  # only where fine-tuning cannot apply, in one line naming the way out
        assert isinstance(e.__cause__, ConfigError)
        assert "\n" not in str(e.__cause__) and "algo.finetune_steps=0" in str(e.__cause__)
        # (gpfl, fedcp: served through their modules)
        assert name in ("fedbn", "fedproto", "gpfl", "fedcp") or build(name).adaptation == "proto"
        return
    assert algo.finetune_steps == 5 and build(name, finetune_epochs=2).finetune_epochs == 2
    assert build(name, finetune_lr=0.013).finetune_lr == 0.013  # one name in a mixed sweep too


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedbabu", "perfedavg"])
def test_finetune_lr_is_the_test_time_lr_of_the_algorithms_that_call_it_alpha(name):
    """FedAvg's family names its test-time lr alpha: finetune_lr, when given, is that lr (Per-FedAvg's
    training inner step keeps alpha)."""
    data = synthetic(num_clients=5, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16)
    torch.manual_seed(0)
    model = MLP(6, 3, hidden=[5])
    state = build(name).init(params_of(model), data.num_clients)
    engine = VmapEngine(model)

    def pers(**opts):
        return build(name, **opts).personalize(engine, state, eval_context(data, SCHED, 0, 1))[0]

    by_alpha, by_lr, default = pers(alpha=0.09), pers(finetune_lr=0.09), pers()
    for k in by_alpha:
        assert torch.equal(by_alpha[k], by_lr[k])
    assert any(not torch.equal(by_lr[k], default[k]) for k in by_lr)
    if name == "perfedavg":
        assert build(name, finetune_lr=0.09).alpha == build(name).alpha


@pytest.mark.parametrize("cls,paper", [(FedAvg, "beta"), (PerFedAvg, "beta"), (PFedMe, "eta")])
def test_lr_sets_the_papers_name_and_the_papers_name_still_wins(cls, paper):
    assert getattr(cls(lr=0.3), paper) == 0.3
    assert getattr(cls(**{paper: 0.4}), paper) == 0.4  # presets and golden traces set the old name
    assert getattr(cls(lr=0.3, **{paper: 0.4}), paper) == 0.4
    assert getattr(cls(), paper) == cls().lr  # the yaml's default, under both names


def _data():
    data = synthetic(num_clients=4, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16)
    data.train.x = data.train.x.double()
    data.test.x = data.test.x.double()
    return data


def _state(algo, data):
    """The algorithm's initial state, with every stacked per-client tensor moved apart per client."""
    torch.manual_seed(0)
    model = MLP(6, 3, hidden=[5]).double()
    state = algo.init(params_of(model), data.num_clients)
    g = torch.Generator().manual_seed(1)
    for part in client_entries(state.clients).values():
        for k, v in part.items():
            part[k] = v + 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype)
    return model, VmapEngine(model), state


def _by_hand(model, start: dict, data, c: int, lr: float, steps: int) -> dict:
    """Client c's model after `steps` full-batch SGD steps of lr on its training rows, by autograd."""
    rows = data.train.client_rows(c)
    q = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    for _ in range(steps):
        out = torch.nn.functional.cross_entropy(torch.func.functional_call(model, q, (data.train.x[rows],)),
                                                data.train.y[rows])
        g = torch.autograd.grad(out, list(q.values()))
        q = {k: (v - lr * gk).detach().requires_grad_(True) for (k, v), gk in zip(q.items(), g)}
    return {k: v.detach() for k, v in q.items()}


def test_ditto_fine_tunes_each_clients_personal_model():
    data = _data()
    plain = Ditto(lr=0.1, personal_lr=0.1, lam=0.1)
    tuned = Ditto(lr=0.1, personal_lr=0.1, lam=0.1, finetune_steps=2, finetune_lr=0.3)
    model, engine, state = _state(plain, data)
    ctx = eval_context(data, SCHED, 0, 1)
    before, _ = served(plain, engine, state, ctx)
    after, _ = served(tuned, engine, state, ctx)
    for c in range(data.num_clients):
        want = _by_hand(model, {k: v[c] for k, v in before.items()}, data, c, 0.3, 2)
        for k in want:
            torch.testing.assert_close(after[k][c], want[k], rtol=1e-10, atol=1e-12)


def test_an_algorithm_serving_the_global_model_only_is_fine_tuned_from_it():
    """FedDyn serves no personal model; with finetune_steps its clients get FedAvg's test-time steps
    from the global model (finetune_lr null: its lr)."""
    data = _data()
    model, engine, state = _state(FedDyn(), data)
    ctx = eval_context(data, SCHED, 0, 1)
    assert served(FedDyn(), engine, state, ctx)[0] is None
    got, loss = served(FedDyn(finetune_steps=3), engine, state, ctx)
    want, want_loss = finetune(engine, state.params, ctx, FedDyn().lr, 3)
    for k in want:
        assert torch.equal(got[k], want[k])
    torch.testing.assert_close(loss, want_loss)


def test_finetune_options_are_checked_in_one_line():
    for options, words in (({"finetune_steps": -1}, "algo.finetune_steps=-1 must be an integer >= 0"),
                           ({"finetune_epochs": 0}, "algo.finetune_epochs=0 must be an integer >= 1 or null"),
                           ({"finetune_lr": 0}, "algo.finetune_lr=0 must be a number > 0 or null")):
        with pytest.raises(ConfigError, match=words):
            Ditto(**options)
    with pytest.raises(ConfigError, match="finetune_steps / finetune_epochs need algo.test_time=train"):
        PerFedAvg(test_time="test_batches", finetune_steps=3)
