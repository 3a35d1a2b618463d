"""The mixing and representation methods on the local trainer (issue 44): APFL, MOON, FedProto, FedDBE,
FedAMP, FedPHP. Each model a client trains takes its step through the optimizer (`optim.*`, one slot per
model), and a BatchNorm model's running statistics move as one torch `train()` forward on the client's
batch moves them (the constant models' forwards, MOON's global and previous models, FedPHP's v_i, move
nothing); FedAMP's server attention ignores the running statistics."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from fedrun.algorithms import build
from fedrun.algorithms.optim import local_optim
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.tree import param_names, stack
from fedrun.models import MLP, MLPBN

C, M, B, D, K = 6, 3, 8, 5, 3  # clients, of them training, rows, features, classes
OPTIONS = {"apfl": {}, "moon": dict(mu=1.0), "fedproto": dict(lam=1.0), "feddbe": dict(kappa=1.0),
           "fedamp": dict(lam=1.0, sigma=10.0), "fedphp": dict(lam=0.5)}
# the models each method's clients train, each with its own optimizer slot
MODELS = {"apfl": ("params", "v"), "feddbe": ("params", "dbe")}
LR, WD = 0.1, 0.05
EPS = torch.finfo(torch.float32).eps


def _setup(name: str, model, optim=None, engine_cls=VmapEngine):
    """(algo, engine, the round's Local of clients 0..M-1, x, y), every method's extra term switched on
    (global prototypes present, the clients' stored models apart from the server's)."""
    algo = build(name, lr=LR, **OPTIONS[name])
    if optim is not None:
        algo = algo.bind(replace(algo.run, optim=local_optim(optim, 2)))
    engine = engine_cls(model)
    params = params_of(model)
    state = algo.init(params, C)
    g = torch.Generator().manual_seed(1)
    noisy = {k: v + 0.3 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
             for k, v in stack(params, C).items()}
    for key in ("v", "prev", "params", "historical"):
        if key in state.clients._fields and name != "feddbe":
            kept = getattr(state.clients, key)
            state.clients = state.clients._replace(**{key: {**kept, **{k: noisy[k].clone() for k in kept}}})
    if name == "fedproto":
        state.extra["protos"] = torch.randn(state.extra["protos"].shape, generator=g)
        state.extra["present"] = torch.ones_like(state.extra["present"])
    if name == "fedamp":
        state.extra["sent"] = torch.ones_like(state.extra["sent"])
    if name == "feddbe":
        state.extra["global_mean"] = torch.randn(state.extra["global_mean"].shape, generator=g)
        dbe = state.clients.dbe
        state.clients = state.clients._replace(dbe={**dbe, "bias": 0.1 * torch.randn(dbe["bias"].shape, generator=g)})
    local = algo.start_local(state, torch.arange(M), 1)
    x, y = torch.randn(M, B, D, generator=g), torch.randint(0, K, (M, B), generator=g)
    return algo, engine, local, x, y


def _model(bn: bool):
    torch.manual_seed(0)
    return MLPBN(D, K, hidden=[4]) if bn else MLP(D, K, hidden=[4])


@pytest.mark.parametrize("name", list(OPTIONS))
def test_weight_decay_reaches_every_trained_model(name):
    """One step with optim.weight_decay: each trained model moves by the plain step's gradient plus
    wd w (torch.optim.SGD's first step: d = g + wd w, no momentum yet), i.e. new = plain - lr wd w."""
    algo, engine, local, x, y = _setup(name, _model(False))
    plain = algo.client_step(engine, local, [(x, y)], 1)
    algo, engine, local, x, y = _setup(name, _model(False), dict(momentum=0.9, weight_decay=WD))
    decayed = algo.client_step(engine, local, [(x, y)], 1)
    for key in MODELS.get(name, ("params",)):
        for k in (param_names(getattr(local, key)) if key != "dbe" else ["bias"]):
            w = getattr(local, key)[k]
            want = getattr(plain, key)[k] - LR * WD * w
            # each side a few roundings of terms of size |w| + lr |g| (|plain - w| bounds lr |g|)
            tol = 8 * EPS * (w.abs() + (getattr(plain, key)[k] - w).abs() + 1).max()
            assert (getattr(decayed, key)[k] - want).abs().max() <= tol, (key, k)
            assert not torch.equal(getattr(decayed, key)[k], getattr(plain, key)[k]), (key, k)
        assert (f"opt.{key}" if key != "params" else "opt") in decayed.opt  # the model's own optimizer state


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_batchnorm_statistics_move_as_one_torch_training_forward(name, engine_cls):
    """A BatchNorm model's running statistics after one step are those of torch's nn.BatchNorm in
    train() on the client's batch, once (the constant models' forwards do not move them): APFL's v
    carries the statistics of the mixture it trains through."""
    model = _model(True)
    algo, engine, local, x, y = _setup(name, model, dict(momentum=0.9), engine_cls)
    before = copy.deepcopy(local)  # (a step that wrote into its input's statistics would hide here)
    out = algo.client_step(engine, local, [(x, y)], 1)
    local = before
    key = "v" if name == "apfl" else "params"
    for c in range(M):
        mine = copy.deepcopy(model)
        state = {k: v[c] for k, v in getattr(local, key).items()}
        if name == "apfl":  # the mixture alpha v + (1 - alpha) w, v's statistics
            a = local.alpha[c, 0]
            state = {k: v if k not in param_names(state) else a * v + (1 - a) * local.params[k][c]
                     for k, v in state.items()}
        mine.load_state_dict(state)
        mine.train()
        mine(x[c])
        for k, v in mine.state_dict().items():
            if k.endswith(("running_mean", "running_var")):
                torch.testing.assert_close(getattr(out, key)[k][c], v, rtol=4 * EPS,
                                           atol=4 * EPS * v.abs().max().item())
            elif k.endswith("num_batches_tracked"):
                assert torch.equal(getattr(out, key)[k][c], v), k


def test_fedamp_attention_ignores_running_statistics():
    """FedAMP's cloud models from BatchNorm states: the same as from the parameters alone (the running
    statistics, however far apart, weigh nothing), and u holds parameters only."""
    model = _model(True)
    algo, engine, local, x, y = _setup("fedamp", model)
    state = algo.init(params_of(model), C)
    g = torch.Generator().manual_seed(2)
    state.clients = state.clients._replace(params={k: v + torch.randn(v.shape, generator=g) if v.is_floating_point()
                                                   else v for k, v in state.clients.params.items()})
    state.extra["sent"] = torch.ones_like(state.extra["sent"])
    ids = torch.arange(M)
    w = {k: v[:M] for k, v in state.clients.params.items()}
    u = algo.cloud_models(state, w, ids)
    assert set(u) == set(param_names(w))
    far = copy.copy(state)
    far.clients = state.clients._replace(params={k: v * 100 if k.endswith("running_var") else v
                                                 for k, v in state.clients.params.items()})
    u_far = algo.cloud_models(far, w, ids)
    for k in u:
        assert torch.equal(u[k], u_far[k]), k
