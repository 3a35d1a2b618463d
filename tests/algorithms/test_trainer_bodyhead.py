"""The body/head family on the local trainer (fedrun.algorithms.trainer): Local, FedPer, LG-FedAvg,
FedRep, FedBABU and FedRoD. Each client's local steps of a BatchNorm model (MLPBN) with SGD of momentum
and weight decay are torch.optim's on that client alone, with PFLlib's optimizers (FedRep: one for the
head, one for the body; FedBABU: the body only, the head frozen; FedRoD: the generic model's and the
personal head's), and the running statistics are torch's nn.BatchNorm1d's in train(); the server keeps
each part's statistics where the part goes."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fedrun.algorithms import build
from fedrun.algorithms.base import client_entries
from fedrun.algorithms.optim import local_optim
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.models.small import MLPBN

M, B, D, K = 3, 6, 5, 4  # clients, rows per minibatch, features, classes
OPT = {"momentum": 0.9, "weight_decay": 0.05}
LR = 0.1
# float32: each entry goes through 3 steps of a few ops of magnitude <= ~1 (eps 1.2e-7): 1e-5 is ~100 eps
# of headroom for the differing summation orders of vmap's batched and torch's per-client kernels
TOL = 1e-5


def _model() -> MLPBN:
    torch.manual_seed(0)
    return MLPBN(D, K, hidden=[7])


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(M, B, D, generator=g) * 2 + 1, torch.randint(0, K, (M, B), generator=g)) for _ in range(steps)]


def _algo(name: str, **kw):
    algo = build(name, **kw)
    algo = algo.bind(replace(algo.run, optim=local_optim(OPT, 3)))
    return algo


def _run(algo, engine_cls, steps: int, step=None, rounds_state=None):
    """Every client's Local after `steps` calls of `step` (default client_step) from round 1's start."""
    model = _model()
    state = rounds_state or algo.init(params_of(model), M)
    local = algo.start_local(state, torch.arange(M), 1)
    engine = engine_cls(model)
    for x, y in _batches(steps):
        local = (step or algo.client_step)(engine, local, [(x, y)], 1)
    return model, local


def _sgd(params) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=LR, **OPT)


def _close(local_params: dict, c: int, module: torch.nn.Module) -> None:
    """Client c's model state (parameters and BatchNorm buffers) equals the torch module's."""
    for k, v in module.state_dict().items():
        mine = local_params[k][c]
        if v.is_floating_point():
            assert (mine - v).abs().max().item() < TOL, k
        else:
            assert torch.equal(mine, v), k


def _head(module: MLPBN) -> torch.nn.Module:
    return module.net[-1]


def _body_params(module: MLPBN) -> list:
    head = set(map(id, _head(module).parameters()))
    return [p for p in module.parameters() if id(p) not in head]


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
@pytest.mark.parametrize("name", ["local", "fedper", "lgfedavg"])
def test_whole_model_steps_are_torch_sgd_in_train_mode(name, engine_cls):
    """Local, FedPer, LG-FedAvg: 3 steps of one SGD(momentum, weight decay) over the whole model in
    train() (BatchNorm's batch statistics, its running ones updated)."""
    algo = _algo(name, lr=LR)
    model, local = _run(algo, engine_cls, 3)
    for c in range(M):
        mine = copy.deepcopy(model).train()
        o = _sgd(mine.parameters())
        for x, y in _batches(3):
            o.zero_grad()
            F.cross_entropy(mine(x[c]), y[c]).backward()
            o.step()
        _close(local.params, c, mine)


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
@pytest.mark.parametrize("phases", [False, True])
def test_fedrep_head_and_body_have_their_own_optimizers(phases, engine_cls):
    """FedRep: step 1 trains the head (PFLlib's poptimizer over the head), steps 2-3 the body (its
    optimizer over the body), the other part frozen (no weight decay, no momentum on it); every step's
    forward updates the running statistics. The tau path (a per-client step counter) and the epochs
    path (head_step, body_step) alike."""
    algo = _algo("fedrep", lr=LR, head_steps=1)
    steps = [algo.head_step, algo.body_step, algo.body_step]
    model, local = _run(algo, engine_cls, 3) if not phases else (None, None)
    if phases:
        model = _model()
        local = algo.start_local(algo.init(params_of(model), M), torch.arange(M), 1)
        engine = engine_cls(model)
        for s, (x, y) in zip(steps, _batches(3)):
            local = s(engine, local, [(x, y)], 1)
    for c in range(M):
        mine = copy.deepcopy(model).train()
        head_opt, body_opt = _sgd(_head(mine).parameters()), _sgd(_body_params(mine))
        for o, (x, y) in zip([head_opt, body_opt, body_opt], _batches(3)):
            mine.zero_grad()
            F.cross_entropy(mine(x[c]), y[c]).backward()
            o.step()
        _close(local.params, c, mine)


def test_fedbabu_steps_the_body_only():
    """FedBABU: SGD(momentum, weight decay) over the body; the head (frozen, PFLlib's requires_grad off)
    stays exactly the initial one."""
    algo = _algo("fedbabu", lr=LR)
    model, local = _run(algo, VmapEngine, 3)
    for c in range(M):
        mine = copy.deepcopy(model).train()
        o = _sgd(_body_params(mine))
        for x, y in _batches(3):
            o.zero_grad()
            F.cross_entropy(mine(x[c]), y[c]).backward()
            o.step()
        _close(local.params, c, mine)
        for k, v in _head(model).state_dict().items():
            assert torch.equal(local.params["net.3." + k][c], v)


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
def test_fedrod_generic_model_and_personal_head_are_pfllib_clientrod(engine_cls):
    """FedRoD (PFLlib's clientROD.train): the generic model's optimizer on the balanced softmax loss,
    then the personal head's (opt_head) on CE(out_g.detach() + head(rep.detach())), one forward of the
    body in train() per step."""
    algo = _algo("fedrod", lr=LR)
    model = _model()
    state = algo.init(params_of(model), M)
    counts = torch.tensor([[5., 1., 2., 9.], [1., 1., 1., 1.], [3., 7., 1., 2.]])
    state = replace(state, clients=state.clients._replace(counts={"n": counts}))
    _, local = _run(algo, engine_cls, 3, rounds_state=state)
    for c in range(M):
        mine = copy.deepcopy(model).train()
        head = copy.deepcopy(_head(model))
        o, o_head = _sgd(mine.parameters()), _sgd(head.parameters())
        for x, y in _batches(3):
            rep = mine(x[c], features=True)
            out_g = _head(mine)(rep)
            o.zero_grad()
            F.cross_entropy(out_g + counts[c].log(), y[c]).backward()
            o.step()
            o_head.zero_grad()
            F.cross_entropy(out_g.detach() + head(rep.detach()), y[c]).backward()
            o_head.step()
        _close(local.params, c, mine)
        for k, v in head.state_dict().items():
            assert (local.head["net.3." + k][c] - v).abs().max().item() < TOL, k


def _round(algo, bn: str):
    """One round of M clients, 2 steps each (through start_local / end_round), from the initial model."""
    algo = algo.bind(replace(algo.run, bn=bn))
    model = _model()
    before = algo.init(params_of(model), M)
    clients = torch.arange(M)
    local = algo.start_local(before, clients, 1)
    engine = VmapEngine(model)
    for x, y in _batches(2):
        local = algo.client_step(engine, local, [(x, y)], 1)
    return model, local, algo.end_round(before, local, clients, clients, None, M)


STATS = ("net.1.running_mean", "net.1.running_var")


@pytest.mark.parametrize("name", ["fedper", "fedbabu", "fedrod", "fedrep"])
def test_the_bodys_statistics_are_averaged_or_kept_by_each_client(name):
    """The body is shared: bn=averaged, the server's statistics are the clients' mean; bn=local, each
    client keeps its own (ServerState.trainer["bn_local"]) and the server carries the first client's."""
    kw = {"head_steps": 1} if name == "fedrep" else {}
    _, local, state = _round(_algo(name, lr=LR, **kw), "averaged")
    for k in STATS:
        assert torch.allclose(state.params[k], local.params[k].mean(0), atol=1e-6, rtol=0)
    _, local, state = _round(_algo(name, lr=LR, **kw), "local")
    for k in STATS:
        assert torch.equal(state.trainer["bn_local"][k], local.params[k])
        assert torch.equal(state.params[k], local.params[k][0])


@pytest.mark.parametrize("name", ["lgfedavg", "local"])
@pytest.mark.parametrize("bn", ["averaged", "local"])
def test_personal_statistics_stay_with_each_client(name, bn):
    """LG-FedAvg's body and Local's whole model are each client's: their running statistics stay in the
    client's own state under either bn policy, and the server's model keeps the initial ones."""
    model, local, state = _round(_algo(name, lr=LR), bn)
    own = client_entries(state.clients)["part" if name == "lgfedavg" else "params"]
    for k in STATS:
        assert torch.equal(own[k], local.params[k])
        assert torch.equal(state.params[k], model.state_dict()[k])
